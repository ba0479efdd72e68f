"""The int8 GEMM of DynamicQuantizeMatMul on AMX tiles (nncc/native/int8_gemm_amx_gen.py),
where the CPU has amx_tile and amx_int8: its integer sums are exact, so every output must
be the operator's exact result (DynamicQuantizeLinear, the product in int64, then the
float32 roundings: tests/test_native_int8.py's ``_exact``) bit for bit, and the same bits as
the vpdpbusd product computes, both where ``NNCC_AMX=0`` turns the tiles off at run time
(what the runtime also does when Linux refuses them) and in code compiled without the
tiles' padding at all. The shapes straddle every remainder: M below, at and past the
16-row tile and the 32-row block, K not a multiple of 4 or of the tile's 64 bytes, N not
a multiple of the 16-column tile or the 64-column panel, batch dimensions folded into M.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper
import pytest

import nncc
from nncc.native import amx, int8_gemm_amx_gen
from nncc.native.toolchain import find_toolchain
from tests.test_native_int8 import _exact

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    find_toolchain(sanitize=False) is None or not amx.usable("native", "amx_int8"),
    reason="no C compiler, or this CPU lacks amx_tile or amx_int8 (the vpdpbusd GEMM then runs, which "
           "tests/test_native_int8.py checks)")]

# (A's shape, N): M = the product of all but A's last dimension, K its last
SHAPES = [((8, 1), 1), ((15, 63), 17), ((16, 64), 64), ((17, 65), 65), ((2, 3, 11, 130), 100),
          ((33, 200), 129), ((47, 770), 48), ((64, 67), 130), ((7, 5), 33)]  # the last: M below AMX_MIN_ROWS


def _model(rng, path):
    """One DynamicQuantizeMatMul per SHAPES entry (input a{i}, output y{i}), with extreme
    weights (sums as large as int8 allows), zero points and bias on alternate ones, per
    column scales on every other; returns the initializers by output."""
    nodes, inputs, outputs, inits, by_output = [], [], [], [], {}
    for i, (shape, n) in enumerate(SHAPES):
        k = shape[-1]
        weights = np.where(rng.random((k, n)) < 0.3, rng.choice([-128, 127], (k, n)), rng.integers(-128, 128, (k, n)))
        mine = {"b": weights.astype(np.int8),
                "bs": (rng.uniform(0.01, 0.03, n) if i % 2 else np.array(0.02)).astype(np.float32)}
        if i % 3 != 0:
            mine["bz"] = (rng.integers(-9, 10, n) if i % 2 else np.array(3)).astype(np.int8)
        if i % 2 == 0:
            mine["bias"] = rng.standard_normal(n).astype(np.float32)
        names = [f"a{i}"] + [f"{key}{i}" if key in mine else "" for key in ("b", "bs", "bz", "bias")]
        while not names[-1]:
            names.pop()
        inits += [numpy_helper.from_array(value, f"{key}{i}") for key, value in mine.items()]
        nodes.append(helper.make_node("DynamicQuantizeMatMul", names, [f"y{i}"], domain="com.microsoft"))
        inputs.append(helper.make_tensor_value_info(f"a{i}", 1, shape))
        outputs.append(helper.make_tensor_value_info(f"y{i}", 1, None))
        by_output[f"y{i}"] = mine
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]), path)
    return by_output


def _feeds(rng):
    feeds = {}
    for i, (shape, _) in enumerate(SHAPES):
        a = (rng.standard_normal(shape) * 3.0).astype(np.float32)
        if i % 4 == 1:  # only the range's ends: every byte 0 or 255
            a = np.where(a < 0, a.min(), a.max()).astype(np.float32)
        feeds[f"a{i}"] = a
    return feeds


RUN_SCRIPT = """
import sys, numpy as np, nncc
feeds = dict(np.load(sys.argv[2]))
np.savez(sys.argv[3], **nncc.compile_model(sys.argv[1]).run(feeds))
"""


def runs_with_tiles_on_and_off(path, feeds: dict, tmp_path) -> dict[str, dict]:
    """The model's outputs on ``feeds`` from two processes sharing one cache (one build),
    labelled "tiles" (NNCC_AMX=1) and "off" (NNCC_AMX=0, decided at run time)."""
    np.savez(tmp_path / "feeds.npz", **feeds)
    runs = {}
    for label, flag in (("tiles", "1"), ("off", "0")):
        env = dict(os.environ, PYTHONPATH=ROOT, NNCC_AMX=flag, NNCC_CACHE_DIR=str(tmp_path / "cache"))
        done = subprocess.run([sys.executable, "-c", RUN_SCRIPT, str(path), str(tmp_path / "feeds.npz"),
                               str(tmp_path / f"{label}.npz")], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        runs[label] = dict(np.load(tmp_path / f"{label}.npz"))
    return runs


def test_tiles_give_the_exact_result_and_the_vpdpbusd_bits(tmp_path, monkeypatch):
    rng = np.random.default_rng(11)
    path = tmp_path / "q.onnx"
    inits = _model(rng, path)
    feeds = _feeds(rng)
    runs = runs_with_tiles_on_and_off(path, feeds, tmp_path)
    # compiled without the tiles' padding or product: the vpdpbusd GEMM alone
    monkeypatch.setattr(int8_gemm_amx_gen, "wanted", lambda vl, m: False)
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path / "plain-cache"))
    runs["plain"] = nncc.compile_model(path).run(feeds)
    for i, (shape, n) in enumerate(SHAPES):
        name = f"y{i}"
        exact = _exact(feeds[f"a{i}"], inits[name])
        for label, got in runs.items():
            np.testing.assert_array_equal(got[name], exact, err_msg=f"{label}: A {shape}, N {n}")
