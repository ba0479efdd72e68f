"""Graphs written with onnx.helper in the idioms other exporters (tf2onnx, paddle2onnx,
keras2onnx, older framework exporters) leave in a model: activations spelled out in
elementwise ops, scalars as Constant nodes, BatchNormalization left unfolded, a Pad node
before a Conv, int32 token ids, an If on a scalar input, NHWC inputs wrapped in
Transposes, and unnamed or repeated dimensions (``float32[-1, 3, '?', '?']``)."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from corpus_models.spec import Feed, Spec

OPSET = 13  # what tf2onnx and paddle2onnx write by default


class Graph:
    """A graph under construction, weights drawn from one seeded generator."""

    def __init__(self, seed: int, weights_as_constants: bool = False):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.initializers, self.count = [], [], 0
        self.weights_as_constants = weights_as_constants

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def op(self, kind: str, inputs: list[str], outputs: int = 1, **attrs) -> str | list[str]:
        names = [self.fresh(kind.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(kind, inputs, names, name=self.fresh(kind), **attrs))
        return names[0] if outputs == 1 else names

    def constant(self, value, dtype=np.float32) -> str:
        """A Constant node, as tf2onnx writes scalars and paddle2onnx writes weights."""
        name = self.fresh("const")
        self.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("Constant"),
                                           value=numpy_helper.from_array(np.asarray(value, dtype), name)))
        return name

    def weight(self, shape, scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        value = (self.rng.standard_normal(shape) * (scale or 1 / math.sqrt(fan_in))).astype(np.float32)
        if self.weights_as_constants:
            return self.constant(value)
        name = self.fresh("w")
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1, pads=None,
             bias: bool = False) -> str:
        inputs = [x, self.weight([cout, cin // groups, k, k])] + ([self.weight([cout], 0.1)] if bias else [])
        return self.op("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], group=groups,
                       pads=pads if pads is not None else [k // 2] * 4)

    def batchnorm(self, x: str, c: int) -> str:
        """BatchNormalization left in the graph, as exporters that do not fold it write it."""
        scale = self.weight([c], 0.1)
        stats = [(1 + self.rng.random(c) * 0.2).astype(np.float32), (self.rng.random(c) * 0.1).astype(np.float32),
                 (0.5 + self.rng.random(c)).astype(np.float32)]
        names = []
        for value in stats:
            if self.weights_as_constants:
                names.append(self.constant(value))
            else:
                names.append(self.fresh("bn"))
                self.initializers.append(numpy_helper.from_array(value, names[-1]))
        gamma, mean, var = names
        return self.op("BatchNormalization", [x, gamma, scale, mean, var], epsilon=1e-3)

    def matmul(self, x: str, cin: int, cout: int) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.weight([cin, cout])]), self.weight([cout], 0.1)])

    def model(self, inputs, outputs, name: str, opset: int = OPSET) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="nncc-corpus")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def image_input(name="image", dims=("batch", 3, "height", "width")):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def output(name, rank=2):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)


def classifier_head(g: Graph, x: str, c: int, classes: int = 100) -> str:
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    return g.op("Gemm", [pooled, g.weight([classes, c]), g.weight([classes], 0.1)], transB=1)


# -- activations spelled out ------------------------------------------------------------------------------


def hardswish(g, x):
    """x * Clip(x + 3, 0, 6) / 6 (keras2onnx, tf2onnx)."""
    clipped = g.op("Clip", [g.op("Add", [x, g.constant(3.0)]), g.constant(0.0), g.constant(6.0)])
    return g.op("Div", [g.op("Mul", [x, clipped]), g.constant(6.0)])


def hardsigmoid(g, x):
    """Relu6(x + 3) * (1/6), as a Mul by the reciprocal."""
    return g.op("Mul", [g.op("Clip", [g.op("Add", [x, g.constant(3.0)]), g.constant(0.0), g.constant(6.0)]),
                        g.constant(1 / 6)])


def silu(g, x):
    return g.op("Mul", [x, g.op("Sigmoid", [x])])


def gelu_erf(g, x):
    """x * 0.5 * (1 + erf(x / sqrt 2)), as BERT's TF port writes it."""
    erf = g.op("Erf", [g.op("Div", [x, g.constant(math.sqrt(2))])])
    return g.op("Mul", [g.op("Mul", [x, g.constant(0.5)]), g.op("Add", [erf, g.constant(1.0)])])


def gelu_tanh(g, x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's form."""
    cube = g.op("Pow", [x, g.constant(3.0)])
    inner = g.op("Add", [x, g.op("Mul", [cube, g.constant(0.044715)])])
    inner = g.op("Mul", [inner, g.constant(math.sqrt(2 / math.pi))])
    return g.op("Mul", [g.op("Mul", [x, g.constant(0.5)]), g.op("Add", [g.op("Tanh", [inner]), g.constant(1.0)])])


def mish(g, x, spelled_softplus=False):
    """x * tanh(softplus(x)); softplus as its op or as log(exp(x) + 1)."""
    soft = g.op("Log", [g.op("Add", [g.op("Exp", [x]), g.constant(1.0)])]) if spelled_softplus else \
        g.op("Softplus", [x])
    return g.op("Mul", [x, g.op("Tanh", [soft])])


def layernorm_spelled(g, x, d):
    """LayerNorm in reductions and elementwise ops (tf2onnx's, opset 13: no LayerNormalization)."""
    mean = g.op("ReduceMean", [x], axes=[-1])
    centred = g.op("Sub", [x, mean])
    var = g.op("ReduceMean", [g.op("Pow", [centred, g.constant(2.0)])], axes=[-1])
    normed = g.op("Div", [centred, g.op("Sqrt", [g.op("Add", [var, g.constant(1e-6)])])])
    return g.op("Add", [g.op("Mul", [normed, g.weight([d], 1.0)]), g.weight([d], 0.1)])


def conv_net(path, seed, activation, name, widths=(16, 32, 64, 96), weights_as_constants=False, depthwise=True):
    """A small conv classifier: per stage a strided Conv, BatchNormalization left
    unfolded, the activation spelled out, and a depthwise Conv."""
    g = Graph(seed, weights_as_constants)
    x, cin = "image", 3
    for c in widths:
        x = activation(g, g.batchnorm(g.conv(x, cin, c, 3, 2), c))
        if depthwise:
            x = activation(g, g.batchnorm(g.conv(x, c, c, 3, 1, groups=c), c))
        cin = c
    x = classifier_head(g, x, cin)
    onnx.save(g.model([image_input()], [output(x)], name), path)
    return [Feed("image", [1, 3, 128, 128])]


def spelled_mish(path):
    g = Graph(6)
    x, cin = "image", 3
    for i, c in enumerate((16, 32, 64, 96)):
        x = mish(g, g.batchnorm(g.conv(x, cin, c, 3, 2), c), spelled_softplus=i % 2 == 1)
        cin = c
    x = classifier_head(g, x, cin)
    onnx.save(g.model([image_input()], [output(x)], "mish"), path)
    return [Feed("image", [1, 3, 128, 128])]


def se_hardsigmoid(path):
    """MobileNetV3 blocks as keras2onnx writes them: hard-swish and an SE gate with the
    hard sigmoid spelled out."""
    g = Graph(2)
    x, cin = hardswish(g, g.batchnorm(g.conv("image", 3, 16, 3, 2), 16)), 16
    for c in (24, 40, 80):
        e = hardswish(g, g.batchnorm(g.conv(x, cin, c * 4, 1), c * 4))
        e = hardswish(g, g.batchnorm(g.conv(e, c * 4, c * 4, 5, 2, groups=c * 4), c * 4))
        s = g.op("GlobalAveragePool", [e])
        s = g.op("Conv", [g.op("Relu", [g.op("Conv", [s, g.weight([c, c * 4, 1, 1]), g.weight([c], 0.1)])]),
                          g.weight([c * 4, c, 1, 1]), g.weight([c * 4], 0.1)])
        x = g.batchnorm(g.conv(g.op("Mul", [e, hardsigmoid(g, s)]), c * 4, c, 1), c)
        cin = c
    x = classifier_head(g, x, cin)
    onnx.save(g.model([image_input()], [output(x)], "se_hardsigmoid"), path)
    return [Feed("image", [1, 3, 128, 128])]


def ffn_block(path, gelu, seed, name):
    """Two transformer feed-forward blocks (d 256, 1024 inner) with LayerNorm and GELU
    spelled out, over [batch, sequence, 256]."""
    g = Graph(seed)
    x = "hidden"
    for _ in range(2):
        y = g.matmul(gelu(g, g.matmul(layernorm_spelled(g, x, 256), 256, 1024)), 1024, 256)
        x = g.op("Add", [x, y])
    inp = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", 256])
    onnx.save(g.model([inp], [output(x, 3)], name), path)
    return [Feed("hidden", [1, 128, 256])]


# -- exporter idioms ----------------------------------------------------------------------------------------


def pad_then_conv(path):
    """TensorFlow's SAME padding through tf2onnx: an explicit Pad (pads from a Constant
    node) before each strided Conv with no padding of its own, depthwise included."""
    g = Graph(7)
    x, cin = "image", 3
    for c in (16, 32, 64, 128):
        x = g.op("Pad", [x, g.constant([0, 0, 0, 0, 0, 0, 1, 1], np.int64)], mode="constant")
        x = g.op("Relu", [g.batchnorm(g.conv(x, cin, c, 3, 2, pads=[0, 0, 0, 0]), c)])
        x = g.op("Pad", [x, g.constant([0, 0, 1, 1, 0, 0, 1, 1], np.int64)], mode="constant")
        x = g.op("Relu", [g.conv(x, c, c, 3, 1, groups=c, pads=[0, 0, 0, 0], bias=True)])
        cin = c
    x = classifier_head(g, x, cin)
    onnx.save(g.model([image_input()], [output(x)], "pad_then_conv"), path)
    return [Feed("image", [1, 3, 128, 128])]


def nhwc_transposes(path):
    """A Keras model through tf2onnx: an NHWC input transposed to NCHW, and each block's
    result transposed back and forth around elementwise ops done in NHWC."""
    g = Graph(8)
    x, cin = g.op("Transpose", ["image"], perm=[0, 3, 1, 2]), 3
    for c in (16, 32, 64):
        y = g.op("Transpose", [g.conv(x, cin, c, 3, 2, bias=True)], perm=[0, 2, 3, 1])
        y = g.op("Relu", [g.op("Add", [g.op("Mul", [y, g.weight([c], 1.0)]), g.weight([c], 0.1)])])
        x, cin = g.op("Transpose", [y], perm=[0, 3, 1, 2]), c
    x = g.op("ReduceMean", [g.op("Transpose", [x], perm=[0, 2, 3, 1])], axes=[1, 2], keepdims=0)
    x = g.op("Softmax", [g.matmul(x, cin, 10)], axis=-1)
    inp = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", "H", "W", 3])
    onnx.save(g.model([inp], [output(x)], "nhwc"), path)
    return [Feed("image", [1, 128, 128, 3])]


def int32_ids(path):
    """A text classifier fed int32 token and position ids (TF exports keep int32):
    Gather from embedding tables, LayerNormalization, a ReLU MLP, mean over the sequence."""
    g = Graph(9)
    vocab, d = 8000, 128
    x = g.op("Add", [g.op("Gather", [g.weight([vocab, d], 0.02), "input_ids"]),
                     g.op("Gather", [g.weight([512, d], 0.02), "position_ids"])])
    x = g.op("LayerNormalization", [x, g.weight([d], 1.0), g.weight([d], 0.1)], axis=-1, epsilon=1e-12)
    x = g.matmul(g.op("Relu", [g.matmul(x, d, 512)]), 512, d)
    x = g.matmul(g.op("ReduceMean", [x], axes=[1], keepdims=0), d, 4)
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", "sequence"])
              for n in ("input_ids", "position_ids")]
    onnx.save(g.model(inputs, [output(x)], "int32_ids", opset=17), path)
    return [Feed("input_ids", [1, 128], "int32", 0, 8000), Feed("position_ids", [1, 128], "int32", 0, 128)]


def if_on_scalar(path):
    """A model with a run-time switch, as exporters of scripted control flow write it: an
    If on a bool scalar input picks one of two heads over the same features."""
    g = Graph(10)
    x = g.op("Relu", [g.batchnorm(g.conv("image", 3, 32, 3, 2), 32)])
    x = g.op("Relu", [g.conv(x, 32, 64, 3, 2, bias=True)])

    def branch(activation, seed):
        b = Graph(seed)
        y = b.op(activation, [b.conv(x, 64, 64, 3, 1, bias=True)])
        nodes, inits = b.nodes, b.initializers
        out = helper.make_tensor_value_info(y, TensorProto.FLOAT, None)
        return helper.make_graph(nodes, f"{activation}_branch", [], [out], inits)

    y = g.op("If", ["use_sigmoid"], then_branch=branch("Sigmoid", 11), else_branch=branch("Relu", 12))
    y = classifier_head(g, y, 64, 10)
    inputs = [image_input(), helper.make_tensor_value_info("use_sigmoid", TensorProto.BOOL, [])]
    onnx.save(g.model(inputs, [output(y)], "if_on_scalar"), path)
    return [Feed("image", [1, 3, 96, 96]), Feed("use_sigmoid", [], "bool", 0, 2, fill=1)]


def paddle_dims(path):
    """paddle2onnx's form: ``float32[-1, 3, '?', '?']`` (a -1 batch, and height and width
    both named '?'), weights as Constant nodes, Conv with bias, BatchNormalization, and a
    MatMul plus Add head instead of Gemm."""
    g = Graph(13, weights_as_constants=True)
    x, cin = "x", 3
    for c in (16, 32, 64):
        x = g.op("Relu", [g.batchnorm(g.conv(x, cin, c, 3, 2, bias=True), c)])
        cin = c
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    x = g.op("Softmax", [g.matmul(x, cin, 10)], axis=1)
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    onnx.save(g.model([inp], [output(x)], "paddle_dims", opset=11), path)
    return [Feed("x", [1, 3, 128, 128])]


def build_conv_net(activation, seed, name, weights_as_constants=False):
    def build(path):
        return conv_net(path, seed, activation, name, weights_as_constants=weights_as_constants)
    return build


MODELS = [
    Spec("spelled_hardswish", "conv net, hard-swish as x * Clip(x + 3, 0, 6) / 6 with Constant scalars, "
         "BatchNormalization unfolded; 1x3x128x128, batch, height, width dynamic", "onnx.helper",
         build_conv_net(hardswish, 1, "hardswish")),
    Spec("spelled_hardsigmoid_se", "MobileNetV3-style blocks: spelled hard-swish, SE gate with hard sigmoid as "
         "Clip(x + 3, 0, 6) * (1/6), strided 5x5 depthwise; 1x3x128x128", "onnx.helper", se_hardsigmoid),
    Spec("spelled_silu", "conv net, SiLU as x * Sigmoid(x), BatchNormalization unfolded; 1x3x128x128",
         "onnx.helper", build_conv_net(silu, 3, "silu")),
    Spec("spelled_silu_constants", "the SiLU conv net with every weight a Constant node (no initializers)",
         "onnx.helper", build_conv_net(silu, 3, "silu_constants", weights_as_constants=True)),
    Spec("spelled_gelu_erf", "2 transformer FFN blocks (256-1024), GELU erf form and LayerNorm spelled out; "
         "1x128x256, batch and sequence dynamic", "onnx.helper", lambda p: ffn_block(p, gelu_erf, 4, "gelu_erf")),
    Spec("spelled_gelu_tanh", "the FFN blocks with GELU's tanh form (Pow, Tanh) spelled out", "onnx.helper",
         lambda p: ffn_block(p, gelu_tanh, 5, "gelu_tanh")),
    Spec("spelled_mish", "conv net, Mish as x * Tanh(Softplus(x)) and with Softplus as Log(Exp(x) + 1); "
         "1x3x128x128", "onnx.helper", spelled_mish),
    Spec("pad_then_conv", "TF SAME padding: Pad (Constant pads) before strided and depthwise Convs without "
         "padding; 1x3x128x128", "onnx.helper", pad_then_conv),
    Spec("nhwc_transposes", "Keras through tf2onnx: NHWC input, Transposes around each conv block, NHWC "
         "elementwise; 1x128x128x3, N, H, W dynamic", "onnx.helper", nhwc_transposes),
    Spec("int32_ids", "text classifier on int32 token and position ids: Gather, LayerNormalization, MLP, mean; "
         "1x128, batch and sequence dynamic", "onnx.helper", int32_ids),
    Spec("if_on_scalar", "conv features, then an If on a bool scalar input choosing a Sigmoid or a ReLU head; "
         "1x3x96x96", "onnx.helper", if_on_scalar),
    Spec("paddle_dims", "paddle2onnx style: input float32[-1, 3, '?', '?'], weights as Constant nodes, opset 11, "
         "MatMul + Add head; 1x3x128x128", "onnx.helper", paddle_dims),
]
