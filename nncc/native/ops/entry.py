"""What a native op entry is (``NativeOp``) and what a fusion is (``Fusion``).

An entry owns the nodes its ``takes`` matches: the first entry of the registry that takes
a node both checks it (``check``: why not, None when it can) and writes it (``plan`` then
``render``), so a node that passes the check always has a writer. The checks every entry
shares are here once: the static float32 values most C steps need (``float_values``,
over ``data_inputs``); the size limits every node gets are codegen's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo

F32 = np.dtype(np.float32)


def static_f32(info: TensorInfo | None) -> bool:
    return info is not None and info.dtype == F32 and info.is_static


def static_values_refused(node: Node, infos: dict[str, TensorInfo], inputs) -> str | None:
    """The first of ``inputs`` and the node's outputs that is not a static float32 tensor."""
    for name in [n for n in inputs if n] + [o for o in node.outputs if o]:
        if not static_f32(infos.get(name)):
            return f"value {name!r} is not a static float32 tensor"
    return None


class NativeOp:
    """One op or op family the native backend writes as C.

    ``ops``: the (domain, op_type) pairs it may take, which ``takes`` matches by default
    and the registry lists. ``float_values``: every data input (``data_inputs``) and
    output must be a static float32 tensor before ``refuse`` is asked. ``own_layout``: the
    entry reads blocked (NCHWc) inputs itself; otherwise the writer makes them plain
    first, after ``render_blocked`` (when ``blocked``) had its chance to keep the layout.
    """

    ops: frozenset[tuple[str, str]] = frozenset()
    float_values = True
    own_layout = False
    blocked = False

    def takes(self, node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> bool:
        return (node.domain, node.op_type) in self.ops

    def data_inputs(self, node: Node) -> list[str]:
        return list(node.inputs)

    def check(self, node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
        if self.float_values:
            why = static_values_refused(node, infos, self.data_inputs(node))
            if why is not None:
                return why
        return self.refuse(node, graph, infos)

    def refuse(self, node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
        """Why this entry cannot write ``node``, its values being as ``float_values`` asks."""
        return None

    def plan(self, writer, node: Node) -> Any:
        """The step's geometry, computed once for ``render`` (None where there is none)."""
        return None

    def render(self, writer, node: Node, plan: Any) -> None:
        raise NotImplementedError

    def render_blocked(self, writer, node: Node) -> bool:
        """Write ``node`` over the blocked layout of its input; False: not in this case."""
        return False


class Generated(NativeOp):
    """An entry whose generator module both decides and writes, checking every value
    itself (quantized, integer or optional inputs): ``generator.check(node, graph, infos)``
    and ``generator.emit(writer, node)``."""

    generator: Any = None
    float_values = False

    def check(self, node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
        return self.generator.check(node, graph, infos)

    def render(self, writer, node: Node, plan: Any) -> None:
        self.generator.emit(writer, node)


class Fusion:
    """A node written together with a neighbour, when the writer's state allows it (a
    residual Add into the convolution before it, an Add into the LayerNormalization
    after it). The node's own entry has checked it; a fusion only changes how it is
    written, after its inputs were made plain."""

    def claim(self, writer, node: Node) -> Any:
        """What ``node`` is written with (truthy), or None: written as its entry says."""
        raise NotImplementedError

    def render(self, writer, node: Node, claim: Any) -> None:
        raise NotImplementedError
