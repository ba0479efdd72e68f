"""The sample axis analysis against onnxruntime on random models (nncc.runtime.sample_axis):
seeded chains of ops that keep samples apart or mix them depending on their axes (Softmax,
Reduce, Transpose, Concat, Gather and Slice along a random axis, MatMul, folding and keeping
Reshapes, Flatten) or read sizes from Shape and Size (a Reshape target, Expand and
ConstantOfShape shapes, and sizes used as data, which only a size other than N's may be). Whatever the analysis accepts must give onnxruntime's outputs when each
sample runs alone through the plan for N = 1; the seeds must give both verdicts, so that
neither half of the test is empty."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from nncc.model import compile_model
from nncc.runtime.sample_axis import Rejected, find_separation
from nncc.runtime.sample_loop import SampleLoop
from tests.models import GraphBuilder
from tests.oracle import ort_outputs
from tests.test_dynamic_samples import _dynamic

OPS = ("softmax", "reduce", "transpose", "concat", "matmul", "fold", "keep", "flatten", "gather", "slice", "add",
       "shape_keep", "size_as_data", "dim_as_data", "expand", "fill")


def _shape_at_two(b: GraphBuilder, value: str, folder) -> tuple | None:
    """The shape of ``value`` with the batch at 2 (onnxruntime runs the model so far), or
    None when the chain is not a valid model."""
    graph = helper.make_graph(b.nodes, "probe", b.inputs, [helper.make_tensor_value_info(value, 1, None)], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)])
    model.ir_version = 8
    path = folder / "probe.onnx"
    onnx.save(model, path)
    try:
        return tuple(next(iter(ort_outputs(path, b.feeds).values())).shape)
    except Exception:  # noqa: BLE001 (any refusal of onnxruntime's: this chain is not a model)
        return None


def _random_model(seed: int, folder):
    """A random chain over x [N, 4, 6] saved with N symbolic, or None."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(seed=seed)
    h = b.input((2, 4, 6))
    for _ in range(int(rng.integers(2, 5))):
        shape = _shape_at_two(b, h, folder) if b.nodes else (2, 4, 6)
        if shape is None or not shape or np.prod(shape) > 4096:
            return None
        rank = len(shape)
        axis = int(rng.integers(0, rank))
        op = OPS[int(rng.integers(0, len(OPS)))]
        if op == "softmax":
            h = b.node("Softmax", [h], axis=axis)
        elif op == "reduce":
            axes = sorted(set(int(a) for a in rng.integers(0, rank, size=int(rng.integers(1, rank + 1)))))
            h = b.node("ReduceSum", [h, b.const(axes, np.int64)], keepdims=1)
        elif op == "transpose":
            h = b.node("Transpose", [h], perm=[int(p) for p in rng.permutation(rank)])
        elif op == "concat":
            h = b.node("Concat", [h, b.node("Mul", [h, b.const(0.5)])], axis=axis)
        elif op == "matmul":
            h = b.node("MatMul", [h, b.weight((shape[-1], 3))])
        elif op == "fold":  # everything into one row, or rows of the last axis
            h = b.node("Reshape", [h, b.const([1, -1] if rng.integers(0, 2) else [-1, shape[-1]], np.int64)])
        elif op == "keep":  # the first axis kept, the rest flattened
            h = b.node("Reshape", [h, b.const([0, -1], np.int64)])
        elif op == "flatten":
            h = b.node("Flatten", [h], axis=axis)
        elif op == "gather":
            h = b.node("Gather", [h, b.const([0, 0], np.int64)], axis=axis)
        elif op == "slice":
            h = b.node("Slice", [h, b.const([0], np.int64), b.const([1], np.int64), b.const([axis], np.int64)])
        elif op == "shape_keep":  # Reshape(h, [Shape(h)[0], -1]): the first axis read at run time
            first = b.node("Gather", [b.node("Shape", [h]), b.const([0], np.int64)], axis=0)
            h = b.node("Reshape", [h, b.node("Concat", [first, b.const([-1], np.int64)], axis=0)])
        elif op == "size_as_data":  # h / Size(h)
            h = b.node("Div", [h, b.node("Cast", [b.node("Size", [h])], to=onnx.TensorProto.FLOAT)])
        elif op == "dim_as_data":  # h + Shape(h)[axis]: data from the batch size only when that axis is N's
            dim = b.node("Gather", [b.node("Shape", [h]), b.const(axis, np.int64)], axis=0)
            h = b.node("Add", [h, b.node("Cast", [dim], to=onnx.TensorProto.FLOAT)])
        elif op == "expand":  # a constant row broadcast to h's run-time shape, then added
            row = b.const(rng.standard_normal(shape[-1:]).astype(np.float32))
            h = b.node("Add", [h, b.node("Expand", [row, b.node("Shape", [h])])])
        elif op == "fill":  # ConstantOfShape(Shape(h)) * h
            fill = b.node("ConstantOfShape", [b.node("Shape", [h])],
                          value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [1.5]))
            h = b.node("Mul", [h, fill])
        else:
            h = b.node("Add", [h, b.const(rng.standard_normal(shape[-1:]).astype(np.float32))])
    if _shape_at_two(b, h, folder) is None:
        return None
    b.output(h)
    path = folder / f"random{seed}.onnx"
    _dynamic(b, path, {0: "N"})
    return path, b


@pytest.mark.slow
def test_what_the_analysis_accepts_runs_sample_by_sample_as_onnxruntime_runs_the_batch(tmp_path):
    verdicts = {"accepted": 0, "rejected": 0}
    for seed in range(150):
        made = _random_model(seed, tmp_path)
        if made is None:
            continue
        path, b = made
        general = compile_model(path, backends=("numpy",)).executor
        slot = general.plan.inputs[0]
        try:
            separation = find_separation(general.plan, lambda n: {slot: (n, 4, 6)}, "N", general.decode_attr)
        except Rejected:
            verdicts["rejected"] += 1
            continue
        verdicts["accepted"] += 1
        one = compile_model(path, backends=("numpy",), dims={"N": 1}).executor
        loop = SampleLoop(one, separation, general)
        for n in (1, 2, 5):
            feeds = {"x0": np.random.default_rng(seed * 10 + n).standard_normal((n, 4, 6)).astype(np.float32)}
            assert loop.samples(feeds) == n  # the loop takes them: it is the loop that answers
            want = ort_outputs(path, feeds)
            got = loop.run(feeds)
            for name, expected in want.items():
                np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5,
                                           err_msg=f"seed {seed}, N = {n}, {[node.op_type for node in b.nodes]}")
    assert verdicts["accepted"] >= 5 and verdicts["rejected"] >= 5, verdicts
