"""Whether a symbolic dimension is a sample axis: the model computes each sample's outputs
from that sample's inputs alone, so one plan compiled for one sample runs any count.

The rule. Call N the dimension. The plan's shape functions run three times, with N = 1, 2
and 3 and every other dimension at its size of the run (nncc.runtime.specialize). Then
every value of the plan must be one of:

* **sample-batched at axis k**: its shapes differ in axis k alone, the size there is N
  times its size at N = 1, and every axis before k has size 1, so that sample b owns the
  b-th contiguous chunk of the value (contents known at N = 2, when they are, must be the
  N = 1 contents repeated: a Range over N is not batched);
* **unbatched**: the same shape at every N, and the same contents where they are known;
* **shape-like**: contents known at every N, differing (Shape of a batched value, and
  arithmetic on it). Such a value may only feed shape arithmetic (an op whose outputs are
  again known) or a shape input (Reshape's target, Expand's and ConstantOfShape's shape,
  Resize's sizes): the batch size used as data (``x / N``) rejects the model.

Every node must be one this module knows to keep samples apart, by a rule of its op on
which inputs are batched at which axis: elementwise ops (any broadcasting, batched inputs
on the output's batched axis); Conv, pools, the normalizations, LRN, Resize with the batch
at axis 0; MatMul with the batch axis not contracted (a batched right operand only on a
broadcast axis), Gemm with transA = 0 and B unbatched; Softmax, LayerNormalization,
Reduce*, ArgMax, TopK, Concat, Split, Slice, Pad, Tile and Gather along another axis than
the batch's (Gather also of an unbatched table by batched indices); Transpose keeping the
batch axis where its chunks stay contiguous; Reshape-like ops between two batched values
(their chunks hold the same elements in the same order); fused attention over a batch
axis; Shape and Size (their outputs are shape-like or unbatched), ConstantOfShape and
Expand of unbatched data (every chunk the same). A node with a subgraph, a random op, or
anything else that reads a batched value rejects the model, as does an output that is
shape-like or batched elsewhere than on an axis of its own. Nodes that read unbatched
values only compute the same thing for every sample.

Rejection is the safe side: the model then runs as it would without a sample loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nncc.kernels.registry import by_key
from nncc.runtime.shape_infos import infer_infos

SIZES = (1, 2, 3)

UNBATCHED, SHAPE_LIKE = "unbatched", "shape-like"


@dataclass(frozen=True)
class Separation:
    """A sample axis found: ``dim`` its name; ``inputs`` and ``outputs``: slot -> the
    batched axis (None: unbatched), for the plan's inputs and outputs."""

    dim: str
    inputs: dict[int, int | None]
    outputs: dict[int, int | None]


class Rejected(Exception):
    """The dimension is not a sample axis; the message says why."""


@dataclass(frozen=True)
class _Value:
    cls: str  # "batched", UNBATCHED or SHAPE_LIKE
    axis: int = -1  # the batched axis
    rank: int = 0
    chunk_axis_size: int = 0  # the batched axis's size at N = 1
    known: bool = False  # contents known at every N (unbatched, shape-like)

    @property
    def batched(self) -> bool:
        return self.cls == "batched"


def find_separation(plan, shapes_at, dim: str, decode_attr) -> Separation:
    """The Separation of ``dim`` in ``plan``, or Rejected. ``shapes_at(n)``: the input
    shapes (slot -> shape) with ``dim`` at n and every other dimension at its size."""
    infos = []
    for n in SIZES:
        found = infer_infos(plan, shapes_at(n), decode_attr)
        if found is None:
            raise Rejected(f"the shape functions refuse {dim} = {n}")
        infos.append(found)
    values = {}
    for slot in range(len(plan.slots)):
        if slot in infos[0]:
            values[slot] = _classify(plan.slots[slot].name, [i.get(slot) for i in infos])
    inputs = {}
    for slot in plan.inputs:
        value = values.get(slot)
        if value is None or value.cls == SHAPE_LIKE:
            raise Rejected(f"input {plan.slots[slot].name!r} is not split by samples")
        inputs[slot] = value.axis if value.batched else None
    opsets = plan.options.get("opsets", {})
    for ins in plan.instructions:
        definition = by_key(plan.kernels[ins.kernel])
        if definition is None:
            raise Rejected(f"unknown kernel {plan.kernels[ins.kernel]}")
        op = definition.op_type if definition.domain in ("", "ai.onnx") else f"{definition.domain}::{definition.op_type}"
        attrs = {k: decode_attr(v) for k, v in ins.attrs.items()}
        opset = int(opsets.get(definition.domain, definition.since))
        contents = [None if s < 0 else infos[0].get(s) for s in ins.inputs]
        label = f"{op} node {ins.node!r}" if ins.node else op
        try:
            ins_values = [None if s < 0 else values[s] for s in ins.inputs]
            out_values = [None if s < 0 else values[s] for s in ins.outputs]
        except KeyError:
            raise Rejected(f"{label}: a value of unknown shape") from None
        try:
            _check_node(op, attrs, opset, ins_values, out_values, contents)
        except Rejected as exc:
            raise Rejected(f"{label}: {exc}") from None
    outputs = {}
    for slot in plan.outputs:
        value = values.get(slot)
        if value is None or value.cls == SHAPE_LIKE:
            raise Rejected(f"output {plan.slots[slot].name!r} depends on the batch size")
        if value.batched and value.chunk_axis_size != 1:
            raise Rejected(f"output {plan.slots[slot].name!r} folds the samples into another axis")
        outputs[slot] = value.axis if value.batched else None
    return Separation(dim, inputs, outputs)


def batch_candidates(plan, slots) -> list[str]:
    """The names of the leading symbolic dimensions (the first that is not 1) of the inputs
    ``slots``: the batch axes worth trying, at most two."""
    names = []
    for slot in slots:
        lead = next((d for d in plan.slots[slot].shape or () if d != 1), None)
        if isinstance(lead, str) and lead not in names:
            names.append(lead)
    return names[:2]


def describe_sample_axes(plan, other_size: int = 4) -> dict[str, dict]:
    """For ``nncc inspect``: each candidate batch dimension of the plan's inputs ->
    ``{"sample_axis": bool, "reason": why not, "other_sizes": the other dimensions' sizes
    it was decided at}``. The run decides again at its own sizes; other dimensions are
    tried at ``other_size``, then at 1 where the shape functions refuse that."""
    inputs = [s for s in plan.inputs if plan.slots[s].kind == "tensor" and plan.slots[s].shape is not None]
    names = sorted({d for s in inputs for d in plan.slots[s].shape if isinstance(d, str)})
    found = {}
    for dim in batch_candidates(plan, inputs):
        for size in dict.fromkeys((other_size, 1)):
            sizes = {name: size for name in names if name != dim}
            shapes_at = lambda n, sizes=sizes: {  # noqa: E731
                s: tuple(n if d == dim else sizes.get(d, 1) if not isinstance(d, int) else d
                         for d in plan.slots[s].shape) for s in inputs}
            try:
                find_separation(plan, shapes_at, dim, lambda v: plain_attr(plan, v))
                found[dim] = {"sample_axis": True, "reason": None, "other_sizes": sizes}
            except Rejected as exc:
                found[dim] = {"sample_axis": False, "reason": str(exc), "other_sizes": sizes}
                if "refuse" in str(exc):
                    continue
            break
    return found


def plain_attr(plan, value):
    """A plan attribute as kernels take it, without an executor: tensor references as the
    plan's constants (a subgraph stays as it is stored: its op rejects the model anyway)."""
    if isinstance(value, dict) and "$tensor" in value:
        return plan.constants[value["$tensor"]]
    if isinstance(value, list):
        return [plain_attr(plan, v) for v in value]
    return value


def _classify(name: str, infos) -> _Value:
    if any(i is None or i.kind != "tensor" or not i.is_static for i in infos):
        raise Rejected(f"the shape of {name!r} is not known from the input shapes")
    shapes = [tuple(i.shape) for i in infos]
    known = all(i.value is not None for i in infos)
    rank = len(shapes[0])
    if not known and any(i.value is not None for i in infos):  # known at some sizes only: take it as N's
        return _Value(SHAPE_LIKE, rank=rank)
    if shapes[0] == shapes[1] == shapes[2]:
        if known and not (_same(infos[0].value, infos[1].value) and _same(infos[0].value, infos[2].value)):
            return _Value(SHAPE_LIKE, rank=rank, known=True)
        return _Value(UNBATCHED, rank=rank, known=known)
    if any(len(s) != rank for s in shapes):
        raise Rejected(f"the rank of {name!r} changes with the batch size")
    differing = [a for a in range(rank) if len({s[a] for s in shapes}) > 1]
    one = shapes[0]
    if len(differing) != 1:
        raise Rejected(f"{name!r} changes in several axes with the batch size")
    k = differing[0]
    if any(s[k] != n * one[k] for n, s in zip(SIZES, shapes)) or math.prod(one[:k]) != 1:
        raise Rejected(f"{name!r} is not split by samples ({list(shapes[0])} at 1, {list(shapes[1])} at 2)")
    if known and not _same(np.concatenate([infos[0].value] * 2, axis=k), infos[1].value):
        raise Rejected(f"the contents of {name!r} differ from sample to sample")
    return _Value("batched", axis=k, rank=rank, chunk_axis_size=one[k])


def _same(a, b) -> bool:
    if a is b:  # a constant: the plan's own array at every size
        return True
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


# -- the rules of the ops ----------------------------------------------------------------------------

ELEMENTWISE = frozenset("""Add Sub Mul Div Pow Max Min Mean Sum Where Equal Less Greater LessOrEqual GreaterOrEqual
And Or Xor Not Neg Abs Relu Sigmoid Tanh Exp Log Sqrt Reciprocal Erf Floor Ceil Round Sign Sin Cos Tan Asin Acos
Atan Sinh Cosh Asinh Acosh Atanh Softplus Softsign Elu Selu Celu LeakyRelu PRelu HardSigmoid HardSwish Gelu Mish
Clip Cast CastLike Identity Dropout IsNaN IsInf Mod ThresholdedRelu Shrink Swish BitShift BitwiseAnd BitwiseOr
BitwiseXor BitwiseNot nncc::Silu nncc::Mish nncc::HardSwish nncc::Gelu""".split())
IMAGE = frozenset("""Conv ConvTranspose MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool GlobalLpPool
BatchNormalization InstanceNormalization GroupNormalization LRN Resize Upsample DepthToSpace SpaceToDepth
nncc::FusedConv nncc::ScaleShift""".split())
REDUCE = frozenset("""ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum
ReduceLogSumExp ReduceSumSquare""".split())
RESHAPING = frozenset("Reshape Flatten Squeeze Unsqueeze".split())
SHAPE_READERS = frozenset("Shape Size".split())
FILLS = frozenset("ConstantOfShape Expand".split())
# inputs that give only the output's shape, where a shape-like value may go: its contents
# follow from the data whatever the shape (Resize's sizes only with batched images, whose
# rule keeps the batch axis's size; elsewhere, as Slice's bounds, a size would pick elements)
SHAPE_INPUTS = {"Reshape": {1}, "Expand": {1}, "ConstantOfShape": {0}, "Resize": {3}}
SHAPE_ONLY = frozenset(("Reshape", "Expand", "ConstantOfShape"))
NEVER = frozenset("If Loop Scan RandomNormal RandomUniform RandomNormalLike RandomUniformLike Multinomial Bernoulli".split())


def _check_node(op, attrs, opset, ins, outs, contents) -> None:
    if op in NEVER:
        raise Rejected("not run per sample (a subgraph, or random)")
    shape_inputs = SHAPE_INPUTS.get(op, set())
    present = [(i, v) for i, v in enumerate(ins) if v is not None]
    if op in SHAPE_READERS:
        if any(o.batched for o in outs if o is not None):
            raise Rejected("its output is batched")
        return
    if any(v.cls == SHAPE_LIKE for i, v in present if i not in shape_inputs):
        # shape arithmetic: every output's contents known at every size
        if all(o is None or (o.known and not o.batched) for o in outs):
            return
        raise Rejected("the batch size is used as data")
    data = [(i, v) for i, v in present if i not in shape_inputs]
    shape_args = [v for i, v in present if i in shape_inputs]
    if any(v.cls == UNBATCHED and not v.known for v in shape_args) and any(o.batched for o in outs if o):
        raise Rejected("a shape input computed from data")
    if not any(v.batched for _, v in data):
        if any(v.cls == SHAPE_LIKE for v in shape_args) and op not in SHAPE_ONLY:
            raise Rejected("the batch size sizes unbatched data")
        if not any(o.batched for o in outs if o is not None):
            return  # the same for every sample
        if op in FILLS:  # unbatched data repeated along the batch axis: every chunk the same
            return
        raise Rejected("batched output from unbatched inputs")
    rule = _RULES.get(op)
    if rule is None:
        raise Rejected("not known to keep samples apart")
    rule(attrs, opset, ins, outs, contents)


def _batched_outputs(outs, axes) -> None:
    """Each present output batched at its expected axis (None: anything batched)."""
    for out, axis in zip(outs, axes):
        if out is None:
            continue
        if not out.batched:
            raise Rejected("an output mixes the samples")
        if axis is not None and out.axis != axis:
            raise Rejected(f"the batch moves to axis {out.axis}, not {axis}")


def _elementwise(attrs, opset, ins, outs, contents) -> None:
    for out in outs:
        if out is None:
            continue
        if not out.batched:
            raise Rejected("an output mixes the samples")
        for v in ins:
            if v is not None and v.batched and (v.rank - v.axis != out.rank - out.axis
                                                or v.chunk_axis_size != out.chunk_axis_size):
                raise Rejected("a batched input is broadcast across the batch axis")


def _image(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    if x is None or not x.batched or x.axis != 0:
        raise Rejected("the batch is not the images' axis 0")
    if any(v is not None and v.batched for v in ins[1:]):
        raise Rejected("batched weights")
    if any(out is not None for out in outs[1:]):  # MaxPool's Indices number elements across the batch
        raise Rejected("a second output")
    if int(attrs.get("training_mode", 0)):
        raise Rejected("statistics over the batch")
    _batched_outputs(outs[:1], [0])
    if outs[0].chunk_axis_size != x.chunk_axis_size:
        raise Rejected("resizes the batch axis")


def _matmul(attrs, opset, ins, outs, contents) -> None:
    a, b = ins[0], ins[1]
    out = outs[0]
    if len(ins) > 2 and ins[2] is not None and ins[2].batched:
        raise Rejected("a batched bias")
    if a.batched and a.axis == a.rank - 1:
        raise Rejected("the batch axis is contracted")
    if b.batched and (b.rank < 3 or b.axis >= b.rank - 2):
        raise Rejected("the batch is an axis of the right operand's matrices")
    if a.batched and b.batched and (a.rank - a.axis != b.rank - b.axis or a.axis >= a.rank - 2):
        raise Rejected("the operands are batched on different axes")
    if a.rank == 1 and a.batched:
        raise Rejected("the batch axis is contracted")
    if b.rank == 1:  # [..., M, K] @ [K] -> [..., M]: A's axes keep their places
        expected = a.axis
    elif a.rank == 1:  # [K] @ [..., K, P] -> [..., P]: B's broadcast axes keep theirs
        expected = b.axis
    else:
        source = a if a.batched else b
        expected = out.rank - (source.rank - source.axis)
    _batched_outputs([out], [expected])


def _gemm(attrs, opset, ins, outs, contents) -> None:
    a, b = ins[0], ins[1]
    if int(attrs.get("transA", 0)):
        raise Rejected("transA contracts the batch axis")
    if not a.batched or a.axis != 0 or b.batched:
        raise Rejected("only A may be batched, on its rows")
    c = ins[2] if len(ins) > 2 else None
    if c is not None and c.batched and not (c.rank == 2 and c.axis == 0):
        raise Rejected("C is batched across the rows")
    _batched_outputs(outs, [0])


def _axis(attrs, rank: int, default: int) -> int:
    axis = int(attrs.get("axis", default))
    return axis + rank if axis < 0 else axis


def _softmax(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    if opset < 13:  # the input is coerced to 2-D at the axis: rows before it, each normalised
        if not x.axis < _axis(attrs, x.rank, 1):
            raise Rejected("normalises across the batch axis")
    elif _axis(attrs, x.rank, -1) == x.axis:
        raise Rejected("normalises along the batch axis")
    _batched_outputs(outs, [x.axis])


def _layer_norm(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    if any(v is not None and v.batched for v in ins[1:]):
        raise Rejected("batched scale or bias")
    if not x.axis < _axis(attrs, x.rank, -1):
        raise Rejected("normalises across the batch axis")
    _batched_outputs(outs, [x.axis] * len(outs))


def _known_ints(info) -> list[int] | None:
    if info is None or info.value is None:
        return None
    return [int(v) for v in np.asarray(info.value).reshape(-1)]


def _reduce(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    if len(ins) > 1 and ins[1] is not None:
        axes = _known_ints(contents[1])
        if axes is None or ins[1].batched:
            raise Rejected("reduction axes computed from data")
    else:
        axes = attrs.get("axes")
        axes = None if axes is None else [int(a) for a in axes]
    if not axes:
        if int(attrs.get("noop_with_empty_axes", 0)):
            _batched_outputs(outs, [x.axis])
            return
        raise Rejected("reduces every axis, the batch's too")
    axes = [a + x.rank if a < 0 else a for a in axes]
    if x.axis in axes:
        raise Rejected("reduces along the batch axis")
    keep = int(attrs.get("keepdims", 1))
    _batched_outputs(outs, [x.axis if keep else x.axis - sum(a < x.axis for a in axes)])


def _arg(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    axis = _axis(attrs, x.rank, 0)
    if axis == x.axis:
        raise Rejected("along the batch axis")
    keep = int(attrs.get("keepdims", 1))
    _batched_outputs(outs, [x.axis if keep or x.axis < axis else x.axis - 1])


def _topk(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    if _axis(attrs, x.rank, -1) == x.axis:
        raise Rejected("along the batch axis")
    _batched_outputs(outs, [x.axis] * len(outs))


def _concat(attrs, opset, ins, outs, contents) -> None:
    first = next(v for v in ins if v is not None)
    if any(v is None or not v.batched or v.axis != first.axis for v in ins):
        raise Rejected("joins batched and unbatched values")
    if _axis(attrs, first.rank, 0) == first.axis:
        raise Rejected("joins along the batch axis")
    _batched_outputs(outs, [first.axis])


def _split(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    if _axis(attrs, x.rank, 0) == x.axis:
        raise Rejected("splits along the batch axis")
    _batched_outputs(outs, [x.axis] * len(outs))


def _slice(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    if opset < 10:
        axes = attrs.get("axes")
        starts = attrs.get("starts")
        axes = list(range(len(starts or ()))) if axes is None else [int(a) for a in axes]
    else:
        starts = _known_ints(contents[1]) if len(contents) > 1 else None
        if starts is None:
            raise Rejected("slice bounds computed from data")
        if any(v is not None and v.cls != UNBATCHED for v in ins[1:]):
            raise Rejected("slice bounds that depend on the batch size")
        if len(ins) > 3 and ins[3] is not None:
            axes = _known_ints(contents[3])
            if axes is None:
                raise Rejected("slice axes computed from data")
        else:
            axes = list(range(len(starts)))
    if x.axis in [a + x.rank if a < 0 else a for a in axes]:
        raise Rejected("slices along the batch axis")
    _batched_outputs(outs, [x.axis])


def _pad(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    if opset < 11:
        pads = [int(p) for p in attrs.get("pads", ())]
        axes = list(range(x.rank))
    else:
        pads = _known_ints(contents[1])
        if pads is None or ins[1].cls != UNBATCHED:
            raise Rejected("pads computed from data")
        axes = _known_ints(contents[3]) if len(ins) > 3 and ins[3] is not None else list(range(x.rank))
        if axes is None:
            raise Rejected("pad axes computed from data")
        if len(ins) > 2 and ins[2] is not None and ins[2].batched:
            raise Rejected("a batched pad value")
    axes = [a + x.rank if a < 0 else a for a in axes]
    if x.axis in axes:
        at = axes.index(x.axis)
        if pads[at] or pads[at + len(axes)]:
            raise Rejected("pads the batch axis")
    _batched_outputs(outs, [x.axis])


def _tile(attrs, opset, ins, outs, contents) -> None:
    x = ins[0]
    repeats = _known_ints(contents[1])
    if repeats is None or ins[1].cls != UNBATCHED or repeats[x.axis] != 1:
        raise Rejected("repeats along the batch axis")
    _batched_outputs(outs, [x.axis])


def _gather(attrs, opset, ins, outs, contents) -> None:
    data, indices = ins[0], ins[1]
    axis = _axis(attrs, data.rank, 0)
    if data.batched and indices.batched:
        raise Rejected("batched indices into batched data")
    if data.batched:
        if axis == data.axis:
            raise Rejected("gathers along the batch axis")
        _batched_outputs(outs, [data.axis if data.axis < axis else data.axis + indices.rank - 1])
    else:  # a table looked up by each sample's indices
        _batched_outputs(outs, [axis + indices.axis])


def _transpose(attrs, opset, ins, outs, contents) -> None:
    x, out = ins[0], outs[0]
    perm = attrs.get("perm")
    perm = list(range(x.rank))[::-1] if perm is None else [int(p) for p in perm]
    _batched_outputs([out], [None])
    if perm[out.axis] != x.axis:
        raise Rejected("moves the batch axis inward")


def _reshaping(attrs, opset, ins, outs, contents) -> None:
    # both ends batched with every axis before the batch's of size 1: sample b's elements
    # are the b-th contiguous chunk of each, in the same order
    _batched_outputs(outs, [None])


def _expand(attrs, opset, ins, outs, contents) -> None:
    x, out = ins[0], outs[0]
    _batched_outputs([out], [out.rank - (x.rank - x.axis)])
    if out.chunk_axis_size != x.chunk_axis_size:
        raise Rejected("broadcasts the batch axis")


def _attention(attrs, opset, ins, outs, contents) -> None:
    """FusedAttention: Q, K, V read through permutations to [*batch, S, D]; the sample axis
    must be one of the logical batch axes, the same for every batched operand."""
    logical = []
    for key, v in zip(("q_perm", "k_perm", "v_perm"), ins[:3]):
        if v is None or not v.batched:
            continue
        perm = attrs.get(key)
        perm = list(range(v.rank)) if perm is None else [int(p) for p in perm]
        at = perm.index(v.axis)
        if at >= v.rank - 2:
            raise Rejected("the batch is an axis of the attention's matrices")
        logical.append(v.rank - at)
    if len(ins) > 3 and ins[3] is not None and ins[3].batched:
        logical.append(ins[3].rank - ins[3].axis)
    if not logical or len(set(logical)) != 1:
        raise Rejected("operands batched on different axes")
    if int(attrs.get("head_group", 1)) > 1 and logical[0] == 3:
        raise Rejected("grouped heads on the batch axis")
    out = outs[0]
    perm = attrs.get("out_perm")
    perm = list(range(out.rank)) if perm is None else [int(p) for p in perm]
    _batched_outputs([out], [perm.index(out.rank - logical[0])])


_RULES = {**{op: _elementwise for op in ELEMENTWISE}, **{op: _image for op in IMAGE},
          **{op: _reduce for op in REDUCE}, **{op: _reshaping for op in RESHAPING},
          "MatMul": _matmul, "nncc::FusedMatMul": _matmul, "Gemm": _gemm, "nncc::FusedGemm": _gemm,
          "Softmax": _softmax, "LogSoftmax": _softmax, "Hardmax": _softmax,
          "LayerNormalization": _layer_norm, "ArgMax": _arg, "ArgMin": _arg, "TopK": _topk,
          "Concat": _concat, "Split": _split, "Slice": _slice, "Pad": _pad, "Tile": _tile,
          "Gather": _gather, "Transpose": _transpose, "Expand": _expand,
          "nncc::FusedAttention": _attention}
