"""Native code that is off says why, once: no C compiler ($CC naming none, or none on
PATH) or a CPU without the ISA the target needs. `nncc inspect` (and --json) and `nncc
cache info` (and --json) show the reason; `nncc run` and `nncc compile` say it at -v, and
warn without -v when $CC names a compiler that is not there (the user's own choice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

from nncc.native.toolchain import TARGETS, find_toolchain, missing_features, required_features
from tests.conftest import ROOT

NO_CC = "no C compiler: $CC is '/nonexistent/cc', which is not an executable file"
NOT_ON_PATH = "no C compiler: none of cc, gcc or clang is on PATH (set $CC to one)"


@pytest.fixture
def model(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                              "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 6])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return str(path)


def nncc(*args, cc=None, path=None, cache):
    """`nncc ARGS` in a process of its own, with $CC (None: unset) and $PATH as given."""
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    env.update(PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(cache), COLUMNS="300")  # no wrapped lines
    if cc is not None:
        env["CC"] = cc
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], env=env, capture_output=True, text=True)


def _lines(text, needle):
    return [line for line in text.splitlines() if needle in line]


def test_a_missing_cc_warns_once_even_without_v(model, tmp_path):
    done = nncc("run", model, "--random-inputs", cc="/nonexistent/cc", cache=tmp_path / "c")
    assert done.returncode == 0, done.stderr
    assert _lines(done.stderr, "native code is off") == [
        f"nncc: warning: native code is off: {NO_CC} (unset CC to use cc, gcc or clang)"]


@pytest.mark.slow
def test_no_compiler_on_path_is_said_at_v_only(model, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    quiet = nncc("run", model, "--random-inputs", path=empty, cache=tmp_path / "c")
    assert quiet.returncode == 0, quiet.stderr
    assert "native" not in quiet.stderr
    for command in (["run", model, "--random-inputs"], ["compile", model, "-o", tmp_path / "m.nncc"]):
        done = nncc(*command, "-v", path=empty, cache=tmp_path / "c")
        assert done.returncode == 0, done.stderr
        assert _lines(done.stderr, "native code is off") == [f"nncc: native code is off: {NOT_ON_PATH}"]


@pytest.mark.slow  # a native compile in a process; the cache info and -v forms stay quick
def test_inspect_says_why(model, tmp_path):
    text = nncc("inspect", model, cc="/nonexistent/cc", cache=tmp_path / "c")
    assert text.returncode == 0, text.stderr
    assert [line.split("── ", 1)[1] for line in _lines(text.stdout, "native code")] == [
        f"native code: off here ({NO_CC})"]
    report = json.loads(nncc("inspect", model, "--json", cc="/nonexistent/cc", cache=tmp_path / "c").stdout)
    assert report["native_off"] == NO_CC
    assert all(p["backend"] == "numpy" for p in report["partitions"])


@pytest.mark.slow
def test_cache_info_says_why(model, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    for cache in (tmp_path / "none-yet", tmp_path / "c"):
        if cache.name == "c":
            assert nncc("run", model, "--random-inputs", path=empty, cache=cache).returncode == 0
        text = nncc("cache", "info", path=empty, cache=cache)
        assert _lines(text.stdout, "Native code") == [f"Native code      off: {NOT_ON_PATH}"]
        info = json.loads(nncc("cache", "info", "--json", path=empty, cache=cache).stdout)
        assert info["native_off"] == NOT_ON_PATH


@pytest.mark.slow
@pytest.mark.skipif(find_toolchain(sanitize=False) is None, reason="no C compiler here: native code is off")
def test_nothing_is_said_when_native_code_is_on(model, tmp_path):
    done = nncc("run", model, "--random-inputs", "-v", cache=tmp_path / "c")
    assert done.returncode == 0 and "native code is off" not in done.stderr, done.stderr
    assert json.loads(nncc("inspect", model, "--json", cache=tmp_path / "c").stdout)["native_off"] is None
    assert json.loads(nncc("cache", "info", "--json", cache=tmp_path / "c").stdout)["native_off"] is None
    assert "Native code" not in nncc("cache", "info", cache=tmp_path / "c").stdout


LACKING = [t for t in TARGETS if missing_features(required_features(t))]


@pytest.mark.slow
@pytest.mark.skipif(not LACKING or find_toolchain(sanitize=False) is None,
                    reason="this CPU has every feature of every named target (or there is no compiler)")
def test_a_target_this_cpu_cannot_run_is_said(model, tmp_path):
    target = LACKING[0]
    report = json.loads(nncc("inspect", model, "--json", "--target", target, cache=tmp_path / "c").stdout)
    assert report["native_off"].startswith("this CPU lacks ") and f"--target {target}" in report["native_off"]
