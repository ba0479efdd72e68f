"""C code for one partition: its nodes become one entry point ``int SYMBOL(void **args, char *ws)``.

``args`` holds a pointer per partition input, then per partition output (the planned
buffers the executor passes); ``ws`` is the partition's workspace, where intermediates
live at offsets planned here by liveness, with im2col columns as per-step scratch. Every
shape is a literal, so the C compiler specialises each step's loops. Reshape-like nodes
alias their input instead of copying, and a Conv whose only consumer is an Add (a residual
connection) writes through that Add and the activation after it in one epilogue pass.

Each step is a kernel, a C function of its buffers in its own translation unit, named by
the hash of its text: the same layer (op, shapes, attributes) in another model, partition
or compile is the same unit, built once into the kernel object cache. The entry point
only calls kernels over its arguments and workspace offsets.

``check(node, graph, infos)`` says why a node cannot be generated (None: it can).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
from blake3 import blake3

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.native import attention_gen, gemm_gen, int8_gemm_gen, norm_gen, plain_ops
from nncc.native.graph_query import (AFFINE_OPS, CONV_OPS, GEMM_OPS, MATMUL_OPS, batch_strides, const_value,
                                     is_pair_sum, source)
from nncc.native.layout import BlockedLayout
from nncc.plan.memory import aligned_empty

F32 = np.dtype(np.float32)
ALIGN = 64
# Benchmark aid (benchmarks/profile_native.py): time every step into a table the entry
# point ``SYMBOL_profile`` copies out. Never set for code that is cached or shipped.
PROFILE_STEPS = False

UNARY = {
    "Relu": "(v > 0.0f ? v : 0.0f)", "Sigmoid": "nn_sigmoid(v)", "Tanh": "nn_tanh(v)",
    "Erf": "nn_erf(v)", "Exp": "nn_exp(v)", "Log": "logf(v)", "Sqrt": "sqrtf(v)", "Neg": "(-v)",
    "Abs": "fabsf(v)", "Reciprocal": "(1.0f / v)", "Identity": "v", "Softsign": "(v / (1.0f + fabsf(v)))",
}
BINARY = {"Add": "(a + b)", "Sub": "(a - b)", "Mul": "(a * b)", "Div": "(a / b)", "Pow": "powf(a, b)",
          "Max": "(a > b || a != a ? a : b)", "Min": "(a < b || a != a ? a : b)"}
ALIASES = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}
POW_BY = {2.0: "(v * v)", 3.0: "(v * v * v)", 0.5: "sqrtf(v)", 1.0: "v", -1.0: "(1.0f / v)"}  # constant exponents
ACT_CODES = {"": 0, "Relu": 1, "Clip": 2, "Sigmoid": 3, "Tanh": 4, "LeakyRelu": 5, "HardSigmoid": 6,
             "HardSwish": 7}
POOL_OPS = {"MaxPool", "AveragePool", "GlobalAveragePool"}
INT8_MATMUL = ("com.microsoft", "DynamicQuantizeMatMul")  # one int8 GEMM step (int8_gemm_gen)
# Generated loops are unrolled per tile of a row, and element moves keep a table per axis:
# an output beyond these (only a damaged or hostile model has one) stays portable, whose
# kernels refuse it with a clear error.
MAX_ELEMENTS = 1 << 31
MAX_EXTENT = 1 << 24


def _static_f32(info: TensorInfo | None) -> bool:
    return info is not None and info.dtype == F32 and info.is_static


def check(node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
    """None when the node can become C, else why not."""
    key = (node.domain, node.op_type)
    op = node.op_type
    if _too_large(node, infos):
        return "an output too large for generated code"  # the portable plan reports it
    if plain_ops.handles(node, graph, infos):
        return plain_ops.check(node, graph, infos)
    if key == INT8_MATMUL:
        return int8_gemm_gen.check(node, graph, infos)
    data_inputs = list(node.inputs)
    if op in ("Reshape", "Unsqueeze", "Squeeze") and len(node.inputs) > 1:
        data_inputs = node.inputs[:1]
    elif op == "Clip":
        data_inputs = node.inputs[:1]
        for bound in node.inputs[1:]:
            value = const_value(graph, infos, bound) if bound else 0.0
            if value is None or np.size(value) != 1 or np.asarray(value).dtype.kind != "f":
                return "Clip bounds are not float constant scalars"
    elif op == "Dropout":
        data_inputs = node.inputs[:1]
        if len([o for o in node.outputs if o]) > 1:
            return "Dropout's mask output"
    for name in [n for n in data_inputs if n] + [o for o in node.outputs if o]:
        if not _static_f32(infos.get(name)):
            return f"value {name!r} is not a static float32 tensor"
    attrs = node.attrs
    if key in CONV_OPS:
        if len(infos[node.inputs[0]].shape) != 4:
            return "only 2-D convolutions"
        k, cg = infos[node.inputs[1]].shape[:2]
        if cg * int(attrs.get("group", 1)) != infos[node.inputs[0]].shape[1]:
            return "weights that do not match the input's channels"
        if len(node.inputs) > 2 and node.inputs[2] and infos[node.inputs[2]].shape != (k,):
            return "a bias that is not one value per output channel"  # the portable kernel says why
        if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return "auto_pad"
        if attrs.get("activation", "") not in ACT_CODES:
            return f"activation {attrs.get('activation')!r}"
        return None
    if key in AFFINE_OPS:
        if attrs.get("activation", "") not in ACT_CODES:
            return f"activation {attrs.get('activation')!r}"
        c = infos[node.inputs[0]].shape[1]
        if any(not n or infos[n].shape != (c,) for n in node.inputs[1:3]):
            return "scale and shift are not per-channel vectors"
        return None
    if key in GEMM_OPS or key in MATMUL_OPS:
        if attrs.get("activation", "") not in ACT_CODES and not gemm_gen.takes(node, graph, infos):
            return f"activation {attrs.get('activation')!r}"
        if key in MATMUL_OPS:
            a, b = (infos[n].shape for n in node.inputs[:2])
            if len(a) < 2 or len(b) < 2:
                return "MatMul of a vector"
            if len(node.inputs) > 2 and node.inputs[2] and len(infos[node.inputs[2]].shape) > 1:
                return "bias of rank > 1"
        return None
    if attention_gen.handles(node):
        return attention_gen.check(node, graph, infos)
    if node.domain:
        return f"no C generator for {node.domain}::{op}"
    if op in UNARY or op in BINARY or op in ALIASES or op in ("Clip", "LeakyRelu", "HardSigmoid", "HardSwish"):
        if op in BINARY and len(node.inputs) != 2:
            return "variadic form"
        return None
    if op == "Sum":
        out = infos[node.outputs[0]].shape
        if not node.inputs or any(not n or infos[n].shape != out for n in node.inputs):
            return "Sum with broadcasting or omitted inputs"
        return None
    if op == "Concat":
        if any(not n for n in node.inputs):
            return "Concat with an omitted input"
        return None
    if op in ("Softmax", "LogSoftmax"):
        shape = infos[node.inputs[0]].shape
        axis = attrs.get("axis", -1 if node_opset(graph, node) >= 13 else 1)
        if node_opset(graph, node) >= 13 and axis % max(len(shape), 1) != len(shape) - 1:
            return "softmax over an inner axis"
        return None
    if op == "LayerNormalization":
        shape = infos[node.inputs[0]].shape
        axis = attrs.get("axis", -1) % len(shape)
        n = math.prod(shape[axis:])
        for extra in node.inputs[1:3]:
            if extra and math.prod(infos[extra].shape) != n:
                return "scale or bias broadcast within the normalized axes"
        if len([o for o in node.outputs if o]) > 1:
            return "mean and inverse std outputs"
        return None
    if op in POOL_OPS:
        if len(infos[node.inputs[0]].shape) != 4:
            return "only 2-D pooling"
        if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return "auto_pad"
        if op == "MaxPool" and (len([o for o in node.outputs if o]) > 1 or attrs.get("storage_order", 0)):
            return "MaxPool indices"
        if op == "AveragePool" and (attrs.get("dilations") and any(d != 1 for d in attrs["dilations"])):
            return "dilated average pooling"
        return None
    if op == "Transpose":
        return None if len(infos[node.inputs[0]].shape) <= 8 else "rank above 8"
    return f"no C generator for {op}"


def _too_large(node: Node, infos: dict[str, TensorInfo]) -> bool:
    """An output beyond MAX_ELEMENTS, or an axis beyond MAX_EXTENT (generated code unrolls
    tiles and tables along an axis): only a damaged or hostile model has one."""
    for name in [o for o in node.outputs if o]:
        info = infos.get(name)
        if info is not None and info.is_static and info.shape and (
                math.prod(info.shape) > MAX_ELEMENTS or max(info.shape) > MAX_EXTENT):
            return True
    return False


def node_opset(graph: Graph, node: Node) -> int:
    return graph.opset(node.domain)


@dataclass
class _Step:
    code: str
    reads: list[str]
    writes: list[str]
    scratch: int = 0  # bytes of per-step workspace
    label: str = ""
    support: str = ""  # file-scope C the step's code calls (micro-kernels, parallel tasks)


@dataclass
class Unit:
    """One partition's C function and how to call it."""

    symbol: str
    source: str  # the entry point, calling its kernels
    args: list[str]  # value names: partition inputs, then outputs
    n_inputs: int
    workspace: int
    ops: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # one per step, for profiles
    kernels: list["Kernel"] = field(default_factory=list)  # the distinct kernels its steps call
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # packed at compile time: inputs too
    blas: bool = False  # some step calls the BLAS numpy loaded (which must then keep to one thread)


class _Writer(BlockedLayout):
    def __init__(self, partition, graph: Graph, infos: dict[str, TensorInfo], symbol: str, vl: int = 4):
        self.graph, self.symbol = graph, symbol
        self.vl = vl  # floats per vector: the blocked layout's channel block (nncc/native/isa.py)
        self.infos = dict(infos)  # plus the packed constants this partition adds
        self.nodes = list(partition.nodes)
        self.packed: dict[str, np.ndarray] = {}  # constants in the layout a kernel reads
        # compile-time constants the C code never reads (a Reshape's shape, Clip's bounds)
        # are not passed: every argument is a float32 tensor the code touches
        read = [n for n in partition.inputs if _static_f32(infos.get(n))]
        self.args = read + list(partition.outputs)
        self.n_inputs = len(read)
        self.outputs = set(partition.outputs)
        self.alias: dict[str, str] = {}  # value -> the value whose memory it is
        self._ids: dict[str, int] = {}  # value -> the number in its C name (v_N)
        self.steps: list[_Step] = []
        consumers: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    consumers.setdefault(name, []).append(node)
        self.consumers = consumers
        self.deferred: dict[str, Node] = {}  # conv output -> conv node, written by its Add
        self.absorbed: set[int] = set()  # ids of activation nodes fused into a residual Add
        self.init_layout()
        self.simd = source("simd.h") + "\n"

    # -- helpers ----------------------------------------------------------------------

    def shape(self, name):
        return self.infos[name].shape

    def root(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def ptr(self, name: str) -> str:
        return f"v_{self._cname(self.root(name))}"

    def _cname(self, name: str) -> str:
        return str(self.index_of(name))

    def index_of(self, name: str) -> int:
        return self._ids.setdefault(name, len(self._ids))

    def only_consumer(self, name: str) -> Node | None:
        users = self.consumers.get(name, [])
        if len(users) == 1 and name not in self.outputs:
            return users[0]
        return None

    def pack(self, source: str, form: str, array: np.ndarray) -> str:
        """A constant derived at compile time from ``source`` (weights in a kernel's
        layout): stored in the plan next to the original, which the portable plan keeps
        reading, and passed to the entry point as one more input."""
        name = f"{source}#{form}"
        if name not in self.packed:
            # on a 64-byte boundary, as the data cache maps it: a vector load that
            # straddles two cache lines costs the micro-kernels a third of their speed
            packed = aligned_empty(np.shape(array), F32)
            packed[...] = array
            self.packed[name] = packed
            self.infos[name] = TensorInfo(F32, tuple(self.packed[name].shape))
        return name

    # -- ops ----------------------------------------------------------------------------

    def build(self) -> Unit:
        for node in self.nodes:
            if id(node) in self.absorbed:
                continue
            first = len(self.steps)
            self.emit(node)
            for step in self.steps[first:]:
                step.label = step.label or f"{node.op_type} {node.name}"
        return self.finish()

    def emit(self, node: Node) -> None:
        key = (node.domain, node.op_type)
        op = node.op_type
        if key in CONV_OPS:
            return self.conv(node)
        if key in AFFINE_OPS:
            return self.scale_shift(node)
        if key == INT8_MATMUL:
            return int8_gemm_gen.emit(self, node)
        if self.emit_blocked(node):
            return
        if not (is_pair_sum(node) and any(i in self.deferred for i in node.inputs)):
            self.plain_inputs(node)
        if plain_ops.handles(node, self.graph, self.infos):
            return plain_ops.emit(self, node)
        if attention_gen.handles(node):
            return attention_gen.emit(self, node)
        if norm_gen.emit_add_layernorm(self, node):
            return
        if key in MATMUL_OPS:
            return self.matmul(node)
        if key in GEMM_OPS:
            return self.gemm(node)
        if is_pair_sum(node) and any(i in self.deferred for i in node.inputs):
            return self.residual(node)
        if op == "Sum":
            return self.sum(node)
        if op == "Concat":
            return self.concat(node)
        if op in ALIASES:
            return self.reshape(node)
        if op == "Pow" and self._scalar_const(node.inputs[1]) in POW_BY:
            return self.unary(node, POW_BY[self._scalar_const(node.inputs[1])])
        if op in BINARY:
            return self.binary(node, BINARY[op])
        if op in UNARY or op in ("Clip", "LeakyRelu", "HardSigmoid", "HardSwish"):
            return self.unary(node)
        if op in ("Softmax", "LogSoftmax"):
            shape = self.shape(node.inputs[0])
            opset = node_opset(self.graph, node)
            axis = node.attrs.get("axis", -1 if opset >= 13 else 1) % len(shape)
            rows, n = math.prod(shape[:axis]), math.prod(shape[axis:])
            return self.step(f"nn_softmax_rows({self.ptr(node.inputs[0])}, {self.ptr(node.outputs[0])}, "
                             f"{rows}, {n}, {int(op == 'LogSoftmax')});", node.inputs[:1], node.outputs[:1])
        if op == "LayerNormalization":
            return norm_gen.emit_layernorm(self, node)
        if op in POOL_OPS:
            return self.pool(node)
        if op == "Transpose":
            return self.transpose(node)
        raise AssertionError(f"no generator for {op}")  # check() passed it: a bug

    def emit_blocked(self, node: Node) -> bool:
        """Write ``node`` over the blocked layout when its data input is blocked."""
        op = node.op_type
        if node.domain or not any(i in self.blocked for i in node.inputs if i):
            return False
        if is_pair_sum(node) and any(i in self.deferred for i in node.inputs):
            return False  # the residual Add of a deferred convolution: written by it
        if op in POOL_OPS:
            return self.blocked_pool(node)
        if op == "Sum":
            return self.blocked_sum(node)
        if op == "Concat":
            return self.blocked_concat(node)
        if op == "Pow" and self._scalar_const(node.inputs[1]) in POW_BY:
            return self.blocked_unary(node, POW_BY[self._scalar_const(node.inputs[1])])
        if op in BINARY:
            return self.blocked_binary(node, BINARY[op], self._broadcast_loop)
        if op in UNARY or op in ("Clip", "LeakyRelu", "HardSigmoid", "HardSwish"):
            return self.blocked_unary(node, self._unary_expr(node))
        return False

    def step(self, code: str, reads, writes, scratch: int = 0, support: str = "") -> None:
        self.steps.append(_Step(code, [r for r in reads if r], [w for w in writes if w], scratch,
                                support=support))

    def _activation(self, attrs) -> tuple[int, float, float]:
        act = attrs.get("activation", "") or ""
        p0 = p1 = 0.0
        if act == "Clip":
            p0 = float(attrs.get("activation_min", -np.inf))
            p1 = float(attrs.get("activation_max", np.inf))
        elif act == "LeakyRelu":
            p0 = float(attrs.get("activation_alpha", 0.01))
        elif act == "HardSigmoid":
            p0 = float(attrs.get("activation_alpha", 0.2))
            p1 = float(attrs.get("activation_beta", 0.5))
        return ACT_CODES[act], p0, p1

    def conv(self, node: Node, residual: str | None = None, target: str | None = None,
             act=None, defer: bool = True) -> None:
        out = node.outputs[0]
        if defer and residual is None and not node.attrs.get("activation"):
            user = self.only_consumer(out)
            if user is not None and is_pair_sum(user) and \
                    self.shape(user.outputs[0]) == self.shape(out) and \
                    all(self.shape(i) == self.shape(out) for i in user.inputs):
                self.deferred[out] = node  # written by the Add, with the residual
                return
        n, c, h, w = self.shape(node.inputs[0])
        k, cg, kh, kw = self.shape(node.inputs[1])
        _, _, oh, ow = self.shape(out)
        a = node.attrs
        group = int(a.get("group", 1))
        sh, sw = (a.get("strides") or [1, 1])
        dh, dw = (a.get("dilations") or [1, 1])
        pads = a.get("pads") or [0, 0, 0, 0]
        if a.get("auto_pad", "NOTSET") == "VALID":
            pads = [0, 0, 0, 0]
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        code, p0, p1 = act if act is not None else self._activation(a)
        target = target or out
        if self.blocked_conv(node, pads, bias, residual, target, (code, p0, p1), _f):
            return
        for name in (node.inputs[0], residual):
            if name:
                self.as_plain(name)
        depthwise = group == c == k
        direct = kh == kw == 1 and sh == sw == 1 and not any(pads)
        scratch = 0 if depthwise or direct else cg * kh * kw * oh * ow * 4
        target = target or out
        self.step(
            f"nn_conv2d({self.ptr(node.inputs[0])}, {self.ptr(node.inputs[1])}, "
            f"{self.ptr(bias) if bias else '0'}, {self.ptr(residual) if residual else '0'}, {self.ptr(target)}, "
            f"{n}, {c}, {h}, {w}, {k}, {oh}, {ow}, {kh}, {kw}, {sh}, {sw}, {pads[0]}, {pads[1]}, {dh}, {dw}, "
            f"{group}, {code}, {_f(p0)}, {_f(p1)}, (float *)SCRATCH);",
            [node.inputs[0], node.inputs[1], bias, residual], [target], scratch)

    def scale_shift(self, node: Node) -> None:
        """y = act(x * scale[c] + shift[c]): per-channel vectors over axis 1."""
        act = self._activation(node.attrs)
        if self.blocked_scale_shift(node, act, _f):
            return
        self.plain_inputs(node)
        x, scale, shift = node.inputs[:3]
        y = node.outputs[0]
        shape = self.shape(x)
        outer, c, inner = shape[0], shape[1], math.prod(shape[2:])
        code, p0, p1 = act
        self.step(f"for (int64_t n = 0; n < {outer}; n++) for (int64_t c = 0; c < {c}; c++) {{\n"
                  f"  const float s = {self.ptr(scale)}[c], b = {self.ptr(shift)}[c];\n"
                  f"  const float *x = {self.ptr(x)} + (n * {c} + c) * {inner};\n"
                  f"  float *y = {self.ptr(y)} + (n * {c} + c) * {inner};\n"
                  f"  for (int64_t i = 0; i < {inner}; i++) y[i] = nn_act({code}, x[i] * s + b, {_f(p0)}, {_f(p1)});\n"
                  "}", [x, scale, shift], [y])

    def residual(self, add: Node) -> None:
        conv_out = next(i for i in add.inputs if i in self.deferred)
        other = add.inputs[1] if add.inputs[0] == conv_out else add.inputs[0]
        conv = self.deferred.pop(conv_out)
        if other in self.deferred:  # both operands are convolutions: write one plainly first
            shortcut = self.deferred.pop(other)
            self.conv(shortcut, defer=False)
            self.steps[-1].label = f"Conv {shortcut.name}"
        target, act = add.outputs[0], (0, 0.0, 0.0)
        user = self.only_consumer(target)
        if user is not None and not user.domain and user.op_type in ("Relu", "Clip"):
            bounds = self._clip_bounds(user) if user.op_type == "Clip" else None
            if user.op_type == "Relu" or bounds is not None:
                act = (1, 0.0, 0.0) if user.op_type == "Relu" else (2, *bounds)
                self.absorbed.add(id(user))
                target = user.outputs[0]
        self.conv(conv, residual=other, target=target, act=act)

    def _clip_bounds(self, node: Node):
        lo, hi = -np.inf, np.inf
        if node_opset(self.graph, node) < 11:
            return float(node.attrs.get("min", lo)), float(node.attrs.get("max", hi))
        if len(node.inputs) > 1 and node.inputs[1]:
            lo = float(np.asarray(const_value(self.graph, self.infos, node.inputs[1])).reshape(()))
        if len(node.inputs) > 2 and node.inputs[2]:
            hi = float(np.asarray(const_value(self.graph, self.infos, node.inputs[2])).reshape(()))
        return lo, hi

    def matmul(self, node: Node) -> None:
        if gemm_gen.emit_matmul(self, node):  # by constant weights: nncc's packed GEMM
            return
        a, b = node.inputs[:2]
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        sa, sb, so = self.shape(a), self.shape(b), self.shape(node.outputs[0])
        m, k = sa[-2], sa[-1]
        nn = sb[-1]
        y = self.ptr(node.outputs[0])
        lines = []
        if len(sb) == 2:  # weights: fold the batch of A into M
            rows = math.prod(so[:-1])
            if bias:
                lines.append(f"for (int64_t r = 0; r < {rows}; r++) memcpy({y} + r * {nn}, {self.ptr(bias)}, "
                             f"{nn} * sizeof(float));")
            lines.append(f"nn_gemm(0, 0, {rows}, {nn}, {k}, 1.0f, {self.ptr(a)}, {k}, {self.ptr(b)}, {nn}, "
                         f"{'1.0f' if bias else '0.0f'}, {y}, {nn});")
        else:
            batch = so[:-2]
            ea = batch_strides(sa[:-2], batch, m * k)
            eb = batch_strides(sb[:-2], batch, k * nn)
            total = math.prod(batch)
            lines.append(f"for (int64_t t = 0; t < {total}; t++) {{")
            lines.append("  int64_t rem = t, oa = 0, ob = 0;")
            for d in range(len(batch) - 1, -1, -1):
                lines.append(f"  {{ int64_t i = rem % {batch[d]}; rem /= {batch[d]}; oa += i * {ea[d]}; "
                             f"ob += i * {eb[d]}; }}")
            if bias:
                lines.append(f"  for (int64_t r = 0; r < {m}; r++) memcpy({y} + t * {m * nn} + r * {nn}, "
                             f"{self.ptr(bias)}, {nn} * sizeof(float));")
            lines.append(f"  nn_gemm(0, 0, {m}, {nn}, {k}, 1.0f, {self.ptr(a)} + oa, {k}, {self.ptr(b)} + ob, "
                         f"{nn}, {'1.0f' if bias else '0.0f'}, {y} + t * {m * nn}, {nn});")
            lines.append("}")
        code, p0, p1 = self._activation(node.attrs)
        if code:
            lines.append(f"nn_epilogue({y}, 0, 0, 1, {math.prod(so)}, {code}, {_f(p0)}, {_f(p1)});")
        self.step("\n".join(lines), [a, b, bias], node.outputs[:1])

    def gemm(self, node: Node) -> None:
        if gemm_gen.emit_gemm(self, node):  # by constant weights: nncc's packed GEMM
            return
        a, b = node.inputs[:2]
        c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        at = node.attrs
        ta, tb = int(at.get("transA", 0)), int(at.get("transB", 0))
        alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
        sa, sb = self.shape(a), self.shape(b)
        m, k = (sa[1], sa[0]) if ta else (sa[0], sa[1])
        nn = sb[0] if tb else sb[1]
        y = self.ptr(node.outputs[0])
        lines = []
        if c and beta != 0.0:  # C broadcast to [M, N], scaled, then the product added to it
            cm, cn = ([1, 1] + list(self.shape(c)))[-2:]
            row = "r" if cm > 1 else "0"
            col = "j" if cn > 1 else "0"
            lines.append(f"for (int64_t r = 0; r < {m}; r++) for (int64_t j = 0; j < {nn}; j++) "
                         f"{y}[r * {nn} + j] = {_f(beta)} * {self.ptr(c)}[{row} * {cn} + {col}];")
        lines.append(f"nn_gemm({ta}, {tb}, {m}, {nn}, {k}, {_f(alpha)}, {self.ptr(a)}, {sa[1]}, {self.ptr(b)}, "
                     f"{sb[1]}, {'1.0f' if c and beta != 0.0 else '0.0f'}, {y}, {nn});")
        code, p0, p1 = self._activation(at)
        if code:
            lines.append(f"nn_epilogue({y}, 0, 0, 1, {m * nn}, {code}, {_f(p0)}, {_f(p1)});")
        self.step("\n".join(lines), [a, b, c], node.outputs[:1])

    def reshape(self, node: Node) -> None:
        src, out = node.inputs[0], node.outputs[0]
        if out in self.outputs:  # the caller's buffer: copy into it
            size = math.prod(self.shape(out))
            self.step(f"memcpy({self.ptr(out)}, {self.ptr(src)}, {size} * sizeof(float));", [src], [out])
        else:
            self.alias[out] = src

    def _scalar_const(self, name: str):
        value = const_value(self.graph, self.infos, name)
        if value is None or np.size(value) != 1:
            return None
        return float(np.asarray(value).reshape(()))

    def unary(self, node: Node, expr: str | None = None) -> None:
        """One loop ``y[i] = expr(v = x[i])``: the node's own expression unless given."""
        expr = expr or self._unary_expr(node)
        x, y = node.inputs[0], node.outputs[0]
        size = math.prod(self.shape(y))
        self.step(f"for (int64_t i = 0; i < {size}; i++) {{ float v = {self.ptr(x)}[i]; "
                  f"{self.ptr(y)}[i] = {expr}; }}", [x], [y])

    def _unary_expr(self, node: Node) -> str:
        op = node.op_type
        if op == "Clip":
            lo, hi = self._clip_bounds(node)
            return f"(v < {_f(lo)} ? {_f(lo)} : (v > {_f(hi)} ? {_f(hi)} : v))"
        if op == "LeakyRelu":
            return f"(v >= 0.0f ? v : v * {_f(float(node.attrs.get('alpha', 0.01)))})"
        if op == "HardSigmoid":
            return f"nn_act(6, v, {_f(float(node.attrs.get('alpha', 0.2)))}, {_f(float(node.attrs.get('beta', 0.5)))})"
        if op == "HardSwish":
            return "nn_act(7, v, 0.0f, 0.0f)"
        return UNARY[op]

    def binary(self, node: Node, expr: str) -> None:
        a, b = node.inputs
        y = node.outputs[0]
        out = self.shape(y)
        sa = _broadcast_strides(self.shape(a), out)
        sb = _broadcast_strides(self.shape(b), out)
        self._broadcast_loop(list(out), sa, sb, a, b, y, expr)

    def _broadcast_loop(self, out, sa, sb, a: str, b: str, y: str, expr: str) -> None:
        """One step ``y[i] = expr(a[...], b[...])`` over ``out`` (dense), reading a and b
        with the element strides ``sa`` and ``sb`` (0 where broadcast)."""
        dims, sa, sb = _collapse(list(out), sa, sb)
        pa, pb, py = self.ptr(a), self.ptr(b), self.ptr(y)
        lines = []
        depth = len(dims)
        # index arithmetic with literal strides: the innermost loop is unit-stride or a splat
        for d in range(depth):
            lines.append(f"{'  ' * d}for (int64_t i{d} = 0; i{d} < {dims[d]}; i{d}++) {{")
        ia = " + ".join(f"i{d} * {sa[d]}" for d in range(depth) if sa[d]) or "0"
        ib = " + ".join(f"i{d} * {sb[d]}" for d in range(depth) if sb[d]) or "0"
        iy = " + ".join(f"i{d} * {_row_stride(dims, d)}" for d in range(depth)) or "0"
        lines.append(f"{'  ' * depth}float a = {pa}[{ia}], b = {pb}[{ib}]; {py}[{iy}] = {expr};")
        for d in range(depth - 1, -1, -1):
            lines.append(f"{'  ' * d}}}")
        self.step("\n".join(lines), [a, b], [y])

    def sum(self, node: Node) -> None:
        """Same-shape operands (check() says so): one pass adding them all."""
        y = node.outputs[0]
        size = math.prod(self.shape(y))
        terms = " + ".join(f"{self.ptr(x)}[i]" for x in node.inputs)
        self.step(f"for (int64_t i = 0; i < {size}; i++) {self.ptr(y)}[i] = {terms};", list(node.inputs), [y])

    def concat(self, node: Node) -> None:
        """Each input's rows copied into its place in the output's rows."""
        y = node.outputs[0]
        out = self.shape(y)
        axis = int(node.attrs.get("axis", 1)) % len(out)
        outer, row = math.prod(out[:axis]), math.prod(out[axis:])
        lines, offset = [], 0
        for x in node.inputs:
            width = math.prod(self.shape(x)[axis:])
            if width:
                lines.append(f"for (int64_t o = 0; o < {outer}; o++) memcpy({self.ptr(y)} + o * {row} + {offset}, "
                             f"{self.ptr(x)} + o * {width}, {width} * sizeof(float));")
            offset += width
        self.step("\n".join(lines), list(node.inputs), [y])

    def pool(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        n, c, h, w = self.shape(x)
        if node.op_type == "GlobalAveragePool":
            return self.step(f"nn_mean_rows({self.ptr(x)}, {self.ptr(y)}, {n * c}, {h * w});", [x], [y])
        _, _, oh, ow = self.shape(y)
        a = node.attrs
        kh, kw = a["kernel_shape"]
        sh, sw = a.get("strides") or [1, 1]
        pads = a.get("pads") or [0, 0, 0, 0]
        if a.get("auto_pad", "NOTSET") == "VALID":
            pads = [0, 0, 0, 0]
        if node.op_type == "MaxPool":
            dh, dw = a.get("dilations") or [1, 1]
            self.step(f"nn_maxpool2d({self.ptr(x)}, {self.ptr(y)}, {n * c}, {h}, {w}, {oh}, {ow}, {kh}, {kw}, "
                      f"{sh}, {sw}, {pads[0]}, {pads[1]}, {dh}, {dw});", [x], [y])
        else:
            self.step(f"nn_avgpool2d({self.ptr(x)}, {self.ptr(y)}, {n * c}, {h}, {w}, {oh}, {ow}, {kh}, {kw}, "
                      f"{sh}, {sw}, {pads[0]}, {pads[1]}, {pads[2]}, {pads[3]}, "
                      f"{int(a.get('count_include_pad', 0))});", [x], [y])

    def transpose(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        shape = self.shape(x)
        perm = node.attrs.get("perm") or list(range(len(shape)))[::-1]
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        out_shape = [shape[p] for p in perm]
        out_strides = [strides[p] for p in perm]
        self.step(f"static const int64_t sh[] = {{{', '.join(map(str, out_shape))}}}; "
                  f"static const int64_t st[] = {{{', '.join(map(str, out_strides))}}}; "
                  f"nn_transpose({self.ptr(x)}, {self.ptr(y)}, {len(shape)}, sh, st);", [x], [y])

    # -- memory and text --------------------------------------------------------------

    def finish(self) -> Unit:
        if self.deferred:  # a deferred Conv whose Add was not emitted: cannot happen
            raise AssertionError("a residual Conv was never written")
        self.args = self.args[:self.n_inputs] + list(self.packed) + self.args[self.n_inputs:]
        self.n_inputs += len(self.packed)
        args = {name: i for i, name in enumerate(self.args)}
        last_use: dict[str, int] = {}
        for index, step in enumerate(self.steps):
            for name in step.reads + step.writes:
                last_use[self.root(name)] = index
        offsets: dict[str, int] = {}
        live: list[tuple[int, int, int]] = []  # (offset, size, last step)
        scratch_at: dict[int, int] = {}
        size_total = 0

        def allocate(size: int, until: int, now: int) -> int:
            nonlocal live, size_total
            live = [blk for blk in live if blk[2] >= now]
            offset = 0
            for start, length, _ in sorted(live):
                if offset + size <= start:
                    break
                offset = max(offset, _align(start + length))
            live.append((offset, size, until))
            size_total = max(size_total, offset + size)
            return offset

        for index, step in enumerate(self.steps):
            for name in step.writes:
                root = self.root(name)
                if root not in args and root not in offsets:
                    offsets[root] = allocate(math.prod(self.shape(root)) * 4, last_use[root], index)
            if step.scratch:
                scratch_at[index] = allocate(step.scratch, index, index)
        kernels: dict[str, Kernel] = {}
        lines = []
        if PROFILE_STEPS:
            lines.append(f"static int64_t {self.symbol}_ns[{len(self.steps)}];")
            lines.append(f"NN_EXPORT int {self.symbol}_profile(int64_t *out) {{ memcpy(out, {self.symbol}_ns, "
                         f"sizeof {self.symbol}_ns); return {len(self.steps)}; }}")
        lines.append(f"NN_EXPORT int {self.symbol}(void **args, char *ws) {{")
        for name, i in args.items():
            lines.append(f"  float *v_{self._cname(name)} = (float *)args[{i}];")
        for name, offset in offsets.items():
            lines.append(f"  float *v_{self._cname(name)} = (float *)(ws + {offset});")
        lines.append("  nn_call_begin();")
        for index, step in enumerate(self.steps):
            kernel, pointers = make_kernel(step.code, step.support)
            kernels.setdefault(kernel.name, kernel)
            if kernel.scratch:
                pointers.append(f"ws + {scratch_at.get(index, 0)}")
            call = f"{kernel.name}({', '.join(pointers)});"
            if PROFILE_STEPS:
                call = f"{{ int64_t t0 = nn_now(); {call} {self.symbol}_ns[{index}] += nn_now() - t0; }}"
            lines.append("  " + call)
        lines.append("  nn_call_end();\n  return 0;\n}\n")
        declarations = [k.declaration for k in kernels.values()]
        ops = sorted({n.op_type for n in self.nodes})
        return Unit(self.symbol, "\n".join(declarations + lines), self.args, self.n_inputs, _align(size_total),
                    ops, [s.label for s in self.steps], list(kernels.values()), dict(self.packed),
                    any(_calls_blas(s.code) for s in self.steps))


@dataclass
class Kernel:
    """One step's code as a C function of its buffers (``float *p0, ...``, then ``char
    *scratch`` when it needs per-step scratch): shapes, attributes and the scalars that
    shape the code (a Clip bound, an exponent) are literals in it; every tensor, weights
    included, and every workspace offset is an argument. So the same layer in another
    model, partition or compile is the same function. Named by the hash of its text."""

    name: str
    definition: str
    declaration: str
    scratch: bool


_POINTER = re.compile(r"\bv_[0-9]+\b")


def make_kernel(code: str, support: str = "") -> tuple[Kernel, list[str]]:
    """The kernel for a step's code (with the file-scope ``support`` it calls), and the
    entry point's pointers to call it with."""
    pointers: list[str] = []
    for found in _POINTER.findall(code):
        if found not in pointers:
            pointers.append(found)
    body = _POINTER.sub(lambda m: f"p{pointers.index(m.group(0))}", code)
    params = [f"float *p{i}" for i in range(len(pointers))]
    scratch = "SCRATCH" in body
    if scratch:
        body = body.replace("SCRATCH", "scratch")
        params.append("char *scratch")
    signature = f"({', '.join(params) or 'void'})"
    text = f"{support}void NN_KERNEL{signature} {{\n  {body.replace(chr(10), chr(10) + '  ')}\n}}\n"
    name = "nnk_" + blake3(text.encode()).hexdigest()[:24]
    return Kernel(name, text.replace("NN_KERNEL", name, 1), f"void {name}{signature};", scratch), pointers


def generate(partition, graph: Graph, infos: dict[str, TensorInfo], symbol: str, vl: int = 4) -> Unit:
    """``vl``: the floats per vector of the ISA the code is built for (nncc.native.isa)."""
    return _Writer(partition, graph, infos, symbol, vl).build()


def prelude() -> str:
    return source("prelude.h")


def translation_units(units: list[Unit]) -> list[tuple[str, str]]:
    """(label, C source) of every translation unit the partitions link from: the runtime,
    each distinct kernel, and one small unit of entry points per partition. Each starts
    with the prelude, so each compiles on its own."""
    head = prelude()
    out = [("runtime", head + "\n" + source("runtime.c"))]
    seen: set[str] = set()
    for unit in units:
        for kernel in unit.kernels:
            if kernel.name not in seen:
                seen.add(kernel.name)
                out.append((kernel.name, head + "\n" + kernel.definition))
    out.extend((unit.symbol, head + "\n" + unit.source) for unit in units)
    return out


def _calls_blas(code: str) -> bool:
    """The runtime helpers that reach BLAS: its GEMM, and the grouped convolution on it."""
    return "nn_gemm(" in code or "nn_conv2d(" in code


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _f(value: float) -> str:
    if value == np.inf:
        return "INFINITY"
    if value == -np.inf:
        return "(-INFINITY)"
    if value != value:
        return "NAN"
    return f"{float(np.float32(value))!r}f"


def _broadcast_strides(shape, out) -> list[int]:
    """Element strides of ``shape`` read in ``out``'s index space (0 where broadcast)."""
    return batch_strides(shape, out, 1)


def _collapse(dims, sa, sb):
    """Merge adjacent axes that every operand walks contiguously, and drop size-1 axes."""
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    dims, sa, sb = [dims[d] for d in keep], [sa[d] for d in keep], [sb[d] for d in keep]
    if not dims:
        return [1], [0], [0]
    out_d, out_a, out_b = [dims[0]], [sa[0]], [sb[0]]
    for d in range(1, len(dims)):
        merge = all(prev == cur * dims[d] for prev, cur in ((out_a[-1], sa[d]), (out_b[-1], sb[d]))
                    if not (prev == 0 and cur == 0))
        if merge and all((p == 0) == (c == 0) for p, c in ((out_a[-1], sa[d]), (out_b[-1], sb[d]))):
            out_d[-1] *= dims[d]
            out_a[-1], out_b[-1] = sa[d], sb[d]
        else:
            out_d.append(dims[d]); out_a.append(sa[d]); out_b.append(sb[d])  # noqa: E702
    return out_d, out_a, out_b


def _row_stride(dims, d) -> int:
    return math.prod(dims[d + 1:])


