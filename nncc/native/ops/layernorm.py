"""LayerNormalization (nncc/native/norm_gen.py), and the fusion of a residual Add into the
LayerNormalization that reads its sum: one step, each row read once."""

from __future__ import annotations

import math

from nncc.native import norm_gen
from nncc.native.graph_query import is_pair_sum
from nncc.native.ops.entry import Fusion, NativeOp


class LayerNormalization(NativeOp):
    ops = frozenset({("", "LayerNormalization")})

    def refuse(self, node, graph, infos) -> str | None:
        shape = infos[node.inputs[0]].shape
        axis = node.attrs.get("axis", -1) % len(shape)
        n = math.prod(shape[axis:])
        for extra in node.inputs[1:3]:
            if extra and math.prod(infos[extra].shape) != n:
                return "scale or bias broadcast within the normalized axes"
        if len([o for o in node.outputs if o]) > 1:
            return "mean and inverse std outputs"
        return None

    def render(self, writer, node, plan) -> None:
        norm_gen.emit_layernorm(writer, node)


class AddLayerNorm(Fusion):
    """An Add of two same-shape values whose sum one LayerNormalization reads: its claim is
    that LayerNormalization, written with the Add (and not again)."""

    def claim(self, writer, add):
        if not is_pair_sum(add) or add.op_type != "Add" or any(i in writer.deferred for i in add.inputs):
            return None
        out = add.outputs[0]
        if len(add.inputs) != 2 or add.inputs[0] == add.inputs[1] or any(not i for i in add.inputs):
            return None
        if any(writer.shape(i) != writer.shape(out) for i in add.inputs):
            return None  # a broadcast: not a residual connection
        norms = [n for n in writer.consumers.get(out, []) if not n.domain and n.op_type == "LayerNormalization"]
        if len(norms) != 1 or norms[0].inputs[0] != out or id(norms[0]) in writer.absorbed:
            return None
        norm = norms[0]
        if len([o for o in norm.outputs if o]) != 1 or norm.inputs.count(out) != 1:
            return None
        if any(p not in writer.graph.initializers for p in norm.inputs[1:3] if p):
            return None  # computed parameters may not exist yet where the Add is written
        return norm

    def render(self, writer, add, norm) -> None:
        norm_gen.emit_add_layernorm(writer, add, norm)


ENTRY = LayerNormalization()
ADD_LAYERNORM = AddLayerNorm()
