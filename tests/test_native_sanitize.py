"""The sanitize mode (native.sanitize, NNCC_NATIVE_SANITIZE): native code built with
AddressSanitizer and UBSan, run in a process that preloads their runtimes.

What is checked here: the setting is validated like every other; sanitized code is another
toolchain key (another cache token, other kernel objects); a process without the runtimes
refuses it in one line instead of aborting in dlopen; and a sanitized native step does
catch a read one element past an input (each argument sits in its own exactly-sized heap
block). tests/test_native_fuzz.py runs generated code for many geometries in this mode."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from nncc.native.toolchain import find_toolchain, sanitizer_preload
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(find_toolchain(sanitize=False) is None,
                                reason="no C compiler: there is no native code to sanitize")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return dict(env, PYTHONPATH=str(ROOT), **extra)


def sanitized_env(**extra) -> dict:
    """The environment of a process that may load sanitized code."""
    return _env(NNCC_NATIVE_SANITIZE="1", LD_PRELOAD=sanitizer_preload(), ASAN_OPTIONS="detect_leaks=0", **extra)


def have_sanitizer_runtime() -> bool:
    return all(os.path.isabs(p) for p in sanitizer_preload().split())


def test_a_bad_value_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nncc", "run", str(ROOT / "fixtures" / "mlp.onnx"),
                           "--random-inputs"], env=_env(NNCC_NATIVE_SANITIZE="maybe"),
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == ("nncc: error: bad switch 'maybe' in NNCC_NATIVE_SANITIZE: use 1, yes, on or "
                                   "true, or 0, no, off or false (hint: fix or unset NNCC_NATIVE_SANITIZE)")


def test_sanitized_code_is_another_toolchain_key():
    plain, sanitized = find_toolchain(sanitize=False), find_toolchain(sanitize=True)
    assert plain.key() != sanitized.key()
    assert "-fsanitize=address,undefined" in sanitized.flags and "-O3" in sanitized.flags
    assert "-fsanitize=address,undefined" in sanitized.link_flags
    assert "-fsanitize=address,undefined" not in " ".join(plain.flags + plain.link_flags)
    assert plain.object_key("int x;") != sanitized.object_key("int x;")


def test_the_setting_reaches_the_cache_token(monkeypatch):
    from nncc.preparing.compiling import compile_options  # what every compile and prepare builds

    plain = compile_options({}).as_dict()["toolchain"]
    monkeypatch.setenv("NNCC_NATIVE_SANITIZE", "on")
    assert compile_options({}).as_dict()["toolchain"] != plain


def _conv_model(path) -> str:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.slow  # a sanitized build
def test_without_the_runtime_it_is_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nncc", "compile", _conv_model(tmp_path / "m.onnx"),
                           "-o", str(tmp_path / "m.nncc"), "--cache-dir", str(tmp_path / "cache")],
                          env=_env(NNCC_NATIVE_SANITIZE="1"), capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("nncc: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert "sanitize mode" in errors[0] and "LD_PRELOAD=" in errors[0] and "detect_leaks=0" in errors[0]


PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    from nncc.native.codegen import prelude
    from nncc.native.loader import Library
    from nncc.native.toolchain import find_toolchain
    from nncc.backends.native import NativeCall
    from nncc.backends.native_step import NativeStep

    toolchain = find_toolchain(sanitize=True)
    source = prelude() + '''
    NN_EXPORT int probe(void **args, char *ws) {
        const float *x = args[0]; float *y = args[1];
        y[0] = 0.0f;
        for (int i = 0; i < LAST; i++) y[0] += x[i];
        return 0;
    }'''
    x = np.ones(8, np.float32)
    for last in (8, 9):  # the whole input, then one element past it
        lib = Library(toolchain.link([toolchain.compile_object(source.replace("LAST", str(last)))]))
        step = NativeStep(lib.function("probe"), NativeCall(0, "probe", [0, 1], 1, 0), "probe", sanitized=True)
        y = np.zeros(1, np.float32)
        step(None, x, out=[y])
        print("sum", last, float(y[0]), flush=True)
""")


@pytest.mark.slow  # built with sanitizers
@pytest.mark.skipif(not have_sanitizer_runtime(), reason="the compiler has no ASan/UBSan runtime to preload")
def test_a_sanitized_step_catches_a_read_past_its_input():
    done = subprocess.run([sys.executable, "-c", PROBE], env=sanitized_env(), capture_output=True, text=True)
    assert "sum 8 8.0" in done.stdout, done.stderr  # in bounds: runs, and right
    assert "sum 9" not in done.stdout
    assert done.returncode != 0
    assert "heap-buffer-overflow" in done.stderr and "0 bytes to the right of 32-byte region" in done.stderr
