"""Static dtype and shape inference, with value propagation for small constants.

Each node's kernel has a shape function; running them in topological order gives every
value a TensorInfo. When all of a node's inputs are known at compile time and its output
is small, the kernel itself is evaluated so that shape arithmetic (Shape -> Gather ->
Concat -> Reshape) resolves to exact static shapes.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import NnccError, ShapeInferenceError
from nncc.ir.graph import Graph, TensorInfo, topological_order
from nncc.kernels.registry import Ctx, resolve
from nncc.kernels.shapes import numel
from nncc.util.limits import MAX_RANK

# Outputs up to this many elements are computed when all inputs are constants.
VALUE_PROPAGATION_LIMIT = 4096


def infer_shapes(graph: Graph, inputs: dict[str, TensorInfo] | None = None) -> dict[str, TensorInfo]:
    """TensorInfo for every value of ``graph``.

    ``inputs`` binds graph inputs to concrete infos (for example the shapes of the arrays
    about to be fed, which binds symbolic batch dimensions); otherwise declared infos are used.
    """
    infos: dict[str, TensorInfo] = {
        name: TensorInfo.of(array) for name, array in graph.initializers.items()
    }
    given = inputs or {}
    for name in graph.inputs:
        infos[name] = given.get(name) or graph.values.get(name) or TensorInfo(None, None)
    for node in topological_order(graph):
        opset = graph.opset(node.domain)
        definition = resolve(node.op_type, node.domain, opset)
        ctx = Ctx(node.attrs, opset, len(node.outputs), node.name)
        args = [infos[name] if name else None for name in node.inputs]
        outs = infer_outputs(definition, ctx, args, node.label(), node.outputs)
        for name, info in zip(node.outputs, outs):
            if name:
                infos[name] = info
    return infos


def infer_outputs(definition, ctx, args: list[TensorInfo | None], label: str,
                  outputs: list) -> list[TensorInfo]:
    """One node's output infos from its input infos: the kernel's shape function, and the
    kernel itself when every input's value is known and the outputs are small. ``outputs``
    names (or numbers) the node's outputs, falsy for an omitted one."""
    outs = _run_shape_function(definition, ctx, args, label, len(outputs))
    if definition.deterministic and _all_known(args) and _small(outs):
        outs = _evaluate(definition, ctx, args, label) or outs
    if len(outs) < len([o for o in outputs if o]):
        raise ShapeInferenceError(f"{label}: shape function gave too few outputs")
    for name, info in zip(outputs, outs):
        if info.shape is not None and len(info.shape) > MAX_RANK:
            raise ShapeInferenceError(f"{label}: output {name!r} would have rank {len(info.shape)}; "
                                      f"at most {MAX_RANK} dimensions are supported")
    return outs


def _run_shape_function(definition, ctx, args, label: str, n_outputs: int) -> list[TensorInfo]:
    try:
        return list(definition.shape(ctx, *args))
    except ShapeInferenceError as exc:
        raise ShapeInferenceError(f"{label}: {exc}") from None
    except Exception as exc:
        if all(a is None or (a.dtype is not None and a.is_static) for a in args):
            raise ShapeInferenceError(f"{label}: {type(exc).__name__}: {exc}") from exc
        # Partially unknown inputs may defeat a shape function: the values stay unknown.
        return [TensorInfo(None, None) for _ in range(n_outputs)]


def _all_known(args: list[TensorInfo | None]) -> bool:
    return all(a is None or a.value is not None for a in args)


def _small(outs: list[TensorInfo]) -> bool:
    sizes = [numel(o.shape) for o in outs]
    return all(s is not None and s <= VALUE_PROPAGATION_LIMIT for s in sizes)


def _evaluate(definition, ctx, args, label: str) -> list[TensorInfo] | None:
    try:
        result = definition.fn(ctx, *[a.value if a is not None else None for a in args])
    except NnccError as exc:
        raise ShapeInferenceError(f"{label}: {exc}") from None
    except (ValueError, IndexError, TypeError, FloatingPointError) as exc:
        # what the executor reports as a kernel failing on its values (KernelError), here
        # on the model's own constants: the model is inconsistent
        raise ShapeInferenceError(f"{label}: {exc}") from None
    results = result if isinstance(result, tuple) else (result,)
    return [TensorInfo.of(np.asarray(r)) for r in results]
