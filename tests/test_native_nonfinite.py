"""Native code fed NaN and ±inf: every elementwise helper (exp, sigmoid, tanh, erf, GELU),
the activations fused into products and convolutions, and the row-wise softmaxes give what
onnxruntime gives, NaN where it gives NaN, and do so without undefined behaviour: the same
model runs once as plain code and once built in the sanitize mode, where converting a NaN
to an integer or shifting a negative value ends the process.

Each op reads its own input of random values with NaN, +inf and -inf planted in it; every
output must come from native code (a numpy fallback would prove nothing about the C)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

from nncc.native.toolchain import find_toolchain
from tests.conftest import ROOT
from tests.oracle import ort_outputs
from tests.test_native_sanitize import have_sanitizer_runtime, sanitized_env

pytestmark = pytest.mark.skipif(find_toolchain(sanitize=False) is None,
                                reason="no C compiler: there is no native code to feed")

SPECIALS = np.array([np.nan, np.inf, -np.inf], np.float32)
UNARY = ["Sigmoid", "Tanh", "Erf", "Exp", "Relu", "Log", "Sqrt", "Abs", "Neg", "Reciprocal", "Softsign",
         "LeakyRelu", "HardSigmoid", "HardSwish", "Clip"]


def _with_specials(rng, shape) -> np.ndarray:
    """Random values, with every special value at least once and a few more at random places."""
    x = (rng.standard_normal(shape) * 4).astype(np.float32).reshape(-1)
    at = rng.permutation(x.size)
    x[at[:3]] = SPECIALS
    x[at[3:6]] = SPECIALS[rng.integers(0, 3, 3)]
    return x.reshape(shape)


def _model(rng) -> tuple[onnx.ModelProto, dict]:
    nodes, inputs, outputs, inits, feeds = [], [], [], [], {}

    def feed(name, shape, values=None):
        feeds[name] = _with_specials(rng, shape) if values is None else values
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    for op in UNARY:  # a 1x16 row of each: the size the sanitized Sigmoid stopped at
        ins = [feed(f"{op}_x", (1, 16))]
        if op == "Clip":
            ins += [const("lo", -0.5), const("hi", 0.5)]
        nodes.append(helper.make_node(op, ins, [f"{op}_y"]))
        outputs.append(f"{op}_y")
    # rows: one all finite, one with -inf (a masked key: still defined), one with +inf, one with NaN
    rows = (rng.standard_normal((4, 16)) * 4).astype(np.float32)
    rows[1, 3], rows[2, 7], rows[3, 11] = -np.inf, np.inf, np.nan
    for op in ("Softmax", "LogSoftmax"):
        nodes.append(helper.make_node(op, [feed(f"{op}_x", (4, 16), rows.copy())], [f"{op}_y"], axis=-1))
        outputs.append(f"{op}_y")
    # GELU spelled out (erf form), which -O2 makes one native Gelu step
    s = feed("gelu_x", (2, 16))
    nodes += [helper.make_node("Div", [s, const("r2", np.sqrt(2.0))], ["gelu_d"]),
              helper.make_node("Erf", ["gelu_d"], ["gelu_e"]),
              helper.make_node("Add", ["gelu_e", const("one", 1.0)], ["gelu_g"]),
              helper.make_node("Mul", [s, const("half", 0.5)], ["gelu_h"]),
              helper.make_node("Mul", ["gelu_h", "gelu_g"], ["gelu_y"])]
    outputs.append("gelu_y")
    # products and a convolution with their activations fused in (-O2): a NaN or inf in A
    # reaches the epilogue
    for act in ("Relu", "Sigmoid", "Tanh", "Clip"):
        a = feed(f"mm_{act}_a", (3, 8))
        w = const(f"mm_{act}_w", rng.standard_normal((8, 16)))
        nodes.append(helper.make_node("MatMul", [a, w], [f"mm_{act}_p"]))
        nodes.append(helper.make_node("Add", [f"mm_{act}_p", const(f"mm_{act}_b", rng.standard_normal(16))],
                                      [f"mm_{act}_s"]))
        extra = [const(f"mm_{act}_lo", -1.0), const(f"mm_{act}_hi", 1.0)] if act == "Clip" else []
        nodes.append(helper.make_node(act, [f"mm_{act}_s", *extra], [f"mm_{act}_y"]))
        outputs.append(f"mm_{act}_y")
    x = feed("conv_x", (1, 3, 6, 6))
    nodes += [helper.make_node("Conv", [x, const("conv_w", rng.standard_normal((8, 3, 3, 3))),
                                        const("conv_b", rng.standard_normal(8))], ["conv_c"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["conv_c"], ["conv_y"])]
    outputs.append("conv_y")
    graph = helper.make_graph(nodes, "nonfinite", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, feeds


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import nncc
    from tests.native_fuzz_cases import native_outputs

    model = nncc.compile_model(sys.argv[1], opt_level=2)
    with np.load(sys.argv[2]) as saved:
        feeds = {name: saved[name] for name in saved.files}
    got = model.run(feeds)
    np.savez(sys.argv[3], **got, __native__=np.array(sorted(native_outputs(model))))
""")


def _run(tmp_path, env) -> tuple[dict, set, dict]:
    model, feeds = _model(np.random.default_rng(20261128))
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "feeds.npz", **feeds)
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "m.onnx"), str(tmp_path / "feeds.npz"),
                           str(tmp_path / "out.npz")], env=env, cwd=str(ROOT), capture_output=True, text=True)
    report = [line for line in done.stderr.splitlines() if "runtime error" in line or "ERROR" in line]
    assert done.returncode == 0, "\n".join(report) or done.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as saved:
        got = {name: saved[name] for name in saved.files if name != "__native__"}
        native = set(saved["__native__"].tolist())
    return got, native, _onnxruntime(model, feeds)


def _onnxruntime(model, feeds) -> dict:
    return ort_outputs(model, feeds)


def _judge(got, native, want) -> None:
    assert set(want) <= native, f"not computed by native code: {sorted(set(want) - native)}"
    wrong = []
    for name, expected in want.items():
        try:  # NaN where onnxruntime has NaN, infinities exactly, the rest to float32 rounding
            np.testing.assert_allclose(got[name], expected, rtol=2e-5, atol=2e-5, equal_nan=True)
        except AssertionError as exc:
            wrong.append(f"{name}: {str(exc).strip()}")
    assert not wrong, "\n\n".join(wrong)


@pytest.mark.slow
def test_plain_native_code_agrees_with_onnxruntime_on_nan_and_inf(tmp_path):
    env = {k: v for k, v in sanitized_env().items() if k not in ("LD_PRELOAD", "NNCC_NATIVE_SANITIZE")}
    _judge(*_run(tmp_path, env))


@pytest.mark.slow  # a sanitized build; the fuzzer's sanitized run (also slow) feeds NaN and inf too
@pytest.mark.skipif(not have_sanitizer_runtime(), reason="the C compiler has no ASan/UBSan runtime to preload")
def test_sanitized_native_code_is_defined_on_nan_and_inf(tmp_path):
    _judge(*_run(tmp_path, sanitized_env()))
