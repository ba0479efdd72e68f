"""Constant folding: subgraphs fed only by constants are evaluated once, at compile time.

* A node whose inputs are all initializers (or omitted) and whose kernel is deterministic is
  run with its own kernel and replaced by initializers; the values propagate to later nodes
  (one walk in topological order).
* ConstantOfShape becomes a zero-copy, read-only splat ``np.broadcast_to(value, shape)``;
  layout ops of a splat stay splats, and large elementwise results are computed only along
  the axes where an input varies, then broadcast (a splat times a per-channel scale stores
  one value per channel). So the light models, which build every weight with
  ConstantOfShape, never materialize hundreds of megabytes.
* Shape and Size of a value whose inferred shape is fully static become constants, after
  which Gather/Concat/Unsqueeze/... chains fold through the rule above. Likewise any output
  whose contents shape inference knows (e.g. Gather(Shape(x), 1) = 3 when only x's batch
  dimension is symbolic) becomes a constant.
* Graph inputs are never folded; a graph output that becomes constant stays, as an
  initializer under its own name.
* A folded result much larger than the constants it is computed from (Expand, Tile, Range
  of a small input to a huge tensor) is left to run time rather than stored in the plan.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import NnccError
from nncc.ir.graph import Graph, Node, TensorInfo, topological_order
from nncc.kernels.registry import Ctx, resolve
from nncc.ir.splats import is_splat, stored_elements
from nncc.passes.cleanup import (
    frozen,
    node_subgraphs,
    rebuild,
    subgraph_references,
)
from nncc.passes.shape_inference import infer_shapes

# A folded output may always have this many elements; beyond, at most GROWTH times the
# elements stored behind its inputs.
SMALL_ELEMENTS = 1 << 16
GROWTH = 2

# Ops computing each output element from the matching (broadcast) input elements only:
# with every input a splat, the output is the splat of the op applied to one element.
_ELEMENTWISE = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "Cast", "Ceil",
    "Clip", "Cos", "Cosh", "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu", "Greater",
    "GreaterOrEqual", "HardSigmoid", "HardSwish", "IsInf", "IsNaN", "LeakyRelu", "Less",
    "LessOrEqual", "Log", "Max", "Mean", "Min", "Mod", "Mul", "Neg", "Not", "Or", "Pow",
    "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus",
    "Softsign", "Sqrt", "Sub", "Sum", "Tan", "Tanh", "Where", "Xor",
})
# Ops that only move elements of input 0 around (the other inputs are shape parameters).
_LAYOUT = frozenset({
    "Expand", "Flatten", "Identity", "Reshape", "Squeeze", "Tile", "Transpose", "Unsqueeze",
})
_SHAPE_OF = frozenset({"Shape", "Size"})
# Ops whose output can be far larger than their inputs: without a predicted output size
# (shape inference failed) they are never folded, so folding never materializes a tensor
# that only the run-time bounds (nncc.util.limits) would have refused.
_GROWING = frozenset({"Expand", "OneHot", "Pad", "Range", "Resize", "Tile", "Upsample"})


def fold_constants(graph: Graph) -> Graph:
    """Evaluate constant subgraphs (see the module docstring); returns a new Graph."""
    try:
        infos = infer_shapes(graph)
    except NnccError:
        infos = {}  # no shape facts: plain constant folding still works
    consts: dict[str, np.ndarray] = dict(graph.initializers)
    needed_later = set(graph.outputs) | subgraph_references(graph)
    kept: list[Node] = []
    folded: dict[str, None] = {}  # ordered: the plan must not depend on hash seeds
    for node in topological_order(graph):
        results = _try_fold(graph, node, consts, infos)
        if results is None:
            kept.append(node)
            continue
        for name, value in zip(node.outputs, results):
            if name:
                consts[name] = value
                folded[name] = None

    if not folded:
        return rebuild(graph)
    used = {n for node in kept for n in node.inputs if n} | needed_later
    initializers = dict(graph.initializers)
    values = dict(graph.values)
    for name in folded:
        if name in used:
            initializers[name] = consts[name]
            values[name] = TensorInfo.of(consts[name], keep_value=False)
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    kept.sort(key=lambda node: order[id(node)])  # keep the file order of what remains
    return rebuild(graph, nodes=kept, initializers=initializers, values=values)


def _try_fold(graph: Graph, node: Node, consts: dict, infos: dict) -> list[np.ndarray] | None:
    """The node's outputs as constants, or None when it must stay in the graph."""
    if node_subgraphs(node) or not any(node.outputs):
        return None
    opset = graph.opset(node.domain)
    try:
        definition = resolve(node.op_type, node.domain, opset)
    except NnccError:
        return None
    if not definition.deterministic:
        return None
    ctx = Ctx(node.attrs, opset, len(node.outputs), node.name)
    standard = node.domain == ""
    all_const = all(not name or name in consts for name in node.inputs)
    try:
        if not all_const:
            if standard and node.op_type in _SHAPE_OF and node.inputs and node.inputs[0]:
                folded = _fold_shape_of(definition, ctx, infos.get(node.inputs[0]))
                if folded is not None:
                    return folded
            return _known_from_inference(node, infos)
        args = [consts[name] if name else None for name in node.inputs]
        if standard and node.op_type == "Dropout" and _training(args, opset):
            return None  # random in training mode: every run differs
        if standard and node.op_type == "ConstantOfShape":
            return _constant_of_shape(ctx, args[0] if args else None)
        predicted = _predicted_outputs(node, infos)
        if standard and predicted is not None and len(predicted) == 1:
            out = next(name for name in node.outputs if name)
            splat = _fold_splat(node, definition, ctx, args, tuple(infos[out].shape))
            if splat is not None:
                return splat
        if predicted is None and node.op_type in _GROWING:
            return None
        if predicted is not None:
            stored = sum(stored_elements(a) for a in args if a is not None)
            limit = max(SMALL_ELEMENTS, GROWTH * stored)
            if any(size is None or size > limit for size in predicted):
                return None
        result = definition.fn(ctx, *args)
    except Exception:  # noqa: BLE001 - a node that fails now fails at run time, with context
        return None
    results = result if isinstance(result, tuple) else (result,)
    if len(results) < len(node.outputs) and any(node.outputs[len(results):]):
        return None
    if any(name and r is None for name, r in zip(node.outputs, results)):
        return None
    if any(isinstance(r, list) for r in results):
        return None  # a sequence is not a tensor constant
    return [None if r is None else frozen(r) for r in results]


def _training(args, opset: int) -> bool:
    """Dropout whose (constant) training_mode input is set, with a non-zero ratio."""
    if opset < 12 or len(args) < 3 or args[2] is None:
        return False
    if not bool(np.asarray(args[2]).reshape(-1)[0]):
        return False
    return args[1] is None or float(np.asarray(args[1]).reshape(-1)[0]) != 0.0


def _known_from_inference(node: Node, infos: dict) -> list[np.ndarray | None] | None:
    """Outputs whose contents shape inference already knows although some input is only
    known by its shape: e.g. Gather(Shape(x), 1) when x is [N, 3, 8, 8] gives 3."""
    results: list[np.ndarray | None] = []
    for name in node.outputs:
        info = infos.get(name) if name else None
        if name and (info is None or info.value is None):
            return None
        results.append(frozen(info.value) if name else None)
    return results


def _predicted_outputs(node: Node, infos: dict) -> list[int | None] | None:
    """Element counts of the node's outputs from shape inference (None: unknown)."""
    sizes = []
    for name in node.outputs:
        if not name:
            continue
        info = infos.get(name)
        if info is None or not info.is_static:
            return None
        sizes.append(int(np.prod(info.shape, dtype=np.int64)))
    return sizes


def _fold_shape_of(definition, ctx: Ctx, info: TensorInfo | None) -> list[np.ndarray] | None:
    """Shape/Size of a value with a fully static inferred shape, whatever its contents."""
    if info is None or not info.is_static:
        return None
    dtype = info.dtype if info.dtype is not None else np.dtype(np.float32)
    stand_in = np.broadcast_to(np.zeros((), dtype=dtype), info.shape)  # no memory
    result = definition.fn(ctx, stand_in)
    return [frozen(result)]


def _constant_of_shape(ctx: Ctx, shape: np.ndarray | None) -> list[np.ndarray] | None:
    value = ctx.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1 or shape is None:
        return None
    dims = [int(d) for d in np.asarray(shape).reshape(-1)]
    if any(d < 0 for d in dims):
        return None
    return [np.broadcast_to(value.reshape(()), tuple(dims))]  # read-only, zero strides


def _fold_splat(node: Node, definition, ctx: Ctx, args, shape: tuple[int, ...]) -> list[np.ndarray] | None:
    """Large outputs of broadcast constants, computed without materializing them.

    ``shape`` is the inferred static output shape. Layout ops of a splat give the splat of
    the output shape. Elementwise ops are computed only along the axes where some input
    varies (the others hold zero strides or size 1 in every input) and broadcast back, so a
    splat weight times a per-channel scale stores one value per channel.
    """
    size = int(np.prod(shape, dtype=np.int64))
    if size <= SMALL_ELEMENTS:
        return None  # small: the plain kernel is fine
    if node.op_type in _LAYOUT:
        data = args[0]
        if data is None or not is_splat(data):
            return None
        if node.op_type not in ("Expand", "Tile") and data.size != size:
            return None
        return [np.broadcast_to(_first(data), shape)]
    if node.op_type not in _ELEMENTWISE or "broadcast" in node.attrs:
        return None  # (opset < 7 axis-based broadcasting: not numpy's alignment)
    present = [a for a in args if a is not None]
    rank = len(shape)
    if not present or any(a.ndim > rank for a in present):
        return None
    aligned = [None if a is None else a.reshape((1,) * (rank - a.ndim) + a.shape) for a in args]
    varying = [any(a.shape[i] > 1 and a.strides[i] != 0 for a in aligned if a is not None)
               for i in range(rank)]
    compact = int(np.prod([d for d, v in zip(shape, varying) if v], dtype=np.int64))
    stored = sum(stored_elements(a) for a in present)
    if compact == size or compact > max(SMALL_ELEMENTS, GROWTH * stored):
        return None  # nothing to gain: the ordinary path decides
    index = tuple(slice(None) if v else slice(0, 1) for v in varying)
    compressed = [None if a is None else a[index] for a in aligned]
    result = frozen(definition.fn(ctx, *compressed))
    if result.ndim != rank:
        return None
    return [np.broadcast_to(result, shape)]


def _first(array: np.ndarray) -> np.ndarray:
    """The first element of a non-empty array, as a 0-d array of its dtype."""
    return np.array(array[(0,) * array.ndim], dtype=array.dtype)
