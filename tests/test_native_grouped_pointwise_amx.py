"""Grouped 1x1 convolutions over NCHW on AMX tiles (``precision="bf16"``,
nncc/native/grouped_pointwise_amx.py): within the bfloat16 bound of a float64 convolution,
reported as bfloat16 layers, kept float32 where precision auto keeps them, and, with the
tiles refused (NNCC_AMX=0), the float32 register tiles' very sums.

The bound, per output, for both operands rounded to 8 significant bits and float32 sums of
the group's CG channels, a bias and a rounding, plus tdpbf16ps's denormal term (denormal
inputs read as zero): tests/test_native_bf16_conv.check_amx_bound.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nncc
from nncc.native.precision import arithmetic
from nncc.native.toolchain import find_toolchain
from nncc.preparing.calibration import low_layers
from tests.native_fuzz_cases import conv_terms
from tests.test_native_bf16_conv import activated, conv64

needs_amx = pytest.mark.skipif(find_toolchain() is None or arithmetic("bf16", "native") != "bf16amx",
                               reason="no C compiler, or this CPU lacks amx_tile or amx_bf16 (grouped 1x1 "
                                      "convolutions then stay float32, as tests/test_native_grouped_conv.py checks)")

# (N, CG, KG, group, H, W, bias, activation, residual, tiny): ShuffleNet's three stages (34,
# 68 and 136 channels a group, its residual Sum), an odd group under one 32-channel step with
# rows under a tile and pixels between tiles, a plane of one pixel, a batch of two, and
# inputs near float32's smallest normal
GROUPED = [(1, 34, 34, 4, 28, 28, True, "", True, False), (1, 68, 68, 4, 14, 14, True, "Relu", False, False),
           (1, 136, 136, 4, 7, 7, False, "Relu", True, False), (2, 17, 5, 3, 3, 11, True, "", False, False),
           (1, 33, 40, 2, 1, 1, False, "", False, False), (2, 20, 24, 4, 5, 7, True, "Relu", True, True)]


def grouped_model(tmp_path):
    rng = np.random.default_rng(13)
    nodes, inits, inputs, outputs, cases, feeds = [], [], [], [], {}, {}
    for i, (n, cg, kg, g, h, w, bias, act, res, tiny) in enumerate(GROUPED):
        c, k = cg * g, kg * g
        x = rng.standard_normal((n, c, h, w)).astype(np.float32) * np.float32(2.0**-124 if tiny else 1)
        wt = (rng.standard_normal((k, cg, 1, 1)) / np.sqrt(cg)).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32) if bias else np.zeros(k, np.float32)
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(x.shape)))
        feeds[f"x{i}"] = x
        inits.append(numpy_helper.from_array(wt, f"w{i}"))
        ins = [f"x{i}", f"w{i}"]
        if bias:
            inits.append(numpy_helper.from_array(b, f"b{i}"))
            ins.append(f"b{i}")
        attrs = dict(kernel_shape=[1, 1], strides=[1, 1], pads=[0] * 4, dilations=[1, 1], group=g)
        nodes.append(helper.make_node("Conv", ins, [f"y{i}"], **attrs))
        out, skip = f"y{i}", None
        if res:  # ShuffleNet's residual: a Sum of two, written by the convolution's store
            skip = rng.standard_normal((n, k, h, w)).astype(np.float32)
            inputs.append(helper.make_tensor_value_info(f"s{i}", TensorProto.FLOAT, list(skip.shape)))
            feeds[f"s{i}"] = skip
            nodes.append(helper.make_node("Sum", [out, f"s{i}"], [f"r{i}"]))
            out = f"r{i}"
        if act:
            nodes.append(helper.make_node(act, [out], [f"a{i}"]))
            out = f"a{i}"
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
        cases[out] = (x, wt, b, attrs, act, skip)
    model = helper.make_model(helper.make_graph(nodes, "grouped", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "grouped.onnx")
    onnx.save(model, path)
    return path, cases, feeds


def check_bound(got: dict, cases: dict) -> None:
    """Each output within the bfloat16 bound of the float64 convolution (plus its residual),
    with the denormal term of tdpbf16ps (denormal inputs read as zero, denormal sums
    flushed): tests/test_native_bf16_conv.check_amx_bound's, the residual one more float32
    term of the sum (Relu after it is monotone and 1-Lipschitz, so it keeps the bound)."""
    for name, (x, w, b, attrs, act, skip) in cases.items():
        skip = np.zeros(1) if skip is None else skip.astype(np.float64)
        taps = w.shape[1]
        terms = conv_terms(x, w, attrs)
        want = activated(conv64(x, w, b, attrs) + skip, act)
        xsum = conv_terms(x, np.ones_like(w), attrs)
        wsum = np.abs(w.astype(np.float64)).reshape(w.shape[0], -1).sum(1)[None, :, None, None]
        denormal = 2.0**-126 * ((xsum + wsum) * (1 + 2.0**-8) + taps + 3)
        limit = (2 * 2.0**-8 + 2.0**-16 + (taps + 3) * 2.0**-24) * (terms + np.abs(skip)) + denormal \
            + 2.0**-22 * np.abs(want)
        err = np.abs(got[name].astype(np.float64) - want)
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}"


@pytest.mark.slow
@needs_amx
def test_grouped_pointwise_on_tiles_is_within_the_bound_of_float64(tmp_path):
    path, cases, feeds = grouped_model(tmp_path)
    compiled = nncc.compile_model(path, precision="bf16")
    assert sorted(low_layers(compiled.plan)) == sorted(f"w{i}" for i in range(len(GROUPED)))
    got = compiled.run(feeds)
    check_bound(got, cases)
    # only the layers whose sums a bias or a tiny input do not swamp tell bfloat16 from float32
    assert not any(np.allclose(got[name], activated(conv64(x, w, b, attrs) + (0 if s is None else s), act),
                               rtol=2.0**-20, atol=2.0**-140)
                   for name, (x, w, b, attrs, act, s) in cases.items() if np.abs(x).max() > 2.0**-100), \
        "a grouped convolution was computed in float32"


RUN_SCRIPT = """
import sys, numpy as np, nncc
feeds = dict(np.load(sys.argv[2]))
np.savez(sys.argv[3], **nncc.compile_model(sys.argv[1], precision=sys.argv[4]).run(feeds))
"""


def _run(path, feeds_path, out, precision, amx_flag, cache) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, NNCC_AMX=amx_flag, NNCC_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", RUN_SCRIPT, path, str(feeds_path), str(out), precision],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return dict(np.load(out))


@pytest.mark.slow
@needs_amx
def test_tiles_refused_run_the_float32_register_tiles(tmp_path):
    """NNCC_AMX=0 (what the runtime also does when Linux refuses the tiles): the step takes
    grouped_pointwise.py's float32 kernel, which precision f32 also builds for groups of up
    to conv_gen.GROUPED_POINTWISE_CHANNELS channels: the same bits there."""
    from nncc.native.conv_gen import GROUPED_POINTWISE_CHANNELS

    path, cases, feeds = grouped_model(tmp_path)
    np.savez(tmp_path / "feeds.npz", **feeds)
    off = _run(path, tmp_path / "feeds.npz", tmp_path / "off.npz", "bf16", "0", tmp_path / "cache")
    f32 = _run(path, tmp_path / "feeds.npz", tmp_path / "f32.npz", "f32", "1", tmp_path / "cache")
    check_bound(off, cases)
    same = [name for name, (x, w, *_rest) in cases.items() if w.shape[1] <= GROUPED_POINTWISE_CHANNELS]
    assert len(same) >= 4
    for name in same:
        np.testing.assert_array_equal(off[name], f32[name], err_msg=f"{name}: NNCC_AMX=0 did not run float32")


@pytest.mark.slow
@needs_amx
def test_kept_layers_stay_float32(tmp_path):
    path, cases, feeds = grouped_model(tmp_path)
    kept = nncc.compile_model(path, precision="bf16", keep_f32=("w0", "w2"))
    assert sorted(low_layers(kept.plan)) == sorted(f"w{i}" for i in range(len(GROUPED)) if i not in (0, 2))
    f32 = nncc.compile_model(path, precision="f32").run(feeds)
    got = kept.run(feeds)
    names = list(cases)
    for i in (0, 2):
        np.testing.assert_array_equal(got[names[i]], f32[names[i]])
