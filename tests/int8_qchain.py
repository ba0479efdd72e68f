"""A builder of small quantized (QOperator) graphs for the native int8 tests: 1x1
QLinearConvs and QLinearAdds whose every value quantizes with the scale and zero point its
readers recover with, so a native plan can keep the values as bytes end to end."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


class QChain:
    """Nodes and initializers of a chain; a value's scalars are named after it ("<value>s",
    "<value>z"). ``act``: the activations' type (int8 zero points near 0, uint8 near 128);
    ``weights``: int8 with zero points 0, or uint8 with zero points around 128."""

    def __init__(self, rng, act, weights=np.int8):
        self.rng, self.weights = rng, weights
        self.inits, self.nodes, self.scales = [], [], {}
        self.zero = (lambda: np.array(int(rng.integers(-20, 21)), act)) if act == np.int8 else \
            (lambda: np.array(int(rng.integers(100, 156)), act))

    def scalars(self, tag, scale):
        self.inits.extend([const(f"{tag}s", np.float32(scale)), const(f"{tag}z", self.zero())])
        return f"{tag}s", f"{tag}z"

    def quantize(self, src, out, scale):
        self.nodes.append(helper.make_node("QuantizeLinear", [src, *self.scalars(out, scale)], [out]))
        self.scales[out] = scale

    def conv(self, src, out, cin, cout):
        rng = self.rng
        if self.weights == np.int8:
            w, wz = rng.integers(-127, 128, (cout, cin, 1, 1)).astype(np.int8), np.zeros(cout, np.int8)
        else:
            w, wz = rng.integers(0, 256, (cout, cin, 1, 1)).astype(np.uint8), rng.integers(120, 137, cout).astype(np.uint8)
        ws = rng.uniform(0.002, 0.02, cout).astype(np.float32)
        scale = self.scales[src] * float(np.mean(ws)) * math.sqrt(cin) * 30
        self.inits.extend([const(f"{out}w", w), const(f"{out}ws", ws), const(f"{out}wz", wz),
                           const(f"{out}b", rng.integers(-3000, 3000, cout).astype(np.int32))])
        self.nodes.append(helper.make_node(
            "QLinearConv", [src, f"{src}s", f"{src}z", f"{out}w", f"{out}ws", f"{out}wz", *self.scalars(out, scale),
                            f"{out}b"], [out], kernel_shape=[1, 1]))
        self.scales[out] = scale

    def add(self, a, b, out, scale=None):
        scale = 1.3 * max(self.scales[a], self.scales[b]) if scale is None else scale
        self.nodes.append(helper.make_node("QLinearAdd", [a, f"{a}s", f"{a}z", b, f"{b}s", f"{b}z",
                                                          *self.scalars(out, scale)], [out], domain=MS))
        self.scales[out] = scale

    def model(self, name, shape):
        """The model of input "x" (float32 ``shape``) and output "y" (float32)."""
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
