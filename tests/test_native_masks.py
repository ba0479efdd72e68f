"""Masks in native code: the comparisons, IsNaN, IsInf, Not, And, Or, Xor and Where, with
broadcasting, run natively (one native partition, no fallback) and give onnxruntime's
outputs exactly, NaN and infinities included (a comparison with NaN is false, -inf is
selected as it is). A mask never crosses a partition's edge: a bool graph output, or a
mask whose reader cannot join its partition, moves its nodes to numpy with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import nncc
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0], np.float32)


class Model(GraphBuilder):
    def __init__(self, seed: int = 0):
        super().__init__(18, seed, "masks")

    def special_input(self, shape) -> str:
        """An input whose values include NaN, +-inf, signed zeros and repeats (so Equal holds somewhere)."""
        name = self.input(shape)
        values = self.rng.choice(np.concatenate([SPECIALS, np.round(self.rng.standard_normal(9), 1)]), size=shape)
        self.feeds[name] = values.astype(np.float32)
        return name

    def mask_input(self, shape, p: float = 0.5) -> str:
        """A float32 input of 0s and 1s (how attention masks are fed)."""
        name = self.input(shape)
        self.feeds[name] = (self.rng.random(shape) < p).astype(np.float32)
        return name


def compile_and_compare(tmp_path, m: Model, native_only: bool = True, rtol: float = 0.0):
    """Exact (``rtol``: a Softmax after the mask rounds as its own), NaN where onnxruntime has it."""
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path)
    names = [o.name for o in m.outputs]
    want = ort_run(path, m.feeds, names)
    got = compiled.run(m.feeds)
    for name, expected in zip(names, want):
        assert got[name].dtype == expected.dtype, name
        np.testing.assert_allclose(got[name], expected, rtol=rtol, atol=0, err_msg=name)
    if native_only:
        assert compiled.native_partitions == 1 and len(compiled.plan.partitions) == 1, compiled.plan.fallbacks
        assert compiled.plan.fallbacks == []
    return compiled


def test_attention_mask_idiom_is_native_and_exact(tmp_path):
    """Where(Equal(mask, 0), -inf, scores) then Softmax: a row with every position masked
    gives NaN, as onnxruntime's does."""
    m = Model(1)
    scores = m.node("Mul", [m.special_input([2, 3, 5, 8]), m.const(0.5)])
    mask = m.mask_input([2, 1, 1, 8])
    m.feeds[mask][1] = 0.0  # the second batch entry: nothing to attend to
    masked = m.node("Where", [m.node("Equal", [mask, m.const(0.0)]), m.const(-np.inf), scores])
    m.output(masked)
    m.output(m.node("Softmax", [masked], axis=-1))
    compile_and_compare(tmp_path, m)


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("shapes", [([3, 4, 5], [3, 4, 5]), ([3, 1, 5], [4, 1]), ([1], [2, 3])])
def test_comparisons_broadcast_and_follow_ieee(tmp_path, op, shapes):
    m = Model(len(op))
    a, b = m.special_input(shapes[0]), m.special_input(shapes[1])
    out = np.broadcast_shapes(*shapes)
    m.output(m.node("Where", [m.node(op, [a, b]), m.special_input(list(out)), m.const(7.0)]))
    compile_and_compare(tmp_path, m)


@pytest.mark.slow
def test_logic_ops_over_masks(tmp_path):
    m = Model(3)
    a, b = m.special_input([4, 6]), m.special_input([6])
    less, nan = m.node("Less", [a, b]), m.node("IsNaN", [a])
    inf = m.node("IsInf", [m.node("Mul", [a, b])])
    either = m.node("Or", [m.node("And", [less, m.node("Not", [nan])]), inf])
    mixed = m.node("Xor", [either, m.node("Equal", [less, nan])])
    m.output(m.node("Where", [mixed, a, b]))
    compile_and_compare(tmp_path, m)


@pytest.mark.parametrize("positive, negative", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isinf_directions(tmp_path, positive, negative):
    m = Model(5)
    x = m.special_input([5, 7])
    m.output(m.node("Where", [m.node("IsInf", [x], detect_positive=positive, detect_negative=negative),
                              m.const(1.0), m.const(-1.0)]))
    compile_and_compare(tmp_path, m)


def test_where_broadcasts_three_operands_and_reads_a_bool_constant(tmp_path):
    m = Model(6)
    x = m.special_input([2, 1, 6])
    cond = m.const(np.array([[True], [False], [True]]), np.bool_)  # [3, 1]
    y = m.node("Where", [cond, x, m.special_input([1, 3, 1])])
    m.output(m.node("Where", [m.node("Greater", [y, m.const(0.0)]), y, m.node("Neg", [y])]))
    compile_and_compare(tmp_path, m)


def test_mask_reshaped_between_masks_is_a_view(tmp_path):
    """HF-style: a [B, S] mask unsqueezed to [B, 1, 1, S] before Where."""
    m = Model(7)
    mask = m.mask_input([2, 6])
    keep = m.node("Unsqueeze", [m.node("Greater", [mask, m.const(0.5)]), m.const([1, 2], np.int64)])
    m.output(m.node("Where", [keep, m.special_input([2, 3, 4, 6]), m.const(np.finfo(np.float32).min)]))
    compile_and_compare(tmp_path, m)


def test_a_bool_graph_output_keeps_its_producer_and_readers_portable_with_the_reason(tmp_path):
    m = Model(8)
    x = m.special_input([3, 4])
    less = m.node("Less", [x, m.const(0.0)])
    m.output(m.node("Where", [less, x, m.const(0.0)]))
    m.save(tmp_path / "m.onnx")
    model = helper.make_model(helper.make_graph(
        m.nodes, "masks", m.inputs,
        [helper.make_tensor_value_info(m.outputs[0].name, TensorProto.FLOAT, None),
         helper.make_tensor_value_info(less, TensorProto.BOOL, None)], m.inits),
        opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = tmp_path / "bool_out.onnx"
    path.write_bytes(model.SerializeToString())
    compiled = nncc.compile_model(path)
    names = [m.outputs[0].name, less]
    for name, want in zip(names, ort_run(path, m.feeds, names)):
        np.testing.assert_array_equal(compiled.run(m.feeds)[name], want)
    reasons = {f["op"]: f["reason"] for f in compiled.plan.fallbacks}
    assert sorted(reasons) == ["Less", "Where"], compiled.plan.fallbacks  # Where reads the mask: it follows
    for op in reasons:
        assert f"its bool value {less!r} would cross a native partition's edge" in reasons[op]


def test_a_mask_whose_reader_cannot_join_its_partition_stays_portable(tmp_path):
    """Where reads a mask made in one native partition and a value computed by numpy
    after that partition: it cannot join it, so its mask would cross; the partitioner moves
    the mask's producer (and then the rest of the chain) to numpy, and the answer holds."""
    m = Model(9)
    x = m.special_input([4, 5])
    y = m.node("Relu", [x])
    mask = m.node("Greater", [y, m.const(0.5)])
    later = m.node("CumSum", [y, m.const(1, np.int64)])  # no C generator: numpy, after the first partition
    m.output(m.node("Where", [mask, later, y]))
    compiled = compile_and_compare(tmp_path, m, native_only=False)
    reasons = " ".join(f["reason"] for f in compiled.plan.fallbacks)
    assert "would cross a native partition's edge" in reasons, compiled.plan.fallbacks


def test_an_int64_attention_mask_input_is_compared_natively(tmp_path):
    """The Hugging Face form: attention_mask is the model's int64 input, Equal to 0 picks
    the positions to hide; token ids compared with a large id and a packed small one."""
    m = Model(10)
    m.inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [2, 1, 1, 8]))
    m.feeds["attention_mask"] = (m.rng.random((2, 1, 1, 8)) < 0.7).astype(np.int64)
    m.inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT32, [2, 8]))
    m.feeds["ids"] = np.array([[5, 2**30, -7, 0, 3, 3, 2**24 + 1, 9]] * 2, np.int32)
    hidden = m.node("Equal", [m.node("Cast", [m.node("Not", [m.node("Equal", ["attention_mask",
                                                                               m.const(0, np.int64)])])],
                                     to=TensorProto.INT64), m.const(0, np.int64)])
    scores = m.node("Where", [hidden, m.const(-np.inf), m.special_input([2, 3, 8, 8])])
    m.output(m.node("Softmax", [scores], axis=-1))
    limits = m.node("Cast", [m.const(np.array([4, 2**30, 0, 1, 3, 2, 2**24, 9]))], to=TensorProto.INT32)
    big = m.node("Less", ["ids", limits])
    m.output(m.node("Where", [big, m.const(1.0), m.const(-1.0)]))
    compiled = compile_and_compare(tmp_path, m, native_only=False, rtol=1e-6)
    assert compiled.native_partitions == 1, compiled.plan.partitions
    # the one refusal: -O1 folds the Cast into an int32 constant holding 2**30, which a
    # packed float32 does not hold exactly (so Less stays portable, saying so)
    assert [(f["op"], f["reason"].split(": ", 1)[1]) for f in compiled.plan.fallbacks] == [
        ("Less", f"an integer constant {limits!r} beyond what a packed float32 holds exactly"),
        ("Where", f"its bool value {big!r} would cross a native partition's edge (native arguments are float32)")]


def test_a_mask_moved_by_gather_expand_and_gathernd_stays_in_one_native_partition(tmp_path):
    """The attention mask as torch's exporters build it for BERT, GPT-2 and LLaMA: the
    int64 input cast to bool, flattened and gathered with constant indices (TorchScript),
    or picked by GatherND with constant index tuples (dynamo), reshaped, combined by And
    with a causal mask, expanded over the heads, then selecting -inf by Where. The bool
    values are moved natively (as bytes), so the model is one native partition with no
    fallback, and exact against onnxruntime."""
    m = Model(11)
    m.inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [2, 6]))
    m.feeds["attention_mask"] = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1]], np.int64)
    keep = m.node("Cast", ["attention_mask"], to=TensorProto.BOOL)
    flat = m.node("Flatten", [keep], axis=0)  # [1, 12]
    rows = m.node("Gather", [flat, m.ints([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, -1]])], axis=1)  # [1, 2, 6]
    rows = m.node("Reshape", [rows, m.ints([2, 1, 1, 6])])
    tuples = np.array([[[0, 0], [0, 1], [0, 2], [0, 3], [0, -2], [0, 5]],
                       [[1, 0], [1, 1], [-1, 2], [1, 3], [1, 4], [1, 5]]], np.int64)
    picked = m.node("Reshape", [m.node("GatherND", [keep, m.ints(tuples)]), m.ints([2, 1, 1, 6])])
    causal = m.node("Cast", [m.const(np.tril(np.ones((6, 6))).reshape(1, 1, 6, 6))], to=TensorProto.BOOL)
    both = m.node("And", [m.node("And", [rows, picked]), causal])  # [2, 1, 6, 6]
    wide = m.node("Expand", [both, m.ints([2, 3, 6, 6])])
    scores = m.node("Where", [wide, m.special_input([2, 3, 6, 6]), m.const(-np.inf)])
    m.output(m.node("Softmax", [scores], axis=-1))
    sliced = m.node("Slice", [m.node("Tile", [keep, m.ints([1, 2])]), m.ints([1]), m.ints([11]), m.ints([1])])
    m.output(m.node("Where", [sliced, m.const(1.0), m.const(-1.0)]))
    compile_and_compare(tmp_path, m, rtol=1e-6)
