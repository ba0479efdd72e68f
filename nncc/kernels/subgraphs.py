"""Running and shape-inferring the subgraphs of control-flow nodes (If, Loop, Scan,
SequenceMap).

A node's subgraphs read outer-scope values through its trailing inputs, named by the
CAPTURES attribute (see nncc.ir.graph); a subgraph runs on the reference interpreter, built
once per node and kept in the node's scratch, with those values bound by name.
"""

from __future__ import annotations

import threading

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import CAPTURES, TENSOR, Graph, TensorInfo, closed

UNKNOWN = TensorInfo(None, None)


def split_args(ctx, args) -> tuple[list, dict]:
    """(the op's own inputs, {captured name: value}) from a node's inputs."""
    captures = ctx.attrs.get(CAPTURES) or []
    if not captures:
        return list(args), {}
    own = len(args) - len(captures)
    return list(args[:own]), dict(zip(captures, args[own:]))


def subgraph(ctx, key: str) -> Graph:
    """Subgraph attribute ``key`` of the node (an artifact may lack it: a clear error)."""
    graph = ctx.attrs.get(key)
    if not isinstance(graph, Graph):
        raise KernelError(f"{ctx.name or 'node'}: attribute {key!r} must be a subgraph")
    return graph


def required(ctx, key: str):
    """A required attribute, or a clear error when it is missing."""
    if key not in ctx.attrs:
        raise KernelError(f"{ctx.name or 'node'}: required attribute {key!r} is missing")
    return ctx.attrs[key]


def run_body(ctx, key: str, feeds: list, outer: dict) -> list:
    """Run subgraph attribute ``key`` on its inputs ``feeds`` (by position)."""
    graph = subgraph(ctx, key)
    cached = ctx.scratch.get(key)
    if cached is None or cached[0] is not graph:
        from nncc.runtime.interpreter import Interpreter  # lazy: start-up

        cached = (graph, Interpreter(closed(graph, ctx.attrs.get(CAPTURES) or [])))
        ctx.scratch[key] = cached
    values = dict(outer)
    values.update(zip(graph.inputs, feeds))
    result = cached[1].execute(values)
    return [result[name] for name in graph.outputs]


# Loop bodies are inferred a few times each (to a fixpoint), so nested loops multiply the
# work: below this many levels of subgraphs, their outputs are taken as declared.
MAX_INFERRED_DEPTH = 4
_nesting = threading.local()


def body_infos(ctx, key: str, inputs: list, outer: dict) -> list[TensorInfo]:
    """Inferred infos of subgraph ``key``'s outputs, its inputs bound to ``inputs``."""
    from nncc.passes.shape_inference import infer_shapes  # lazy: start-up

    graph = subgraph(ctx, key)
    depth = getattr(_nesting, "depth", 0)
    if depth >= MAX_INFERRED_DEPTH:
        return [_declared(graph, name) for name in graph.outputs]
    bound = dict(outer)
    bound.update((n, i) for n, i in zip(graph.inputs, inputs) if i is not None)
    _nesting.depth = depth + 1
    try:
        infos = infer_shapes(closed(graph, ctx.attrs.get(CAPTURES) or []), bound)
    except ShapeInferenceError:  # the subgraph then reports its error when it runs
        return [_declared(graph, name) for name in graph.outputs]
    finally:
        _nesting.depth = depth
    return [infos.get(name) or _declared(graph, name) for name in graph.outputs]


def _declared(graph: Graph, name: str) -> TensorInfo:
    info = graph.values.get(name)
    return UNKNOWN if info is None else TensorInfo(info.dtype, info.shape, kind=info.kind)


def variable(info: TensorInfo | None) -> TensorInfo:
    """What is known of a value that may change between iterations: not its contents."""
    if info is None:
        return UNKNOWN
    return TensorInfo(info.dtype, info.shape, kind=info.kind)


def merge(a: TensorInfo | None, b: TensorInfo | None) -> TensorInfo:
    """What holds for a value that is either ``a`` or ``b``."""
    if a is None or b is None:
        return UNKNOWN
    if a.kind != b.kind:
        return UNKNOWN
    dtype = a.dtype if a.dtype == b.dtype else None
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorInfo(dtype, None, kind=a.kind)
    shape = tuple(x if x == y else None for x, y in zip(a.shape, b.shape))
    return TensorInfo(dtype, shape, kind=a.kind)


def carried_infos(ctx, key: str, fixed: list, state: list, outer: dict, first_output: int,
                  after: list = ()):
    """Infos of loop-carried values: a fixpoint over the body, whose inputs are ``fixed``,
    the state, then ``after``, and where state output i is body output ``first_output + i``.
    Returns (state infos, all body output infos)."""
    state = [variable(s) for s in state]
    after = list(after)
    for _ in range(3):
        outs = body_infos(ctx, key, fixed + state + after, outer)
        new = [merge(s, o) for s, o in zip(state, outs[first_output:first_output + len(state)])]
        if new == state:
            return state, outs
        state = new
    state = [TensorInfo(s.dtype, None, kind=s.kind) for s in state]
    return state, body_infos(ctx, key, fixed + state + after, outer)


def owned(value, inputs: list):
    """An output array that is one of the node's inputs (or a view) becomes a copy: the
    executor may reuse an input's memory once its last reader ran."""
    if isinstance(value, np.ndarray) and (value.base is not None or any(value is x for x in inputs)):
        return value.copy()
    return value


def empty_stack(graph: Graph, name: str, axis: int = 0) -> np.ndarray:
    """The stacked scan output of zero iterations: its element shape as declared."""
    info = graph.values.get(name)
    dtype = info.dtype if info is not None and info.dtype is not None else np.dtype(np.float32)
    element = info.shape if info is not None and info.kind == TENSOR and info.shape is not None \
        and all(isinstance(d, int) for d in info.shape) else ()
    shape = list(element)
    shape.insert(axis if axis >= 0 else axis + len(shape) + 1, 0)
    return np.empty(shape, dtype=dtype)
