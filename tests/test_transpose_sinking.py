"""Transposes sunk through elementwise ops and cancelled, composed or folded into a
Reduce's axes (nncc/passes/transposes.py): each model against onnxruntime, and the compiled
plan's nodes counted through the report `nncc inspect` prints."""

from __future__ import annotations

import numpy as np
import pytest

import nncc
from nncc.report import describe_plan
from tests.models import GraphBuilder, one_native_partition
from tests.test_compile import nncc_cli, no_cache_flag
from tests.oracle import ort_run


def plan_ops(compiled) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in describe_plan(compiled.plan)["partitions"]:
        for op, n in part["ops"].items():
            counts[op] = counts.get(op, 0) + n
    return counts


def plan_order(compiled) -> list[str]:
    """The plan's ops in the order they run."""
    plan = compiled.plan
    return [plan.kernels[ins.kernel].split("::")[1] for ins in plan.instructions]


def compiled_and_checked(tmp_path, b: GraphBuilder, rtol: float = 1e-5, order: list | None = None):
    """``b``'s model compiled at -O2 on the portable backend (the rewrite is the same for
    every backend), each output checked against onnxruntime; the plan's op counts (and, into
    ``order``, its ops in order)."""
    path = tmp_path / "m.onnx"
    b.save(path)
    compiled = nncc.compile_model(path, backends=["numpy"])
    names = [out.name for out in b.outputs]
    if order is not None:
        order.extend(plan_order(compiled))
    got = compiled.run(b.feeds)
    for name, want in zip(names, ort_run(path, b.feeds, names)):
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=1e-5, err_msg=name)
    return plan_ops(compiled)


def nhwc_convnet(b: GraphBuilder, shape, channels) -> str:
    """The Keras-through-tf2onnx pattern: an NHWC input transposed to NCHW, each conv's
    result transposed to NHWC for a per-channel Mul/Add/Relu and back, a last Transpose
    before a ReduceMean over the spatial axes."""
    x, cin = b.node("Transpose", [b.input(shape)], perm=[0, 3, 1, 2]), shape[3]
    for c in channels:
        y = b.node("Conv", [x, b.weight([c, cin, 3, 3]), b.const(np.full(c, 0.05))], pads=[1, 1, 1, 1],
                   strides=[2, 2])
        y = b.node("Transpose", [y], perm=[0, 2, 3, 1])
        y = b.node("Mul", [y, b.const(b.rng.uniform(0.5, 1.5, c))])
        y = b.node("Relu", [b.node("Add", [y, b.const(b.rng.uniform(-0.2, 0.2, c))])])
        x, cin = b.node("Transpose", [y], perm=[0, 3, 1, 2]), c
    return b.node("ReduceMean", [b.node("Transpose", [x], perm=[0, 2, 3, 1])], axes=[1, 2], keepdims=0)


@pytest.mark.slow
@pytest.mark.parametrize("shape, channels", [((1, 16, 16, 3), (8, 16)), ((2, 33, 29, 3), (16, 32, 64))])
def test_nhwc_convnet_is_one_convolution_chain(tmp_path, shape, channels):
    b = GraphBuilder(opset=13, seed=len(channels), weight_gain=np.sqrt(2))
    b.output(nhwc_convnet(b, shape, channels))
    compiled, got, want = one_native_partition(tmp_path, b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # only the input's Transpose (it is data) stays; the per-channel ops fold into the convs
    assert plan_ops(compiled) == {"Transpose": 1, "FusedConv": len(channels), "ReduceMean": 1}


def test_add_of_two_transposed_values(tmp_path):
    b = GraphBuilder(seed=1)
    perm, inverse = [0, 2, 3, 1], [0, 3, 1, 2]
    x = b.node("Transpose", [b.input((2, 3, 4, 5))], perm=perm)
    y = b.node("Transpose", [b.input((2, 3, 4, 5))], perm=perm)
    z = b.node("Sigmoid", [b.node("Add", [x, y])])
    z = b.node("Sub", [z, b.const(np.linspace(-1, 1, 3))])  # per-channel, in the NHWC layout
    b.output(b.node("Transpose", [z], perm=inverse))
    assert "Transpose" not in compiled_and_checked(tmp_path, b)


def test_a_transpose_with_another_reader_stays(tmp_path):
    """The Transposed value, or a value of the chain, read by something else too: the
    chain keeps its Transposes and every output its value."""
    b = GraphBuilder(seed=2)
    x = b.node("Transpose", [b.input((2, 3, 4, 5))], perm=[0, 2, 3, 1])
    b.output(b.node("Transpose", [b.node("Relu", [x])], perm=[0, 3, 1, 2]))
    b.output(b.node("MatMul", [x, b.weight([3, 5])]))  # a second reader of the Transpose
    y = b.node("Transpose", [b.input((2, 3, 4))], perm=[2, 0, 1])
    y = b.node("Exp", [y])
    b.output(y)  # the chain's value is a graph output: its layout is the model's
    b.output(b.node("Transpose", [y], perm=[1, 2, 0]))
    z = b.node("Tanh", [b.node("Transpose", [b.input((3, 4, 5))], perm=[1, 0, 2])])
    b.output(b.node("Transpose", [z], perm=[1, 0, 2]))
    b.output(b.node("Neg", [z]))  # a value of the chain with a second reader
    assert compiled_and_checked(tmp_path, b)["Transpose"] == 6


def test_a_transpose_of_a_transpose_read_twice_composes(tmp_path):
    """The first Transpose has another reader: it stays for it, and the second reads the
    input through one composed Transpose."""
    b = GraphBuilder(seed=3)
    x = b.node("Transpose", [b.input((2, 3, 4, 5))], perm=[0, 2, 3, 1])
    b.output(b.node("Transpose", [x], perm=[3, 0, 2, 1]))
    b.output(b.node("Softmax", [x], axis=-1))
    assert compiled_and_checked(tmp_path, b)["Transpose"] == 2


def test_an_operand_that_is_not_transposed_stops_the_move(tmp_path):
    b = GraphBuilder(seed=4)
    x = b.node("Transpose", [b.input((2, 3, 4))], perm=[0, 2, 1])
    y = b.node("Add", [x, b.input((2, 4, 3))])  # computed at run time, in the transposed layout
    b.output(b.node("Transpose", [y], perm=[0, 2, 1]))
    assert compiled_and_checked(tmp_path, b)["Transpose"] == 2


@pytest.mark.parametrize("opset", [13, 18])  # axes an attribute, then an input
@pytest.mark.parametrize("op, perm, axes, keepdims, transposes", [
    ("ReduceMean", [0, 2, 3, 1], [1, 2], 0, 0),  # the kept axes in order: no Transpose left
    ("ReduceSum", [2, 0, 1, 3], [3], 0, 1),  # kept out of order: a Transpose of the result
    ("ReduceMax", [0, 2, 3, 1], [-1], 1, 1),  # keepdims: the Transpose moves after the result
    ("ReduceSumSquare", [3, 1, 0, 2], [0, 2], 1, 1),
    ("ReduceMin", [1, 3, 0, 2], None, 0, 0),  # every axis: the order does not matter
    ("ReduceL2", [1, 3, 0, 2], None, 1, 0),
])
def test_reduce_of_a_transpose(tmp_path, opset, op, perm, axes, keepdims, transposes):
    b = GraphBuilder(opset=opset, seed=5)
    x = b.node("Transpose", [b.input((2, 3, 4, 5))], perm=perm)
    x = b.node("Mul", [x, b.const(np.linspace(0.5, 1.5, (2, 3, 4, 5)[perm[-1]]))])  # over the last axis
    axes_input = opset >= 18 or op == "ReduceSum"
    if axes is None:
        y = b.node(op, [x], keepdims=keepdims)
    elif axes_input:
        y = b.node(op, [x, b.ints(axes)], keepdims=keepdims)
    else:
        y = b.node(op, [x], axes=axes, keepdims=keepdims)
    b.output(y)
    order: list[str] = []
    ops = compiled_and_checked(tmp_path, b, rtol=1e-4, order=order)
    assert ops.get("Transpose", 0) == transposes, ops
    if transposes:  # what is left of the Transpose permutes the (smaller) result
        assert order[-1] == "Transpose", order


def test_rank_3_chain_with_constants_cancels(tmp_path):
    b = GraphBuilder(seed=6)
    x = b.node("Transpose", [b.input((2, 5, 7))], perm=[0, 2, 1])  # [2, 7, 5]
    x = b.node("Mul", [x, b.const(np.linspace(0.5, 2, 5))])  # broadcast over the last axis
    x = b.node("Add", [x, b.const(np.linspace(-1, 1, 7).reshape(7, 1))])  # over the middle one
    x = b.node("LeakyRelu", [x], alpha=0.2)
    b.output(b.node("Transpose", [x], perm=[0, 2, 1]))
    assert "Transpose" not in compiled_and_checked(tmp_path, b)


def test_rank_5_chain_cancels_or_composes(tmp_path):
    b = GraphBuilder(seed=7)
    perm = [0, 2, 4, 1, 3]
    inverse = list(np.argsort(perm))
    x = b.node("Transpose", [b.input((2, 3, 4, 5, 6))], perm=perm)  # [2, 4, 6, 3, 5]
    x = b.node("Clip", [x, b.const(-0.5), b.const(0.8)])
    x = b.node("Sub", [x, b.const(b.rng.standard_normal((6, 1, 5)))])  # rank 3 under rank 5
    keep = b.const(b.rng.standard_normal((6, 1, 5)) > 0, np.bool_)
    x = b.node("Where", [keep, x, b.const(b.rng.standard_normal((3, 1)))])
    b.output(b.node("Transpose", [x], perm=inverse))  # cancels
    y = b.node("Transpose", [b.input((2, 3, 4, 5, 6))], perm=perm)
    y = b.node("Pow", [b.node("Abs", [y]), b.const(np.full((1, 1, 1), 1.5))])
    b.output(b.node("Transpose", [y], perm=[4, 3, 2, 1, 0]))  # composes into one
    assert compiled_and_checked(tmp_path, b, rtol=1e-4)["Transpose"] == 1


def test_a_bad_transpose_pair_is_still_reported(tmp_path):
    """A perm of the wrong length does not cancel with its inverse: the model is refused
    with one line, exit 2, as without the rewrite."""
    b = GraphBuilder(seed=8)
    x = b.node("Transpose", [b.input((2, 3, 4))], perm=[0, 2, 3, 1])
    b.output(b.node("Transpose", [b.node("Relu", [x])], perm=[0, 3, 1, 2]))
    b.save(tmp_path / "bad.onnx")
    done = nncc_cli("compile", tmp_path / "bad.onnx", "-o", tmp_path / "bad.nncc", *no_cache_flag(), check=False)
    assert done.returncode == 2, done.stderr
    assert "Transpose" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def random_chain(b: GraphBuilder, rng) -> None:
    """A Transpose of a random perm, then elementwise ops (constants of random broadcasting
    shapes, the same Transpose of another input, a scalar) and Softmaxes over a random
    axis, maybe a second reader, and an
    end: the inverse, another Transpose, a Reduce or the output itself."""
    rank = int(rng.integers(2, 6))
    shape = tuple(int(d) for d in rng.integers(1, 5, rank))
    perm = [int(a) for a in rng.permutation(rank)]
    tshape = [shape[a] for a in perm]
    x = b.node("Transpose", [b.input(shape)], perm=perm)
    for _ in range(int(rng.integers(1, 4))):
        kind = rng.integers(0, 6)
        if kind == 0:
            x = b.node(str(rng.choice(["Relu", "Sigmoid", "Neg", "Softsign"])), [x])
        elif kind == 1:  # a constant over some trailing axes, some of them 1
            k = int(rng.integers(0, rank + 1))
            cshape = [d if rng.random() < 0.7 else 1 for d in tshape[rank - k:]]
            x = b.node(str(rng.choice(["Mul", "Add", "Sub"])), [x, b.const(rng.uniform(0.5, 1.5, cshape))])
        elif kind == 2:
            x = b.node("Add", [x, b.node("Transpose", [b.input(shape)], perm=perm)])
        elif kind == 3:
            x = b.node("Clip", [x, b.const(-0.7), b.const(0.9)])
        elif kind == 4:
            x = b.node("Softmax", [x], axis=int(rng.integers(-rank, rank)))
        else:
            x = b.node("Max", [b.const(rng.uniform(-1, 1, tshape[-1:])), x, b.const(0.1)])
    if rng.random() < 0.25:
        b.output(b.node("Exp", [x]))  # a second reader
    end = rng.integers(0, 4)
    if end == 0:
        x = b.node("Transpose", [x], perm=[int(a) for a in np.argsort(perm)])
    elif end == 1:
        x = b.node("Transpose", [x], perm=[int(a) for a in rng.permutation(rank)])
    elif end == 2:
        axes = sorted(int(a) for a in rng.choice(rank, int(rng.integers(1, rank + 1)), replace=False))
        x = b.node(str(rng.choice(["ReduceSum", "ReduceMax", "ReduceMean"])), [x, b.ints(axes)],
                   keepdims=int(rng.integers(0, 2)))
    b.output(x)


@pytest.mark.parametrize("seed", range(4))
def test_random_chains_keep_their_values(tmp_path, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder(seed=seed)
    for _ in range(8):
        random_chain(b, rng)
    compiled_and_checked(tmp_path, b, rtol=1e-5)


@pytest.mark.parametrize("opset", [11, 13])  # before 13 a Softmax flattens around its axis: it stays
def test_concat_and_softmax_renumber_their_axis(tmp_path, opset):
    b = GraphBuilder(opset=opset, seed=9)
    perm, inverse = [0, 2, 3, 1], [0, 3, 1, 2]
    x = b.node("Transpose", [b.input((2, 3, 4, 5))], perm=perm)  # [2, 4, 5, 3]
    y = b.node("Transpose", [b.input((2, 6, 4, 5))], perm=perm)  # [2, 4, 5, 6]
    z = b.node("Concat", [x, b.const(b.rng.standard_normal((2, 4, 5, 2))), y], axis=-1)
    z = b.node("Softmax", [z], axis=3)  # over the channels, as in the NHWC layout
    b.output(b.node("Transpose", [z], perm=inverse))
    ops = compiled_and_checked(tmp_path, b)
    assert ops.get("Transpose", 0) == (0 if opset >= 13 else 3), ops
