"""Random geometries for every op the native backend takes, as small real ONNX models.

A case is one op (or a short chain) with its own inputs and outputs; case ``index`` of
``seed`` is drawn from its own generator (``default_rng([seed, index])``), so it can be
rebuilt alone. Kinds take turns by index, so any run of consecutive indices covers them
all; one round in four is compiled at -O0 (nothing fused), the others at -O2. One case in
``NONFINITE`` (drawn from the case's third generator, so the geometries stay as they were;
``NNCC_FUZZ_NONFINITE=1`` plants them in every case) has NaN, +inf and -inf planted at
random places of one of its inputs: an output must then be NaN exactly where onnxruntime's
is, and infinite where it is. ``indices(count, kinds)`` are the first ``count`` indices
whose kind is one of ``kinds`` (all kinds when empty).
``batch_model(cases)`` puts many cases side by side into one model, so one compile builds
all their kernels in parallel.

``compare`` judges a case: nncc against onnxruntime, and where those disagree beyond the
tolerance, against the onnx reference evaluator (nncc passes only if it matches that).
Tolerance per output element: ``|nncc - oracle| <= ATOL_PER_TERM * terms * scale + RTOL *
|oracle|``, where ``terms`` is the length of the longest sum behind an element (Conv:
C/group * kh * kw; Gemm/MatMul: K; pooling: the window; Softmax/LayerNormalization: the
row; RNN/GRU/LSTM: a gate's, input + hidden + 2; elementwise ops: 1) and ``scale`` is
max(1, max |oracle|) over the output: float32 rounding grows with both, and any real
mistake (a wrong tap, a missed pad, garbage read past a buffer) is off by the order of the
values themselves.

Reproduce one case (prints its geometry and the differences)::

    PYTHONPATH=. python -m tests.native_fuzz_cases SEED INDEX

``--run SEED OUT.npz INDEX...`` runs cases through nncc only, ``BATCH`` to a model, and
saves their outputs (the sanitized run of tests/test_native_fuzz.py does this in a process
with the sanitizer runtimes preloaded, and compares in the parent).
"""

from __future__ import annotations

import contextlib

import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
NONFINITE = int(os.environ.get("NNCC_FUZZ_NONFINITE") or 8)  # one case in this many is fed NaN, +inf and -inf
BATCH = 120  # cases per model: one compile builds all their kernels in parallel
ATOL_PER_TERM = 1e-6
RTOL = 1e-5


@dataclass
class Case:
    seed: int
    index: int
    kind: str
    geometry: dict
    nodes: list = field(default_factory=list)
    inputs: dict = field(default_factory=dict)  # graph input name -> array
    inits: dict = field(default_factory=dict)  # initializer name -> array
    outputs: list = field(default_factory=list)
    terms: int = 1  # the longest sum behind an output element
    opt_level: int = 2  # -O2 fuses activations and biases into Conv, Gemm and MatMul; -O0 leaves them apart
    precision: str = "f32"  # the compile's precision (bf16: products by constant weights in bfloat16)
    slack: dict = field(default_factory=dict)  # output name -> per-element error bound added to the tolerance
    # the same computation as onnxruntime can run it, when it cannot run ``nodes`` (a
    # batch-major recurrent node: its layout-0 twin between Transposes)
    oracle_nodes: list | None = None
    # the same computation in standard ops, for the onnx reference evaluator when ``nodes``
    # hold a com.microsoft one (a DynamicQuantizeMatMul's chain)
    reference_nodes: list | None = None
    nonfinite: str | None = None  # the input NaN, +inf and -inf were planted in
    # sets ``slack`` from the final inputs, once NaN and infinities are planted (a bound
    # that depends on the inputs' values: attention_bf16's)
    bound: object = None


    @property
    def reproduce(self) -> str:
        return f"PYTHONPATH=. python -m tests.native_fuzz_cases {self.seed} {self.index}"

    def describe(self) -> str:
        planted = f" NaN/inf in {self.nonfinite}" if self.nonfinite else ""
        return f"case {self.seed}:{self.index} {self.kind} -O{self.opt_level} {self.precision}{planted} {self.geometry}"


class _Builder:
    """Names prefixed by the case, random tensors from the case's generator."""

    def __init__(self, case: Case, rng):
        self.case, self.rng = case, rng
        self.prefix = f"c{case.index}_"

    def name(self, short: str) -> str:
        return self.prefix + short

    def input(self, short, shape, low=None, high=None) -> str:
        name = self.name(short)
        self.case.inputs[name] = self._values(shape, low, high)
        return name

    def init(self, short, shape_or_value, low=None, high=None) -> str:
        name = self.name(short)
        if isinstance(shape_or_value, np.ndarray):
            self.case.inits[name] = shape_or_value.astype(np.float32)
        else:
            self.case.inits[name] = self._values(shape_or_value, low, high)
        return name

    def init_ints(self, short, values) -> str:
        """An int64 constant: positions, axes."""
        name = self.name(short)
        self.case.inits[name] = np.asarray(values, np.int64)
        return name

    def node(self, op, inputs, outputs, **attrs) -> list[str]:
        outs = [self.name(o) for o in outputs]
        self.case.nodes.append(helper.make_node(op, list(inputs), outs, name=self.name(f"{op}{len(self.case.nodes)}"),
                                                **attrs))
        return outs

    def output(self, name: str) -> None:
        self.case.outputs.append(name)

    def _values(self, shape, low, high) -> np.ndarray:
        if low is None:
            return self.rng.standard_normal(shape).astype(np.float32)
        return self.rng.uniform(low, high, shape).astype(np.float32)


def _choice(rng, options):
    return options[int(rng.integers(len(options)))]


ODD = [1, 2, 3, 5, 7, 17]


# -- convolution ---------------------------------------------------------------------------


def _conv_geometry(rng, c, depthwise=False, pointwise=False, groups=None):
    """Attributes and the weight shape of a random 2-D Conv over ``c`` channels;
    ``pointwise``: a 1x1 kernel, mostly stride 1 (a GEMM over the input when unpadded);
    ``groups``: (group, output channels per group) as given."""
    if depthwise:
        group, k = c, c
    elif groups:
        group, k = groups[0], groups[0] * groups[1]
    else:
        group = _choice(rng, [1, 1, 1] + [g for g in (2, 3) if c % g == 0])
        k = group * int(rng.integers(1, 4))
    kh, kw = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    if pointwise or rng.random() < 0.25:
        kh = kw = 1
    strides = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    if pointwise and rng.random() < 0.8:
        strides = [1, 1]
    dil = [int(rng.integers(1, 4)), int(rng.integers(1, 4))] if rng.random() < 0.35 else [1, 1]
    eh, ew = (kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1
    pads = [int(rng.integers(0, max(eh - 1, 2) + 1)), int(rng.integers(0, max(ew - 1, 2) + 1)),
            int(rng.integers(0, max(eh - 1, 2) + 1)), int(rng.integers(0, max(ew - 1, 2) + 1))]
    style = rng.random()
    if style < (0.4 if pointwise else 0.2):
        pads[0] = pads[1] = 0  # end pads only
        if pointwise and not any(pads):
            pads[2 + int(rng.integers(0, 2))] = 1
    elif style < (0.8 if pointwise else 0.3):
        pads = [0, 0, 0, 0]
    attrs = dict(kernel_shape=[kh, kw], strides=strides, pads=pads, dilations=dil, group=group)
    return attrs, (k, c // group, kh, kw), (eh, ew)


def _spatial(rng, eh, ew, pads):
    """An input size the (dilated) kernel fits into once padded."""
    h = max(1, eh - pads[0] - pads[2]) + int(rng.integers(0, 9))
    w = max(1, ew - pads[1] - pads[3]) + int(rng.integers(0, 9))
    return h, w


def _out(size, pb, pe, extent, stride, ceil=False):
    span = size + pb + pe - extent
    if ceil:
        o = -(-span // stride) + 1
        return o - 1 if (o - 1) * stride >= size + pb else o
    return span // stride + 1


def _conv_epilogue(b, y: str, rng, epilogue: str, skip_shape) -> str:
    """What follows a fuzzed convolution ``y``, fused into its store by -O2: ``epilogue`` is
    one of "", Relu, Clip (random bounds), Sigmoid, Silu, Mish (spelled out, as exporters
    write them), residual or residual_relu (an Add of an input of ``skip_shape``, the
    convolution's output shape); the value after it."""
    if epilogue == "Relu":
        (y,) = b.node("Relu", [y], ["relu"])
    elif epilogue == "Clip":
        lo, hi = sorted(float(v) for v in rng.uniform(-1.5, 1.5, 2))
        (y,) = b.node("Clip", [y, b.init("lo", np.array(lo)), b.init("hi", np.array(hi))], ["clip"])
    elif epilogue == "Sigmoid":
        (y,) = b.node("Sigmoid", [y], ["sigmoid"])
    elif epilogue == "Silu":  # x * Sigmoid(x), which -O2 fuses into the convolution as SiLU
        (s,) = b.node("Sigmoid", [y], ["sigmoid"])
        (y,) = b.node("Mul", [y, s], ["silu"])
    elif epilogue == "Mish":  # x * Tanh(Softplus(x)), which -O2 fuses into the convolution as Mish
        (t,) = b.node("Tanh", [b.node("Softplus", [y], ["softplus"])[0]], ["tanh"])
        (y,) = b.node("Mul", [y, t], ["mish"])
    elif epilogue.startswith("residual"):
        (y,) = b.node("Add", [y, b.input("skip", tuple(skip_shape))], ["add"])
        if epilogue == "residual_relu":
            (y,) = b.node("Relu", [y], ["relu"])
    return y


def conv(case, rng, pointwise=False, wide=False):
    b = _Builder(case, rng)
    depthwise = not pointwise and not wide and rng.random() < 0.3
    c = _choice(rng, [1, 2, 3, 4, 5, 6, 7, 9]) if not depthwise else _choice(rng, [1, 2, 3, 5, 8, 16])
    groups = None
    if wide:
        # several output channel blocks over an input larger than the weights: each task
        # then sweeps every block of output channels over its rows (blocked_conv.sweeps_groups)
        c = _choice(rng, [3, 8, 13, 20])
        groups = (1, _choice(rng, [16, 17, 24, 33, 40, 48]))
    elif not depthwise and not pointwise and rng.random() < 0.2:
        # groups of 8 or 16 channels in and out: whole channel blocks with AVX2 (16: with
        # AVX-512 too), written as a dense convolution per group over the blocked layout
        groups = (_choice(rng, [2, 3]), _choice(rng, [8, 16]))
        c = groups[0] * _choice(rng, [8, 16])
    elif pointwise and rng.random() < 0.3:
        # groups that are not whole channel blocks (ShuffleNet's), written over NCHW as one
        # step of register tiles that stay in a group: rows past a tile, pixels past a vector
        groups = (_choice(rng, [2, 3, 4]), _choice(rng, [1, 5, 7, 12, 34]))
        c = groups[0] * _choice(rng, [3, 6, 17, 34])
    attrs, wshape, (eh, ew) = _conv_geometry(rng, c, depthwise, pointwise, groups)
    n = _choice(rng, [1, 1, 2, 3])
    h, w = _spatial(rng, eh, ew, attrs["pads"])
    if wide:  # enough pixels that the image outweighs the weights
        h, w = h + int(rng.integers(8, 24)), w + int(rng.integers(8, 24))
    x = b.input("x", (n, c, h, w))
    ins = [x, b.init("w", wshape)]
    bias = rng.random() < 0.6
    if bias:
        ins.append(b.init("b", (wshape[0],)))
    epilogue = _choice(rng, ["", "", "Relu", "Clip", "residual", "residual_relu", "Sigmoid", "Silu", "Mish"])
    (y,) = b.node("Conv", ins, ["conv"], **attrs)
    oh = _out(h, attrs["pads"][0], attrs["pads"][2], eh, attrs["strides"][0])
    ow = _out(w, attrs["pads"][1], attrs["pads"][3], ew, attrs["strides"][1])
    y = _conv_epilogue(b, y, rng, epilogue, (n, wshape[0], oh, ow))
    b.output(y)
    case.terms = wshape[1] * wshape[2] * wshape[3] + 2
    case.geometry = dict(x=[n, c, h, w], w=list(wshape), bias=bias, epilogue=epilogue or None,
                         **{k: v for k, v in attrs.items() if k != "kernel_shape"})


def conv_chain(case, rng):
    """Conv -> Conv, or Conv -> MaxPool -> Conv, maybe a channel Concat before the second
    Conv: intermediates in the workspace."""
    b = _Builder(case, rng)
    c = _choice(rng, [1, 2, 3, 4, 5])
    a1, w1, (eh1, ew1) = _conv_geometry(rng, c)
    n = _choice(rng, [1, 2])
    h, w = _spatial(rng, eh1, ew1, a1["pads"])
    h, w = h + 6, w + 6  # room for what follows
    (y,) = b.node("Conv", [b.input("x", (n, c, h, w)), b.init("w1", w1), b.init("b1", (w1[0],))], ["conv1"], **a1)
    oh = _out(h, a1["pads"][0], a1["pads"][2], eh1, a1["strides"][0])
    ow = _out(w, a1["pads"][1], a1["pads"][3], ew1, a1["strides"][1])
    chain = ["Conv"]
    if rng.random() < 0.5 and oh >= 2 and ow >= 2:
        stride, ph, pw = 1 + int(rng.integers(0, 2)), int(rng.integers(0, 2)), int(rng.integers(0, 2))
        (y,) = b.node("MaxPool", [y], ["pool"], kernel_shape=[2, 2], strides=[stride] * 2, pads=[0, 0, ph, pw])
        oh, ow = _out(oh, 0, ph, 2, stride), _out(ow, 0, pw, 2, stride)
        chain.append("MaxPool")
    (y,) = b.node("Relu", [y], ["relu"])
    channels = w1[0]
    if rng.random() < 0.3:  # a channel Concat over the blocked layout, half the time with an NCHW input
        if rng.random() < 0.5:
            (other,), extra = b.node("Neg", [y], ["neg"]), w1[0]
        else:
            extra = _choice(rng, [1, 3, 8])
            other = b.input("side", (n, extra, oh, ow))
        (y,) = b.node("Concat", [y, other] if rng.random() < 0.5 else [other, y], ["joined"], axis=1)
        channels += extra
        chain.append("Concat")
    a2, w2, (eh2, ew2) = _conv_geometry(rng, channels)
    a2["pads"] = [min(p, 1) for p in a2["pads"]]
    if rng.random() < 0.5 or eh2 > oh + a2["pads"][0] + a2["pads"][2] or ew2 > ow + a2["pads"][1] + a2["pads"][3]:
        a2.update(kernel_shape=[1, 1], dilations=[1, 1], strides=[1, 1])  # pointwise, which always fits
    w2 = (w2[0], w2[1], *a2["kernel_shape"])
    (y,) = b.node("Conv", [y, b.init("w2", w2)], ["conv2"], **a2)
    chain.append("Conv")
    b.output(y)
    case.terms = (w1[1] * w1[2] * w1[3] + 1) * w2[1] * w2[2] * w2[3]
    case.geometry = dict(x=[n, c, h, w], chain=chain, w1=list(w1), w2=list(w2), conv1=a1, conv2=a2)


# -- pooling -------------------------------------------------------------------------------


def pool(case, rng):
    b = _Builder(case, rng)
    op = _choice(rng, ["MaxPool", "MaxPool", "AveragePool", "AveragePool", "GlobalAveragePool"])
    # from half a vector of channels up an NCHW average pool runs over the blocked layout
    n, c = _choice(rng, [1, 2, 3]), _choice(rng, [1, 2, 3, 5, 9, 16])
    if op == "GlobalAveragePool":
        h, w = int(rng.integers(1, 12)), int(rng.integers(1, 12))
        b.output(b.node(op, [b.input("x", (n, c, h, w))], ["y"])[0])
        case.terms = h * w
        case.geometry = dict(op=op, x=[n, c, h, w])
        return
    kh, kw = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    dil = [int(rng.integers(1, 3)), int(rng.integers(1, 3))] if op == "MaxPool" and rng.random() < 0.4 else [1, 1]
    pads = [int(rng.integers(0, kh)), int(rng.integers(0, kw)), int(rng.integers(0, kh)), int(rng.integers(0, kw))]
    if rng.random() < 0.3:
        pads = [0, 0, 0, 0]
    strides = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    eh, ew = (kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1
    h, w = _spatial(rng, eh, ew, pads)
    attrs = dict(kernel_shape=[kh, kw], strides=strides, pads=pads, ceil_mode=int(rng.random() < 0.4))
    if op == "MaxPool" and not all(_windows_see_input(size, pads[i], pads[i + 2], k, st, d, attrs["ceil_mode"])
                                   for i, (size, k, st, d) in enumerate(zip((h, w), (kh, kw), strides, dil))):
        # a window of padding only has no defined maximum (onnxruntime gives -FLT_MAX, the
        # reference evaluator 0, nncc -inf): unpadded, every window starts on the input
        attrs["pads"] = [0, 0, 0, 0]
        h, w = max(h, eh), max(w, ew)
    if op == "MaxPool":
        attrs["dilations"] = dil
    else:
        attrs["count_include_pad"] = int(rng.random() < 0.5)
    x = b.input("x", (n, c, h, w))
    b.output(b.node(op, [x], ["y"], **attrs)[0])
    case.terms = kh * kw
    case.geometry = dict(op=op, x=[n, c, h, w], **attrs)


def _windows_see_input(size, pb, pe, k, stride, dil, ceil) -> bool:
    """Whether every pooling window along an axis has a tap on the input itself."""
    out = _out(size, pb, pe, (k - 1) * dil + 1, stride, bool(ceil))
    return all(any(0 <= o * stride - pb + t * dil < size for t in range(k)) for o in range(out))


# -- Gemm and MatMul -----------------------------------------------------------------------


def gemm(case, rng):
    b = _Builder(case, rng)
    m, k, nn = (_choice(rng, ODD + [4, 8, 33]) for _ in range(3))
    ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
    alpha = float(_choice(rng, [1.0, 1.0, 0.5, -1.25]))
    beta = float(_choice(rng, [1.0, 1.0, 0.0, 2.0]))
    c_form = _choice(rng, [None, "scalar", "row", "col", "full", "1x1"])
    a = b.input("a", (k, m) if ta else (m, k))
    bmat = b.init("b", (nn, k) if tb else (k, nn)) if rng.random() < 0.7 else b.input("b", (nn, k) if tb else (k, nn))
    ins = [a, bmat]
    if c_form is not None:
        shape = {"scalar": (), "row": (nn,), "col": (m, 1), "full": (m, nn), "1x1": (1, 1)}[c_form]
        ins.append(b.init("c", shape) if rng.random() < 0.7 else b.input("c", shape))
    act = _choice(rng, ["", "", "Relu", "Sigmoid", "Tanh"])
    (y,) = b.node("Gemm", ins, ["gemm"], transA=ta, transB=tb, alpha=alpha, beta=beta)
    if act:
        (y,) = b.node(act, [y], ["act"])
    b.output(y)
    case.terms = k + 1
    case.geometry = dict(M=m, K=k, N=nn, transA=ta, transB=tb, alpha=alpha, beta=beta, C=c_form, act=act or None)


def matmul(case, rng):
    b = _Builder(case, rng)
    m, k, nn = (_choice(rng, ODD + [4, 16]) for _ in range(3))
    batch_a = [_choice(rng, [1, 2, 3]) for _ in range(int(rng.integers(0, 3)))]
    weights = rng.random() < 0.5
    if weights:
        batch_b = []
    else:  # broadcast batches: each of B's dims is A's, or 1, or A has none there
        batch_b = [d if rng.random() < 0.6 else 1 for d in batch_a]
        if rng.random() < 0.3:
            batch_b = [_choice(rng, [2, 3])] + batch_b
        for i in range(len(batch_a)):
            if rng.random() < 0.2:
                batch_a[i] = 1
    a = b.input("a", (*batch_a, m, k))
    bm = b.init("b", (*batch_b, k, nn)) if weights else b.input("b", (*batch_b, k, nn))
    (y,) = b.node("MatMul", [a, bm], ["mm"])
    bias = rng.random() < 0.4
    if bias:
        (y,) = b.node("Add", [y, b.init("bias", (nn,))], ["add"])
    act = _choice(rng, ["", "", "Relu", "Sigmoid", "Tanh"])
    if act:
        (y,) = b.node(act, [y], ["act"])
    b.output(y)
    case.terms = k + 1
    case.geometry = dict(a=[*batch_a, m, k], b=[*batch_b, k, nn], weights=weights, bias=bias, act=act or None)



def product_act(case, rng):
    """A product by constant weights (and a bias) with an activation its store applies on
    vectors after the tile is stored (gemm_gen.TILE_VECTOR_ACTS), spelled out as exporters
    write it: GELU's erf and tanh forms, SiLU, Mish, Sigmoid; then, sometimes, a residual
    Add the same store takes. Widths that are not whole vectors give partial last vectors;
    pre-activations spread over the functions' tails (standard normal inputs and weights)."""
    b = _Builder(case, rng)
    m, k = _choice(rng, ODD + [6, 13]), _choice(rng, ODD + [16, 40])
    nn = _choice(rng, ODD + [8, 16, 19, 40, 70])
    x = b.input("a", (m, k))
    (y,) = b.node("MatMul", [x, b.init("w", (k, nn))], ["mm"])
    (y,) = b.node("Add", [y, b.init("bias", (nn,))], ["z"])
    act = _choice(rng, ["GeluErf", "GeluTanh", "Silu", "Mish", "Sigmoid"])
    half, one = b.init("half", np.array(0.5)), b.init("one", np.array(1.0))
    if act == "GeluErf":
        inner = b.node("Erf", [b.node("Div", [y, b.init("r2", np.array(math.sqrt(2.0)))], ["d"])[0]], ["e"])[0]
        (g,) = b.node("Mul", [b.node("Mul", [y, half], ["hs"])[0], b.node("Add", [inner, one], ["g1"])[0]], ["g"])
    elif act == "GeluTanh":
        cube = b.node("Mul", [b.node("Mul", [y, y], ["y2"])[0], y], ["y3"])[0]
        u = b.node("Add", [y, b.node("Mul", [cube, b.init("c", np.array(0.044715))], ["cc"])[0]], ["u"])[0]
        inner = b.node("Tanh", [b.node("Mul", [u, b.init("k", np.array(math.sqrt(2.0 / math.pi)))], ["uk"])[0]],
                       ["t"])[0]
        (g,) = b.node("Mul", [b.node("Mul", [y, half], ["hs"])[0], b.node("Add", [inner, one], ["g1"])[0]], ["g"])
    elif act == "Silu":
        (g,) = b.node("Mul", [y, b.node("Sigmoid", [y], ["sg"])[0]], ["g"])
    elif act == "Mish":
        (sp,) = b.node("Log", [b.node("Add", [b.node("Exp", [y], ["ex"])[0], one], ["ex1"])[0]], ["sp"])
        (g,) = b.node("Mul", [y, b.node("Tanh", [sp], ["th"])[0]], ["g"])
    else:
        (g,) = b.node("Sigmoid", [y], ["g"])
    residual = rng.random() < 0.4
    if residual:
        (g,) = b.node("Add", [g, b.input("res", (m, nn))], ["y"])
    b.output(g)
    case.terms = k + 3
    case.geometry = dict(M=m, K=k, N=nn, act=act, residual=residual)

def bf16_bound(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """The error bound of a product computed in bfloat16 (the compile's ``precision="bf16"``),
    per element of ``a @ b`` (batch dims broadcast): each input rounded to 8 significant
    bits is off by at most 2^-8 of itself, so each product by (2 * 2^-8 + 2^-16) of |a b|;
    float32 sums of K + 2 terms (the bias and a rounding) add (K + 2) * 2^-24 of the
    absolute sum. vdpbf16ps and tdpbf16ps read a denormal as zero and flush a denormal
    result: each input off by at most 2^-126 more, each of the K + 2 sums too, so
    2^-126 * (sum_k |a_ik| + sum_k |b_kj|) * (1 + 2^-8) + (K + 2) * 2^-126 (docs/native.md).
    The activations tested are 1-Lipschitz, so the bound passes through."""
    a64, b64 = np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64))
    terms = a64 @ b64
    denormal = 2.0**-126 * ((a64.sum(-1, keepdims=True) + b64.sum(-2, keepdims=True)) * (1 + 2.0**-8) + k + 2)
    return (2 * 2.0**-8 + 2.0**-16 + (k + 2) * 2.0**-24) * terms + denormal


def bf16_gemm(case, rng):
    """A product by constant weights compiled with precision bf16: MatMul (A with batch
    dims) or Gemm (transposed operands, alpha, a bias row), then an activation."""
    b = _Builder(case, rng)
    case.precision = "bf16"
    m, k, nn = (_choice(rng, ODD + [4, 16, 33, 64]) for _ in range(3))
    act = _choice(rng, ["", "Relu", "Sigmoid", "Tanh"])
    if rng.random() < 0.5:
        batch = [_choice(rng, [1, 2, 3]) for _ in range(int(rng.integers(0, 3)))]
        a = b.input("a", (*batch, m, k))
        w = b.init("w", (k, nn))
        (y,) = b.node("MatMul", [a, w], ["mm"])
        bias = rng.random() < 0.6
        if bias:
            (y,) = b.node("Add", [y, b.init("bias", (nn,))], ["add"])
        bound = bf16_bound(case.inputs[a], case.inits[w], k)
        case.geometry = dict(a=[*batch, m, k], w=[k, nn], bias=bias, act=act or None)
    else:
        ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        alpha = float(_choice(rng, [1.0, 0.5, -1.25]))
        a = b.input("a", (k, m) if ta else (m, k))
        w = b.init("w", (nn, k) if tb else (k, nn))
        (y,) = b.node("Gemm", [a, w, b.init("c", (nn,))], ["gemm"], transA=ta, transB=tb, alpha=alpha)
        av, wv = case.inputs[a], case.inits[w]
        bound = abs(alpha) * bf16_bound(av.T if ta else av, wv.T if tb else wv, k)
        case.geometry = dict(M=m, K=k, N=nn, transA=ta, transB=tb, alpha=alpha, act=act or None)
    if act:
        (y,) = b.node(act, [y], ["act"])
    b.output(y)
    case.terms = k + 1
    case.slack = {y: bound}



def conv_terms(x: np.ndarray, w: np.ndarray, attrs: dict) -> np.ndarray:
    """sum |x * w| over each output element's taps, in float64: what bounds the error of a
    convolution computed in bfloat16 as bf16_bound's row sums bound a product's."""
    (sh, sw), (dh, dw), pads, group = attrs["strides"], attrs["dilations"], attrs["pads"], attrs["group"]
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]))
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = np.abs(x.astype(np.float64))
    oh = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[3] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, k, oh, ow))
    aw = np.abs(w.astype(np.float64))
    kg = k // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                taps = xp[:, g * cg:(g + 1) * cg, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                out[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", taps, aw[g * kg:(g + 1) * kg, :, i, j])
    return out


# the precision of a case whose convolutions must compute in bfloat16 pairs on vdpbf16ps:
# precision bf16 built as for a CPU whose vdpbf16ps pays (nncc.native.precision.SLOW_DOT
# left out of the host's features, so the cache token differs too)
BF16_CONV = "bf16+conv"


def conv_bf16(case, rng):
    """A convolution over a channel-blocked input in bfloat16 (nncc/native/conv_bf16.py):
    input channels of every remainder of a 16-lane block and in pairs (odd counts leave a
    half pair), strides, pads, dilations, whole-block groups, bias and the epilogues,
    judged by bf16_bound's reasoning over the taps (conv_terms)."""
    b = _Builder(case, rng)
    case.precision = BF16_CONV
    groups = None
    if rng.random() < 0.2:
        groups = (2, 16)
        c = 32
    else:
        c = _choice(rng, [16, 17, 18, 20, 23, 24, 31, 32, 33, 40, 47])
    attrs, wshape, (eh, ew) = _conv_geometry(rng, c, groups=groups)
    attrs["group"] = 1 if groups is None else attrs["group"]
    if groups is None:
        k = _choice(rng, [1, 5, 16, 17, 33, 48])
        wshape = (k, c, *wshape[2:])
    n = _choice(rng, [1, 1, 2])
    h, w = _spatial(rng, eh, ew, attrs["pads"])
    x = b.input("x", (n, c, h, w))
    ins = [x, b.init("w", wshape)]
    bias = rng.random() < 0.6
    if bias:
        ins.append(b.init("b", (wshape[0],)))
    epilogue = _choice(rng, ["", "Relu", "Clip", "residual", "residual_relu", "Sigmoid"])
    (y,) = b.node("Conv", ins, ["conv"], **attrs)
    oh = _out(h, attrs["pads"][0], attrs["pads"][2], eh, attrs["strides"][0])
    ow = _out(w, attrs["pads"][1], attrs["pads"][3], ew, attrs["strides"][1])
    y = _conv_epilogue(b, y, rng, epilogue, (n, wshape[0], oh, ow))
    b.output(y)
    taps = wshape[1] * wshape[2] * wshape[3]
    case.terms = taps + 2
    # the activations here are 1-Lipschitz, so the products' bound passes through them
    with np.errstate(invalid="ignore"):
        case.slack = {y: (2 * 2.0**-8 + 2.0**-16 + (taps + 2) * 2.0**-24)
                      * conv_terms(case.inputs[x], case.inits[ins[1]], attrs)}
    case.geometry = dict(x=[n, c, h, w], w=list(wshape), bias=bias, epilogue=epilogue or None,
                         **{k: v for k, v in attrs.items() if k != "kernel_shape"})


def _tiles_conv_slack(xv: np.ndarray, wv: np.ndarray, attrs: dict) -> np.ndarray:
    """bf16_bound over a convolution's taps with the denormal term of the tiles, which read
    bfloat16 denormals as zero: |x| summed over each output's taps and |w| over each output
    channel's (conv_amx and conv_stem_amx)."""
    k = wv.shape[0]
    taps = int(np.prod(wv.shape[1:]))
    with np.errstate(invalid="ignore"):
        xsum = conv_terms(xv, np.ones_like(wv), attrs)
        wsum = np.abs(wv.astype(np.float64)).reshape(k, -1).sum(1)[None, :, None, None]
        denormal = 2.0**-126 * ((xsum + wsum) * (1 + 2.0**-8) + taps + 2)
        return (2 * 2.0**-8 + 2.0**-16 + (taps + 2) * 2.0**-24) * conv_terms(xv, wv, attrs) + denormal


def conv_amx(case, rng):
    """A convolution over a channel-blocked input compiled with precision bf16, which CPUs
    with AMX multiply on tiles (nncc/native/conv_amx.py; elsewhere vdpbf16ps or float32,
    both within the same bound): half 1x1 stride-1 unpadded, half any kernel, stride
    (the input split into phases), padding and dilation, output rows of fewer, as many and
    more pixels than a tile; input channels of every remainder of a block and odd and even
    counts of blocks (whole and half 32-channel groups per tile of the product), output
    channels around the 16-channel tile and the 32-channel micro-tile, pixels around the
    16-pixel tile, batches, bias and the epilogues; one case in four with the input near float32's
    smallest normal, so some of it is denormal (which the tiles read as zero)."""
    b = _Builder(case, rng)
    case.precision = "bf16"
    c = _choice(rng, [16, 17, 24, 31, 32, 33, 48, 64, 65, 96])
    k = _choice(rng, [1, 5, 16, 17, 31, 32, 33, 48, 64])
    n = _choice(rng, [1, 1, 2])
    if rng.random() < 0.5:  # 1x1, stride 1, unpadded: the product over all pixels
        attrs = dict(kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
        h, w = _choice(rng, [(1, 1), (3, 5), (4, 4), (2, 8), (4, 8), (5, 7), (7, 7), (3, 11), (6, 6), (9, 9), (1, 33)])
    else:  # tap by tap: kernels, strides, pads, dilations, rows under, at and over 16 pixels
        attrs, wshape, (eh, ew) = _conv_geometry(rng, c, groups=(1, k))
        h, w = _spatial(rng, eh, ew, attrs["pads"])
        w += _choice(rng, [0, 0, 10, 30])
    x = b.input("x", (n, c, h, w))
    if rng.random() < 0.25:
        case.inputs[x] *= np.float32(2.0**-124)
    kh, kw = attrs["kernel_shape"]
    ins = [x, b.init("w", (k, c, kh, kw))]
    bias = rng.random() < 0.6
    if bias:
        ins.append(b.init("b", (k,)))
    epilogue = _choice(rng, ["", "Relu", "Clip", "residual", "residual_relu", "Sigmoid"])
    (y,) = b.node("Conv", ins, ["conv"], **attrs)
    oh = _out(h, attrs["pads"][0], attrs["pads"][2], (kh - 1) * attrs["dilations"][0] + 1, attrs["strides"][0])
    ow = _out(w, attrs["pads"][1], attrs["pads"][3], (kw - 1) * attrs["dilations"][1] + 1, attrs["strides"][1])
    y = _conv_epilogue(b, y, rng, epilogue, (n, k, oh, ow))
    b.output(y)
    taps = c * kh * kw
    case.terms = taps + 2
    wv = case.inits[ins[1]]
    case.slack = {y: _tiles_conv_slack(case.inputs[x], wv, attrs)}
    case.geometry = dict(x=[n, c, h, w], w=[k, c, kh, kw], bias=bias, epilogue=epilogue or None,
                         **{key: v for key, v in attrs.items() if key != "kernel_shape"})


def conv_stem_amx(case, rng):
    """A network's first convolution (a few channels read straight from the NCHW input)
    compiled with precision bf16, which CPUs with AMX multiply on tiles over gathered
    receptive fields (nncc/native/conv_stem_bf16.py; elsewhere float32, within the same
    bound): one to four channels, square and oblong kernels up to 7x7 (a kernel row's values
    up to 28, the receptive field one to five tiles), strides, pads of either end, row
    dilations, output channels around the 16-channel tile and the 32-channel micro-tile,
    pixels around the 32-pixel block, batches, bias and the epilogues; one case in four with
    the input near float32's smallest normal, so some of it is denormal (which the tiles
    read as zero)."""
    b = _Builder(case, rng)
    case.precision = "bf16"
    c = _choice(rng, [1, 2, 3, 3, 3, 4])
    k = _choice(rng, [1, 5, 16, 17, 24, 32, 33, 48, 64])
    n = _choice(rng, [1, 1, 2])
    kh, kw = _choice(rng, [(7, 7), (7, 7), (3, 3), (3, 3), (5, 5), (1, 1),
                           (int(rng.integers(1, 8)), int(rng.integers(1, 8)))])
    strides = [_choice(rng, [1, 2, 2, 3]), _choice(rng, [1, 2, 2, 3])]
    dil = [_choice(rng, [1, 1, 1, 2]), 1]
    eh, ew = (kh - 1) * dil[0] + 1, kw
    pads = [int(rng.integers(0, eh)), int(rng.integers(0, ew)), int(rng.integers(0, eh)), int(rng.integers(0, ew))]
    attrs = dict(kernel_shape=[kh, kw], strides=strides, pads=pads, dilations=dil, group=1)
    h, w = _spatial(rng, eh, ew, pads)
    h, w = h + _choice(rng, [0, 3, 12]), w + _choice(rng, [0, 5, 20, 40])
    x = b.input("x", (n, c, h, w))
    if rng.random() < 0.25:
        case.inputs[x] *= np.float32(2.0**-124)
    ins = [x, b.init("w", (k, c, kh, kw))]
    bias = rng.random() < 0.6
    if bias:
        ins.append(b.init("b", (k,)))
    epilogue = _choice(rng, ["", "Relu", "Relu", "Clip", "residual", "residual_relu", "Sigmoid"])
    (y,) = b.node("Conv", ins, ["conv"], **attrs)
    oh = _out(h, pads[0], pads[2], eh, strides[0])
    ow = _out(w, pads[1], pads[3], ew, strides[1])
    y = _conv_epilogue(b, y, rng, epilogue, (n, k, oh, ow))
    b.output(y)
    taps = c * kh * kw
    case.terms = taps + 2
    wv = case.inits[ins[1]]
    case.slack = {y: _tiles_conv_slack(case.inputs[x], wv, attrs)}  # conv_amx's bound
    case.geometry = dict(x=[n, c, h, w], w=[k, c, kh, kw], bias=bias, epilogue=epilogue or None,
                         **{key: v for key, v in attrs.items() if key != "kernel_shape"})


def bf16_weights_bound(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """The error bound of a product by weights rounded to bfloat16 and widened (what
    precision bf16 computes on a CPU without AVX-512 BF16): each weight off by at most
    2^-8 of itself, exact float32 products, float32 sums of K + 2 terms."""
    terms = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return (2.0**-8 + (k + 2) * 2.0**-24 * (1 + 2.0**-8)) * terms


def bf16_long_gemm(case, rng):
    """A product by constant weights compiled with precision bf16, judged by the bound of
    the arithmetic this CPU computes it in (bfloat16 weights widened where it lacks AVX-512
    BF16, else vdpbf16ps): K long enough to be cut into blocks, one and two rows (the
    split sums), odd panel tails, and a residual Add the product's store takes."""
    from nncc.native.precision import arithmetic  # lazy: only this kind asks

    b = _Builder(case, rng)
    case.precision = "bf16"
    m = _choice(rng, [1, 2, 3, 6, 7, 13, 40])
    k = _choice(rng, [1, 7, 33, 385, 800])
    nn = _choice(rng, [1, 7, 16, 31, 33, 65, 100])
    a = b.input("a", (m, k))
    w = b.init("w", (k, nn))
    (y,) = b.node("MatMul", [a, w], ["mm"])
    residual = rng.random() < 0.5
    if residual:
        (y,) = b.node("Add", [y, b.input("r", (m, nn))], ["res"])
    b.output(y)
    weights_only = arithmetic("bf16", "native") == "bf16w"
    bound = (bf16_weights_bound if weights_only else bf16_bound)(case.inputs[a], case.inits[w], k)
    case.terms = k + 1
    case.slack = {y: bound}
    case.geometry = dict(M=m, K=k, N=nn, residual=residual, arithmetic="bf16w" if weights_only else "bf16")


def gemm_amx(case, rng):
    """A product by constant weights compiled with precision bf16, which CPUs with AMX
    multiply on tiles (nncc/native/gemm_amx_gen.py; elsewhere vdpbf16ps or widened
    weights, each judged by its own bound): M around the 16-row tile (below 8 the
    vdpbf16ps GEMM), K around the tile's 32 values, N around its 16 columns and the
    64-column panel; MatMul with batch dims on A or on both, or Gemm with transposed
    operands, alpha and C as a bias row or a full matrix; an activation, a residual Add;
    one case in four with A scaled near float32's smallest normal, so some of it is
    denormal (which the tiles read as zero)."""
    from nncc.native.precision import arithmetic  # lazy: only this kind asks

    b = _Builder(case, rng)
    case.precision = "bf16"
    m = _choice(rng, [1, 5, 8, 15, 16, 17, 31, 32, 33, 47, 64, 100])
    k = _choice(rng, [1, 2, 15, 31, 32, 33, 63, 64, 65, 100, 129])
    nn = _choice(rng, [1, 15, 16, 17, 48, 63, 64, 65, 100, 130])
    weights_only = arithmetic("bf16", "native") == "bf16w"
    bound_of = bf16_weights_bound if weights_only else bf16_bound
    tiny = rng.random() < 0.25
    form = _choice(rng, ["matmul", "batched", "gemm"])
    if form == "gemm":
        ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        alpha = float(_choice(rng, [1.0, 0.5, -1.25]))
        a = b.input("a", (k, m) if ta else (m, k))
        w = b.init("w", (nn, k) if tb else (k, nn))
        c_form = _choice(rng, ["row", "full"])
        c = b.init("c", (nn,)) if c_form == "row" else b.input("c", (m, nn))
        if tiny:
            case.inputs[a] *= np.float32(2.0**-124)
        (y,) = b.node("Gemm", [a, w, c], ["gemm"], transA=ta, transB=tb, alpha=alpha)
        av, wv = case.inputs[a], case.inits[w]
        bound = abs(alpha) * bound_of(av.T if ta else av, wv.T if tb else wv, k)
        case.geometry = dict(M=m, K=k, N=nn, transA=ta, transB=tb, alpha=alpha, C=c_form)
    else:
        batch = [_choice(rng, [1, 2, 3]) for _ in range(int(rng.integers(1, 3)))]
        a = b.input("a", (*batch, m, k))
        w = b.init("w", (batch[-1], k, nn) if form == "batched" else (k, nn))
        if tiny:
            case.inputs[a] *= np.float32(2.0**-124)
        (y,) = b.node("MatMul", [a, w], ["mm"])
        if rng.random() < 0.6:
            (y,) = b.node("Add", [y, b.init("bias", (nn,))], ["add"])
        bound = bound_of(case.inputs[a], case.inits[w], k)
        case.geometry = dict(a=[*batch, m, k], w=list(case.inits[w].shape))
    act = _choice(rng, ["", "Relu", "Sigmoid", "Tanh", "LeakyRelu"])
    if act:
        (y,) = b.node(act, [y], ["act"])
    if rng.random() < 0.4:
        (y,) = b.node("Add", [y, b.input("res", bound.shape)], ["res_add"])
    b.output(y)
    case.terms = k + 2
    case.slack = {y: bound}
    case.geometry.update(act=act or None, tiny=tiny, arithmetic=arithmetic("bf16", "native"))


# -- attention ---------------------------------------------------------------------------------


def attention(case, rng, **given):
    """Scaled dot-product attention as exporters write it (the attention fusion makes it one
    nncc FusedAttention at -O2): heads split by Transposes or given already split, a scale
    by Mul or Div, an optional mask (a padding mask fed at run time, a constant causal or
    random one, -1e9 or -inf, or a window mask of -100 fed at run time), Softmax, the product with V, heads merged back or not.
    Grouped-query heads (``kv_heads`` dividing ``heads``, drawn from the case's second
    generator so the other geometries stay as they were): K and V with fewer heads, each
    repeated for its group of query heads as exporters write it (Unsqueeze, Expand, Reshape),
    which -O2 reads unrepeated. From the case's fourth generator (so again the other
    geometries stay): the scale split as torch's scaled_dot_product_attention writes it
    (Q and Kᵀ each times the square root of the factor, ``scale="split"``), and its guard
    after the Softmax (``guard``: Where(IsNaN(p), 0, p)), with rows whose keys are all
    hidden (-inf) by the padding mask then. ``given`` fixes any of the geometry's keys
    (tests/test_native_attention.py)."""
    b = _Builder(case, rng)
    g = dict(batch=_choice(rng, [1, 1, 2, 3]), heads=_choice(rng, [1, 2, 3, 5, 8]),
             d=_choice(rng, [1, 3, 8, 17, 32, 64, 80]), sq=_choice(rng, [1, 2, 7, 33, 64, 128, 200]),
             split=_choice(rng, ["transpose", "transpose", "given", "rank3"]),
             mask=_choice(rng, ["", "padding", "causal", "causal_inf", "random"]),
             scale=_choice(rng, ["mul", "mul_first", "div", ""]), merge=rng.random() < 0.6)
    g["dv"] = g["d"] if rng.random() < 0.7 else _choice(rng, [1, 5, 16, 33])
    g["skv"] = g["sq"] if rng.random() < 0.6 else _choice(rng, [1, 5, 64, 65, 130])
    if rng.random() < 0.05:
        g["sq"] = g["skv"] = 512
    grouped = np.random.default_rng([case.seed, case.index, 1])
    if g["split"] != "rank3" and grouped.random() < 0.35:
        g["heads"], g["kv_heads"] = _choice(grouped, [(4, 2), (6, 3), (9, 3), (15, 5), (8, 1), (5, 1), (12, 4),
                                                      (3, 1), (6, 2)])
    g["kv_heads"] = g.get("kv_heads", g["heads"])
    torch_forms = np.random.default_rng([case.seed, case.index, 3])
    if torch_forms.random() < 0.3:
        g["scale"] = "split"
    g["guard"] = bool(torch_forms.random() < 0.4)
    if g["mask"] == "random" and given.get("window", True) and \
            np.random.default_rng([case.seed, case.index, 4]).random() < 0.5:
        g["mask"] = "window"  # from a generator of its own, so the other geometries stay
    g.update(given)
    if "heads" in given and "kv_heads" not in given:
        g["kv_heads"] = g["heads"]
    batch, heads, d, dv, sq, skv = (g[k] for k in ("batch", "heads", "d", "dv", "sq", "skv"))
    kv_heads = g["kv_heads"]
    if g["split"] == "rank3" and g["mask"] == "padding":
        g["mask"] = "random"

    def repeat(x, shape, short):  # [B, Hkv, A, C] -> each head repeated for its group: [B, H, A, C]
        group = heads // kv_heads
        consts = {"axes": [2], "wide": [shape[0], kv_heads, group, shape[2], shape[3]],
                  "merged": [shape[0], heads, shape[2], shape[3]]}
        for key, value in consts.items():
            case.inits[b.name(f"{short}_{key}")] = np.array(value, np.int64)
        x = b.node("Unsqueeze", [x, b.name(f"{short}_axes")], [f"{short}_lone"])[0]
        x = b.node("Expand", [x, b.name(f"{short}_wide")], [f"{short}_wide_out"])[0]
        return b.node("Reshape", [x, b.name(f"{short}_merged")], [f"{short}_rep"])[0]

    if g["split"] == "transpose" and kv_heads != heads:  # [B, S, Hkv, D], heads split, then repeated
        q = b.node("Transpose", [b.input("q", (batch, sq, heads, d))], ["qt"], perm=[0, 2, 1, 3])[0]
        k = b.node("Transpose", [b.input("k", (batch, skv, kv_heads, d))], ["kh"], perm=[0, 2, 1, 3])[0]
        kt = b.node("Transpose", [repeat(k, (batch, kv_heads, skv, d), "k")], ["kt"], perm=[0, 1, 3, 2])[0]
        v = b.node("Transpose", [b.input("v", (batch, skv, kv_heads, dv))], ["vh"], perm=[0, 2, 1, 3])[0]
        v = repeat(v, (batch, kv_heads, skv, dv), "v")
        lead = (batch, heads)
    elif g["split"] == "transpose":  # [B, S, H, D] as a projection's Reshape leaves it
        q = b.node("Transpose", [b.input("q", (batch, sq, heads, d))], ["qt"], perm=[0, 2, 1, 3])[0]
        kt = b.node("Transpose", [b.input("k", (batch, skv, heads, d))], ["kt"], perm=[0, 2, 3, 1])[0]
        v = b.node("Transpose", [b.input("v", (batch, skv, heads, dv))], ["vt"], perm=[0, 2, 1, 3])[0]
        lead = (batch, heads)
    elif g["split"] == "given" and kv_heads != heads:  # [B, Hkv, S, D], K already transposed, repeated
        q = b.input("q", (batch, heads, sq, d))
        kt = repeat(b.input("k", (batch, kv_heads, d, skv)), (batch, kv_heads, d, skv), "k")
        v = repeat(b.input("v", (batch, kv_heads, skv, dv)), (batch, kv_heads, skv, dv), "v")
        lead = (batch, heads)
    elif g["split"] == "given":  # already [B, H, S, D], K already transposed
        q, kt, v = b.input("q", (batch, heads, sq, d)), b.input("k", (batch, heads, d, skv)), \
            b.input("v", (batch, heads, skv, dv))
        lead = (batch, heads)
    else:  # [B * H, S, D], as older exporters flatten heads
        q, kt, v = b.input("q", (batch * heads, sq, d)), b.input("k", (batch * heads, d, skv)), \
            b.input("v", (batch * heads, skv, dv))
        lead = (batch * heads,)
    factor = 1.0 / math.sqrt(d)
    if g["scale"] == "split":
        root = b.init("root", np.array(math.sqrt(factor)))
        q = b.node("Mul", [q, root], ["q_scaled"])[0]
        kt = b.node("Mul", [root, kt], ["k_scaled"])[0]
    y = b.node("MatMul", [q, kt], ["scores"])[0]
    if g["scale"] == "mul":
        y = b.node("Mul", [y, b.init("scale", np.array(factor))], ["scaled"])[0]
    elif g["scale"] == "mul_first":
        y = b.node("Mul", [b.init("scale", np.array([factor])), y], ["scaled"])[0]
    elif g["scale"] == "div":
        y = b.node("Div", [y, b.init("scale", np.array(math.sqrt(d)))], ["scaled"])[0]
    if g["mask"] == "padding":  # keys past a random length hidden, per batch
        lengths = rng.integers(1, skv + 1, size=(batch, 1))
        fill = -10000.0
        if g["guard"] and torch_forms.random() < 0.5:  # a sample with every key hidden
            lengths[int(torch_forms.integers(batch))] = 0
            fill = -np.inf
        keep = np.arange(skv)[None, :] < lengths
        name = b.name("mask")
        case.inputs[name] = np.where(keep, 0.0, fill).astype(np.float32).reshape(batch, 1, 1, skv)
        y = b.node("Add", [y, name], ["masked"])[0]
    elif g["mask"] in ("causal", "causal_inf"):  # query i sees keys up to i + (skv - sq), at least key 0
        offset = max(skv - sq, 0)
        hidden = np.arange(skv)[None, :] > np.arange(sq)[:, None] + offset
        fill = -1e9 if g["mask"] == "causal" else -np.inf
        y = b.node("Add", [b.init("mask", np.where(hidden, fill, 0.0)), y], ["masked"])[0]
    elif g["mask"] == "random":
        y = b.node("Add", [y, b.init("mask", (lead[-1], sq, skv))], ["masked"])[0]
    elif g["mask"] == "window":  # Swin's shifted windows: -100 where hidden (e^-100 is below float32's
        hidden = rng.random((lead[-1], sq, skv)) < 0.5  # normal range), fed at run time; key 0 kept
        hidden[..., 0] = False
        name = b.name("mask")
        case.inputs[name] = np.where(hidden, -100.0, 0.0).astype(np.float32)
        y = b.node("Add", [y, name], ["masked"])[0]
    y = b.node("Softmax", [y], ["probs"], axis=-1)[0]
    if g["guard"]:
        nan = b.node("IsNaN", [y], ["nan"])[0]
        y = b.node("Where", [nan, b.init("zero", np.array([0.0])), y], ["guarded"])[0]
    y = b.node("MatMul", [y, v], ["context"])[0]
    if g["merge"] and len(lead) == 2:
        y = b.node("Transpose", [y], ["merged"], perm=[0, 2, 1, 3])[0]
    b.output(y)
    case.terms = d + skv + 1
    case.geometry = g


# -- dynamic quantization -------------------------------------------------------------------


def _int8_weights(rng, shape, lo: int, hi: int) -> np.ndarray:
    """int64 weights in [lo, hi] in one of the forms the AVX2 int8 kernel treats apart
    (int8_gemm_gen.split_pairs, which bounds |w0| + |w1| of each same-sign pair of rows by
    128, keeps pairs of opposite signs whole and adds the rest exactly): uniform (about a
    quarter of the pairs past the bound: a remainder multiplied whole); bell-shaped as trained weights are, 1% at the extremes (a sparse
    one, its entries added one by one);
    drawn from values whose pairs land at, just under and just over the bound (64 + 64,
    64 + 65, 127 + 1, 127 - 128, -128 + 0...); or every weight lo or hi (half the pairs far
    over it, the other half kept whole at the extremes of opposite signs, and with bytes of
    255 the largest sums there are)."""
    form = _choice(rng, ["uniform", "bell", "edge", "extreme"])
    if form == "uniform":
        return rng.integers(lo, hi + 1, shape)
    if form == "bell":  # a few at the extremes: a sparse remainder (a dense one where K is short)
        bell = np.clip(np.round(rng.standard_normal(shape) * 20.0), lo, hi).astype(np.int64)
        return np.where(rng.random(shape) < 0.01, rng.choice([lo, hi], shape), bell)
    if form == "edge":
        return np.clip(rng.choice([-128, -127, -65, -64, -63, -1, 0, 1, 63, 64, 65, 127], shape), lo, hi)
    return np.where(rng.random(shape) < 0.5, lo, hi)


def dynamic_int8(case, rng):
    """A product by an int8 weight matrix as quantize_dynamic writes it (DynamicQuantizeLinear,
    MatMulInteger, Cast, Mul by the scales, maybe Add of a bias), which -O2 makes one
    DynamicQuantizeMatMul; at -O0 that node itself, as onnxruntime's optimizer writes it (the
    chain then stays the reference evaluator's, which knows no com.microsoft op)."""
    m = int(rng.integers(1, 201)) if rng.random() < 0.7 else _choice(rng, [1, 2, 6, 7, 12, 64, 128])
    # K = 1030: a long K, remainder entries' rows past 1024 (int8_gemm_gen's pairs layout)
    k, nn = _choice(rng, ODD + [16, 48, 64, 128, 65, 200, 1030]), _choice(rng, ODD + [16, 48, 64, 128, 65, 200])
    _dynamic_int8_product(case, rng, m, k, nn)


def qgemm_amx(case, rng):
    """dynamic_int8 at the AMX int8 GEMM's edges (nncc/native/int8_gemm_amx_gen.py; the
    vpdpbusd or plain GEMM where the CPU or target lacks amx_int8): M around the 16-row tile
    and the 32-row block (and below AMX_MIN_ROWS), K around the tile's 64 bytes and not a
    multiple of 4, N around the 16-column tile and the 64-column panel."""
    m = _choice(rng, [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 96, 100])
    k = _choice(rng, [1, 3, 5, 62, 63, 64, 65, 66, 67, 127, 128, 129, 191, 257, 770])
    nn = _choice(rng, [1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 80, 127, 129, 200])
    _dynamic_int8_product(case, rng, m, k, nn)


def _dynamic_int8_product(case, rng, m: int, k: int, nn: int):
    """The model of dynamic_int8 for A of ``m`` rows (maybe split into batch dimensions) and
    ``k`` columns by weights of ``nn`` columns."""
    b = _Builder(case, rng)
    batch = [_choice(rng, [1, 2, 3]) for _ in range(int(rng.integers(0, 3)))]
    if math.prod(batch) * m > 256:
        batch = []
    per_column = rng.random() < 0.4
    zero_form = _choice(rng, [None, "zero", "scalar", "column"])
    a = b.input("a", (*batch, m, k), -3.0, float(_choice(rng, [3.0, 0.5, 10.0])))
    extremes = rng.random() < 0.15  # A only at its range's ends: every byte 0 or 255
    if extremes:
        values = case.inputs[a]
        case.inputs[a] = np.where(values < 0.0, values.min(), values.max()).astype(np.float32)
    weights = b.name("b")
    case.inits[weights] = _int8_weights(rng, (k, nn), -128, 127).astype(np.int8)
    scale = b.name("b_scale")
    scales = rng.uniform(0.005, 0.05, nn) if per_column else np.array(rng.uniform(0.005, 0.05))
    case.inits[scale] = scales.astype(np.float32)
    b_zero = ""
    if zero_form is not None:
        b_zero = b.name("b_zero")
        value = {"zero": np.zeros(()), "scalar": np.array(rng.integers(-20, 21)),
                 "column": rng.integers(-20, 21, nn)}[zero_form]
        case.inits[b_zero] = value.astype(np.int8)
    bias = b.init("bias", (nn,)) if rng.random() < 0.6 else ""
    aq, a_scale, a_zero = b.node("DynamicQuantizeLinear", [a], ["aq", "as", "az"])
    (scales,) = b.node("Mul", [a_scale, scale], ["scales"])
    (product,) = b.node("MatMulInteger", [aq, weights, a_zero] + ([b_zero] if b_zero else []), ["mmi"])
    (y,) = b.node("Cast", [product], ["cast"], to=TensorProto.FLOAT)
    (y,) = b.node("Mul", [y, scales], ["scaled" if bias else "y"])
    if bias:
        (y,) = b.node("Add", [y, bias], ["y"])
    if case.opt_level == 0:
        case.reference_nodes, case.nodes = case.nodes, []
        ins = [a, weights, scale, b_zero, bias]
        while not ins[-1]:
            ins.pop()
        b.node("DynamicQuantizeMatMul", ins, ["y"], domain="com.microsoft")
    b.output(y)
    case.terms = k + 1
    case.geometry = dict(a=[*batch, m, k], N=nn, per_column=per_column, b_zero=zero_form, bias=bool(bias),
                         extremes=extremes)


# -- elementwise and row-wise ops -----------------------------------------------------------

UNARY = {  # op -> input range (None: standard normal)
    "Relu": None, "Sigmoid": (-12, 12), "Tanh": (-6, 6), "Erf": (-4, 4), "Exp": (-20, 20), "Log": (0.01, 50),
    "Sqrt": (0, 50), "Neg": None, "Abs": None, "Reciprocal": (0.1, 10), "Softsign": None,
    "LeakyRelu": None, "HardSigmoid": (-6, 6), "HardSwish": (-6, 6), "Clip": None,
    "Floor": (-40, 40), "Ceil": (-40, 40), "Round": (-40, 40), "Sign": None,
}
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]


def _shape(rng, rank):
    return [_choice(rng, [1, 2, 3, 4, 5, 7, 17]) for _ in range(rank)]


def _broadcast_pair(rng):
    out = _shape(rng, int(rng.integers(1, 5)))
    a = [d if rng.random() < 0.75 else 1 for d in out]
    bshape = [d if rng.random() < 0.6 else 1 for d in out]
    bshape = bshape[int(rng.integers(0, len(out) + 1)):]  # B may have fewer dims
    return a, bshape


def elementwise(case, rng):
    b = _Builder(case, rng)
    pick = rng.random()
    if pick < 0.45:
        op = _choice(rng, list(UNARY))
        shape = _shape(rng, int(rng.integers(1, 5)))
        low, high = UNARY[op] or (None, None)
        x = b.input("x", shape, low, high)
        attrs, ins = {}, [x]
        if op == "LeakyRelu":
            attrs["alpha"] = float(rng.uniform(0.01, 0.5))
        elif op == "HardSigmoid":
            attrs.update(alpha=float(rng.uniform(0.1, 0.5)), beta=float(rng.uniform(0.2, 0.8)))
        elif op == "Clip":
            lo, hi = sorted(float(v) for v in rng.uniform(-1.5, 1.5, 2))
            ins += [b.init("lo", np.array(lo)), b.init("hi", np.array(hi))] if rng.random() < 0.7 else \
                [b.init("lo", np.array(lo))]
        b.output(b.node(op, ins, ["y"], **attrs)[0])
        case.geometry = dict(op=op, x=shape, **attrs)
    elif pick < 0.85:
        op = _choice(rng, BINARY)
        sa, sb = _broadcast_pair(rng)
        if rng.random() < 0.5:
            sa, sb = sb, sa
        positive = (0.5, 3.0) if op in ("Pow", "Div") else (None, None)
        a = b.input("a", sa, *positive)
        if op == "Pow" and rng.random() < 0.5:
            bb = b.init("e", np.array(float(_choice(rng, [2.0, 3.0, 0.5, 1.0, -1.0, 1.5]))))
            sb = []
        else:
            bb = b.input("b", sb, *((-2.0, 2.0) if op == "Pow" else positive))
        b.output(b.node(op, [a, bb], ["y"])[0])
        case.geometry = dict(op=op, a=sa, b=sb)
    else:
        shape = _shape(rng, int(rng.integers(1, 4)))
        count = int(rng.integers(1, 4))
        ins = [b.input(f"x{i}", shape) for i in range(count)]
        b.output(b.node("Sum", ins, ["y"])[0])
        case.geometry = dict(op="Sum", shape=shape, operands=count)
    case.terms = 3


def gelu(case, rng):
    """GELU spelled out after a sum, erf or tanh form, with a Gelu-sized chunk of the pool
    or less: -O2 makes it one nncc Gelu step (fuse_gelu)."""
    b = _Builder(case, rng)
    shape = _shape(rng, int(rng.integers(1, 4)))
    s = b.node("Add", [b.input("a", shape), b.input("b", shape)], ["s"])[0]
    half, one = b.init("half", np.array(0.5)), b.init("one", np.array(1.0))
    erf = rng.random() < 0.5
    if erf:
        inner = b.node("Erf", [b.node("Div", [s, b.init("r2", np.array(math.sqrt(2.0)))], ["d"])[0]], ["e"])[0]
    else:
        cube = b.node("Mul", [b.node("Mul", [s, s], ["s2"])[0], s], ["s3"])[0]
        u = b.node("Add", [s, b.node("Mul", [cube, b.init("c", np.array(0.044715))], ["cc"])[0]], ["u"])[0]
        inner = b.node("Tanh", [b.node("Mul", [u, b.init("k", np.array(math.sqrt(2.0 / math.pi)))], ["uk"])[0]],
                       ["t"])[0]
    y = b.node("Mul", [b.node("Mul", [s, half], ["hs"])[0], b.node("Add", [inner, one], ["g"])[0]], ["y"])[0]
    b.output(y)
    case.terms = 3
    case.geometry = dict(op="Gelu", form="erf" if erf else "tanh", x=shape)


def rows(case, rng):
    b = _Builder(case, rng)
    op = _choice(rng, ["Softmax", "LogSoftmax", "LayerNormalization", "LayerNormalization"])
    shape = _shape(rng, int(rng.integers(1, 5)))
    shape[-1] = _choice(rng, [1, 2, 3, 7, 17, 64, 129])
    x = b.input("x", shape, -8.0, 8.0) if op != "LayerNormalization" else b.input("x", shape)
    residual = op == "LayerNormalization" and rng.random() < 0.5  # Add -> LayerNormalization: one step
    keep_sum = residual and rng.random() < 0.5  # the sum read by something else too
    if residual:
        (x,) = b.node("Add", [x, b.input("skip", shape)], ["sum"])
        if keep_sum:
            b.output(x)
    if op == "LayerNormalization":
        axis = int(rng.integers(-len(shape), len(shape)))
        norm = shape[axis % len(shape):]
        ins = [x, b.init("scale", norm)]
        if rng.random() < 0.6:
            ins.append(b.init("bias", norm))
        eps = float(_choice(rng, [1e-5, 1e-3]))
        b.output(b.node(op, ins, ["y"], axis=axis, epsilon=eps)[0])
        case.terms = math.prod(norm) + 1
        case.geometry = dict(op=op, x=shape, axis=axis, bias=len(ins) == 3, epsilon=eps, residual=residual,
                             keep_sum=keep_sum)
    else:
        b.output(b.node(op, [x], ["y"], axis=-1)[0])
        case.terms = shape[-1] + 1
        case.geometry = dict(op=op, x=shape)


def shuffle(case, rng):
    b = _Builder(case, rng)
    form = rng.random()
    if form < 0.3:
        return channel_shuffle(case, rng)
    if form < 0.65:
        rank = int(rng.integers(1, 6))
        shape = _shape(rng, rank)
        perm = [int(p) for p in rng.permutation(rank)]
        b.output(b.node("Transpose", [b.input("x", shape)], ["y"], perm=perm)[0])
        case.geometry = dict(op="Transpose", x=shape, perm=perm)
    else:
        rank = int(rng.integers(1, 5))
        base = _shape(rng, rank)
        axis = int(rng.integers(-rank, rank))
        shapes = []
        for i in range(int(rng.integers(1, 5))):
            s = list(base)
            s[axis % rank] = _choice(rng, [1, 2, 3, 5])
            shapes.append(s)
        ins = [b.input(f"x{i}", s) for i, s in enumerate(shapes)]
        b.output(b.node("Concat", ins, ["y"], axis=axis)[0])
        case.geometry = dict(op="Concat", inputs=shapes, axis=axis)


def channel_shuffle(case, rng):
    """ShuffleNet's channel shuffle (Reshape to [N, G, K, H, W], Transpose of G and K, Reshape
    back) read by a convolution, which takes it as its reorder into the blocked layout; its
    input straight from the caller (NCHW) or from a convolution (blocked), and sometimes
    read by an elementwise op too (which wants it in NCHW)."""
    b = _Builder(case, rng)
    g, k = _choice(rng, [2, 3, 4]), _choice(rng, [1, 2, 5, 8, 17])
    n, c = _choice(rng, [1, 2]), g * k
    h, w = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    x = b.input("x", (n, c, h, w))
    before = rng.random() < 0.5
    if before:
        (x,) = b.node("Conv", [x, b.init("w0", (c, c, 1, 1)), b.init("b0", (c,))], ["conv0"], kernel_shape=[1, 1])
    (y,) = b.node("Reshape", [x, b.init_ints("split_shape", [n, g, k, h, w])], ["split"])
    (y,) = b.node("Transpose", [y], ["swapped"], perm=[0, 2, 1, 3, 4])
    (y,) = b.node("Reshape", [y, b.init_ints("joined_shape", [n, c, h, w])], ["shuffled"])
    depthwise = rng.random() < 0.5
    wshape = (c, 1, 3, 3) if depthwise else (_choice(rng, [1, 8, 9]), c, 1, 1)
    attrs = dict(kernel_shape=list(wshape[2:]), pads=[1, 1, 1, 1] if depthwise else [0, 0, 0, 0],
                 group=c if depthwise else 1)
    (out,) = b.node("Conv", [y, b.init("w", wshape), b.init("b", (wshape[0],))], ["conv"], **attrs)
    b.output(out)
    also = rng.random() < 0.3
    if also:
        b.output(b.node("Neg", [y], ["neg"])[0])
    case.terms = (c + 1 if before else 1) * (wshape[1] * wshape[2] * wshape[3] + 1)
    case.geometry = dict(op="channel shuffle", x=[n, c, h, w], groups=g, after_conv=before,
                         w=list(wshape), depthwise=depthwise, plain_reader=also)


def qconv(case, rng, tiles=False):
    """A quantized convolution as onnxruntime's quantizer writes one: QOperator
    (QuantizeLinear -> QLinearConv -> DequantizeLinear) or QDQ (Q -> DQ -> Conv of
    dequantized weights and int32 bias -> Q -> DQ); int8 or uint8 weights, per-tensor or
    per-channel scales, symmetric or not (QOperator), plain or depthwise, odd channel counts
    on both sides of the 64-channel panel. -O2 carries it as float images and makes it
    native (nncc/passes/qlinear_float.py), so every round compiles it at -O2. onnxruntime
    requantizes in float32 as nncc does: the outputs agree exactly."""
    case.opt_level = 2
    b = _Builder(case, rng)
    depthwise = not tiles and rng.random() < 0.3
    c = _choice(rng, [1, 2, 3, 4, 5, 9, 16]) if depthwise else _choice(rng, [1, 3, 4, 7, 16, 33])
    attrs, wshape, (eh, ew) = _conv_geometry(rng, c, depthwise)
    if tiles:  # K = C x taps around the tile's 64 bytes, enough output channels for the pixel-major form
        c = _choice(rng, [1, 3, 7, 16, 21, 32, 63, 64, 65, 100])
        kh = kw = _choice(rng, [1, 1, 3])
        stride = _choice(rng, [1, 1, 2])
        attrs = dict(kernel_shape=[kh, kw], strides=[stride, stride], pads=[kh // 2] * 4, dilations=[1, 1], group=1)
        wshape, (eh, ew) = (_choice(rng, [40, 48, 63, 64, 65, 96, 128, 130]), c, kh, kw), (kh, kw)
    elif not depthwise:  # other groupings stay portable
        attrs["group"] = 1
        wshape = (_choice(rng, [1, 3, 17, 64, 65, 70]), c) + wshape[2:]
    qdq = rng.random() < 0.4
    signed = qdq or rng.random() < 0.6
    per_channel = rng.random() < 0.5
    asymmetric = not qdq and rng.random() < 0.5
    m, taps = wshape[0], wshape[1] * wshape[2] * wshape[3]
    n = _choice(rng, [1, 1, 2])
    h, w = _spatial(rng, eh, ew, attrs["pads"])
    if tiles:  # output pixels below, at and past the 32-pixel block
        pixels = _choice(rng, [8, 9, 16, 31, 32, 33, 49, 64, 65, 96, 100])
        w = _choice(rng, [1, 4, 7, 8, 16])
        h = -(-pixels // w)
        if attrs["strides"][0] == 2:
            h, w = 2 * h, 2 * w
    # saturating: about half the activations quantize to the ends of their range (bytes 0
    # and 255 after the kernel's shift), where the AVX2 kernel's pairs sum to the most
    saturating = rng.random() < 0.2
    x = b.input("x", (n, c, h, w), -8.0, 8.0) if saturating else b.input("x", (n, c, h, w))
    lo, hi = (-127, 127) if signed else (0, 255)
    shift = 0 if signed else 128  # uint8 weights: their forms about 128, as the kernel shifts them
    weights = (_int8_weights(rng, wshape, lo - shift, hi - shift) + shift).astype(np.int8 if signed else np.uint8)
    count = m if per_channel else 1
    w_scale = rng.uniform(0.002, 0.02, count).astype(np.float32).reshape((count,) if per_channel else ())
    if signed:
        w_zero = rng.integers(-20, 21, count) if asymmetric else np.zeros(count, np.int64)
    else:  # onnxruntime takes one uint8 zero point for all channels
        w_zero = np.full(count, int(rng.integers(100, 156)) if asymmetric else 128)
    w_zero = w_zero.astype(weights.dtype).reshape(w_scale.shape)
    x_scale = np.float32(rng.uniform(0.01, 0.03))
    y_scale = np.float32(x_scale * float(np.mean(w_scale)) * math.sqrt(taps) * float(rng.uniform(20, 60)))
    names = {}
    for short, value in (("xs", np.array(x_scale)), ("xz", np.array(int(rng.integers(100, 156)), np.uint8)),
                         ("w", weights), ("ws", w_scale), ("wz", w_zero), ("ys", np.array(y_scale)),
                         ("yz", np.array(int(rng.integers(60, 196)), np.uint8))):
        names[short] = b.name(short)
        case.inits[names[short]] = value
    bias = rng.random() < 0.7
    if bias:
        names["b"] = b.name("b")
        case.inits[names["b"]] = rng.integers(-3000, 3000, m).astype(np.int32)
    (xq,) = b.node("QuantizeLinear", [x, names["xs"], names["xz"]], ["xq"])
    if qdq:
        (xf,) = b.node("DequantizeLinear", [xq, names["xs"], names["xz"]], ["xf"])
        (wf,) = b.node("DequantizeLinear", [names["w"], names["ws"], names["wz"]], ["wf"], axis=0)
        ins = [xf, wf]
        if bias:
            names["bs"], names["bz"] = b.name("bs"), b.name("bz")
            case.inits[names["bs"]] = (x_scale * np.broadcast_to(w_scale, (m,))).astype(np.float32)
            case.inits[names["bz"]] = np.zeros(m, np.int32)
            ins += b.node("DequantizeLinear", [names["b"], names["bs"], names["bz"]], ["bf"], axis=0)
        (yf,) = b.node("Conv", ins, ["conv"], **attrs)
        (yq,) = b.node("QuantizeLinear", [yf, names["ys"], names["yz"]], ["yq"])
    else:
        ins = [xq] + [names[k] for k in ("xs", "xz", "w", "ws", "wz", "ys", "yz")] + ([names["b"]] if bias else [])
        (yq,) = b.node("QLinearConv", ins, ["yq"], **attrs)
    (y,) = b.node("DequantizeLinear", [yq, names["ys"], names["yz"]], ["y"])
    b.output(y)
    case.terms = taps + 2
    case.geometry = dict(form="QDQ" if qdq else "QOperator", x=[n, c, h, w], saturating=saturating,
                         w=list(wshape), bias=bias,
                         weights="int8" if signed else "uint8", per_channel=per_channel, asymmetric=asymmetric,
                         **{k: v for k, v in attrs.items() if k != "kernel_shape"})


def _q_activation(case, b, rng, act, tag: str, scale) -> tuple[str, str]:
    """A quantized activation's scale (given) and zero point (drawn, of ``act``'s type) as
    initializers named by ``tag``: their names."""
    zero = int(rng.integers(-20, 21)) if act == np.int8 else int(rng.integers(60, 196))
    names = (b.name(f"{tag}s"), b.name(f"{tag}z"))
    case.inits[names[0]], case.inits[names[1]] = np.array(scale, np.float32), np.array(zero, act)
    return names


def _quantized_input(case, b, rng, act, x: str) -> tuple[str, str, str, np.float32]:
    """A chain's first step: ``x`` quantized to ``act`` with a drawn scale and zero point
    (_q_activation's "a0"): (the bytes' name, the scale's and zero point's names, the scale)."""
    scale = np.float32(rng.uniform(0.01, 0.03))
    xs, xz = _q_activation(case, b, rng, act, "a0", scale)
    (q,) = b.node("QuantizeLinear", [x, xs, xz], ["q0"])
    return q, xs, xz, scale


def _qlinear_conv(case, b, rng, act, i: int, x, c: int, m: int, k: int, stride: int, pad: int,
                  depthwise: bool):
    """Layer ``i`` of a quantized chain: a QLinearConv of ``x`` (its bytes, scale name, zero
    point name and scale value) to ``m`` channels, int8 weights, per-channel scales and an
    int32 bias drawn, its output's scale set so that its bytes span their range: (the output
    bytes, its scale name and zero point name, its scale value)."""
    q, xs, xz, scale = x
    weights = _int8_weights(rng, (m, 1 if depthwise else c, k, k), -127, 127).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.02, m).astype(np.float32)
    taps = (1 if depthwise else c) * k * k
    y_scale = np.float32(scale * float(np.mean(w_scale)) * math.sqrt(taps) * float(rng.uniform(20, 60)))
    ys, yz = _q_activation(case, b, rng, act, f"a{i + 1}", y_scale)
    wn, wsn, wzn, bn = (b.name(f"w{i}"), b.name(f"ws{i}"), b.name(f"wz{i}"), b.name(f"b{i}"))
    case.inits[wn], case.inits[wsn], case.inits[wzn] = weights, w_scale, np.zeros(m, np.int8)
    case.inits[bn] = rng.integers(-3000, 3000, m).astype(np.int32)
    (q,) = b.node("QLinearConv", [q, xs, xz, wn, wsn, wzn, ys, yz, bn], [f"q{i + 1}"], kernel_shape=[k, k],
                  strides=[stride, stride], pads=[pad] * 4, group=c if depthwise else 1)
    return q, ys, yz, y_scale


def qconv_chain(case, rng):
    """Two or three quantized convolutions in a row (QOperator), each quantizing with the
    scale and zero point the next recovers with: the values between them travel as bytes
    (nncc/native/int8_bytes.py) out of every form of the int8 convolution (pixel-major,
    channel-major, pointwise, depthwise) into every form. Activations uint8 or int8 (stored
    shifted by 128); sometimes an inner value is also an output, so it must stay a float
    image; batch 1 or 2. Exact, as one quantized convolution is."""
    case.opt_level = 2
    b = _Builder(case, rng)
    n = _choice(rng, [1, 1, 2])
    c = _choice(rng, [1, 3, 4, 7, 16, 33])
    h, w = int(rng.integers(1, 13)), int(rng.integers(1, 13))
    act = np.int8 if rng.random() < 0.3 else np.uint8
    x = b.input("x", (n, c, h, w))
    q, xs, xz, scale = _quantized_input(case, b, rng, act, x)
    layers = []
    for i in range(_choice(rng, [2, 2, 3])):
        depthwise = i > 0 and rng.random() < 0.4
        k = _choice(rng, [1, 1, 3]) if not depthwise else _choice(rng, [3, 3, 5])
        stride = _choice(rng, [1, 1, 2])
        pad = 0 if k == 1 else _choice(rng, [0, 1, 1, 2])
        if (h + 2 * pad - k) < 0 or (w + 2 * pad - k) < 0:
            k, pad = 1, 0
        m = c if depthwise else _choice(rng, [1, 3, 17, 24, 64, 70])
        q, ys, yz, y_scale = _qlinear_conv(case, b, rng, act, i, (q, xs, xz, scale), c, m, k, stride, pad,
                                           depthwise)
        if rng.random() < 0.15:  # an inner value read outside the chain too
            b.output(b.node("DequantizeLinear", [q, ys, yz], [f"inner{i}"])[0])
        h, w = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        layers.append(dict(w=[m, 1 if depthwise else c, k, k], stride=stride, pad=pad))
        c, xs, xz, scale = m, ys, yz, y_scale
    (y,) = b.node("DequantizeLinear", [q, xs, xz], ["y"])
    b.output(y)
    case.terms = max(math.prod(layer["w"][1:]) for layer in layers) + 2
    case.geometry = dict(x=list(case.inputs[x].shape), activations=np.dtype(act).name, layers=layers)


def qconv_depthwise(case, rng):
    """A quantized depthwise convolution (QOperator) at the edges of its integer ranges:
    kernel 3 or 5 (sometimes 1 or 3x5), stride 1 or 2 (sometimes 3), dilation, uneven pads,
    rows shorter and longer than a vector of the native kernel (16 or 32 positions) and than
    the fill's 64 bytes split into stride phases at once; its input quantized straight from
    the float image or, after a 1x1 convolution that quantizes with
    the scale and zero point it recovers with, read as that one's bytes; activations uint8
    (zero point 0, 128, 255 or any) or int8 (-128, 0, 127 or any), the input's scale small
    enough that most bytes saturate at 0 and 255; weights int8 or uint8, per channel or per
    tensor, at -128 and 127 and about the pairs' saturation bound (|w0| + |w1| = 128), the
    output saturating at times. Exact, as every quantized convolution is."""
    case.opt_level = 2
    b = _Builder(case, rng)
    n = _choice(rng, [1, 1, 2])
    c = _choice(rng, [1, 3, 8, 17])
    kh, kw = _choice(rng, [(3, 3), (3, 3), (5, 5), (1, 1), (3, 5)])
    stride = _choice(rng, [1, 1, 2, 2, 3])
    dil = _choice(rng, [1, 1, 1, 2])
    pads = [int(rng.integers(0, (k - 1) * dil + 1)) for k in (kh, kw, kh, kw)]
    eh, ew = (kh - 1) * dil + 1, (kw - 1) * dil + 1
    h = max(1, eh - pads[0] - pads[2]) + int(rng.integers(0, 12))
    w = max(1, ew - pads[1] - pads[3]) + _choice(rng, [0, 3, 9, 17, 30, 45, 66, 77])
    act = np.int8 if rng.random() < 0.3 else np.uint8
    info = np.iinfo(act)
    x = b.input("x", (n, c, h, w))

    def activation(tag, scale):
        zero = _choice(rng, [info.min, 0, 128, info.max, int(rng.integers(info.min, info.max + 1))])
        zero = int(np.clip(zero, info.min, info.max))
        names = (b.name(f"{tag}s"), b.name(f"{tag}z"))
        case.inits[names[0]], case.inits[names[1]] = np.array(scale, np.float32), np.array(zero, act)
        return names

    xs, xz = activation("a0", np.float32(rng.uniform(0.004, 0.01)))  # x ~ N(0, 1): many bytes at the ends
    (q,) = b.node("QuantizeLinear", [x, xs, xz], ["q0"])
    through_bytes = rng.random() < 0.6
    if through_bytes:  # a 1x1 convolution first: the depthwise one reads its bytes
        ys, yz = activation("a1", np.float32(rng.uniform(0.05, 0.5)))
        names = [b.name(short) for short in ("pw", "pws", "pwz")]
        case.inits[names[0]] = _int8_weights(rng, (c, c, 1, 1), -128, 127).astype(np.int8)
        case.inits[names[1]] = rng.uniform(0.002, 0.02, c).astype(np.float32)
        case.inits[names[2]] = np.zeros(c, np.int8)
        (q,) = b.node("QLinearConv", [q, xs, xz, *names, ys, yz], ["q1"], kernel_shape=[1, 1])
        xs, xz = ys, yz
    signed = act == np.int8 or rng.random() < 0.6
    per_channel = rng.random() < 0.5
    lo, hi = (-128, 127) if signed else (0, 255)
    shift = 0 if signed else 128  # uint8 weights: their forms about 128
    weights = (_int8_weights(rng, (c, 1, kh, kw), lo - shift, hi - shift) + shift).astype(np.int8 if signed else np.uint8)
    count = c if per_channel else 1
    w_scale = rng.uniform(0.002, 0.02, count).astype(np.float32).reshape((count,) if per_channel else ())
    if signed:
        w_zero = rng.integers(-20, 21, count) if rng.random() < 0.3 else np.zeros(count, np.int64)
    else:  # onnxruntime takes one uint8 zero point for all channels
        w_zero = np.full(count, _choice(rng, [0, 128, 255, int(rng.integers(0, 256))]))
    w_zero = w_zero.astype(weights.dtype).reshape(w_scale.shape)
    taps = kh * kw
    x_scale = float(np.asarray(case.inits[xs]))
    y_scale = np.float32(x_scale * float(np.mean(w_scale)) * math.sqrt(taps) * float(rng.uniform(5, 60)))
    ys, yz = activation("a2", y_scale)
    names = [b.name(short) for short in ("w", "ws", "wz")]
    case.inits[names[0]], case.inits[names[1]], case.inits[names[2]] = weights, w_scale, w_zero
    ins = [q, xs, xz, *names, ys, yz]
    if rng.random() < 0.7:
        ins.append(b.name("b"))
        case.inits[ins[-1]] = rng.integers(-30000, 30000, c).astype(np.int32)
    (q,) = b.node("QLinearConv", ins, ["q2"], kernel_shape=[kh, kw], strides=[stride, stride],
                  dilations=[dil, dil], pads=pads, group=c)
    (y,) = b.node("DequantizeLinear", [q, ys, yz], ["y"])
    b.output(y)
    case.terms = taps + 2
    case.geometry = dict(x=[n, c, h, w], kernel=[kh, kw], stride=stride, dilation=dil, pads=pads,
                         activations=np.dtype(act).name, through_bytes=through_bytes,
                         weights="int8" if signed else "uint8", per_channel=per_channel,
                         w_zero=np.asarray(w_zero).reshape(-1)[:3].tolist())


def pointwise_conv(case, rng):
    conv(case, rng, pointwise=True)


def wide_conv(case, rng):
    conv(case, rng, wide=True)


# -- recurrent ---------------------------------------------------------------------------------

RECURRENT_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def recurrent(case, rng, **given):
    """One RNN, GRU or LSTM with constant weights (uniform in ±1/sqrt(hidden), as
    frameworks initialise them): any direction and layout, clip, GRU's linear_before_reset,
    LSTM's peepholes and input_forget, initial states fed at run time or absent, a random
    non-empty subset of the outputs. onnxruntime runs only layout 0, so a layout-1 node is
    judged against its layout-0 twin between Transposes. ``given`` fixes any of the
    geometry's keys (tests/test_native_recurrent.py)."""
    b = _Builder(case, rng)
    g = dict(op=_choice(rng, ["LSTM", "LSTM", "GRU", "GRU", "RNN"]), hidden=int(rng.integers(1, 71)),
             input=int(rng.integers(1, 41)), seq=int(rng.integers(1, 21)), batch=int(rng.integers(1, 4)),
             direction=_choice(rng, ["forward", "reverse", "bidirectional"]), layout=int(rng.integers(0, 2)),
             clip=_choice(rng, [None, None, 0.5, 3.0]), lbr=int(rng.integers(0, 2)), bias=rng.random() < 0.8,
             initial=rng.random() < 0.5, peepholes=rng.random() < 0.3, input_forget=int(rng.random() < 0.2))
    outputs = [rng.random() < 0.7 for _ in range(3)]
    g["outputs"] = outputs if any(outputs[:3 if g["op"] == "LSTM" else 2]) else [True, False, False]
    g.update(given)
    op, hidden, inp, seq, batch = (g[k] for k in ("op", "hidden", "input", "seq", "batch"))
    gates, d = RECURRENT_GATES[op], 2 if g["direction"] == "bidirectional" else 1
    bound = 1.0 / math.sqrt(hidden)
    ins = [b.input("x", (seq, batch, inp) if g["layout"] == 0 else (batch, seq, inp)),
           b.init("w", (d, gates * hidden, inp), -bound, bound),
           b.init("r", (d, gates * hidden, hidden), -bound, bound),
           b.init("b", (d, 2 * gates * hidden), -bound, bound) if g["bias"] else "", ""]
    state = (d, batch, hidden) if g["layout"] == 0 else (batch, d, hidden)
    for short in ["h0"] + (["c0"] if op == "LSTM" else []):
        ins.append(b.input(short, state) if g["initial"] else "")
    if op == "LSTM" and g["peepholes"]:
        ins.append(b.init("p", (d, 3 * hidden), -bound, bound))
    while not ins[-1]:
        ins.pop()
    names = ["y", "yh", "yc"][:3 if op == "LSTM" else 2]
    outs = [b.name(name) if want else "" for name, want in zip(names, g["outputs"])]
    while not outs[-1]:
        outs.pop()
    attrs = dict(hidden_size=hidden, direction=g["direction"])
    if g["clip"] is not None:
        attrs["clip"] = g["clip"]
    if op == "GRU":
        attrs["linear_before_reset"] = g["lbr"]
    if op == "LSTM":
        attrs["input_forget"] = g["input_forget"]
    case.nodes.append(helper.make_node(op, ins, outs, name=b.name(op), layout=g["layout"], **attrs))
    case.outputs += [o for o in outs if o]
    if g["layout"] == 1:  # onnxruntime's twin: layout 0 between Transposes
        twin, t_ins = [], list(ins)
        for i in (0, 5, 6):  # X, initial_h, initial_c
            if i < len(ins) and ins[i]:
                t_ins[i] = ins[i] + "_t"
                twin.append(helper.make_node("Transpose", [ins[i]], [t_ins[i]], perm=[1, 0, 2]))
        t_outs = [o + "_t" if o else "" for o in outs]
        twin.append(helper.make_node(op, t_ins, t_outs, layout=0, **attrs))
        twin += [helper.make_node("Transpose", [t], [o], perm=[2, 0, 1, 3] if k == 0 else [1, 0, 2])
                 for k, (o, t) in enumerate(zip(outs, t_outs)) if o]
        case.oracle_nodes = twin
    g["outputs"] = [name for name, o in zip(names, outs) if o]
    case.terms = inp + hidden + 2
    case.geometry = g


MASK_COMPARE = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


def _with_specials(b, name, rng) -> None:
    """Values rounded to whole numbers (so Equal holds somewhere), a fifth of them NaN, +inf,
    -inf or a signed zero: a mask must follow IEEE comparisons exactly."""
    x = np.array(np.round(b.case.inputs[name] * 2), np.float64, ndmin=1)
    spots = rng.random(x.shape) < 0.2
    x[spots] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]), size=int(spots.sum()))
    b.case.inputs[name] = x.astype(np.float32).reshape(b.case.inputs[name].shape)


def masks(case, rng):
    """A comparison, IsNaN or IsInf, maybe combined with a second mask by And, Or or Xor
    (or negated), selecting by Where between broadcast operands or -inf (the attention
    mask idiom): exact, NaN and infinities included."""
    b = _Builder(case, rng)
    sa, sb = _broadcast_pair(rng)
    if rng.random() < 0.5:
        sa, sb = sb, sa
    a, other = b.input("a", sa), b.input("b", sb)
    _with_specials(b, a, rng)
    _with_specials(b, other, rng)
    op = _choice(rng, MASK_COMPARE + ["IsNaN", "IsInf"])
    attrs = {}
    if op == "IsInf":
        attrs = dict(detect_positive=int(rng.integers(0, 2)), detect_negative=int(rng.integers(0, 2)))
    compared = [a, other]
    if op in MASK_COMPARE and rng.random() < 0.3:  # integers, as an int64 attention mask or int32 ids come
        dtype = np.int64 if rng.random() < 0.5 else np.int32
        compared = [b.name("ia"), b.name("ib")]
        for name, shape in zip(compared, (sa, sb)):
            case.inputs[name] = rng.integers(-3, 4, shape).astype(dtype)
    (mask,) = b.node(op, compared if op in MASK_COMPARE else [a], ["m"], **attrs)
    logic = _choice(rng, ["", "Not", "And", "Or", "Xor"])
    if logic == "Not":
        (mask,) = b.node("Not", [mask], ["n"])
    elif logic:
        (second,) = b.node(_choice(rng, MASK_COMPARE), [other, b.init("t", np.array(0.0))], ["m2"])
        (mask,) = b.node(logic, [mask, second], ["l"])
    if rng.random() < 0.5:
        chosen = [b.init("ninf", np.array(-np.inf)), a]
    else:
        chosen = [a, other]
    b.output(b.node("Where", [mask, *chosen], ["y"])[0])
    integers = str(case.inputs[compared[0]].dtype) if compared[0] != a else None
    case.geometry = dict(op=op, a=sa, b=sb, integers=integers, logic=logic or None, where=len(chosen), **attrs)


CAST_TYPES = {"int32": (TensorProto.INT32, 2.0**31), "int64": (TensorProto.INT64, 2.0**63),
              "uint8": (TensorProto.UINT8, 256.0), "bool": (TensorProto.BOOL, math.inf)}


def casts(case, rng):
    """float32 to int32, int64, uint8 or bool (maybe on to a wider integer) and back, over
    values scaled up to beyond each type's range, NaN and infinities among them (the
    sanitized build must stay defined on them). What a float the type does not hold
    becomes is not defined by ONNX, so the output keeps the round trip only where the value
    fits (Where over the range test) and 0 elsewhere."""
    b = _Builder(case, rng)
    shape = _shape(rng, int(rng.integers(1, 4)))
    kind = _choice(rng, list(CAST_TYPES))
    to, limit = CAST_TYPES[kind]
    x = b.input("x", shape)
    scale = float(_choice(rng, [1.0, 100.0, 1e5, 1e10, 1e20]))
    _with_specials(b, x, rng)
    b.case.inputs[x] = (b.case.inputs[x] * scale).astype(np.float32)
    (value,) = b.node("Cast", [x], ["c"], to=to)
    wider = kind in ("uint8", "int32") and rng.random() < 0.5
    if wider:
        (value,) = b.node("Cast", [value], ["w"], to=TensorProto.INT64)
    (back,) = b.node("Cast", [value], ["f"], to=TensorProto.FLOAT)
    low = 0.0 if kind == "uint8" else -limit
    (fits,) = b.node("And", [b.node("GreaterOrEqual", [x, b.init("lo", np.array(max(low, -3e38)))], ["ge"])[0],
                             b.node("Less", [x, b.init("hi", np.array(min(limit, 3e38)))], ["lt"])[0]], ["fits"])
    b.output(b.node("Where", [fits, back, b.init("zero", np.array(0.0))], ["y"])[0])
    case.geometry = dict(op="Cast", to=kind, x=shape, scale=scale, wider=wider)


def conv_transpose(case, rng):
    """ConvTranspose, 2-D or 1-D, with random strides, pads, output_padding (below the
    stride, as onnxruntime asks), dilations, groups and bias."""
    b = _Builder(case, rng)
    nd = 1 if rng.random() < 0.25 else 2
    group = _choice(rng, [1, 1, 1, 2, 3])
    cg, mg = _choice(rng, [1, 2, 3, 5]), _choice(rng, [1, 2, 4, 7])
    k = [_choice(rng, [1, 2, 3, 4]) for _ in range(nd)]
    s = [_choice(rng, [1, 2, 2, 3]) for _ in range(nd)]
    d = [_choice(rng, [1, 1, 2]) for _ in range(nd)]
    size = [_choice(rng, [1, 2, 3, 5, 8]) for _ in range(nd)]
    pads = [int(rng.integers(0, k[i] * d[i])) for i in range(nd) for _ in range(2)]
    pads = pads[0::2] + pads[1::2]  # begins, then ends
    out_pad = [int(rng.integers(0, s[i])) for i in range(nd)]
    full = [(size[i] - 1) * s[i] + out_pad[i] + (k[i] - 1) * d[i] + 1 - pads[i] - pads[nd + i] for i in range(nd)]
    if min(full) <= 0:
        pads = [0] * (2 * nd)
    x = b.input("x", [int(rng.integers(1, 3)), group * cg, *size])
    ins = [x, b.init("w", [group * cg, mg, *k])]
    if rng.random() < 0.6:
        ins.append(b.init("b", [group * mg]))
    # a 2-D Conv reading it takes the blocked layout, which an ungrouped 2-D ConvTranspose
    # scatters straight into (a 1-D Conv is native from -O2 only)
    then_conv = rng.random() < 0.4 and nd == 2
    (y,) = b.node("ConvTranspose", ins, ["up" if then_conv else "y"], strides=s, pads=pads, dilations=d,
                  output_padding=out_pad, group=group)
    case.terms = cg * math.prod(k) + 1
    if then_conv:
        (y,) = b.node("Conv", [y, b.init("w2", [3, group * mg, *[1] * nd])], ["y"])
        case.terms *= group * mg
    b.output(y)
    case.geometry = dict(op="ConvTranspose", x=list(case.inputs[x].shape), k=k, strides=s, pads=pads, dilations=d,
                         output_padding=out_pad, group=group, mg=mg, bias=len(ins) == 3, then_conv=then_conv)


def gather(case, rng):
    """Gather by run-time indices (int64 or int32 inputs, negative ones among them) from a
    constant table or a computed one, along a random axis: token ids into an embedding."""
    b = _Builder(case, rng)
    shape = _shape(rng, int(rng.integers(1, 4)))
    axis = int(rng.integers(-len(shape), len(shape)))
    extent = shape[axis % len(shape)]
    ishape = _shape(rng, int(rng.integers(0, 3)))
    dtype = np.int64 if rng.random() < 0.7 else np.int32
    ids = b.name("ids")
    case.inputs[ids] = rng.integers(-extent, extent, ishape).astype(dtype)
    if rng.random() < 0.5:
        table = b.init("table", shape)
    else:
        (table,) = b.node("Neg", [b.input("x", shape)], ["table"])
    b.output(b.node("Gather", [table, ids], ["y"], axis=axis)[0])
    case.geometry = dict(op="Gather", data=shape, indices=ishape, axis=axis, dtype=np.dtype(dtype).name)


def int_gather(case, rng):
    """Integer index paths: ids picked out of an int64 or int32 input by constant indices
    (negative ones among them) along a random axis, as a tabular model picks its categorical
    columns (maybe out of a Slice of it, a run of columns), or by run-time positions (an
    integer Gather by integer ids), maybe joined to a second pick (Concat), flattened,
    unsqueezed or cast to the other integer type, then looked up in a constant or computed
    embedding table."""
    b = _Builder(case, rng)
    rows = int(_choice(rng, ODD))
    shape = _shape(rng, int(rng.integers(1, 4)))
    dtype = np.int64 if rng.random() < 0.7 else np.int32
    cats = b.name("cats")
    case.inputs[cats] = rng.integers(-rows, rows, shape).astype(dtype)
    sliced = None
    if rng.random() < 0.3:  # a run of the input's columns first: a Slice along one axis, never empty
        cut = int(rng.integers(0, len(shape)))
        d, step = shape[cut], _choice(rng, [1, 2, -1])
        start = int(rng.integers(0, d))
        end = int(rng.integers(start + 1, d + 1)) if step > 0 else _choice(rng, [-(d + 1), *range(start)])
        (cats,) = b.node("Slice", [cats, b.init_ints("starts", [start]), b.init_ints("ends", [end]),
                                   b.init_ints("cut", [cut]), b.init_ints("steps", [step])], ["run"])
        shape = list(shape)
        shape[cut] = len(range(start, max(end, -1), step))
        sliced = dict(axis=cut, start=start, end=end, step=step)
    axis = int(rng.integers(-len(shape), len(shape)))
    extent = shape[axis % len(shape)]
    pshape = _shape(rng, int(rng.integers(0, 2)))
    runtime = rng.random() < 0.3
    if runtime:
        pos = b.name("pos")
        case.inputs[pos] = rng.integers(-extent, extent, pshape).astype(np.int64 if rng.random() < 0.5 else np.int32)
    else:
        pos = b.init_ints("pick", rng.integers(-extent, extent, pshape))
    (ids,) = b.node("Gather", [cats, pos], ["ids"], axis=axis)
    between = []  # what comes between the pick and the lookup, as exporters write it
    if rng.random() < 0.4:  # a second pick joined to the first, along one of its axes (a scalar's unsqueezed)
        (more,) = b.node("Gather", [cats, b.init_ints("pick2", rng.integers(-extent, extent, pshape))],
                         ["more"], axis=axis)
        rank = len(shape) - 1 + len(pshape)
        if rank == 0:
            ids, more = (b.node("Unsqueeze", [v, b.init_ints(f"at_{v[-4:]}", [0])], [f"{v[-4:]}_1d"])[0]
                         for v in (ids, more))
            rank = 1
        join = int(rng.integers(-rank, rank))
        (ids,) = b.node("Concat", [ids, more], ["joined"], axis=join)
        between.append(f"Concat axis {join}")
    if rng.random() < 0.3:
        (ids,) = b.node("Flatten", [ids], ["flat"], axis=0)
        between.append("Flatten")
    if rng.random() < 0.3:
        (ids,) = b.node("Unsqueeze", [ids, b.init_ints("axes", [0])], ["unsqueezed"])
        between.append("Unsqueeze")
    if rng.random() < 0.3:
        to = TensorProto.INT32 if dtype == np.int64 else TensorProto.INT64
        (ids,) = b.node("Cast", [ids], ["cast"], to=to)
        between.append("Cast")
    width = int(_choice(rng, ODD))
    if rng.random() < 0.5:
        table = b.init("table", [rows, width])
    else:
        (table,) = b.node("Neg", [b.input("x", [rows, width])], ["table"])
    b.output(b.node("Gather", [table, ids], ["y"])[0])
    case.geometry = dict(op="Gather of Gather", data=shape, picks=pshape, axis=axis, runtime_picks=runtime,
                         between=between, sliced=sliced, rows=rows, width=width, dtype=np.dtype(dtype).name)


TYPED_MOVES = ["Expand", "Tile", "Gather", "Slice", "Split", "GatherND"]


def typed_moves(case, rng):
    """Element moves of bool and integer values inside a partition, as exporters build an
    attention mask (an int64 input compared, then expanded, gathered or sliced, then
    Where between 0 and -inf) or move integers (then Cast to float32), or float32 values
    (then Neg, so that the move is not the partition's edge): Expand, Tile,
    Gather with constant indices, Slice, Split and GatherND with constant index tuples
    (negative ones among them), each along a random axis."""
    b = _Builder(case, rng)
    shape = _shape(rng, int(rng.integers(1, 4)))
    dtype = np.int64 if rng.random() < 0.6 else np.int32
    ints = b.name("ints")
    case.inputs[ints] = rng.integers(-2, 3, shape).astype(dtype)
    mask = rng.random() < 0.6
    value = ints
    floats = not mask and rng.random() < 0.3  # float32 data: GatherND's own case
    if floats:
        value = b.input("x", shape)
    if mask:
        zero = b.name("zero")
        case.inits[zero] = np.zeros((), dtype)
        (value,) = b.node("Equal", [ints, zero], ["m"])
    move = _choice(rng, TYPED_MOVES)
    axis = int(rng.integers(0, len(shape)))
    geometry = dict(op=move, data=shape, dtype=np.dtype(dtype).name, mask=mask, axis=axis)
    if move == "Expand":
        target = [_choice(rng, [1, 2, 3])] + [d if d != 1 else _choice(rng, [1, 4]) for d in shape]
        (value,) = b.node("Expand", [value, b.init_ints("to", target)], ["moved"])
        geometry["to"] = target
    elif move == "Tile":
        reps = [_choice(rng, [1, 2, 3]) for _ in shape]
        (value,) = b.node("Tile", [value, b.init_ints("reps", reps)], ["moved"])
        geometry["repeats"] = reps
    elif move == "Gather":
        picks = rng.integers(-shape[axis], shape[axis], _shape(rng, int(rng.integers(0, 3))))
        (value,) = b.node("Gather", [value, b.init_ints("pick", picks)], ["moved"], axis=axis)
        geometry["picks"] = picks.tolist()
    elif move == "Slice":
        d, step = shape[axis], _choice(rng, [1, 2, -1])
        start = int(rng.integers(0, d))
        end = int(rng.integers(start + 1, d + 1)) if step > 0 else _choice(rng, [-(d + 1), *range(start)])
        (value,) = b.node("Slice", [value, b.init_ints("starts", [start]), b.init_ints("ends", [end]),
                                    b.init_ints("axes", [axis]), b.init_ints("steps", [step])], ["moved"])
        geometry.update(start=start, end=end, step=step)
    elif move == "Split":
        if shape[axis] < 2:
            shape[axis] = 2
            case.inputs[ints] = rng.integers(-2, 3, shape).astype(dtype)
            if floats:
                case.inputs[value] = rng.standard_normal(shape).astype(np.float32)
        first = int(rng.integers(1, shape[axis]))
        outs = b.node("Split", [value, b.init_ints("sizes", [first, shape[axis] - first])], ["s0", "s1"], axis=axis)
        value = outs[int(rng.integers(0, 2))]
        geometry.update(data=shape, first=first)
    else:  # GatherND: tuples over the leading k axes
        k = int(rng.integers(1, len(shape) + 1))
        count = _shape(rng, int(rng.integers(0, 2)))
        tuples = np.stack([rng.integers(-shape[i], shape[i], count) for i in range(k)], axis=-1)
        (value,) = b.node("GatherND", [value, b.init_ints("tuples", tuples)], ["moved"])
        geometry.update(depth=k, tuples=list(tuples.shape))
    if mask:  # the attention mask idiom: 0 where kept, -inf where hidden
        (y,) = b.node("Where", [value, b.init("kept", np.array(0.0)), b.init("ninf", np.array(-np.inf))], ["y"])
    else:
        (y,) = b.node("Cast" if not floats else "Neg", [value], ["y"], **({} if floats else {"to": TensorProto.FLOAT}))
    b.output(y)
    geometry["dtype"] = "float32" if floats else geometry["dtype"]
    case.geometry = geometry


KINDS = {"conv": conv, "pointwise_conv": pointwise_conv, "conv_chain": conv_chain, "pool": pool, "gemm": gemm,
         "matmul": matmul, "elementwise": elementwise, "rows": rows, "shuffle": shuffle, "attention": attention,
         "dynamic_int8": dynamic_int8, "bf16_gemm": bf16_gemm, "qconv": qconv, "qconv_chain": qconv_chain, "gelu": gelu,
         "recurrent": recurrent, "bf16_long_gemm": bf16_long_gemm, "masks": masks, "casts": casts,
         "conv_transpose": conv_transpose, "gather": gather,
         "int_gather": int_gather, "typed_moves": typed_moves, "product_act": product_act, "wide_conv": wide_conv,
         "conv_bf16": conv_bf16}
# how often each kind comes up in a round: convolution has the most geometry to cover
ROUND = ["conv", "conv", "pointwise_conv", "conv_chain", "pool", "pool", "gemm", "matmul", "matmul", "elementwise",
         "rows", "shuffle", "attention", "dynamic_int8", "bf16_gemm", "qconv", "qconv_chain", "recurrent", "gelu",
         "bf16_long_gemm", "masks", "casts", "conv_transpose", "gather", "int_gather", "typed_moves", "product_act", "wide_conv", "conv_bf16"]
KINDS["qconv_depthwise"] = qconv_depthwise
ROUND.append("qconv_depthwise")
KINDS["gemm_amx"] = gemm_amx
ROUND.append("gemm_amx")
KINDS["qgemm_amx"] = qgemm_amx
ROUND.append("qgemm_amx")


def qconv_amx(case, rng):
    """qconv at the AMX int8 convolution's edges (nncc/native/int8_conv_amx_gen.py; the
    vpdpbusd tiles where the CPU or target lacks amx_int8): ungrouped 1x1 and 3x3 layers,
    stride 1 or 2, K around the tile's 64 bytes, output pixels around the 32-pixel block,
    output channels around the 16-channel tile and the 64-channel panel. Exact, as qconv."""
    qconv(case, rng, tiles=True)


KINDS["qconv_amx"] = qconv_amx
ROUND.append("qconv_amx")


def qconv_nhwc(case, rng):
    """A depthwise quantized convolution into an ungrouped one (QOperator): the depthwise
    step stores NCHW bytes, which the pixel-major form turns into its NHWC byte image 16
    channels x 16 pixels at a time (nncc/native/int8_transpose.py); channels at, below and
    past whole blocks of 16, pixels (a row, or the whole image when the layer has no
    padding) at, below and past whole blocks of 16, some a block's worth of zero-point
    padding around them. Exact, as one quantized convolution is."""
    case.opt_level = 2
    b = _Builder(case, rng)
    n = _choice(rng, [1, 1, 2])
    c = _choice(rng, [15, 16, 17, 31, 32, 48, 100])
    h, w = int(rng.integers(1, 21)), _choice(rng, [1, 5, 7, 15, 16, 17, 33])
    act = np.int8 if rng.random() < 0.3 else np.uint8
    x = b.input("x", (n, c, h, w))
    q, xs, xz, scale = _quantized_input(case, b, rng, act, x)
    layers = []
    for i, depthwise in enumerate((True, False)):
        k = 3 if depthwise else _choice(rng, [1, 1, 3])
        pad = 1 if depthwise or min(h, w) < k else _choice(rng, [0, k // 2])
        stride = _choice(rng, [1, 1, 2]) if depthwise else 1
        m = c if depthwise else _choice(rng, [40, 64, 96, 130])
        q, ys, yz, y_scale = _qlinear_conv(case, b, rng, act, i, (q, xs, xz, scale), c, m, k, stride, pad,
                                           depthwise)
        h, w = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        layers.append(dict(w=[m, 1 if depthwise else c, k, k], stride=stride, pad=pad))
        c, xs, xz, scale = m, ys, yz, y_scale
    (y,) = b.node("DequantizeLinear", [q, xs, xz], ["y"])
    b.output(y)
    case.terms = max(math.prod(layer["w"][1:]) for layer in layers) + 2
    case.geometry = dict(x=list(case.inputs[x].shape), activations=np.dtype(act).name, layers=layers)


KINDS["qconv_nhwc"] = qconv_nhwc
ROUND.append("qconv_nhwc")


def qconv_depthwise_nhwc(case, rng):
    """A depthwise quantized convolution on a small plane between two 1x1 ones (QOperator),
    channels enough for both 1x1 layers to take the pixel-major form: the depthwise step
    reads and writes NHWC bytes, 32 channels a vector (nncc/native/int8_depthwise_nhwc.py);
    channel counts at and past whole blocks, kernel 3 (sometimes 5), stride 1 or 2, dilation
    1 or 2, uneven pads, weights with per-channel zero points; activations uint8 or int8;
    sometimes the first 1x1's output is also an output (a float image into the step) or
    read by a second depthwise layer (NCHW bytes into it). Exact, as one quantized
    convolution is."""
    case.opt_level = 2
    b = _Builder(case, rng)
    n = _choice(rng, [1, 1, 2])
    c = _choice(rng, [64, 96, 100, 128, 160])  # pixel-major 1x1 layers on up to 36 pixels
    kh, kw = _choice(rng, [(3, 3), (3, 3), (3, 3), (5, 5), (3, 5)])
    stride = _choice(rng, [1, 1, 2])
    dil = _choice(rng, [1, 1, 1, 2])
    pads = [int(rng.integers(0, (k - 1) * dil // 2 + 2)) for k in (kh, kw, kh, kw)]
    eh, ew = (kh - 1) * dil + 1, (kw - 1) * dil + 1
    h = max(1, eh - pads[0] - pads[2]) + int(rng.integers(0, 4))
    w = max(1, ew - pads[1] - pads[3]) + int(rng.integers(0, 4))
    act = np.int8 if rng.random() < 0.3 else np.uint8
    x = b.input("x", (n, c, h, w))
    q, xs, xz, scale = _quantized_input(case, b, rng, act, x)
    q, xs, xz, scale = _qlinear_conv(case, b, rng, act, 0, (q, xs, xz, scale), c, c, 1, 1, 0, False)
    detour = _choice(rng, ["", "", "", "output", "reader"])
    if detour == "output":  # the depthwise step's input also leaves: a float image
        b.output(b.node("DequantizeLinear", [q, xs, xz], ["inner"])[0])
    elif detour == "reader":  # a second depthwise reader on its own: NCHW bytes
        side = _qlinear_conv(case, b, rng, act, 5, (q, xs, xz, scale), c, c, 3, 1, 1, True)
        b.output(b.node("DequantizeLinear", list(side[:3]), ["side"])[0])
    weights = _int8_weights(rng, (c, 1, kh, kw), -127, 127).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.02, c).astype(np.float32)
    w_zero = (rng.integers(-20, 21, c) if rng.random() < 0.5 else np.zeros(c, np.int64)).astype(np.int8)
    y_scale = np.float32(scale * float(np.mean(w_scale)) * math.sqrt(kh * kw) * float(rng.uniform(10, 60)))
    ys, yz = _q_activation(case, b, rng, act, "a2", y_scale)
    names = [b.name(short) for short in ("dw", "dws", "dwz", "dwb")]
    case.inits[names[0]], case.inits[names[1]], case.inits[names[2]] = weights, w_scale, w_zero
    case.inits[names[3]] = rng.integers(-30000, 30000, c).astype(np.int32)
    (q,) = b.node("QLinearConv", [q, xs, xz, *names[:3], ys, yz, names[3]], ["q2"], kernel_shape=[kh, kw],
                  strides=[stride, stride], dilations=[dil, dil], pads=pads, group=c)
    m = _choice(rng, [64, 128])
    q, ys, yz, _ = _qlinear_conv(case, b, rng, act, 2, (q, ys, yz, y_scale), c, m, 1, 1, 0, False)
    (y,) = b.node("DequantizeLinear", [q, ys, yz], ["y"])
    b.output(y)
    case.terms = c + 2
    case.geometry = dict(x=[n, c, h, w], kernel=[kh, kw], stride=stride, dilation=dil, pads=pads,
                         activations=np.dtype(act).name, m=m, detour=detour)


KINDS["qconv_depthwise_nhwc"] = qconv_depthwise_nhwc
ROUND.append("qconv_depthwise_nhwc")


def _bf16_values(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to the nearest bfloat16 values, kept as float32."""
    from nncc.native.gemm_bf16_gen import to_bf16  # lazy: only the bfloat16 kinds ask

    return (to_bf16(x).astype(np.uint32) << 16).view(np.float32).reshape(x.shape)


def recurrent_bf16(case, rng, **given):
    """A recurrent case compiled with precision bf16 (the projection on the compile's
    bfloat16 GEMM, R widened from bfloat16 words in the recurrence: nncc/native/
    recurrent_gen.py), every input and weight drawn as a bfloat16 value. Rounding such a
    value is exact, so whatever the arithmetic (AMX tiles, vdpbf16ps, widened weights) the
    node must compute what onnxruntime's float32 node does with the same values, within
    the recurrent kind's own float32 tolerance: a wrong word, half or panel of the packed
    R is off by the order of the values."""
    recurrent(case, rng, **given)
    case.precision = "bf16"
    for table in (case.inputs, case.inits):
        for name, value in table.items():
            if value.dtype == np.float32:
                table[name] = _bf16_values(value)


KINDS["recurrent_bf16"] = recurrent_bf16
ROUND.append("recurrent_bf16")


def attention_bf16(case, rng, **given):
    """An attention case (``attention``) compiled with precision bf16, so that -O2's fused
    attention multiplies Q·Kᵀ and P·V in bfloat16 (nncc/native/attention_bf16_gen.py: AMX
    tiles where the CPU has them, vdpbf16ps elsewhere; half the cases, from the case's sixth
    generator, built as for a CPU without tiles, so vdpbf16ps runs here too). Q, K, V and
    the masks are drawn as bfloat16 values and the scale is applied to the scores (never
    split over Q and K), so only P's rounding is inexact: each probability off by at most
    2^-8 of itself (or 2^-125 where it is flushed to zero) moves an output element by at
    most 2^-8 * sum_j w_j |v_j| + skv * 2^-125 * max |v| (w the softmax's weights), which
    onnxruntime computes as the same graph fed |V|. A wrong word, pair or tile is off by
    the order of the values."""
    forms = np.random.default_rng([case.seed, case.index, 5])
    given.setdefault("scale", _choice(forms, ["mul", "mul_first", "div", ""]))
    # no window mask of -100: bfloat16 has no denormals, so a hidden key's probability (e^-100)
    # is 0 and an infinite V there gives NaN (0 * inf), where onnxruntime's denormal gives inf
    given.setdefault("window", False)
    attention(case, rng, **given)
    case.precision = "bf16" if forms.random() < 0.5 else BF16_CONV
    for name, value in case.inputs.items():
        if value.dtype == np.float32:
            case.inputs[name] = _bf16_values(value)
    case.bound = _attention_bf16_slack


def _attention_bf16_slack(case: Case) -> None:
    """attention_bf16's slack, from the inputs as fed (NaN and infinities in K or a mask
    move the weights w)."""
    v = f"c{case.index}_v"  # the _Builder's name of V
    weighted = _weighted_abs(case, v)
    (y,) = case.outputs
    finite = np.abs(case.inputs[v])[np.isfinite(case.inputs[v])]
    vmax = float(finite.max(initial=0.0))
    slack = 2.0**-8 * (1 + 2.0**-10) * weighted.astype(np.float64) + case.geometry["skv"] * 2.0**-125 * vmax
    case.slack = {y: np.nan_to_num(slack, nan=0.0, posinf=0.0)}


def _weighted_abs(case: Case, v: str) -> np.ndarray:
    """onnxruntime's output of ``case`` with V replaced by |V|: per element, sum_j w_j |v_j|."""
    from tests.oracle import ort_session  # lazy: onnxruntime, the oracle only

    fed = {name: (np.abs(value) if name == v else value) for name, value in case.inputs.items()}
    return ort_session(batch_model([case], oracle=True)).run(None, fed)[0]


KINDS["attention_bf16"] = attention_bf16
ROUND.append("attention_bf16")


def qgemm(case, rng):
    """A QDQ Gemm as onnxruntime's quantizer writes one (Q -> DQ -> Gemm of dequantized
    int8 or uint8 weights, transposed or not, per-tensor or per-column scales, an int32 bias
    -> Q -> DQ), which -O2 makes one native QGemm step (nncc/native/qimage_ops_gen.py): K
    not a multiple of four, N on both sides of sixteen and of the 64-column panels, rows 1 to 5. The oracles
    quantize a float32 sum, the step an exact integer one: the slack is one step of the
    output's scale (a wrong layout or zero point is off by many)."""
    case.opt_level = 2
    b = _Builder(case, rng)
    m = _choice(rng, [1, 1, 2, 5])
    k = _choice(rng, [1, 3, 4, 17, 64, 130])
    n = _choice(rng, [1, 7, 16, 17, 70, 130, 300])
    trans_b = rng.random() < 0.5
    signed = rng.random() < 0.6
    per_column = rng.random() < 0.5
    x = b.input("x", (m, k))
    lo, hi = (-127, 127) if signed else (0, 255)
    shift = 0 if signed else 128
    weights = (_int8_weights(rng, (k, n), lo - shift, hi - shift) + shift).astype(np.int8 if signed else np.uint8)
    weights = weights.T.copy() if trans_b else weights
    count = n if per_column else 1
    w_scale = rng.uniform(0.002, 0.02, count).astype(np.float32).reshape((count,) if per_column else ())
    w_zero = np.full(count, 0 if signed else 128).astype(weights.dtype).reshape(w_scale.shape)
    x_scale = np.float32(rng.uniform(0.01, 0.03))
    y_scale = np.float32(x_scale * float(np.mean(w_scale)) * math.sqrt(k) * float(rng.uniform(20, 60)))
    x_zero = np.array(int(rng.integers(100, 156)), np.uint8)
    names = {}
    for short, value in (("xs", np.array(x_scale)), ("xz", x_zero), ("w", weights), ("ws", w_scale), ("wz", w_zero),
                         ("ys", np.array(y_scale)), ("yz", np.array(int(rng.integers(60, 196)), np.uint8))):
        names[short] = b.name(short)
        case.inits[names[short]] = value
    (xq,) = b.node("QuantizeLinear", [x, names["xs"], names["xz"]], ["xq"])
    (xf,) = b.node("DequantizeLinear", [xq, names["xs"], names["xz"]], ["xf"])
    axis = 0 if trans_b else 1
    (wf,) = b.node("DequantizeLinear", [names["w"], names["ws"], names["wz"]], ["wf"], axis=axis)
    ins = [xf, wf]
    bias = rng.random() < 0.7
    if bias:
        names["b"], names["bs"], names["bz"] = b.name("b"), b.name("bs"), b.name("bz")
        case.inits[names["b"]] = rng.integers(-3000, 3000, n).astype(np.int32)
        case.inits[names["bs"]] = (x_scale * np.broadcast_to(w_scale, (n,))).astype(np.float32)
        case.inits[names["bz"]] = np.zeros(n, np.int32)
        ins += b.node("DequantizeLinear", [names["b"], names["bs"], names["bz"]], ["bf"], axis=0)
    (yf,) = b.node("Gemm", ins, ["gemm"], transB=int(trans_b))
    (yq,) = b.node("QuantizeLinear", [yf, names["ys"], names["yz"]], ["yq"])
    (y,) = b.node("DequantizeLinear", [yq, names["ys"], names["yz"]], ["y"])
    b.output(y)
    case.terms = k + 2
    case.slack[y] = float(y_scale) * 1.001
    case.geometry = dict(m=m, k=k, n=n, transB=trans_b, weights="int8" if signed else "uint8",
                         per_column=per_column, bias=bias)


KINDS["qgemm"] = qgemm
ROUND.append("qgemm")
KINDS["conv_amx"] = conv_amx
ROUND.append("conv_amx")
KINDS["conv_stem_amx"] = conv_stem_amx
ROUND.append("conv_stem_amx")

def grouped_pointwise_amx(case, rng):
    """A grouped 1x1 stride-1 convolution over NCHW compiled with precision bf16, which CPUs
    with AMX multiply on tiles (nncc/native/grouped_pointwise_amx.py; elsewhere float32
    register tiles, within the same bound): channels a group around and between the
    32-channel tile product (odd counts: a pair half padding; whole 16-channel blocks go the
    blocked way), output channels a group around the 16-row tile and the 32-row micro-tile,
    planes around the 16-pixel tile and the 32-pixel micro-tile, batches, bias and the
    epilogues, a residual as Add or as ShuffleNet's Sum; one case in four with the input
    near float32's smallest normal, so some of it is denormal (which the tiles read as zero)."""
    b = _Builder(case, rng)
    case.precision = "bf16"
    group = _choice(rng, [2, 3, 4, 4, 8])
    cg = _choice(rng, [16, 17, 20, 28, 31, 33, 34, 47, 68, 100, 136])
    kg = _choice(rng, [1, 5, 16, 17, 28, 31, 33, 34, 48, 68])
    n = _choice(rng, [1, 1, 2])
    h, w = _choice(rng, [(1, 1), (3, 5), (4, 4), (1, 17), (7, 7), (2, 16), (1, 33), (14, 14), (28, 28)])
    c, k = cg * group, kg * group
    attrs = dict(kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=group)
    x = b.input("x", (n, c, h, w))
    if rng.random() < 0.25:
        case.inputs[x] *= np.float32(2.0**-124)
    ins = [x, b.init("w", (k, cg, 1, 1))]
    bias = rng.random() < 0.6
    if bias:
        ins.append(b.init("b", (k,)))
    epilogue = _choice(rng, ["", "Relu", "Clip", "residual", "residual_relu", "sum", "sum_relu", "Sigmoid"])
    (y,) = b.node("Conv", ins, ["conv"], **attrs)
    if epilogue.startswith("sum"):  # ShuffleNet's residual: a Sum of two
        (y,) = b.node("Sum", [y, b.input("skip", (n, k, h, w))], ["sum"])
        if epilogue == "sum_relu":
            (y,) = b.node("Relu", [y], ["relu"])
    else:
        y = _conv_epilogue(b, y, rng, epilogue, (n, k, h, w))
    b.output(y)
    case.terms = cg + 2
    case.slack = {y: _tiles_conv_slack(case.inputs[x], case.inits[ins[1]], attrs)}
    case.geometry = dict(x=[n, c, h, w], w=[k, cg, 1, 1], bias=bias, epilogue=epilogue or None, group=group)


KINDS["grouped_pointwise_amx"] = grouped_pointwise_amx
ROUND.append("grouped_pointwise_amx")


def concat_graph(case, rng):
    """Channel Concats as dense blocks and Inception blocks join them (the plan may place
    an input inside its Concat's output, its producer writing there: nncc/native/
    concat_slices.py): a chain where each Concat is the previous one plus a new
    convolution's output, fan-outs joining earlier values in any order (one twice, or in
    two Concats), a graph input or a constant joined in, a value read again after it was
    joined, a Concat that is a graph output, batches of 2 (whose slices are not contiguous),
    channel counts that are not whole blocks, and an NCHW Concat of elementwise results on
    any axis. Convolution weights are scaled by 1/sqrt(fan-in), so values stay O(1)."""
    b = _Builder(case, rng)
    n = _choice(rng, [1, 1, 1, 2])
    h, w = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    c0 = _choice(rng, [3, 8, 16, 16, 32])
    x = b.input("x", (n, c0, h, w))
    terms, events = 0, []

    def conv(src: str, cin: int, cout: int, tag: str) -> str:
        nonlocal terms
        k = _choice(rng, [1, 3])
        weights = rng.standard_normal((cout, cin, k, k)) / math.sqrt(cin * k * k)
        (y,) = b.node("Conv", [src, b.init(f"w{tag}", weights), b.init(f"b{tag}", (cout,))], [f"conv{tag}"],
                      pads=[k // 2] * 4)
        terms += cin * k * k + 1  # each layer's rounding, carried on at a gain of about 1
        return y

    if rng.random() < 0.2:  # NCHW values (no convolution): a Concat on any axis
        shape = [n, c0, h, w]
        axis = int(rng.integers(0, 4))
        parts = []
        for i in range(int(rng.integers(2, 5))):
            part = list(shape)
            part[axis] = int(rng.integers(1, 5))
            (v,) = b.node("Sigmoid", [b.input(f"p{i}", part)], [f"sig{i}"])
            parts.append(v)
        if rng.random() < 0.3:
            parts.append(parts[0])
        (y,) = b.node("Concat", parts, ["plain"], axis=axis)
        if rng.random() < 0.5:
            (y,) = b.node("Relu", [y], ["plain_read"])
        b.output(y)
        if rng.random() < 0.5:
            (r,) = b.node("Relu", [parts[-1]], ["after"])
            b.output(r)
        if rng.random() < 0.5:  # the same inputs and one more joined anew (a nested Concat)
            (z,) = b.node("Concat", [*parts, parts[int(rng.integers(0, len(parts)))]], ["again"], axis=axis)
            (z,) = b.node("Neg", [z], ["again_read"])
            b.output(z)
        case.geometry = dict(kind="plain", n=n, axis=axis, parts=len(parts))
        return
    channels = _choice(rng, [8, 16, 16, 32])
    last = conv(x, c0, channels, "0")
    values, shown, joins = [(last, channels)], set(), []
    for step in range(int(rng.integers(2, 6))):
        event = _choice(rng, ["grow", "grow", "grow", "again", "fan", "input", "reread"])
        events.append(event)
        if event in ("grow", "again"):  # a dense layer: Relu, Conv, and the Concat of all before with it
            growth = _choice(rng, [8, 16, 16, 32, 5])
            (r,) = b.node("Relu", [last], [f"pre{step}"])
            new = conv(r, channels, growth, str(step + 1))
            values.append((new, growth))
            if event == "again" and joins:  # torchvision's form: an earlier Concat's inputs joined anew
                inputs, width = joins[int(rng.integers(0, len(joins)))]
                (last,) = b.node("Concat", [*inputs, new], [f"again{step}"], axis=1)
                channels = width + growth
            else:
                (last,) = b.node("Concat", [last, new], [f"dense{step}"], axis=1)
                channels += growth
            joins.append((list(case.nodes[-1].input), channels))
        elif event == "fan":  # an Inception block's join of earlier values, maybe one twice
            picks = [values[int(i)] for i in rng.integers(0, len(values), int(rng.integers(2, 4)))]
            picks.append((last, channels))
            rng.shuffle(picks)
            (last,) = b.node("Concat", [p[0] for p in picks], [f"fan{step}"], axis=1)
            channels = sum(p[1] for p in picks)
            joins.append(([p[0] for p in picks], channels))
        elif event == "input":  # a graph input or a constant joined to a convolution's output
            extra = _choice(rng, [8, 16, 3])
            other = b.input(f"side{step}", (n, extra, h, w)) if rng.random() < 0.5 else \
                b.init(f"const{step}", (n, extra, h, w))
            (last,) = b.node("Concat", [last, other] if rng.random() < 0.5 else [other, last], [f"join{step}"], axis=1)
            channels += extra
        else:  # a joined value read again, and the Concat made a graph output
            (r,) = b.node("Neg", [values[-1][0]], [f"neg{step}"])
            b.output(r)
            if last not in shown:
                shown.add(last)
                b.output(last)
        values.append((last, channels))
    b.output(conv(last, channels, _choice(rng, [4, 16]), "out"))
    case.terms = terms
    case.geometry = dict(kind="blocked", n=n, x=[n, c0, h, w], events=events)


KINDS["concat_graph"] = concat_graph
ROUND.append("concat_graph")


def conv_narrow_groups(case, rng):
    """Grouped convolutions whose groups (as many channels in as out) are narrower than a
    vector block (nncc/native/narrow_group_conv.py): groups of 2, 4 or 8 channels, counts
    that leave the last block part empty (13 groups of 8), rows of several tiles and an
    interior, strides, dilations, pads, bias and the epilogues. A NaN or infinity planted
    in one group's input must stay in that group's outputs, as onnxruntime's do."""
    b = _Builder(case, rng)
    cg = _choice(rng, [2, 4, 8])
    group = _choice(rng, [1, 2, 3, 5, 6, 13])
    c = group * cg
    attrs, wshape, (eh, ew) = _conv_geometry(rng, c, groups=(group, cg))
    n = _choice(rng, [1, 1, 2])
    h, w = _spatial(rng, eh, ew, attrs["pads"])
    h, w = h + int(rng.integers(0, 12)), w + int(rng.integers(0, 40))  # rows of one tile or several
    x = b.input("x", (n, c, h, w))
    ins = [x, b.init("w", wshape)]
    bias = rng.random() < 0.6
    if bias:
        ins.append(b.init("b", (wshape[0],)))
    epilogue = _choice(rng, ["", "Relu", "Clip", "residual", "residual_relu", "Sigmoid", "Silu"])
    (y,) = b.node("Conv", ins, ["conv"], **attrs)
    oh = _out(h, attrs["pads"][0], attrs["pads"][2], eh, attrs["strides"][0])
    ow = _out(w, attrs["pads"][1], attrs["pads"][3], ew, attrs["strides"][1])
    y = _conv_epilogue(b, y, rng, epilogue, (n, wshape[0], oh, ow))
    b.output(y)
    case.terms = wshape[1] * wshape[2] * wshape[3] + 2
    case.geometry = dict(x=[n, c, h, w], w=list(wshape), bias=bias, epilogue=epilogue or None,
                         **{k: v for k, v in attrs.items() if k != "kernel_shape"})


KINDS["conv_narrow_groups"] = conv_narrow_groups
ROUND.append("conv_narrow_groups")


def qadd_residual(case, rng):
    """Quantized inverted-residual blocks (QOperator): a stem convolution, then one to three
    blocks of expansion (1x1), sometimes a depthwise 3x3, and projection (1x1), whose output
    a QLinearAdd sums with the block's input (either operand first); sometimes a quantized
    second input joins the stream through one more QLinearAdd (a float image read beside
    bytes: NaN and infinities enter there too); then a QLinearGlobalAveragePool, a 1x1
    convolution, or the stream itself. Each value quantizes with the scale and zero point
    its readers recover with, so the stream, the adds' inputs and outputs included, travels
    as bytes (nncc/native/int8_bytes.py), NHWC between pixel-major convolutions (many
    channels over few pixels), NCHW otherwise; or MobileNetV2's 14 x 14 blocks (a stream of
    61 to 128 channels over 150 to 320 pixels, expansions past 160 channels), whose
    pixel-major projections keep the stream NHWC while the pointwise expansions, channel-major,
    read it in place (int8_conv_cm.py); sometimes a block's input is also an output
    (a float image). onnxruntime's own QLinearAdd and QLinearGlobalAveragePool round in
    fixed point, so its model (``oracle_nodes``) spells both in standard float32 ops with
    the portable kernels' arithmetic (nncc/kernels/quantize.py's qlinear_add, qlinear_contrib's
    pool): each side's centred integer times float32(its scale / the output's), the sum,
    the zero point added, rounded half to even and saturated (a QuantizeLinear of scale 1);
    the pool's exact integer sum times float32(x_scale / (y_scale * pixels)). Exact."""
    case.opt_level = 2
    b = _Builder(case, rng)
    n = _choice(rng, [1, 1, 2])
    c = _choice(rng, [3, 8, 16])
    form = rng.random()
    narrow = form < 0.4  # many channels over few pixels: the pixel-major form
    mobile = form >= 0.7  # pixel-major projections, channel-major expansions over one NHWC stream
    if mobile:
        h, w, m = int(rng.integers(12, 18)), int(rng.integers(13, 20)), _choice(rng, [61, 62, 64, 125, 128])
    elif narrow:
        h, w, m = int(rng.integers(1, 6)), int(rng.integers(1, 7)), _choice(rng, [40, 64, 96, 128])
    else:
        h, w, m = int(rng.integers(1, 13)), int(rng.integers(1, 14)), _choice(rng, [3, 8, 17, 24])
    act = np.int8 if rng.random() < 0.3 else np.uint8
    x = b.input("x", (n, c, h, w))
    q, xs, xz, scale = _quantized_input(case, b, rng, act, x)
    layers, standard, i = [], {}, 0  # standard: a contrib node's name -> the oracle's nodes for it
    f32 = np.float32

    def const(short, value):
        case.inits[b.name(short)] = np.asarray(value)
        return b.name(short)

    def conv(value, cin, cout, k, depthwise):
        nonlocal i
        out = _qlinear_conv(case, b, rng, act, i, value, cin, cout, k, 1, k // 2, depthwise)
        layers.append(dict(w=[cout, 1 if depthwise else cin, k, k]))
        i += 1
        return out

    def add(first, second):
        nonlocal i
        (qa, sa_name, za_name, sa), (qb, sb_name, zb_name, sb) = first, second
        s_out = f32(max(float(sa), float(sb)) * float(rng.uniform(1.0, 2.0)))
        ys, yz = _q_activation(case, b, rng, act, f"s{i}", s_out)
        (qy,) = b.node("QLinearAdd", [qa, sa_name, za_name, qb, sb_name, zb_name, ys, yz], [f"sum{i}"],
                       domain="com.microsoft")
        t = f"t{i}_"
        ra, rb = const(t + "ra", f32(sa) / s_out), const(t + "rb", f32(sb) / s_out)
        cz, one, zero = const(t + "cz", f32(case.inits[yz])), const(t + "one", f32(1)), const(t + "zero", np.zeros((), act))
        standard[case.nodes[-1].name] = [
            helper.make_node("DequantizeLinear", [qa, ra, za_name], [b.name(t + "l")]),
            helper.make_node("DequantizeLinear", [qb, rb, zb_name], [b.name(t + "r")]),
            helper.make_node("Add", [b.name(t + "l"), b.name(t + "r")], [b.name(t + "sum")]),
            helper.make_node("Add", [b.name(t + "sum"), cz], [b.name(t + "at")]),
            helper.make_node("QuantizeLinear", [b.name(t + "at"), one, zero], [qy])]
        layers.append(dict(add=True))
        i += 1
        return qy, ys, yz, s_out

    stream = conv((q, xs, xz, scale), c, m, 1, False)
    if mobile:  # the stream's first writer a projection too (a short K would be channel-major)
        stream = conv(stream, m, 192, 1, False)
        stream = conv(stream, 192, m, 1, False)
    for _ in range(_choice(rng, [1, 2, 3])):
        e = _choice(rng, [192, 3 * m, 256]) if mobile else _choice(rng, [m, 2 * m]) if not narrow else _choice(rng, [m, 64, 128])
        inner = conv(stream, m, e, 1, False)
        if rng.random() < 0.4:
            inner = conv(inner, e, e, 3, True)
        proj = conv(inner, e, m, 1, False)
        if rng.random() < 0.15:  # the block's input read outside the int8 steps too
            b.output(b.node("DequantizeLinear", list(stream[:3]), [f"inner{i}"])[0])
        stream = add(*((stream, proj) if rng.random() < 0.5 else (proj, stream)))
    if rng.random() < (0.1 if mobile else 0.3):  # a second quantized input joins the stream as a float image
        x2 = b.input("x2", (n, m, h, w))
        s2 = f32(rng.uniform(0.01, 0.03))
        x2s, x2z = _q_activation(case, b, rng, act, "b0", s2)
        (q2,) = b.node("QuantizeLinear", [x2, x2s, x2z], ["q2in"])
        stream = add(stream, (q2, x2s, x2z, s2))
    # (a pool or a float output reads the stream NCHW: MobileNetV2's form mostly ends in a convolution)
    tail = _choice(rng, ["pool", "conv", "stream"] if not mobile else ["conv", "conv", "conv", "pool"])
    if tail == "pool":
        q_in, s_name, z_name, s_in = stream
        s_out = f32(float(s_in) * float(rng.uniform(0.3, 1.0)))
        ys, yz = _q_activation(case, b, rng, act, "p", s_out)
        (qp,) = b.node("QLinearGlobalAveragePool", [q_in, s_name, z_name, ys, yz], ["pooled"], domain="com.microsoft")
        factor = const("p_factor", f32(s_in) / (s_out * f32(h * w)))
        one, axes = const("p_one", f32(1)), b.init_ints("p_axes", [2, 3])
        standard[case.nodes[-1].name] = [
            helper.make_node("DequantizeLinear", [q_in, one, z_name], [b.name("p_centred")]),
            helper.make_node("ReduceSum", [b.name("p_centred"), axes], [b.name("p_sum")], keepdims=1),
            helper.make_node("Mul", [b.name("p_sum"), factor], [b.name("p_mean")]),
            helper.make_node("QuantizeLinear", [b.name("p_mean"), one, yz], [qp])]
        stream = (qp, ys, yz, s_out)
    elif tail == "conv":
        stream = conv(stream, m, _choice(rng, [m, 64]), 1, False)
    (y,) = b.node("DequantizeLinear", list(stream[:3]), ["y"])
    b.output(y)
    case.oracle_nodes = [o for node in case.nodes for o in standard.get(node.name, [node])]
    case.reference_nodes = case.oracle_nodes
    case.terms = 2  # exact integers; the image one product
    case.geometry = dict(x=[n, c, h, w], m=m, activations=np.dtype(act).name, layers=layers, tail=tail)


KINDS["qadd_residual"] = qadd_residual
ROUND.append("qadd_residual")


def make_case(seed: int, index: int) -> Case:
    rng = np.random.default_rng([seed, index])
    kind = ROUND[index % len(ROUND)]
    case = Case(seed, index, kind, {}, opt_level=0 if index // len(ROUND) % 4 == 3 else 2)  # a round in 4 at -O0
    KINDS[kind](case, rng)
    specials = np.random.default_rng([seed, index, 2])
    floats = any(a.dtype == np.float32 for a in case.inputs.values())
    if specials.random() < 1 / NONFINITE and floats and kind not in NO_ORACLE_FOR_NONFINITE:
        plant_nonfinite(case, specials)
    if case.bound is not None:
        case.bound(case)
    return case


# Kinds whose oracle stops being one on NaN and inf. onnxruntime's RNN, GRU and LSTM clamp a
# gate's input before its activation, so a NaN there becomes a saturated gate (its Sigmoid
# and Tanh ops keep NaN, as the reference evaluator's recurrent ops and nncc's do). The
# quantized convolutions take them in their float input: their fixed scales send an infinity
# to an end of the byte range, and onnxruntime's exact integer products (tests/oracle.py)
# then agree with nncc's. A dynamically quantized product's NaN makes the range, so every
# result, NaN, as the reference evaluator computes it (onnxruntime's vector min/max keeps or
# loses it by its place in memory: tests/test_dynamic_quantize_nonfinite.py).
NO_ORACLE_FOR_NONFINITE = {"recurrent", "recurrent_bf16"}


def plant_nonfinite(case: Case, rng) -> None:
    """NaN, +inf and -inf, once or twice each, at random places of one input of the case.
    No NaN may reach a MaxPool: the maximum of a window holding NaN is not defined alike by
    the oracles (onnxruntime skips it in one code path and keeps it in another, by position),
    so a MaxPool reading the input gets infinities only, one after a Conv (where infinities
    of both signs make NaN) nothing."""
    name = _choice(rng, sorted(n for n, a in case.inputs.items() if a.dtype == np.float32))
    flat = case.inputs[name].reshape(-1).copy()
    pools = [node for node in case.nodes if node.op_type == "MaxPool"]
    if pools and any(node.input[0] != name for node in pools):
        return
    for value in (np.nan, np.inf, -np.inf):
        count = int(rng.integers(1, 3))
        if not (pools and np.isnan(value)):
            flat[rng.integers(0, flat.size, count)] = value
    case.inputs[name] = flat.reshape(case.inputs[name].shape)
    case.nonfinite = name[len(f"c{case.index}_"):]


def make_cases(seed: int, start: int, count: int) -> list[Case]:
    return [make_case(seed, i) for i in range(start, start + count)]


def indices(count: int, kinds=()) -> list[int]:
    """The first ``count`` case indices of the given kinds (every kind when none is given)."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"no fuzz kind {', '.join(sorted(unknown))}; the kinds are {', '.join(sorted(KINDS))}")
    chosen = [i for i, kind in enumerate(ROUND) if not kinds or kind in kinds]
    rounds = -(-count // len(chosen))
    return [r * len(ROUND) + i for r in range(rounds) for i in chosen][:count]


# -- models and judging ------------------------------------------------------------------------


def batch_model(cases: list[Case], oracle: bool = False, reference: bool = False) -> onnx.ModelProto:
    """One model holding every case side by side (each its own inputs and outputs); with
    ``oracle``, each case's nodes as onnxruntime runs them (``Case.oracle_nodes``), with
    ``reference`` as the onnx reference evaluator does (``Case.reference_nodes``)."""
    nodes, inputs, outputs, inits = [], [], [], []
    for case in cases:
        if reference and case.reference_nodes is not None:
            nodes += case.reference_nodes
        else:
            nodes += case.oracle_nodes if oracle and case.oracle_nodes is not None else case.nodes
        inputs += [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                   for n, a in case.inputs.items()]  # float32, or a gather's int32 and int64 indices
        outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in case.outputs]
        inits += [numpy_helper.from_array(a, n) for n, a in case.inits.items()]
    graph = helper.make_graph(nodes, "native_fuzz", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def feeds(cases: list[Case]) -> dict:
    return {n: a for case in cases for n, a in case.inputs.items()}


def run_nncc(cases: list[Case], path) -> tuple[dict, set]:
    """(outputs, names of the outputs a native partition wrote) of the batch, by nncc:
    one model per optimization level and precision among the cases."""
    import nncc

    got, native = {}, set()
    for level, precision in sorted({(case.opt_level, case.precision) for case in cases}):
        group = [case for case in cases if (case.opt_level, case.precision) == (level, precision)]
        onnx.save(batch_model(group), str(path))
        with dot_convolutions(precision == BF16_CONV):
            model = nncc.compile_model(path, opt_level=level, precision="bf16" if precision == BF16_CONV else precision)
            got.update(model.run(feeds(group)))
        native |= native_outputs(model)
    return got, native


@contextlib.contextmanager
def dot_convolutions(on: bool):
    """With ``on``, the host's features as a CPU whose vdpbf16ps outruns float32's FMAs has
    them (nncc.native.precision.SLOW_DOT left out), so precision bf16 builds its blocked
    convolutions in bfloat16 on this CPU too (the features are in the cache token)."""
    from nncc.native import precision, toolchain  # lazy: the native backend's modules

    if not on:
        yield
        return
    real = toolchain._host_features
    toolchain._host_features = lambda: real() - {precision.SLOW_DOT}
    try:
        yield
    finally:
        toolchain._host_features = real


def native_outputs(model) -> set:
    """The values written by an instruction of a partition that runs as native code."""
    plan = model.plan
    if not model.native_partitions:
        return set()
    written = set()
    for part in plan.partitions:
        if part.backend == "native":
            for ins in plan.instructions[part.first:part.first + part.count]:
                written.update(plan.slots[s].name for s in ins.outputs if s >= 0)
    return written


def run_onnxruntime(cases: list[Case]) -> dict:
    from tests.oracle import NO_KERNEL, exact_integer_session, ort_session  # lazy: onnxruntime, the oracle only

    try:
        session = exact_integer_session(batch_model(cases, oracle=True))
    except NO_KERNEL:
        # a case with int8 activations, which onnxruntime's exact integer path has no kernel
        # for: each case alone, so the others keep that path
        outputs = {}
        for case in cases:
            single = ort_session(batch_model([case], oracle=True))
            outputs.update(zip([o.name for o in single.get_outputs()], single.run(None, feeds([case]))))
        return outputs
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds(cases))))


def run_reference(case: Case) -> dict:
    from onnx.reference import ReferenceEvaluator

    return dict(zip(case.outputs, ReferenceEvaluator(batch_model([case], reference=True)).run(None, case.inputs)))


def worst(case: Case, got, want, name: str = "") -> tuple[float, float] | None:
    """(largest difference, its tolerance) where ``got`` (output ``name``) exceeds the
    tolerance, else None."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf"), 0.0
    scale = max(1.0, float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0)))
    tol = ATOL_PER_TERM * case.terms * scale + RTOL * np.abs(want) + case.slack.get(name, 0.0)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    bad = ~same & ~(diff <= tol)
    if not bad.any():
        return None
    at = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1.0))), got.shape)
    return float(diff[at]), float(tol[at])


def judge(case: Case, got: dict, ort_out: dict, native: set) -> str | None:
    """None when the case passes, else a report: geometry, difference, reproduction."""
    problems = [f"{name} was not computed by native code" for name in case.outputs if name not in native]
    off = {name: worst(case, got[name], ort_out[name], name) for name in case.outputs}
    if not problems and not any(off.values()):
        return None
    if not problems:
        try:
            ref = run_reference(case)
        except Exception as exc:  # noqa: BLE001 - the evaluator lacks some ops and opsets: the case fails, said so
            cannot = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            problems += [f"{name}: off by {d:.3g} (tolerance {t:.3g}) from onnxruntime, and the onnx reference "
                         f"evaluator cannot run it ({cannot})" for name, (d, t) in ((n, v) for n, v in off.items() if v)]
            return f"{case.describe()}: {'; '.join(problems)}\n    reproduce: {case.reproduce}"
        ref_off = {name: worst(case, got[name], ref[name], name) for name in case.outputs}
        if not any(ref_off.values()):
            return None  # onnxruntime disagrees, the reference evaluator agrees with nncc
        problems += [f"{name}: off by {d:.3g} (tolerance {t:.3g}) from onnxruntime, and by "
                     f"{ref_off[name][0]:.3g} from the onnx reference evaluator" if ref_off[name] else
                     f"{name}: off by {d:.3g} (tolerance {t:.3g}) from onnxruntime (the reference evaluator "
                     "agrees on it, not on another output)"
                     for name, (d, t) in ((n, v) for n, v in off.items() if v)]
        if not any(off.values()):
            problems.append("matches onnxruntime, not the reference evaluator?")
    return f"{case.describe()}: {'; '.join(problems)}\n    reproduce: {case.reproduce}"


def _main(argv: list[str]) -> int:
    import tempfile

    if argv[:1] == ["--run"]:  # SEED OUT.npz INDEX...: nncc only, in batches, outputs saved
        seed, out, indices = int(argv[1]), argv[2], [int(i) for i in argv[3:]]
        saved, written = {}, set()
        with tempfile.TemporaryDirectory() as tmp:
            for at in range(0, len(indices), BATCH):
                cases = [make_case(seed, i) for i in indices[at:at + BATCH]]
                got, native = run_nncc(cases, f"{tmp}/batch.onnx")
                saved.update(got)
                written |= native
        np.savez(out, **saved, __native__=np.array(sorted(written)))
        return 0
    seed, index = int(argv[0]), int(argv[1])
    case = make_case(seed, index)
    print(case.describe())
    with tempfile.TemporaryDirectory() as tmp:
        got, native = run_nncc([case], f"{tmp}/case.onnx")
    want = run_onnxruntime([case])
    try:
        ref = run_reference(case)
    except Exception as exc:  # noqa: BLE001 - onnx.reference lacks some ops at some opsets (QDQ at 17): not judged
        ref = None
        print(f"onnx.reference cannot run this case ({type(exc).__name__}: {str(exc).splitlines()[0]})")
    for name in case.outputs:
        g = np.asarray(got[name])
        versus = "" if ref is None else f"; reference {ref[name].shape} max diff {_maxdiff(g, ref[name])}"
        print(f"{name}: nncc {g.shape} native={name in native}; onnxruntime {want[name].shape} "
              f"max diff {_maxdiff(g, want[name])}{versus}")
    verdict = judge(case, got, want, native)
    print(verdict or "pass")
    return 1 if verdict else 0


def _maxdiff(a, b):
    return "shape differs" if a.shape != b.shape else f"{float(np.max(np.abs(a - b), initial=0.0)):.3g}"


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

