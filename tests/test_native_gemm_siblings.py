"""Products of one input by constant weights computed as one packed GEMM
(nncc/native/gemm_gen.py, ``siblings``): attention's query, key and value projections, a
gated unit's two products. Each output must equal onnxruntime's, and the grouping must
happen exactly where the products share A, the weights' shape and the activation."""

from __future__ import annotations

import numpy as np
import pytest

import nncc
from nncc.native import gemm_gen
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.oracle import ort_outputs

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler on this machine: the native "
                                "backend selects nothing, which tests/test_native.py covers with CC set")


def _compiled(tmp_path, b: GraphBuilder, monkeypatch) -> tuple[list[int], dict, dict]:
    """(the size of each group the GEMM wrote as one step, nncc's outputs, onnxruntime's)."""
    groups = []
    emit = gemm_gen.emit_siblings

    def spy(w, nodes, s, act):
        groups.append(len(nodes))
        return emit(w, nodes, s, act)

    monkeypatch.setattr(gemm_gen, "emit_siblings", spy)
    path = tmp_path / "m.onnx"
    b.save(path)
    compiled = nncc.compile_model(path)
    assert compiled.native_partitions == 1 and compiled.plan.fallbacks == []
    return groups, compiled.run(b.feeds), ort_outputs(path, b.feeds)


def _product(b: GraphBuilder, x: str, k: int, n: int, bias: bool, act: str) -> str:
    y = b.node("MatMul", [x, b.weight((k, n))])
    if bias:
        y = b.node("Add", [y, b.const(b.rng.standard_normal(n))])
    return b.node(act, [y]) if act else y


def _close(got: dict, want: dict, k: int) -> None:
    for name, w in want.items():
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6 * k * max(1.0, float(np.abs(w).max())),
                                   err_msg=name)


# (A's shape, N, the activation): rows below and above the register tile, one row; N below
# a vector, across panels with a partial last one (each product's own, in the middle of B)
SHAPES = [((2, 13, 40), 37, "Relu"), ((1, 64, 48), 32, ""), ((1, 40), 70, "Gelu"), ((5, 9), 3, "Tanh")]


@pytest.mark.parametrize("shape, n, act", SHAPES)
def test_three_products_of_one_input_are_one_step(tmp_path, monkeypatch, shape, n, act):
    b = GraphBuilder(seed=3, opset=20)
    x = b.input(shape)
    k = shape[-1]
    # biases on two of the three: the third adds a row of zeros
    outs = [_product(b, x, k, n, bias, act) for bias in (True, False, True)]
    for out in outs:
        b.output(b.node("Neg", [out]))  # a reader after the group: the outputs are complete
    b.output(outs[1])  # one of them a graph output as well
    groups, got, want = _compiled(tmp_path, b, monkeypatch)
    assert groups == [3]
    _close(got, want, k)


def test_products_that_differ_stay_apart(tmp_path, monkeypatch):
    """Another activation, other weights' shape or a residual Add each keep a product out
    of the group; the two alike are still one step."""
    b = GraphBuilder(seed=4, opset=20)
    x = b.input((1, 20, 24))
    alike = [_product(b, x, 24, 24, True, "Relu") for _ in range(2)]
    other_act = _product(b, x, 24, 24, True, "Sigmoid")
    other_n = _product(b, x, 24, 16, True, "Relu")
    residual = b.node("Add", [_product(b, x, 24, 24, True, ""), x])
    for out in alike + [other_act, other_n, residual]:
        b.output(out)
    groups, got, want = _compiled(tmp_path, b, monkeypatch)
    assert groups == [2]
    _close(got, want, 24)


def test_a_product_reading_a_sibling_comes_after_the_group(tmp_path, monkeypatch):
    """The second product of x waits in the graph behind a product of the first's output;
    computed early with the first, it is still right, and so is that later product."""
    b = GraphBuilder(seed=5, opset=20)
    x = b.input((3, 16))
    first = _product(b, x, 16, 16, True, "")
    chained = _product(b, first, 16, 16, False, "")
    second = _product(b, x, 16, 16, False, "")
    b.output(chained)
    b.output(second)
    groups, got, want = _compiled(tmp_path, b, monkeypatch)
    assert groups == [2]
    _close(got, want, 32)
