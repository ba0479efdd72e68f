"""Runs a Graph node by node over numpy arrays: the reference path of nncc.

Kernels are resolved once up front, so an unsupported op fails before anything runs,
and each intermediate is released right after its last use.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from nncc.errors import KernelError, ModelFormatError, NnccError
from nncc.ir.graph import Graph, TensorInfo, topological_order
from nncc.kernels.registry import Ctx, resolve
from nncc.passes.validate import check_attributes
from nncc.runtime.feeds import as_value, check_feeds
from nncc.util.limits import LimitError


class Interpreter:
    def __init__(self, graph: Graph):
        self.graph = graph
        order = topological_order(graph)
        self.steps = []
        for node in order:
            opset = graph.opset(node.domain)
            definition = resolve(node.op_type, node.domain, opset)
            check_attributes(node)
            why = definition.check_inputs([bool(name) for name in node.inputs], node.label())
            if why:
                raise ModelFormatError(why)
            ctx = Ctx(node.attrs, opset, len(node.outputs), node.name)
            self.steps.append((node, definition.fn, ctx))
        self._release_after = self._last_uses(order)

    @property
    def input_infos(self) -> dict[str, TensorInfo]:
        return {name: self.graph.values.get(name, TensorInfo(None, None)) for name in self.graph.inputs}

    def _last_uses(self, order) -> list[list[str]]:
        keep = set(self.graph.outputs) | set(self.graph.initializers)
        last: dict[str, int] = {}
        for index, node in enumerate(order):
            for name in node.inputs:
                if name:
                    last[name] = index
        release: list[list[str]] = [[] for _ in order]
        for name, index in last.items():
            if name not in keep:
                release[index].append(name)
        return release

    def run(self, feeds: Mapping[str, object], *, expected: dict[str, TensorInfo] | None = None) -> dict[str, np.ndarray]:
        """Execute the graph. ``expected`` (name -> TensorInfo) checks each produced value."""
        return self.execute(check_feeds(self.input_infos, feeds), expected)

    def execute(self, values: Mapping[str, object],
                expected: dict[str, TensorInfo] | None = None) -> dict[str, object]:
        """Execute on inputs already checked (a subgraph's, fed by its control-flow node)."""
        env: dict[str, object] = dict(self.graph.initializers)
        env.update(values)
        for (node, fn, ctx), release in zip(self.steps, self._release_after):
            args = [env[name] if name else None for name in node.inputs]
            try:
                result = fn(ctx, *args)
            except LimitError as exc:
                raise LimitError(f"{node.label()}: {exc}") from None
            except NnccError:
                raise
            except (ValueError, FloatingPointError) as exc:  # numpy refusing these values
                # (a TypeError or IndexError is a bug in the kernel: it keeps its traceback)
                raise KernelError(f"{node.label()} failed: {exc}") from exc
            except MemoryError:  # numpy refused an allocation before touching it
                raise LimitError(f"{node.label()} needs more memory than this machine can give") from None
            results = result if isinstance(result, tuple) else (result,)
            for name, value in zip(node.outputs, results):
                if name:
                    env[name] = as_value(value)
                    if expected is not None and isinstance(env[name], np.ndarray):
                        _check_against(node, name, env[name], expected.get(name))
            for name in release:
                env.pop(name, None)
        return {name: env[name] for name in self.graph.outputs}


def _check_against(node, name: str, value: np.ndarray, info: TensorInfo | None) -> None:
    """Debug aid for tests: inferred dtype/shape must match what the kernel produced."""
    if info is None:
        raise AssertionError(f"{node.label()}: no inferred info for {name!r}")
    if info.dtype is not None and info.dtype != value.dtype:
        raise AssertionError(f"{node.label()}: {name!r} inferred {info.dtype}, produced {value.dtype}")
    if info.shape is not None:
        ok = len(info.shape) == value.ndim and all(
            not isinstance(d, int) or d == s for d, s in zip(info.shape, value.shape)
        )
        if not ok:
            raise AssertionError(
                f"{node.label()}: {name!r} inferred shape {info.shape}, produced {value.shape}"
            )
