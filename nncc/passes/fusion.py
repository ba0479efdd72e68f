"""Algebraic fusions (-O2).

* ``fold_batchnorm_into_conv``: Conv(X, W, [B]) -> BatchNormalization (inference) becomes
  one Conv with per-output-channel rescaled weights and a new bias.
* ``fold_scale_shift_into_conv``: Conv -> Mul or Add by a per-output-channel constant
  folds into the Conv's weights and bias.
* ``batchnorm_to_scale_shift``: inference BatchNormalization (not after a Conv) -> any
  per-channel constant Mul / Add / Sub becomes ``nncc::ScaleShift(X, scale, shift)``
  (see nncc.kernels.affine).
* ``matmul_add_to_gemm``: MatMul(A, constant 2-D B) -> Add(constant bias over the last
  axis) becomes ``nncc::FusedMatMul(A, B, bias)`` (A of any rank, unlike ONNX Gemm).
* ``fold_pad_into_conv``: a zero Pad of the spatial axes before a Conv becomes its pads.
* ``fuse_spelled_activations``: HardSwish, SiLU and Mish spelled out in elementwise ops
  become one node (the ONNX op at the model's opset, else nncc's), recognised by what they
  compute; ``fuse_spelled_gelu`` does the same for GELU after a value no product absorbed.
* ``fuse_activation``: Conv / Gemm / MatMul / FusedMatMul / ScaleShift -> Relu, LeakyRelu,
  Clip (constant bounds), Sigmoid, Tanh, HardSigmoid, HardSwish, SiLU or Mish becomes
  ``nncc::FusedConv`` / ``FusedGemm`` / ``FusedMatMul`` / ``ScaleShift`` with an
  ``activation`` attribute (see nncc.kernels.fused). A Gemm or MatMul by a constant matrix
  also takes a GELU: the ONNX Gelu op, or GELU spelled out in elementwise ops as exporters
  write it (erf or tanh form), recognised by what it computes rather than by its spelling.

A pattern only fuses when the intermediate value has exactly one consumer (the second op),
is not a graph output and is not captured by a subgraph. Each pass builds its producer and
consumer maps once and makes one sweep over the nodes.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import NnccError
from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.passes.cleanup import all_names, fresh_name, rebuild, subgraph_references
from nncc.passes.shape_inference import infer_shapes

NNCC = "nncc"


class Rewriter:
    """Collects node replacements and removals, then builds the new Graph in one go."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.consumers = graph.consumers()
        self.pinned = set(graph.outputs) | subgraph_references(graph)
        self.replace: dict[int, Node] = {}
        self.drop: set[int] = set()
        self.new_initializers: dict[str, np.ndarray] = {}
        self._taken: set[str] | None = None

    def sole_consumer(self, value: str) -> Node | None:
        """The only node reading ``value``, if it reads it once and nothing else needs it."""
        users = self.consumers.get(value, [])
        if value in self.pinned or len(users) != 1:
            return None
        user = users[0]
        if sum(1 for name in user.inputs if name == value) != 1:
            return None
        if id(user) in self.drop or id(user) in self.replace:
            return None
        return user

    def constant(self, name: str) -> np.ndarray | None:
        return self.graph.initializers.get(name) if name else None

    def add_initializer(self, base: str, array: np.ndarray) -> str:
        if self._taken is None:
            self._taken = all_names(self.graph)
        name = fresh_name(base, self._taken)
        self.new_initializers[name] = array
        return name

    def fuse(self, first: Node, second: Node, fused: Node) -> None:
        """``fused`` takes ``first``'s place in the node list; ``second`` disappears."""
        self.replace[id(first)] = fused
        self.drop.add(id(second))

    def result(self) -> Graph:
        graph = self.graph
        if not self.replace and not self.drop:
            return rebuild(graph)
        nodes = []
        for node in graph.nodes:
            if id(node) in self.drop:
                continue
            nodes.append(self.replace.get(id(node), node))
        initializers = dict(graph.initializers)
        initializers.update(self.new_initializers)
        values = dict(graph.values)
        for name, array in self.new_initializers.items():
            values[name] = TensorInfo.of(array, keep_value=False)
        opsets = dict(graph.opsets)
        if any(node.domain == NNCC for node in self.replace.values()):
            opsets.setdefault(NNCC, 1)
        return rebuild(graph, nodes=nodes, initializers=initializers, values=values, opsets=opsets)


# --------------------------------------------------------------------------- BN folding


def bn_foldable(graph: Graph, bn: Node, rewriter: Rewriter) -> bool:
    if int(bn.attrs.get("training_mode", 0)) or int(bn.attrs.get("spatial", 1)) == 0:
        return False
    if len(bn.inputs) != 5 or not bn.outputs or not bn.outputs[0]:
        return False
    for extra in bn.outputs[1:]:  # running statistics (training outputs) must be unused
        if extra and (extra in rewriter.pinned or rewriter.consumers.get(extra)):
            return False
    return True


def _scale_rows(w: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """``w * factor`` along axis 0, keeping a weight that is constant per output channel
    (a ConstantOfShape splat, say) as a zero-copy broadcast instead of materializing it."""
    factor = factor.astype(w.dtype)
    if w.ndim >= 1 and w.shape[0] > 0 and w.size > 0 and all(s == 0 for s in w.strides[1:]):
        rows = w[(slice(None),) + (0,) * (w.ndim - 1)] * factor
        rows.flags.writeable = False
        return np.broadcast_to(rows.reshape((-1,) + (1,) * (w.ndim - 1)), w.shape)
    out = w * factor.reshape((-1,) + (1,) * (w.ndim - 1))
    out.flags.writeable = False
    return out


def fold_batchnorm_into_conv(graph: Graph) -> Graph:
    """Conv (constant W, optional constant B) -> BatchNormalization (inference mode, all
    four parameters constant, the Conv output read only by the BN) becomes one Conv with
    ``W' = W * s`` and ``B' = (B - mean) * s + bias`` where ``s = scale / sqrt(var + eps)``."""
    rw = Rewriter(graph)
    for conv in graph.nodes:
        if conv.op_type != "Conv" or conv.domain != "" or len(conv.outputs) != 1:
            continue
        if len(conv.inputs) < 2 or not conv.inputs[0]:
            continue
        bn = rw.sole_consumer(conv.outputs[0])
        if bn is None or bn.op_type != "BatchNormalization" or bn.domain != "":
            continue
        if bn.inputs[0] != conv.outputs[0] or not bn_foldable(graph, bn, rw):
            continue
        w = rw.constant(conv.inputs[1])
        b = rw.constant(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if w is None or w.dtype.kind != "f" or w.ndim < 3 or w.shape[0] == 0:
            continue
        if len(conv.inputs) > 2 and conv.inputs[2] and b is None:
            continue  # a bias computed at run time
        params = [rw.constant(name) for name in bn.inputs[1:5]]
        m = w.shape[0]
        if any(p is None or p.dtype.kind != "f" or p.size != m for p in params):
            continue
        if b is not None and b.size != m:
            continue
        scale, bias, mean, var = (p.reshape(-1).astype(np.float64) for p in params)
        eps = float(bn.attrs.get("epsilon", 1e-5))
        factor = scale / np.sqrt(var + eps)
        base = b.reshape(-1).astype(np.float64) if b is not None else np.zeros(m)
        new_b = ((base - mean) * factor + bias).astype(w.dtype)
        new_b.flags.writeable = False
        stem = bn.outputs[0]
        w_name = rw.add_initializer(f"{stem}/folded_W", _scale_rows(w, factor))
        b_name = rw.add_initializer(f"{stem}/folded_B", new_b)
        fused = Node("Conv", [conv.inputs[0], w_name, b_name], [bn.outputs[0]],
                     dict(conv.attrs), "", conv.name or bn.name)
        rw.fuse(conv, bn, fused)
    return rw.result()


# --------------------------------------------------------------------------- Conv + Mul/Add


def _per_channel(c: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """A constant that, broadcast against a Conv output of ``rank``, varies at most along
    the channel axis: its values per output channel (length ``channels``), else None."""
    if c is None or c.dtype.kind != "f" or c.ndim > rank:
        return None
    if c.size == 1:
        return np.full(channels, c.reshape(-1)[0], dtype=np.float64)
    shape = (1,) * (rank - c.ndim) + tuple(c.shape)
    if shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return c.reshape(-1).astype(np.float64)


def fold_scale_shift_into_conv(graph: Graph) -> Graph:
    """Conv -> Mul or Add by a constant that varies only per output channel (how some
    exporters write inference BatchNormalization, e.g. light_inception_v2) folds into the
    Conv: ``W' = W * s, B' = B * s`` for Mul and ``B' = B + t`` for Add. Applied until no
    more fold, so Conv -> Mul -> Add chains become one Conv and activations can then fuse."""
    while True:
        rw = Rewriter(graph)
        folded = False
        for conv in graph.nodes:
            if conv.op_type != "Conv" or conv.domain != "" or len(conv.outputs) != 1:
                continue
            if len(conv.inputs) < 2 or not conv.inputs[0] or id(conv) in rw.replace:
                continue
            op = rw.sole_consumer(conv.outputs[0])
            if op is None or op.op_type not in ("Mul", "Add") or op.domain != "" or id(op) in rw.drop:
                continue
            if len(op.inputs) != 2 or conv.outputs[0] not in op.inputs or op.inputs[0] == op.inputs[1]:
                continue
            w = rw.constant(conv.inputs[1])
            b = rw.constant(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
            if w is None or w.dtype.kind != "f" or w.ndim < 3:
                continue
            if len(conv.inputs) > 2 and conv.inputs[2] and b is None:
                continue
            other = op.inputs[1] if op.inputs[0] == conv.outputs[0] else op.inputs[0]
            m = w.shape[0]
            values = _per_channel(rw.constant(other), m, w.ndim)
            if values is None or rw.constant(other).dtype != w.dtype:
                continue
            base = b.reshape(-1).astype(np.float64) if b is not None else np.zeros(m)
            stem = op.outputs[0]
            if op.op_type == "Mul":
                new_w = _scale_rows(w, values)
                new_b = base * values
            else:
                new_w = w
                new_b = base + values
            new_b = new_b.astype(w.dtype)
            new_b.flags.writeable = False
            w_name = conv.inputs[1] if new_w is w else rw.add_initializer(f"{stem}/folded_W", new_w)
            b_name = rw.add_initializer(f"{stem}/folded_B", new_b)
            fused = Node("Conv", [conv.inputs[0], w_name, b_name], [op.outputs[0]],
                         dict(conv.attrs), "", conv.name or op.name)
            rw.fuse(conv, op, fused)
            folded = True
        graph = rw.result()
        if not folded:
            return graph


# --------------------------------------------------------------------------- BN -> ScaleShift

_AFFINE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _bn_inference(graph: Graph, bn: Node, rw: Rewriter) -> bool:
    """``bn`` normalizes with its stored statistics (decided as the BatchNormalization
    kernel decides it) and only its Y output is used."""
    if not bn_foldable(graph, bn, rw):
        return False
    opset, outputs = graph.opset(""), len(bn.outputs)
    if opset >= 14:
        return True  # training_mode checked by bn_foldable
    if opset < 7 and bn.attrs.get("is_test") is not None:
        return bool(bn.attrs["is_test"]) or outputs == 1
    return outputs == 1  # opset 7..13: several outputs mean training mode


def _absorb_per_channel(rw: Rewriter, out: str, dtype: np.dtype, channels: int, rank: int,
                        scale: np.ndarray, shift: np.ndarray) -> tuple[list[Node], str]:
    """Follow ``out`` through Mul / Add / Sub nodes by per-channel constants of ``dtype``,
    composing them into ``scale`` and ``shift`` (float64, updated in place). Returns the
    absorbed nodes and the last value they produce."""
    absorbed: list[Node] = []
    while True:
        op = rw.sole_consumer(out)
        if op is None or op.domain != "" or op.op_type not in ("Mul", "Add", "Sub"):
            break
        if len(op.inputs) != 2 or len(op.outputs) != 1 or not op.outputs[0]:
            break
        first = op.inputs[0] == out
        other = op.inputs[1] if first else op.inputs[0]
        constant = rw.constant(other)
        if constant is None or constant.dtype != dtype:
            break
        values = _per_channel(constant, channels, rank)
        if values is None:
            break
        if op.op_type == "Mul":
            scale *= values
            shift *= values
        elif op.op_type == "Add":
            shift += values
        elif first:  # (x * s + b) - c
            shift -= values
        else:  # c - (x * s + b)
            np.negative(scale, out=scale)
            np.subtract(values, shift, out=shift)
        absorbed.append(op)
        out = op.outputs[0]
    return absorbed, out


def batchnorm_to_scale_shift(graph: Graph) -> Graph:
    """Inference BatchNormalization with constant scale, B, mean and var over a float32 or
    float64 X becomes ``nncc::ScaleShift(X, scale', shift')`` with ``scale' = scale /
    sqrt(var + eps)`` and ``shift' = B - mean * scale'`` (folded in float64, stored in X's
    dtype). Following Mul / Add / Sub nodes by a constant that varies at most along the
    channel axis are absorbed into it: ``(x * s + b) * m + a``. Runs after the Conv folds,
    so this only handles BatchNormalization that could not fold into a Conv; the activation
    fusion then merges a following Relu, Clip, ..."""
    rw = Rewriter(graph)
    candidates = [
        bn for bn in graph.nodes
        if bn.op_type == "BatchNormalization" and bn.domain == "" and len(bn.inputs) == 5
        and bn.inputs[0] and all(name in graph.initializers for name in bn.inputs[1:5])
        and _bn_inference(graph, bn, rw)
    ]
    if not candidates:
        return rw.result()
    try:
        infos = infer_shapes(graph)
    except NnccError:
        return rw.result()  # X's dtype is unknown: leave everything as it is
    absorb = graph.opset("") >= 7  # before: legacy axis-based broadcasting of Mul / Add
    for bn in candidates:
        info = infos.get(bn.inputs[0])
        if info is None or info.dtype not in _AFFINE_DTYPES:
            continue
        rank = info.rank
        if rank is not None and rank < 2:
            continue
        params = [rw.constant(name) for name in bn.inputs[1:5]]
        channels = params[0].size
        if any(p.dtype.kind != "f" or p.ndim != 1 or p.size != channels for p in params):
            continue
        if rank is not None and isinstance(info.shape[1], int) and info.shape[1] != channels:
            continue  # a malformed model: the BatchNormalization kernel reports it
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        eps = float(bn.attrs.get("epsilon", 1e-5))
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = gamma / np.sqrt(var + eps)
        shift = beta - mean * scale
        absorbed, out = [], bn.outputs[0]
        if absorb and rank is not None:
            absorbed, out = _absorb_per_channel(rw, out, info.dtype, channels, rank, scale, shift)
        stem = bn.outputs[0]
        names = []
        for what, array in (("scale", scale), ("shift", shift)):
            array = array.astype(info.dtype)
            array.flags.writeable = False
            names.append(rw.add_initializer(f"{stem}/folded_{what}", array))
        name = bn.name or next((n.name for n in absorbed if n.name), "")
        rw.replace[id(bn)] = Node("ScaleShift", [bn.inputs[0]] + names, [out], {}, NNCC, name)
        rw.drop.update(id(n) for n in absorbed)
    return rw.result()


# --------------------------------------------------------------------------- MatMul + Add


def matmul_add_to_gemm(graph: Graph) -> Graph:
    """MatMul(A, constant 2-D B) -> Add(constant bias broadcast over the last axis only)
    becomes ``nncc::FusedMatMul(A, B, bias)`` (bias stored 1-D)."""
    rw = Rewriter(graph)
    onnx_opset = graph.opset("")
    for mm in graph.nodes:
        if mm.op_type != "MatMul" or mm.domain != "" or len(mm.inputs) != 2 or len(mm.outputs) != 1:
            continue
        b = rw.constant(mm.inputs[1])
        if b is None or b.ndim != 2 or not mm.inputs[0] or b.dtype.kind not in "fiu":
            continue
        add = rw.sole_consumer(mm.outputs[0])
        if add is None or add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
            continue
        if len(add.outputs) != 1 or not add.outputs[0]:
            continue
        if onnx_opset < 7 and add.attrs.get("broadcast"):
            continue  # legacy axis-based broadcasting
        other = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
        bias = rw.constant(other)
        if bias is None or bias.dtype != b.dtype:
            continue
        n = b.shape[1]
        if bias.ndim > 1:
            rank = _rank(graph, mm.inputs[0])
            if rank is None or bias.ndim > max(rank, 2) or any(d != 1 for d in bias.shape[:-1]):
                continue  # the Add would broadcast over leading axes or raise the rank
        if bias.ndim >= 1 and bias.shape[-1] not in (1, n):
            continue
        bias_name = other
        if bias.ndim != 1:
            flat = np.ascontiguousarray(bias.reshape(-1))
            flat.flags.writeable = False
            bias_name = rw.add_initializer(f"{other}/flat", flat)
        fused = Node("FusedMatMul", [mm.inputs[0], mm.inputs[1], bias_name], [add.outputs[0]],
                     {"onnx_opset": onnx_opset}, NNCC, mm.name or add.name)
        rw.fuse(mm, add, fused)
    return rw.result()


def _rank(graph: Graph, name: str) -> int | None:
    info = graph.values.get(name)
    if info is not None and info.rank is not None:
        return info.rank
    if name in graph.initializers:
        return graph.initializers[name].ndim
    return None


# --------------------------------------------------------------------------- Pad + Conv


def fold_pad_into_conv(graph: Graph) -> Graph:
    """Pad (constant mode, value 0, non-negative, spatial axes only, constant pads) whose
    output only a Conv or FusedConv reads as its input becomes that convolution's own pads,
    as exporters of TensorFlow models and explicit-padding PyTorch modules write it: the
    convolution's kernels pad at no cost, where a Pad step copies the whole input."""
    rw = Rewriter(graph)
    for pad in graph.nodes:
        if pad.op_type != "Pad" or pad.domain or len(pad.outputs) != 1 or not pad.inputs or not pad.inputs[0]:
            continue
        conv = rw.sole_consumer(pad.outputs[0])
        if conv is None or (conv.domain, conv.op_type) not in _CONV_OPS or conv.inputs[0] != pad.outputs[0]:
            continue
        w = rw.constant(conv.inputs[1]) if len(conv.inputs) > 1 else None
        spatial = _spatial_pads(graph, rw, pad, w.ndim) if w is not None and w.ndim >= 3 else None
        if spatial is None:
            continue
        auto_pad = conv.attrs.get("auto_pad", "NOTSET")
        if auto_pad not in ("NOTSET", "VALID"):
            continue
        own = [0] * len(spatial) if auto_pad == "VALID" else list(conv.attrs.get("pads") or [0] * len(spatial))
        if len(own) != len(spatial):
            continue
        attrs = dict(conv.attrs, pads=[a + b for a, b in zip(own, spatial)])
        attrs.pop("auto_pad", None)
        rw.replace[id(conv)] = Node(conv.op_type, [pad.inputs[0], *conv.inputs[1:]], list(conv.outputs), attrs,
                                    conv.domain, conv.name)
        rw.drop.add(id(pad))
    return rw.result()


_CONV_OPS = {("", "Conv"), (NNCC, "FusedConv")}


def _spatial_pads(graph: Graph, rw: Rewriter, pad: Node, rank: int) -> list[int] | None:
    """The Pad's begin and end pads of the axes after N and C of its ``rank`` input (the
    convolution's weights' rank), as a Conv's ``pads`` lists them, when it pads with zeros
    only there; else None."""
    if pad.attrs.get("mode", "constant") not in ("constant", b"constant"):
        return None
    if graph.opset("") < 11:
        pads, value, axes = pad.attrs.get("pads"), float(pad.attrs.get("value", 0.0)), None
    else:
        names = list(pad.inputs[1:]) + ["", "", ""]
        pads = rw.constant(names[0])
        constant = rw.constant(names[1]) if names[1] else np.zeros(1)
        if pads is None or constant is None or constant.size != 1 or (names[2] and rw.constant(names[2]) is None):
            return None
        value = float(np.asarray(constant).reshape(-1)[0])
        axes = rw.constant(names[2]) if names[2] else None
    if pads is None or value != 0.0:
        return None
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    if axes is not None:  # pads of the listed axes only
        listed = [int(a) for a in np.asarray(axes).reshape(-1)]
        if any(not -rank <= a < rank for a in listed):
            return None  # the Pad kernel reports it
        listed = [a % rank for a in listed]
        if len(pads) != 2 * len(listed) or len(set(listed)) != len(listed):
            return None
        full = [0] * (2 * rank)
        for i, axis in enumerate(listed):
            full[axis], full[rank + axis] = pads[i], pads[len(listed) + i]
        pads = full
    if len(pads) != 2 * rank or any(p < 0 for p in pads) or any(pads[a] or pads[rank + a] for a in (0, 1)):
        return None
    return pads[2:rank] + pads[rank + 2:]


# --------------------------------------------------------------------------- activations

_FUSED_NAME = {("", "Conv"): "FusedConv", ("", "Gemm"): "FusedGemm", ("", "MatMul"): "FusedMatMul",
               (NNCC, "FusedMatMul"): "FusedMatMul", (NNCC, "ScaleShift"): "ScaleShift"}
_NO_ONNX_OPSET = {"ScaleShift"}  # fused ops that do not run an underlying ONNX kernel
_SIMPLE = {"Relu", "Sigmoid", "Tanh", "HardSwish"}


def _activation_attrs(graph: Graph, act: Node, rw: Rewriter) -> dict | None:
    """The fused node's activation attributes for ``act``, or None if it cannot fuse."""
    if len(act.outputs) != 1 or not act.outputs[0]:
        return None
    op = act.op_type
    if act.domain == NNCC and op in ("HardSwish", "Silu", "Mish"):  # spelled out (fuse_spelled_activations)
        return {"activation": op} if len(act.inputs) == 1 else None
    if act.domain != "":
        return None
    if op == "Mish" or op == "Swish" and float(act.attrs.get("alpha", 1.0)) == 1.0:
        return {"activation": "Mish" if op == "Mish" else "Silu"} if len(act.inputs) == 1 else None
    if op in _SIMPLE:
        return {"activation": op} if len(act.inputs) == 1 else None
    if op == "LeakyRelu":
        return {"activation": op, "activation_alpha": float(act.attrs.get("alpha", 0.01))}
    if op == "HardSigmoid":
        return {"activation": op, "activation_alpha": float(act.attrs.get("alpha", 0.2)),
                "activation_beta": float(act.attrs.get("beta", 0.5))}
    if op == "Clip":
        attrs: dict = {"activation": op}
        if graph.opset("") < 11:
            for key in ("min", "max"):
                if act.attrs.get(key) is not None:
                    attrs[f"activation_{key}"] = float(act.attrs[key])
            return attrs
        for key, name in zip(("min", "max"), act.inputs[1:3]):
            if not name:
                continue
            bound = rw.constant(name)
            if bound is None or bound.size != 1:
                return None  # a bound computed at run time
            attrs[f"activation_{key}"] = float(np.asarray(bound).reshape(-1)[0])
        return attrs
    return None


def fuse_activation(graph: Graph) -> Graph:
    """Conv / Gemm / MatMul / FusedMatMul / ScaleShift followed by an activation become one
    fused node in the "nncc" domain carrying the activation as attributes."""
    rw = Rewriter(graph)
    onnx_opset = graph.opset("")
    position = {id(node): i for i, node in enumerate(graph.nodes)}
    for producer in graph.nodes:
        fused_op = _FUSED_NAME.get((producer.domain, producer.op_type))
        if fused_op is None or len(producer.outputs) != 1 or not producer.outputs[0]:
            continue
        if producer.attrs.get("activation"):
            continue
        weights = rw.constant(producer.inputs[1]) if len(producer.inputs) > 1 else None
        gelu = (producer.domain, producer.op_type) in _GELU_PRODUCERS and weights is not None and weights.ndim >= 2
        act = rw.sole_consumer(producer.outputs[0])
        absorbed = [act]
        if act is None or not act.inputs or act.inputs[0] != producer.outputs[0]:
            attrs = None
        elif act.op_type == "Gelu" and not act.domain:
            attrs = {"activation": "Gelu", "activation_approximate": str(act.attrs.get("approximate", "none"))}
            attrs = attrs if gelu and len(act.inputs) == 1 and len(act.outputs) == 1 else None
        else:
            attrs = _activation_attrs(graph, act, rw)
        if attrs is None and gelu:
            found = _spelled_gelu(graph, rw, producer.outputs[0], position[id(producer)])
            if found is not None:
                absorbed, approximate = found
                act = absorbed[-1]
                attrs = {"activation": "Gelu", "activation_approximate": approximate}
        if attrs is None:
            continue
        new_attrs = dict(producer.attrs)
        if fused_op not in _NO_ONNX_OPSET:
            new_attrs.setdefault("onnx_opset", onnx_opset)
        new_attrs.update(attrs)
        fused = Node(fused_op, list(producer.inputs), [act.outputs[0]], new_attrs, NNCC,
                     producer.name or act.name)
        rw.replace[id(producer)] = fused
        rw.drop.update(id(node) for node in absorbed)
    return rw.result()


# --------------------------------------------------------------------------- GELU
def fuse_spelled_gelu(graph: Graph) -> Graph:
    """A GELU spelled out in elementwise ops after a value no product absorbed (an int8
    product's float result, a bias Add) -> one nncc Gelu node: one pass over the value
    instead of five, and ONNX Gelu's arithmetic at any opset."""
    rw = Rewriter(graph)
    for start, producer in enumerate(graph.nodes):
        if len(producer.outputs) != 1 or not producer.outputs[0] or id(producer) in rw.drop:
            continue
        found = _spelled_gelu(graph, rw, producer.outputs[0], start)
        if found is None:
            continue
        nodes, approximate = found
        rw.replace[id(nodes[0])] = Node("Gelu", [producer.outputs[0]], [nodes[-1].outputs[0]],
                                        {"approximate": approximate}, NNCC, nodes[-1].name or nodes[0].name)
        rw.drop.update(id(node) for node in nodes[1:])
    return rw.result()



_GELU_PRODUCERS = {("", "Gemm"), ("", "MatMul"), (NNCC, "FusedMatMul")}
_GELU_OPS = {"Mul", "Div", "Add", "Sub", "Erf", "Tanh", "Pow", "Sqrt"}
_SPELLING_WINDOW = 24  # nodes after the value searched for a spelled-out function of it
_SPELLING_SIZE = 12  # nodes at most in a spelled-out function


def _spelled_gelu(graph: Graph, rw: Rewriter, x: str, start: int) -> tuple[list[Node], str] | None:
    """The nodes after ``x``'s producer that compute GELU(x) (erf form: "none", or tanh form)
    and nothing else, and which form; None if there are none (``_spelled``)."""
    return _spelled(graph, rw, x, start, _GELU_OPS, _which_gelu)


def _spelled(graph: Graph, rw: Rewriter, x: str, start: int, ops, which) -> tuple[list[Node], str] | None:
    """The nodes after ``x``'s producer (at ``start``; -1 for a graph input) that compute a
    known function of x and nothing else, and which (``which`` names it, or says None).
    Candidates are the nodes of ``ops`` after the producer whose other operands are scalar
    constants; a candidate region (all of them up to one result) is accepted when every
    value it computes is read only inside it, it reads all of ``x``'s uses, and ``which``
    recognises what it evaluates to on sample points: any order of operands and any spelling
    of the constants fuse alike."""
    if x in rw.pinned:
        return None
    values, region = {x}, []
    for node in graph.nodes[start + 1:start + 1 + _SPELLING_WINDOW]:
        if node.domain or node.op_type not in ops or len(node.outputs) != 1 or not node.outputs[0]:
            continue
        if id(node) in rw.drop or id(node) in rw.replace or not any(name in values for name in node.inputs):
            continue
        if all(not name or name in values or _scalar(rw.constant(name)) for name in node.inputs):
            region.append(node)
            values.add(node.outputs[0])
            if len(region) == _SPELLING_SIZE:
                break
    for end in range(len(region) - 1, 0, -1):
        nodes = _ancestors(region[:end + 1], x)
        if nodes is None or not _closed(rw, nodes, x):
            continue
        name = which(graph, rw, nodes, x)
        if name is not None:
            return nodes, name
    return None


def _scalar(value: np.ndarray | None) -> bool:
    """A constant that broadcasts against the product (rank >= 1) without changing its shape."""
    return value is not None and value.size == 1 and value.dtype.kind == "f" and value.ndim <= 1


def _ancestors(candidates: list[Node], x: str) -> list[Node] | None:
    """The candidates the last one depends on, in order; None if it does not read ``x``."""
    by_output = {node.outputs[0]: node for node in candidates}
    keep, stack, reads_x = set(), [candidates[-1]], False
    while stack:
        node = stack.pop()
        if id(node) in keep:
            continue
        keep.add(id(node))
        for name in node.inputs:
            reads_x |= name == x
            if name in by_output:
                stack.append(by_output[name])
    return [node for node in candidates if id(node) in keep] if reads_x else None


def _closed(rw: Rewriter, nodes: list[Node], x: str) -> bool:
    """Only the last node's value leaves the region, and every reader of ``x`` is in it."""
    inside = {id(node) for node in nodes}
    if any(id(user) not in inside for user in rw.consumers.get(x, [])):
        return False
    for node in nodes[:-1]:
        out = node.outputs[0]
        if out in rw.pinned or any(id(user) not in inside for user in rw.consumers.get(out, [])):
            return False
    return True


_GELU_SAMPLES = np.linspace(-6.0, 6.0, 97)


def _evaluate(graph: Graph, rw: Rewriter, nodes: list[Node], x: str, t: np.ndarray) -> np.ndarray | None:
    """What ``nodes`` compute from x = ``t`` (float64), or None for a node it cannot say."""
    env = {x: t}
    erf = np.vectorize(math.erf)
    unary = {"Erf": erf, "Tanh": np.tanh, "Sqrt": np.sqrt, "Sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
             "Exp": np.exp, "Log": np.log, "Softplus": lambda v: np.logaddexp(0.0, v),
             "Relu": lambda v: np.maximum(v, 0.0)}
    binary = {"Mul": np.multiply, "Div": np.divide, "Add": np.add, "Sub": np.subtract, "Pow": np.power,
              "Max": np.maximum, "Min": np.minimum}
    with np.errstate(all="ignore"):
        for node in nodes:
            args = [env[name] if name in env else float(rw.constant(name).reshape(-1)[0]) if name else None
                    for name in node.inputs]
            op = node.op_type
            if op in unary and len(args) == 1:
                result = unary[op](args[0])
            elif op in binary and len(args) == 2:
                result = binary[op](*args)
            elif op == "Clip":
                if graph.opset("") < 11:
                    lo, hi = node.attrs.get("min", -np.inf), node.attrs.get("max", np.inf)
                else:
                    lo, hi = (args[1:2] + [None])[0], (args[2:3] + [None])[0]
                result = np.clip(args[0], -np.inf if lo is None else lo, np.inf if hi is None else hi)
            elif op == "HardSigmoid" and len(args) == 1:
                alpha, beta = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
                result = np.clip(alpha * args[0] + beta, 0.0, 1.0)
            else:
                return None
            env[node.outputs[0]] = np.broadcast_to(result, t.shape)
    return env[nodes[-1].outputs[0]]


def _matching(got: np.ndarray | None, forms: dict[str, np.ndarray]) -> str | None:
    """The form ``got`` equals to float32 rounding, if any."""
    if got is None:
        return None
    for name, want in forms.items():
        if np.all(np.abs(got - want) <= 1e-5 * (1.0 + np.abs(want))):
            return name
    return None


def _which_gelu(graph: Graph, rw: Rewriter, nodes: list[Node], x: str) -> str | None:
    t = _GELU_SAMPLES
    erf = np.vectorize(math.erf)
    forms = {"none": 0.5 * t * (1.0 + erf(t / math.sqrt(2.0))),
             "tanh": 0.5 * t * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * t ** 3)))}
    return _matching(_evaluate(graph, rw, nodes, x, t), forms)


# --------------------------------------------------------------------------- spelled activations


def fuse_spelled_activations(graph: Graph) -> Graph:
    """HardSwish, SiLU and Mish spelled out in elementwise ops, as exporters write them
    (``x * Clip(x + 3, 0, 6) / 6``, ``HardSigmoid(x) * x``, ``x * Sigmoid(x)``,
    ``x * Tanh(Softplus(x))`` or ``x * Tanh(Log(1 + Exp(x)))``, any order of operands, any
    spelling of the constants), become one node: the ONNX op where the model's opset has
    one (HardSwish from 14, Mish from 18, Swish from 24), else nncc's. Recognised by what
    the nodes compute on sample points, as fuse_gelu recognises GELU; a near miss (another
    constant, an inner value read elsewhere) stays as it is. Runs before fuse_activation,
    which then takes the one node into a product's epilogue where it has the code."""
    rw = Rewriter(graph)
    opset = graph.opset("")
    starts = [(name, -1) for name in graph.inputs]
    starts += [(node.outputs[0], i) for i, node in enumerate(graph.nodes) if len(node.outputs) == 1]
    results: set[str] = set()  # outputs of the new nodes, which may start another spelling
    for x, start in starts:
        if not x or (start >= 0 and id(graph.nodes[start]) in rw.drop and x not in results):
            continue
        found = _spelled(graph, rw, x, start, _ACTIVATION_OPS, _which_activation)
        if found is None:
            continue
        nodes, name = found
        results.add(nodes[-1].outputs[0])
        domain, op, attrs = _activation_node(name, opset)
        rw.replace[id(nodes[0])] = Node(op, [x], [nodes[-1].outputs[0]], attrs, domain,
                                        nodes[-1].name or nodes[0].name)
        rw.drop.update(id(node) for node in nodes[1:])
    return rw.result()


_ACTIVATION_OPS = {"Mul", "Div", "Add", "Sub", "Clip", "Max", "Min", "Relu", "HardSigmoid", "Sigmoid", "Tanh",
                   "Softplus", "Exp", "Log"}
_ACTIVATION_SAMPLES = np.concatenate([np.linspace(-8.0, 8.0, 161), [-3.0001, 2.9999, -20.0, 20.0]])


def _which_activation(graph: Graph, rw: Rewriter, nodes: list[Node], x: str) -> str | None:
    t = _ACTIVATION_SAMPLES
    forms = {"HardSwish": t * np.clip(t / 6.0 + 0.5, 0.0, 1.0), "Silu": t / (1.0 + np.exp(-t)),
             "Mish": t * np.tanh(np.logaddexp(0.0, t))}
    return _matching(_evaluate(graph, rw, nodes, x, t), forms)


def _activation_node(name: str, opset: int) -> tuple[str, str, dict]:
    """(domain, op_type, attributes) of the one node computing activation ``name``."""
    if name == "HardSwish" and opset >= 14 or name == "Mish" and opset >= 18:
        return "", name, {}
    if name == "Silu" and opset >= 24:
        return "", "Swish", {}
    return NNCC, name, {}


__all__ = ["fold_batchnorm_into_conv", "fold_scale_shift_into_conv", "batchnorm_to_scale_shift",
           "matmul_add_to_gemm", "fuse_activation", "fuse_spelled_gelu", "fuse_spelled_activations",
           "fold_pad_into_conv"]
