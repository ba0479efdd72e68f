"""nncc's packed GEMM (nncc/native/gemm_gen.py): products by constant weights with their
bias, Gemm's C, activation (GELU included) and residual Add, checked against onnxruntime
at every shape class the generator distinguishes (one row, odd sizes below and above the
register tile and the vector width, K long enough to be blocked, transposes, batches).
Several independent products share one model, so one compile covers a whole table."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.native import gemm_gen
from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler on this machine: the native "
                                "backend selects nothing, which tests/test_native.py covers with CC set")

RTOL, ATOL = 1e-4, 1e-4


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.outputs, self.feeds = [], [], [], [], {}

    def input(self, name, shape):
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.feeds[name] = self.rng.standard_normal(shape).astype(np.float32)
        return name

    def const(self, name, shape, scale=1.0):
        value = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def scalar(self, name, value):
        self.inits.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def op(self, op, inputs, out, **attrs):
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def output(self, name, shape):
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))

    def check(self, tmp_path, opset=17, packed=None):
        """Compile natively, compare every output with onnxruntime; ``packed``: how many
        products the packed GEMM must have generated."""
        graph = helper.make_graph(self.nodes, "t", self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 9
        path = str(tmp_path / "m.onnx")
        onnx.save(model, path)
        want = ort_run(path, self.feeds)
        taken, self.residuals = [], []
        emit_matmul, emit_gemm, residual = gemm_gen.emit_matmul, gemm_gen.emit_gemm, gemm_gen._residual

        def spy(emit):
            def call(w, node):
                done = emit(w, node)
                if done:
                    taken.append(node.name)
                return done
            return call

        def spy_residual(w, node, out):
            found = residual(w, node, out)
            if found is not None:
                self.residuals.append(found[0].outputs[0])
            return found

        try:
            gemm_gen.emit_matmul, gemm_gen.emit_gemm = spy(emit_matmul), spy(emit_gemm)
            gemm_gen._residual = spy_residual
            compiled = nncc.compile_model(path)
        finally:
            gemm_gen.emit_matmul, gemm_gen.emit_gemm, gemm_gen._residual = emit_matmul, emit_gemm, residual
        assert compiled.native_partitions == len(compiled.plan.partitions), "a partition stayed portable"
        if packed is not None:
            assert len(taken) == packed, f"the packed GEMM generated {len(taken)} products, not {packed}"
        got = compiled.run(self.feeds)
        for name, w in zip([o.name for o in self.outputs], want):
            assert got[name].shape == w.shape, name
            np.testing.assert_allclose(got[name], w, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(w).max())),
                                       err_msg=name)
        return compiled


# (M, K, N, activation): one row; sizes below, at and above the AVX-512 tile (6 x 64) and
# each vector width; K long enough to be cut into blocks (with M above the tile)
MATMULS = [
    (1, 7, 5, ""), (1, 300, 65, "Relu"), (1, 1, 1, "Sigmoid"), (2, 33, 17, "Tanh"), (3, 17, 65, "LeakyRelu"),
    (17, 65, 3, "Clip"), (65, 3, 17, "HardSigmoid"), (12, 16, 32, "HardSwish"), (13, 800, 33, "Relu"),
    (130, 40, 100, ""), (25, 1000, 49, "Tanh"),
]


def _activation(b: _Builder, act: str, x: str, out: str) -> str:
    if act == "Clip":
        return b.op("Clip", [x, b.scalar(f"{out}_lo", -0.5), b.scalar(f"{out}_hi", 0.75)], out)
    if act == "LeakyRelu":
        return b.op("LeakyRelu", [x], out, alpha=0.2)
    if act == "HardSigmoid":
        return b.op("HardSigmoid", [x], out, alpha=0.3, beta=0.4)
    return b.op(act, [x], out)


@pytest.mark.slow  # every activation over many shapes; test_native checks the products quickly
def test_matmul_bias_activation_shapes(tmp_path):
    b = _Builder(1)
    for i, (m, k, n, act) in enumerate(MATMULS):
        x = b.input(f"x{i}", (m, k))
        z = b.op("Add", [b.op("MatMul", [x, b.const(f"w{i}", (k, n), 1 / math.sqrt(k))], f"p{i}"),
                         b.const(f"b{i}", (n,))], f"z{i}" if act else f"y{i}")
        if act:
            _activation(b, act, z, f"y{i}")
        b.output(f"y{i}", (m, n))
    b.check(tmp_path, packed=len(MATMULS))


def _gelu(b: _Builder, x: str, form: str, i: int) -> str:
    """GELU as exporters spell it, in a few operand orders."""
    if form == "op":
        return b.op("Gelu", [x], f"g{i}")
    if form == "erf":  # 0.5x * (1 + erf(x / sqrt 2))
        e = b.op("Erf", [b.op("Div", [x, b.scalar(f"s{i}", math.sqrt(2))], f"d{i}")], f"e{i}")
        return b.op("Mul", [b.op("Mul", [x, b.scalar(f"h{i}", 0.5)], f"xh{i}"),
                            b.op("Add", [e, b.scalar(f"o{i}", 1.0)], f"a{i}")], f"g{i}")
    if form == "erf2":  # x * (0.5 * (1 + erf(x * (1 / sqrt 2)))), constants first
        e = b.op("Erf", [b.op("Mul", [b.scalar(f"s{i}", 1 / math.sqrt(2)), x], f"d{i}")], f"e{i}")
        half = b.op("Mul", [b.scalar(f"h{i}", 0.5), b.op("Add", [b.scalar(f"o{i}", 1.0), e], f"a{i}")], f"q{i}")
        return b.op("Mul", [x, half], f"g{i}")
    # tanh: 0.5x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    cube = b.op("Mul", [b.op("Pow", [x, b.scalar(f"three{i}", 3.0)], f"c{i}"), b.scalar(f"k{i}", 0.044715)], f"ck{i}")
    inner = b.op("Mul", [b.op("Add", [x, cube], f"in{i}"), b.scalar(f"r{i}", math.sqrt(2 / math.pi))], f"ir{i}")
    t = b.op("Add", [b.op("Tanh", [inner], f"t{i}"), b.scalar(f"o{i}", 1.0)], f"to{i}")
    return b.op("Mul", [b.op("Mul", [x, b.scalar(f"h{i}", 0.5)], f"xh{i}"), t], f"g{i}")


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1, 24, 40), pytest.param((20, 48, 70), marks=pytest.mark.slow)])  # larger: slow
def test_gelu_forms_fuse_and_run_natively(tmp_path, shape):
    m, k, n = shape
    b = _Builder(2)
    forms = ["erf", "erf2", "tanh", "op"]
    for i, form in enumerate(forms):
        x = b.input(f"x{i}", (m, k))
        p = b.op("Add", [b.op("MatMul", [x, b.const(f"w{i}", (k, n), 0.5)], f"p{i}"), b.const(f"b{i}", (n,))], f"z{i}")
        b.op("Identity", [_gelu(b, p, form, i)], f"y{i}")
        b.output(f"y{i}", (m, n))
    model = b.check(tmp_path, opset=20, packed=len(forms))
    kernels = {model.plan.kernels[i.kernel].split("::")[1] for i in model.plan.instructions}
    assert kernels == {"FusedMatMul"}, f"GELU did not fuse: {kernels}"


@pytest.mark.slow
def test_gelu_shared_input_is_not_fused(tmp_path):
    """A GELU whose input is read elsewhere too stays as it is written (and right)."""
    b = _Builder(3)
    x = b.input("x", (4, 8))
    p = b.op("MatMul", [x, b.const("w", (8, 8))], "p")
    g = _gelu(b, p, "erf", 0)
    b.op("Add", [g, p], "y")
    b.output("y", (4, 8))
    model = b.check(tmp_path)
    assert any("Erf" in model.plan.kernels[i.kernel] for i in model.plan.instructions)


@pytest.mark.slow
def test_residual_add_in_the_store(tmp_path):
    """The Add of a residual connection is done by the product's store: after the bias and
    the activation, with the shortcut an input, an earlier value, or the product's own A."""
    b = _Builder(4)
    m, k, n = 19, 40, 40
    x = b.input("x", (m, k))
    h = b.op("Relu", [x], "h")
    p1 = b.op("Add", [b.op("MatMul", [h, b.const("w1", (k, n))], "m1"), b.const("b1", (n,))], "p1")
    r1 = b.op("Add", [h, p1], "r1")  # shortcut computed earlier; product on the right
    p2 = b.op("Relu", [b.op("MatMul", [r1, b.const("w2", (n, n))], "m2")], "p2")
    r2 = b.op("Add", [p2, r1], "r2")  # activation before the residual; shortcut = the product's A
    p3 = b.op("MatMul", [r2, b.const("w3", (n, n))], "m3")
    b.op("Add", [p3, x], "y")  # the graph's input as the shortcut, written to a graph output
    b.output("y", (m, n))
    b.check(tmp_path, packed=3)
    assert sorted(b.residuals) == ["r1", "r2", "y"]


def test_residual_computed_later_is_a_separate_add(tmp_path):
    """An Add whose other operand is computed after the product cannot be folded into it."""
    b = _Builder(5)
    x = b.input("x", (6, 10))
    p = b.op("MatMul", [x, b.const("w", (10, 10))], "p")
    late = b.op("Tanh", [x], "late")
    b.op("Add", [p, late], "y")
    b.output("y", (6, 10))
    b.check(tmp_path, packed=1)
    assert b.residuals == []


def _silu(b: _Builder, x: str, i: int) -> str:
    return b.op("Mul", [x, b.op("Sigmoid", [x], f"sg{i}")], f"g{i}")


# (M, K, N, activation, residual): the activations the store applies lane by lane, over a
# stored row (gemm_gen.SCALAR_ACTS), with and without a residual Add after them; partial
# tiles of rows and columns, and K long enough to be blocked
ROW_ACTIVATIONS = [(7, 24, 40, "Silu", False), (13, 30, 17, "Silu", True), (8, 700, 33, "Silu", True),
                   (7, 24, 40, "GeluTanh", True), (1, 24, 19, "GeluTanh", False), (9, 40, 21, "Sigmoid", True),
                   (6, 16, 37, "Tanh", True), (5, 20, 24, "Mish", False)]


@pytest.mark.slow
def test_lane_by_lane_activations_with_a_residual(tmp_path):
    """SiLU, tanh-GELU, Sigmoid, Tanh and Mish after a product by constant weights are
    applied to each stored row, and a residual Add after them in the same pass: the result
    is onnxruntime's, and the Add is the store's."""
    b = _Builder(9)
    for i, (m, k, n, act, residual) in enumerate(ROW_ACTIVATIONS):
        x = b.input(f"x{i}", (m, k))
        z = b.op("Add", [b.op("MatMul", [x, b.const(f"w{i}", (k, n), 1 / math.sqrt(k))], f"p{i}"),
                         b.const(f"b{i}", (n,))], f"z{i}")
        if act == "Silu":
            g = _silu(b, z, i)
        elif act == "GeluTanh":
            g = _gelu(b, z, "tanh", i)
        elif act == "Mish":
            g = b.op("Mul", [z, b.op("Tanh", [b.op("Softplus", [z], f"sp{i}")], f"th{i}")], f"g{i}")
        else:
            g = b.op(act, [z], f"g{i}")
        if residual:
            b.op("Add", [g, b.input(f"res{i}", (m, n))], f"y{i}")
        else:
            b.op("Identity", [g], f"y{i}")
        b.output(f"y{i}", (m, n))
    model = b.check(tmp_path, opset=20, packed=len(ROW_ACTIVATIONS))
    kernels = {model.plan.kernels[i.kernel].split("::")[1] for i in model.plan.instructions}
    assert kernels == {"FusedMatMul", "Add"}, f"an activation did not fuse: {kernels}"  # Add: the residuals
    assert sorted(b.residuals) == sorted(f"y{i}" for i, row in enumerate(ROW_ACTIVATIONS) if row[4])


# (M, K, N, transA, transB, alpha, beta, C: shape or "input" for a run-time [M, N] matrix)
GEMMS = [
    (5, 7, 3, 0, 0, 1.0, 1.0, (3,)), (5, 7, 3, 1, 0, 0.5, 2.0, (1, 3)), (5, 7, 3, 0, 1, 1.0, 0.25, (5, 1)),
    (4, 6, 9, 1, 1, 2.0, 1.0, (1,)), (4, 6, 9, 0, 1, 1.0, 1.0, None), (1, 50, 70, 0, 1, 1.0, 1.0, (70,)),
    (33, 20, 17, 1, 1, 1.5, -0.5, "input"), (14, 500, 40, 0, 0, 1.0, 1.0, (14, 40)),
]


@pytest.mark.slow  # test_native's test_gemm covers transposes, alpha and beta quickly
def test_gemm_transposes_scales_and_c(tmp_path):
    b = _Builder(6)
    for i, (m, k, n, ta, tb, alpha, beta, c) in enumerate(GEMMS):
        ins = [b.input(f"a{i}", (k, m) if ta else (m, k)), b.const(f"w{i}", (n, k) if tb else (k, n))]
        if c == "input":
            ins.append(b.input(f"c{i}", (m, n)))
        elif c is not None:
            ins.append(b.const(f"c{i}", c))
        out = b.op("Gemm", ins, f"g{i}", transA=ta, transB=tb, alpha=alpha, beta=beta)
        b.op("Relu" if i % 2 else "Sigmoid", [out], f"y{i}")
        b.output(f"y{i}", (m, n))
    b.check(tmp_path, packed=len(GEMMS))


# (A shape, constant B shape): B with batch axes, broadcast either way; A's batch folded
BATCHED = [((2, 3, 5), (5, 4)), ((2, 3, 4, 5), (3, 5, 6)), ((2, 1, 4, 5), (3, 5, 6)), ((4, 5), (2, 5, 3)),
           ((1, 3, 4, 5), (2, 1, 5, 2)), ((3, 1, 17), (3, 17, 33))]


@pytest.mark.slow
def test_batched_matmul_by_constant_b(tmp_path):
    b = _Builder(7)
    for i, (sa, sb) in enumerate(BATCHED):
        out = np.matmul(np.zeros(sa, np.float32), np.zeros(sb, np.float32)).shape
        b.op("MatMul", [b.input(f"a{i}", sa), b.const(f"w{i}", sb)], f"y{i}")
        b.output(f"y{i}", out)
    b.check(tmp_path, packed=len(BATCHED))


def test_product_of_two_activations_stays_on_blas(tmp_path):
    """Attention's Q·Kᵀ: B is computed at run time, so the packed GEMM does not take it."""
    b = _Builder(8)
    q, kt = b.input("q", (2, 4, 6, 8)), b.input("kt", (2, 4, 8, 6))
    b.op("Relu", [b.op("MatMul", [q, kt], "s")], "y")
    b.output("y", (2, 4, 6, 6))
    b.check(tmp_path, packed=0)


@pytest.mark.parametrize("form", ["none", "tanh"])
@pytest.mark.parametrize("residual", [False, True])
def test_the_gelu_epilogue_is_within_its_bound_over_the_whole_range(tmp_path, monkeypatch, residual, form):
    """The product's store computes GELU on vectors (nncc/native/simd.h): the erf form with
    its own erf (a rational function), the tanh form as v / (1 + e^-2u). Over pre-activations
    from -12 to 12, dense near 0 and tiny ones, each result is within its stated error of the
    exact GELU in float64: the erf form within erf's error (3.2e-7, times 0.5|v|) plus two
    float32 steps; the tanh form within two float32 steps plus what rounding u to float32 can
    cost e^-2u (a few float32 epsilons times 2|u|, relative: a negative v's tiny result keeps
    its digits), and a result below 1e-36 may be 0. The product is by the
    identity, so the pre-activations are the inputs themselves; with ``residual`` a second
    input is added after the GELU, in the same store."""
    if find_toolchain() is None:
        pytest.skip("no C compiler: the native backend takes nothing")
    grid = np.concatenate([np.linspace(-12, 12, 8001), np.geomspace(1e-7, 1, 500), -np.geomspace(1e-7, 1, 500),
                           [0.0, 5.656854, -5.656854, 5.6568546, -5.6568546]]).astype(np.float32)
    n = 128
    rows = -(-grid.size // n)
    x = np.resize(grid, rows * n).reshape(rows, n)
    nodes = [helper.make_node("MatMul", ["x", "eye"], ["z"]),
             helper.make_node("Gelu", ["z"], ["g" if residual else "y"], approximate=form)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    if residual:
        nodes.append(helper.make_node("Add", ["g", "r"], ["y"]))
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(x.shape)))
    r = np.random.default_rng(3).standard_normal(x.shape).astype(np.float32)
    graph = helper.make_graph(
        nodes, "gelu_range", inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(np.eye(n, dtype=np.float32), "eye")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "gelu.onnx"))
    stored = []  # the residual Adds the product's store takes

    def spy(w, node, out, residual=gemm_gen._residual):
        found = residual(w, node, out)
        stored.extend(n.outputs[0] for n in (found or [])[:1])
        return found

    monkeypatch.setattr(gemm_gen, "_residual", spy)
    compiled = nncc.compile_model(tmp_path / "gelu.onnx")
    assert compiled.native_partitions == 1 and "FusedMatMul" in {k.split("::")[1] for k in compiled.plan.kernels}
    assert stored == (["y"] if residual else [])
    got = compiled.run({"x": x, "r": r} if residual else {"x": x})["y"].astype(np.float64)
    v = x.astype(np.float64)
    if form == "none":
        want = np.array([0.5 * a * (1 + math.erf(a / math.sqrt(2))) for a in v.ravel()]).reshape(v.shape)
        own = 0.5 * np.abs(v) * 3.2e-7
    else:  # v sigmoid(2u): 0.5 v (1 + tanh u) without float64's own cancellation where tanh u is near -1
        u = math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)
        want = v / (1 + np.exp(np.minimum(-2 * u, 700)))
        own = np.abs(want) * 2.4e-7 * (1 + 2 * np.abs(u)) + 1e-36  # e^-2u taken as infinite above e^88
    steps = 2 * np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)  # the GELU's rounding
    if residual:  # then the sum's rounding: one step of the sum
        want = want + r
        steps += np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    worst = np.max(np.abs(got - want) - (own + steps))
    assert worst <= 0, f"beyond the bound by {worst:.3g}"
