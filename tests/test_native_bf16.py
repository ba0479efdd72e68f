"""The bfloat16 precision of products by constant weights (``precision="bf16"``,
nncc/native/gemm_bf16_gen.py): results within the error bound bfloat16 rounding gives
against onnxruntime's float32, and equal (up to float32 sums) to the product of the inputs
rounded to bfloat16 by ml_dtypes, an independent rounding; the option's place in the cache
token; and bad values. Where the target lacks AVX-512 BF16 the weights alone are bfloat16
(tests/test_native_bf16_weights.py).

The bound, per output element, for inputs rounded to 8 significant bits (each off by at
most 2^-8 of itself, so each product by at most 2 * 2^-8 + 2^-16 of |a b|) and float32
sums of K + 2 terms (bias, Gemm's C): ``(2 * 2^-8 + 2^-16 + (K + 2) * 2^-24) * sum_k |a_ik
b_kj|``, plus a denormal term: A's conversion, vdpbf16ps and AMX's tdpbf16ps read a
denormal as zero and flush a denormal result, so ``2^-126 * ((sum_k |a_ik| + sum_k |b_kj|)
* (1 + 2^-8) + K + 2)``. The activations used here change by no more than their input does.
Where the CPU has AMX the products run on its tiles (nncc/native/gemm_amx_gen.py), and
``NNCC_AMX=0`` makes the same code take its vdpbf16ps path.
"""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.compiler import CompileOptions, OptionError
from nncc.native.precision import arithmetic, why_not_bf16
from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_COMPILER = find_toolchain() is None
needs_amx = pytest.mark.skipif(NO_COMPILER or arithmetic("bf16", "native") != "bf16amx",
                               reason="no C compiler, or this CPU lacks amx_tile or amx_bf16 (bf16 then multiplies "
                                      "with vdpbf16ps, which the other tests here check)")
needs_bf16 = pytest.mark.skipif(NO_COMPILER or why_not_bf16("native") is not None,
                                reason="no C compiler, or this CPU lacks avx512_bf16 (a bf16 compile then keeps "
                                       "bfloat16 weights, which test_native_bf16_weights.py checks)")


def bound(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """The module docstring's bound for ``a @ b`` (batch dims broadcast)."""
    terms = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return (2 * 2.0**-8 + 2.0**-16 + (k + 2) * 2.0**-24) * terms


def denormal_term(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """The module docstring's denormal term: each input read as zero when denormal (at most
    2^-126 off), each of the K + 2 sums flushed when denormal."""
    a64, b64 = np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64))
    return 2.0**-126 * ((a64.sum(-1, keepdims=True) + b64.sum(-2, keepdims=True)) * (1 + 2.0**-8) + k + 2)


class Model:
    """Independent products side by side in one model: one compile builds every kernel."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.feeds, self.consts, self.slack = {}, {}, {}

    def input(self, name, shape):
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.feeds[name] = self.rng.standard_normal(shape).astype(np.float32)
        return self.feeds[name]

    def const(self, name, shape, scale=1.0):
        value = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        self.consts[name] = value
        return value

    def op(self, op, inputs, out, **attrs):
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def output(self, name):
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))

    def save(self, path) -> str:
        graph = helper.make_graph(self.nodes, "bf16", self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        onnx.save(model, str(path))
        return str(path)

    def reference(self, path) -> dict:
        session = ort_session(path)
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, self.feeds)))


# (batch of A, M, K, N, bias, activation): M from 1 to 200 (one row, two, below, at and
# above the 6-row tile), odd K and N (K padded to a pair, N to a vector and a panel), K
# long enough to be cut into blocks, batch dims folded into M
PRODUCTS = [
    ((), 1, 1, 1, False, ""), ((), 1, 511, 65, True, "Relu"), ((), 2, 33, 17, True, "Tanh"),
    ((), 3, 7, 129, False, "Sigmoid"), ((), 5, 1, 63, True, ""), ((), 6, 97, 64, True, "Relu"),
    ((), 7, 2049, 31, True, ""), ((), 13, 65, 191, False, "Tanh"), ((), 64, 255, 257, True, "Relu"),
    ((), 97, 1025, 67, True, "Sigmoid"), ((), 200, 129, 77, True, ""), ((), 128, 3, 1, False, ""),
    ((2, 3), 5, 17, 33, True, "Relu"), ((3,), 67, 301, 65, False, ""),
]


def products_model(tmp_path, seed: int):
    """A model of every product of PRODUCTS (MatMul by constant weights, a bias, an
    activation), saved: (its Model, path, output -> (input, weights, bias, K, activation),
    onnxruntime's outputs)."""
    b = Model(seed)
    cases = {}
    for i, (batch, m, k, n, bias, act) in enumerate(PRODUCTS):
        a = b.input(f"x{i}", (*batch, m, k))
        w = b.const(f"w{i}", (k, n), 1 / np.sqrt(k))
        y = b.op("MatMul", [f"x{i}", f"w{i}"], f"p{i}")
        c = b.const(f"b{i}", (n,)) if bias else np.zeros(n, np.float32)
        if bias:
            y = b.op("Add", [y, f"b{i}"], f"z{i}")
        if act:
            y = b.op(act, [y], f"a{i}")
        b.output(y)
        cases[y] = (a, w, c, k, act)
    path = b.save(tmp_path / "m.onnx")
    want = b.reference(path)
    return b, path, cases, want


@needs_bf16
def test_bf16_products_are_within_the_bound_of_onnxruntime_and_round_like_ml_dtypes(tmp_path):
    b, path, cases, want = products_model(tmp_path, 1)
    compiled = nncc.compile_model(path, precision="bf16")
    assert compiled.native_partitions == len(compiled.plan.partitions), "a partition stayed portable"
    packed = [s.name for s in compiled.plan.slots if "#gemm" in s.name]
    layout = "#gemm16bf16amx" if arithmetic("bf16", "native") == "bf16amx" else "#gemm16bf16"  # AMX pads K
    assert len(packed) == len(PRODUCTS) and all(name.endswith(layout) for name in packed), packed
    got = compiled.run(b.feeds)
    exact_f32 = 0
    for name, (a, w, c, k, act) in cases.items():
        err = np.abs(got[name].astype(np.float64) - want[name])
        limit = bound(a, w, k) + 2.0**-22 * np.abs(want[name]) + 1e-30
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}, bound {limit[err > limit].min():.3g}"
        # the independent rounding: both operands to bfloat16 by ml_dtypes, products exact,
        # then only float32 sums (and the activation's own few ulps) separate nncc from it
        rounded = (a.astype(ml_dtypes.bfloat16).astype(np.float64)
                   @ w.astype(ml_dtypes.bfloat16).astype(np.float64)) + c
        rounded = {"": rounded, "Relu": np.maximum(rounded, 0), "Tanh": np.tanh(rounded),
                   "Sigmoid": 1 / (1 + np.exp(-rounded))}[act]
        sums = (k + 2) * 2.0**-24 * np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64)) \
            + 2.0**-21 * np.abs(rounded) + 1e-30
        off = np.abs(got[name] - rounded)
        assert (off <= sums).all(), f"{name}: {off.max():.3g} from the bfloat16-rounded product"
        exact_f32 += int(np.array_equal(got[name], want[name]))
    # float32 arithmetic would pass the first bound too: it must not pass for the rounding
    assert exact_f32 <= 2, "the products were not computed in bfloat16"


@needs_bf16
def test_bf16_gemm_reads_transposed_operands_and_folds_alpha_and_c(tmp_path):
    b = Model(2)
    forms = [(0, 0, 1.0, 37, 301, 45), (1, 0, 0.5, 200, 77, 129), (0, 1, -1.25, 9, 1030, 63), (1, 1, 2.0, 6, 64, 64)]
    cases = {}
    for i, (ta, tb, alpha, m, k, n) in enumerate(forms):
        a = b.input(f"a{i}", (k, m) if ta else (m, k))
        w = b.const(f"w{i}", (n, k) if tb else (k, n), 1 / np.sqrt(k))
        b.const(f"c{i}", (n,))
        b.output(b.op("Gemm", [f"a{i}", f"w{i}", f"c{i}"], f"y{i}", transA=ta, transB=tb, alpha=alpha))
        cases[f"y{i}"] = (a.T if ta else a, w.T if tb else w, abs(alpha), k)
    path = b.save(tmp_path / "g.onnx")
    want = b.reference(path)
    compiled = nncc.compile_model(path, precision="bf16")
    assert compiled.native_partitions == len(compiled.plan.partitions)
    got = compiled.run(b.feeds)
    for name, (a, w, alpha, k) in cases.items():
        err = np.abs(got[name].astype(np.float64) - want[name])
        limit = alpha * bound(a, w, k) + 2.0**-22 * np.abs(want[name])
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}"
        assert not np.array_equal(got[name], want[name]), f"{name}: float32's result, not bfloat16's"


def test_precision_is_in_the_token_only_when_not_float32():
    from nncc.preparing.token import token_context

    default, f32, bf16 = CompileOptions(), CompileOptions(precision="f32"), CompileOptions(precision="bf16")
    assert "precision" not in default.as_dict()  # every float32 token stays what it was
    assert f32.as_dict() == default.as_dict()
    assert bf16.as_dict() == dict(default.as_dict(), precision="bf16", arithmetic=arithmetic("bf16", "native"))
    assert token_context(f32) == token_context(default) != token_context(bf16)


@pytest.mark.slow
def test_an_unknown_precision_is_one_line_and_exit_2(tmp_path):
    with pytest.raises(OptionError, match="unknown precision 'fp8'; choose from f32, bf16"):
        CompileOptions(precision="fp8")
    b = Model(3)
    b.input("x", (2, 3))
    b.const("w", (3, 4))
    b.output(b.op("MatMul", ["x", "w"], "y"))
    path = b.save(tmp_path / "m.onnx")
    env = dict(os.environ, PYTHONPATH=ROOT, NNCC_CACHE_DIR=str(tmp_path / "cache"),
               NNCC_CONFIG_FILE=str(tmp_path / "config.toml"))
    env.pop("NNCC_PRECISION", None)
    cli = [sys.executable, "-m", "nncc", "compile", path, "-o", str(tmp_path / "m.nncc"), "--stage", "quick"]
    for extra, where in ((["--precision", "fp8"], {}), ([], {"NNCC_PRECISION": "fp8"})):
        done = subprocess.run(cli + extra, env=dict(env, **where), capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("nncc: error: ") and "fp8" in lines[0], done.stderr
    # the config file's key is the default of --precision
    (tmp_path / "config.toml").write_text('[native]\nprecision = "bf16"\n')
    done = subprocess.run(cli + ["-v"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "precision=bf16" in done.stderr


# (M, K, N): M at and around the 16-row tile (8, the smallest AMX product, up to 47), K
# around the 32 values of a tile step (padded with zero pairs on both sides), N around the
# 16-column tile and the 64-column panel
AMX_PRODUCTS = [(8, 1, 1), (15, 31, 17), (16, 32, 64), (17, 33, 65), (31, 63, 15), (33, 100, 130),
                (47, 129, 48), (64, 768, 200)]


def amx_model(tmp_path, seed: int):
    """MatMul + bias + Relu per AMX_PRODUCTS shape, A mixing normal values with values near
    and below float32's smallest normal (2^-126): (Model, path, output -> (a, w, c, k))."""
    b = Model(seed)
    cases = {}
    for i, (m, k, n) in enumerate(AMX_PRODUCTS):
        a = b.input(f"x{i}", (m, k))
        a[: m // 2] *= np.float32(2.0**-125)  # the first rows tiny: about a third of them denormal
        w = b.const(f"w{i}", (k, n), 1 / np.sqrt(k))
        c = b.const(f"b{i}", (n,))
        b.op("MatMul", [f"x{i}", f"w{i}"], f"p{i}")
        b.op("Add", [f"p{i}", f"b{i}"], f"z{i}")
        b.output(b.op("Relu", [f"z{i}"], f"y{i}"))
        cases[f"y{i}"] = (a, w, c, k)
    return b, b.save(tmp_path / "amx.onnx"), cases


def check_amx_products(got: dict, cases: dict) -> None:
    """Each output within the bound (denormal term included) of the float64 product, and of
    the product of the inputs rounded by ml_dtypes up to float32 sums: no other rounding."""
    for name, (a, w, c, k) in cases.items():
        exact = np.maximum(a.astype(np.float64) @ w.astype(np.float64) + c, 0)
        limit = bound(a, w, k) + denormal_term(a, w, k) + 2.0**-22 * np.abs(exact)
        err = np.abs(got[name] - exact)
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}, bound {limit[err > limit].min():.3g}"
        rounded = np.maximum(a.astype(ml_dtypes.bfloat16).astype(np.float64)
                             @ w.astype(ml_dtypes.bfloat16).astype(np.float64) + c, 0)
        sums = (k + 2) * 2.0**-24 * np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64)) \
            + denormal_term(a, w, k) + 2.0**-22 * np.abs(rounded)
        off = np.abs(got[name] - rounded)
        assert (off <= sums).all(), f"{name}: {off.max():.3g} from the bfloat16-rounded product"


@needs_amx
def test_amx_products_are_within_the_bound_with_denormals_and_every_tile_remainder(tmp_path):
    b, path, cases = amx_model(tmp_path, 4)
    compiled = nncc.compile_model(path, precision="bf16")
    assert compiled.native_partitions == len(compiled.plan.partitions), "a partition stayed portable"
    assert compiled.plan.options.get("arithmetic") == "bf16amx"
    check_amx_products(compiled.run(b.feeds), cases)


AMX_OFF_SCRIPT = """
import sys, numpy as np, nncc
feeds = dict(np.load(sys.argv[2]))
np.savez(sys.argv[3], **nncc.compile_model(sys.argv[1], precision="bf16").run(feeds))
"""


@pytest.mark.slow
@needs_amx
def test_amx_off_computes_what_vdpbf16ps_computes(tmp_path, monkeypatch):
    """NNCC_AMX=0 (what the runtime also does when Linux refuses the tiles): the AMX code
    takes its vdpbf16ps path, the very sums of code compiled without AMX."""
    b, path, cases = amx_model(tmp_path, 5)
    np.savez(tmp_path / "feeds.npz", **b.feeds)
    env = dict(os.environ, PYTHONPATH=ROOT, NNCC_AMX="0", NNCC_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", AMX_OFF_SCRIPT, path, str(tmp_path / "feeds.npz"),
                           str(tmp_path / "off.npz")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    off = dict(np.load(tmp_path / "off.npz"))
    check_amx_products(off, cases)
    from nncc.native import amx
    monkeypatch.setattr(amx, "usable", lambda target, feature="amx_bf16": False)  # compile for vdpbf16ps alone
    compiled = nncc.compile_model(path, precision="bf16")
    assert compiled.plan.options.get("arithmetic") == "bf16"
    vdp = compiled.run(b.feeds)
    for name in cases:
        np.testing.assert_array_equal(off[name], vdp[name], err_msg=f"{name}: NNCC_AMX=0 did not take vdpbf16ps")
