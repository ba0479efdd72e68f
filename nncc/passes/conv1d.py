"""1-D convolutions as 2-D ones (-O2): a Conv or nncc FusedConv over [N, C, L] becomes
Unsqueeze to [N, C, 1, L], the 2-D convolution with weights [K, C/g, 1, kL] and the neutral
values on the new axis (stride and dilation 1, no padding), and Squeeze back. Unsqueeze and
Squeeze alias their input in native code, so audio and sequence models (Whisper's stem,
wav2vec's feature extractor) run their convolutions on the tuned 2-D kernels.

Only a convolution whose weights are a constant of rank 3 is rewritten (its input is then
[N, C, L]); its weights get the new axis as a view of the original, which is then dead.
"""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.passes.cleanup import all_names, frozen, fresh_name, rebuild

_CONVS = {("", "Conv"), ("nncc", "FusedConv")}


def conv1d_as_2d(graph: Graph) -> Graph:
    taken: set[str] | None = None
    nodes: list[Node] = []
    initializers = dict(graph.initializers)
    axes_name = None
    for node in graph.nodes:
        w = graph.initializers.get(node.inputs[1]) if len(node.inputs) > 1 else None
        if (node.domain, node.op_type) not in _CONVS or w is None or w.ndim != 3 or not node.inputs[0] \
                or len(node.outputs) != 1 or not node.outputs[0] or not _well_formed(node.attrs):
            nodes.append(node)
            continue
        if taken is None:
            taken = all_names(graph)
        stem = node.name or node.outputs[0]
        w2 = fresh_name(f"{node.inputs[1]}/2d", taken)
        initializers[w2] = frozen(np.asarray(w)[:, :, None, :])
        x2, y2 = fresh_name(f"{node.inputs[0]}/2d", taken), fresh_name(f"{node.outputs[0]}/2d", taken)
        axes_attr, axes_inputs = {}, []
        if graph.opset("") >= 13:  # Unsqueeze and Squeeze take their axes as an input
            if axes_name is None:
                axes_name = fresh_name("conv1d/axis2", taken)
                initializers[axes_name] = frozen(np.array([2], np.int64))
            axes_inputs = [axes_name]
        else:
            axes_attr = {"axes": [2]}
        nodes.append(Node("Unsqueeze", [node.inputs[0], *axes_inputs], [x2], dict(axes_attr), "", f"{stem}/unsqueeze"))
        nodes.append(Node(node.op_type, [x2, w2, *node.inputs[2:]], [y2], _attrs_2d(node.attrs), node.domain,
                          node.name))
        nodes.append(Node("Squeeze", [y2, *axes_inputs], [node.outputs[0]], dict(axes_attr), "", f"{stem}/squeeze"))
    if taken is None:
        return rebuild(graph)
    values = dict(graph.values)
    values.update({name: TensorInfo.of(initializers[name], keep_value=False)
                   for name in initializers if name not in graph.initializers})
    return rebuild(graph, nodes=nodes, initializers=initializers, values=values)


def _attrs_2d(attrs: dict) -> dict:
    """The 1-D convolution's attributes over [1, L]: the new axis strides, dilates and pads
    by the neutral values."""
    out = dict(attrs)
    for key, neutral in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if attrs.get(key):
            out[key] = [neutral, *attrs[key]]
    if attrs.get("pads"):
        begin, end = attrs["pads"]
        out["pads"] = [0, begin, 0, end]
    return out


def _well_formed(attrs: dict) -> bool:
    """One value per spatial axis (two pads): anything else the Conv kernel reports as it is."""
    return all(len(attrs.get(key) or [0] * n) == n for key, n in
               (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("pads", 2)))
