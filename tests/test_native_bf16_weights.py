"""bfloat16 weights widened to float32 (``precision="bf16"`` on a target without AVX-512
BF16, nncc/native/gemm_bf16_gen.py's BF16W): results within the bound the weights' rounding
gives against onnxruntime's float32, and equal (up to float32 sums) to the product of the
float32 input by the weights rounded to bfloat16 by ml_dtypes, an independent rounding; half
the packed bytes of float32; the arithmetic's place in the cache token; and float32 with one
warning where no native code can be built.

The bound, per output element, for weights rounded to 8 significant bits (each off by at
most 2^-8 of itself) multiplied exactly in float32 and summed in float32 over K + 2 terms
(bias, Gemm's C): ``(2^-8 + (K + 2) * 2^-24 * (1 + 2^-8)) * sum_k |a_ik b_kj|``. The
activations used here change by no more than their input does.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nncc
from nncc.backends.native import NativeBackend
from nncc.compiler import CompileOptions
from nncc.native.isa import vector_floats
from nncc.native.precision import WIDENED_ROWS_MAX
from nncc.native.toolchain import find_toolchain, missing_features, required_features
from nncc.preparing.token import token_context
from tests.test_native_bf16 import PRODUCTS, Model, products_model

NO_COMPILER = find_toolchain() is None


def targets(slow: tuple[str, ...] = ()) -> list:
    """The targets without AVX-512 BF16 at each vector width: each runs where this CPU has its
    features; those in ``slow`` are left to the full run."""
    return [pytest.param(t, marks=[pytest.mark.skipif(NO_COMPILER or bool(missing_features(required_features(t))),
                                                      reason=f"no C compiler, or this CPU cannot run {t} code"),
                                   *([pytest.mark.slow] if t in slow else [])])
            for t in ("x86-64-v4", "x86-64-v3", "x86-64-v2")]


def bound(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """The module docstring's bound for ``a @ b`` (batch dims broadcast)."""
    terms = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return (2.0**-8 + (k + 2) * 2.0**-24 * (1 + 2.0**-8)) * terms


def rounded_product(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w`` in float64 with only ``w`` rounded to bfloat16, by ml_dtypes."""
    return a.astype(np.float64) @ w.astype(ml_dtypes.bfloat16).astype(np.float64)


ACTS = {"": lambda x: x, "Relu": lambda x: np.maximum(x, 0), "Tanh": np.tanh, "Sigmoid": lambda x: 1 / (1 + np.exp(-x))}


# x86-64-v2 slow: the bound is checked quickly at the wider targets, and v2's four-float
# widening stays quick in the Gemm forms' test below
@pytest.mark.slow
@pytest.mark.parametrize("target", targets(slow=("x86-64-v2",)))
def test_bf16_weights_are_within_the_bound_and_round_like_ml_dtypes(tmp_path, target):
    b, path, cases, want = products_model(tmp_path, 11)
    compiled = nncc.compile_model(path, precision="bf16", target=target)
    assert compiled.native_partitions == len(compiled.plan.partitions), "a partition stayed portable"
    vl = vector_floats(target)
    packed = {s.name: s for s in compiled.plan.slots if "#gemm" in s.name}
    # more rows than the widening pays for keep float32 weights (test_native_bf16_widening.py)
    widened = {f"w{i}": np.prod(batch) * m <= WIDENED_ROWS_MAX for i, (batch, m, *_) in enumerate(PRODUCTS)}
    assert len(packed) == len(PRODUCTS), list(packed)
    assert all(name.endswith(f"#gemm{vl}bf16w" if widened[name.split("#")[0]] else f"#gemm{vl}") for name in packed)
    got = compiled.run(b.feeds)
    exact_f32 = 0
    for i, (name, (a, w, c, k, act)) in enumerate(cases.items()):
        err = np.abs(got[name].astype(np.float64) - want[name])
        limit = bound(a, w, k) + 2.0**-22 * np.abs(want[name]) + 1e-30
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}, bound {limit[err > limit].min():.3g}"
        if not widened[f"w{i}"]:
            continue
        rounded = ACTS[act](rounded_product(a, w) + c)
        sums = (k + 2) * 2.0**-24 * np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64)) \
            + 2.0**-21 * np.abs(rounded) + 1e-30
        off = np.abs(got[name] - rounded)
        assert (off <= sums).all(), f"{name}: {off.max():.3g} from the product by bfloat16-rounded weights"
        exact_f32 += int(np.array_equal(got[name], want[name]))
    # float32 weights would pass the first bound too: they must not pass for the rounding
    assert exact_f32 <= 2, "the weights were not rounded to bfloat16"


def _packed_bytes(compiled) -> int:
    return sum(int(np.prod(s.shape)) * 4 for s in compiled.plan.slots if "#gemm" in s.name)


@pytest.mark.slow
@pytest.mark.parametrize("target", targets())
def test_bf16_weights_gemm_reads_transposed_operands_folds_alpha_and_c_in_half_the_bytes(tmp_path, target):
    b = Model(12)
    forms = [(0, 0, 1.0, 37, 301, 45), (1, 0, 0.5, 120, 77, 129), (0, 1, -1.25, 9, 1030, 63), (1, 1, 2.0, 6, 64, 64),
             (0, 0, 1.0, 1, 512, 100), (0, 1, 1.0, 2, 33, 7)]
    cases = {}
    for i, (ta, tb, alpha, m, k, n) in enumerate(forms):
        a = b.input(f"a{i}", (k, m) if ta else (m, k))
        w = b.const(f"w{i}", (n, k) if tb else (k, n), 1 / np.sqrt(k))
        c = b.const(f"c{i}", (n,))
        b.output(b.op("Gemm", [f"a{i}", f"w{i}", f"c{i}"], f"y{i}", transA=ta, transB=tb, alpha=alpha))
        cases[f"y{i}"] = (a.T if ta else a, w.T if tb else w, alpha, c, k)
    path = b.save(tmp_path / "g.onnx")
    want = b.reference(path)
    compiled = nncc.compile_model(path, precision="bf16", target=target)
    plain = nncc.compile_model(path, target=target)
    assert compiled.native_partitions == len(compiled.plan.partitions)
    assert _packed_bytes(compiled) * 2 == _packed_bytes(plain)
    got = compiled.run(b.feeds)
    for name, (a, w, alpha, c, k) in cases.items():
        err = np.abs(got[name].astype(np.float64) - want[name])
        limit = abs(alpha) * bound(a, w, k) + 2.0**-22 * np.abs(want[name])
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}"
        scaled = (w.astype(np.float64) * np.float32(alpha)).astype(np.float32)  # alpha is folded before rounding
        rounded = rounded_product(a, scaled) + c
        sums = (k + 2) * 2.0**-24 * abs(alpha) * np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64)) \
            + 2.0**-22 * np.abs(rounded)
        assert (np.abs(got[name] - rounded) <= sums).all(), name
        assert not np.array_equal(got[name], want[name]), f"{name}: float32's result, not bfloat16's"


def test_the_weights_arithmetic_has_its_own_token():
    """No x86-64 level includes AVX-512 BF16, so each computes bf16 as bfloat16 weights, and
    the backend's facts say so: a CPU with it (vdpbf16ps, another arithmetic) names "bf16"."""
    native = NativeBackend()
    f32, v3, v4 = (CompileOptions.from_keywords({"precision": p, "target": t}) for p, t in
                   (("f32", "x86-64-v3"), ("bf16", "x86-64-v3"), ("bf16", "x86-64-v4")))
    assert "arithmetic" not in native.compile_facts(f32)
    assert native.compile_facts(v3)["arithmetic"] == native.compile_facts(v4)["arithmetic"] == "bf16w"
    assert len({token_context(o) for o in (f32, v3, v4)}) == 3


def test_without_a_compiler_bf16_is_float32_and_said_once(tmp_path, capfd):
    b = Model(13)
    b.input("x", (9, 33))
    b.const("w", (33, 17))
    b.output(b.op("MatMul", ["x", "w"], "y"))
    path = b.save(tmp_path / "m.onnx")
    capfd.readouterr()
    asked = [nncc.compile_model(path, precision="bf16", cc="") for _ in range(2)]
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["nncc: warning: precision bf16 ignored: no C compiler, so no native code; the portable "
                        "plan computes in float32"]
    assert asked[0].native_partitions == 0
    np.testing.assert_allclose(asked[0].run(b.feeds)["y"], b.reference(path)["y"], rtol=1e-5, atol=1e-5)
