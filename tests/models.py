"""Model builders the tests share (one-node models: tests/one_node_graphs.py).

``GraphBuilder``: a float32 model under construction, node by node, with seeded random
inputs and weights.

Small fixed models: ``relu_model`` (one Relu), ``matmul_model`` (x @ w + b, its weights
inline or external), ``mlp`` (two products with a Relu between, maybe a Softmax),
``layernorm_mlp`` (Gemm, LayerNormalization, LogSoftmax), and two convnets to quantize:
``convnet`` (Conv, MaxPool, Gemm) and ``gated_convnet`` (LeakyRelu, a Sigmoid gate,
Concat, AveragePool); ``dynamic_quantize_matmul`` (one com.microsoft DynamicQuantizeMatMul).

``benchmark_model``: a model benchmarks/real_models.py builds, made as the benchmarks make
it, in a process of its own with benchmarks/ on its path (the benchmarks are scripts, not
a package the tests import)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ROOT


class GraphBuilder:
    """A model under construction: float32 inputs fed seeded normal values (times
    ``scale``), constants, weights scaled by their fan-in, nodes (one output each unless
    made by ``node_outputs``), and ``case``: one node on a new input, its outputs the
    model's, so one compile checks many independent cases."""

    def __init__(self, opset: int = 18, seed: int = 0, name: str = "model", weight_gain: float = 1.0):
        self.opset, self.name, self.weight_gain = opset, name, weight_gain
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inputs, self.outputs, self.inits, self.feeds = [], [], [], [], {}

    def input(self, shape, scale: float = 1.0) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.feeds[name] = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    def const(self, value, dtype=np.float32) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def ints(self, value) -> str:
        """An int64 constant: shapes, axes, pads, sizes, indices."""
        return self.const(value, np.int64)

    def weight(self, shape) -> str:
        """Normal values times ``weight_gain`` / sqrt(fan-in) (a gain of sqrt(2) keeps the
        values' scale through layers that end in a Relu)."""
        return self.const(self.rng.standard_normal(shape) * self.weight_gain / np.sqrt(np.prod(shape[1:])))

    def node(self, op, inputs, domain: str = "", **attrs) -> str:
        out = f"y{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], domain=domain, **attrs))
        return out

    def node_outputs(self, op, inputs, count: int, domain: str = "", **attrs) -> list[str]:
        """A node with ``count`` outputs, their names."""
        outs = [f"y{len(self.nodes)}_{i}" for i in range(count)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, domain=domain, **attrs))
        return outs

    def output(self, name: str) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))

    def case(self, op, shape, *extra, n_out: int = 1, scale: float = 1.0, **attrs) -> None:
        """One node of ``op`` reading a new input of ``shape`` (then ``extra`` inputs), all
        its outputs the model's: many independent cases side by side, checked by one compile."""
        for out in self.node_outputs(op, [self.input(shape, scale), *extra], n_out, **attrs):
            self.output(out)

    def model(self, opset: int | None = None, domains=()) -> onnx.ModelProto:
        """The model at opset ``opset`` (the builder's unless given), plus version 1 of each
        of ``domains``."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset or self.opset)]
                                  + [helper.make_opsetid(d, 1) for d in domains])
        model.ir_version = 8
        return model

    def save(self, path, domains=()) -> onnx.ModelProto:
        """Write the model (opset ``opset``, plus version 1 of each of ``domains``)."""
        model = self.model(domains=domains)
        onnx.save(model, path)
        return model


def benchmark_model(call: str, folder: pathlib.Path) -> onnx.ModelProto:
    """The model ``call`` returns, a Python expression over benchmarks/real_models.py's
    names (e.g. ``"lstm(seq=9, inp=6, hidden=21, layers=3)"``)."""
    path = folder / "benchmark-model.onnx"
    code = f"import onnx\nfrom real_models import *\nfrom real_models import _transformer\nonnx.save({call}, {str(path)!r})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return onnx.load(path)


def _normal(rng, name: str, shape, scale: float = 1.0) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _float(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def relu_model(path: pathlib.Path, shape=(2, 3), output: str = "y", opset: int = 14) -> pathlib.Path:
    """x -> Relu -> ``output``, both of ``shape`` (names or sizes), written to ``path``."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], [output])], "relu", [_float("x", shape)],
                              [_float(output, shape)])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString())
    return path


def matmul_model(folder: pathlib.Path, rows: int, cols: int, seed: int = 0, external: bool = False,
                 name: str = "m.onnx") -> pathlib.Path:
    """x[2, rows] @ w[rows, cols] + b with real random weights (rows*cols*4 bytes of data),
    in ``folder``/``name``; with ``external``, the weights in weights.bin beside it."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])], "mm",
        [_float("x", [2, rows])], [_float("y", [2, cols])], [_normal(rng, "w", (rows, cols)), _normal(rng, "b", cols)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path


def mlp(x_shape, hidden: int, outputs: int, *, seed: int, scale: float = 1.0, bias_scale: float | None = None,
        second_bias: bool = False, softmax: bool = False, opset: int = 17) -> onnx.ModelProto:
    """x[``x_shape``] @ w1 + b1, Relu, @ w2 (+ b2 with ``second_bias``), then a Softmax over
    the last axis named ``probs`` (with ``softmax``) or not (the output is ``y``). Normal
    weights times ``scale`` (biases times ``bias_scale``, by default ``scale``), drawn from
    ``seed`` in the order w1, b1, w2, b2."""
    rng = np.random.default_rng(seed)
    bias_scale = scale if bias_scale is None else bias_scale
    k = x_shape[-1]
    inits = [_normal(rng, "w1", (k, hidden), scale), _normal(rng, "b1", (hidden,), bias_scale),
             _normal(rng, "w2", (hidden, outputs), scale)]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["l"])]
    if second_bias:
        inits.append(_normal(rng, "b2", (outputs,), bias_scale))
        nodes.append(helper.make_node("Add", ["l", "b2"], ["lb"]))
    out = "probs" if softmax else "y"
    if softmax:
        nodes.append(helper.make_node("Softmax", [nodes[-1].output[0]], [out], axis=-1))
    else:
        nodes[-1].output[0] = out
    graph = helper.make_graph(nodes, "mlp", [_float("x", x_shape)], [_float(out, [*x_shape[:-1], outputs])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def layernorm_mlp(path: pathlib.Path, batch) -> pathlib.Path:
    """MatMul + bias + Relu (fused by the passes), a Gemm with transB, alpha and beta,
    LayerNormalization, a MatMul and a LogSoftmax: x[``batch``, 16] -> y[``batch``, 5]."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["g"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("LayerNormalization", ["g", "scale", "shift"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w3"], ["m"]),
             helper.make_node("LogSoftmax", ["m"], ["y"], axis=-1)]
    weights = [_normal(rng, name, shape, 0.1) for name, shape in (
        ("w1", (16, 24)), ("b1", (24,)), ("w2", (8, 24)), ("b2", (1, 8)), ("scale", (8,)), ("shift", (8,)),
        ("w3", (8, 5)))]
    graph = helper.make_graph(nodes, "mlp", [_float("x", [batch, 16])], [_float("y", [batch, 5])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def convnet(seed: int, opset: int = 17) -> onnx.ModelProto:
    """x[n, 3, 16, 16] -> Conv, Relu, Conv (stride 2), Relu, MaxPool, Flatten, Gemm -> y[n, 10]."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    weights = [_normal(rng, "w1", (8, 3, 3, 3), 0.3), _normal(rng, "b1", (8,), 0.1),
               _normal(rng, "w2", (16, 8, 3, 3), 0.2), _normal(rng, "b2", (16,), 0.1),
               _normal(rng, "w3", (10, 16 * 4 * 4), 0.1), _normal(rng, "b3", (10,), 0.1)]
    graph = helper.make_graph(nodes, "convnet", [_float("x", ["n", 3, 16, 16])], [_float("y", ["n", 10])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def gated_convnet(shape=(2, 3, 12, 12), seed: int = 5) -> onnx.ModelProto:
    """x[``shape``] -> Conv, LeakyRelu, Conv, Sigmoid gate (Mul), Concat with the gated
    input, AveragePool (stride 2, padded), GlobalAveragePool, Flatten, Gemm -> y[n, 5]."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c1"], ["l1"], alpha=0.1),
        helper.make_node("Conv", ["l1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["l1", "s2"], ["m"]),
        helper.make_node("Concat", ["m", "l1"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    weights = [_normal(rng, "w1", (8, shape[1], 3, 3), 0.3), _normal(rng, "b1", (8,), 0.1),
               _normal(rng, "w2", (8, 8, 3, 3), 0.2), _normal(rng, "b2", (8,), 0.1),
               _normal(rng, "w3", (5, 16), 0.3), _normal(rng, "b3", (5,), 0.1)]
    graph = helper.make_graph(nodes, "convnet", [_float("x", shape)], [_float("y", (shape[0], 5))], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def one_native_partition(tmp_path, builder: GraphBuilder):
    """``builder``'s model saved under ``tmp_path`` and compiled, checked to be one native
    partition with no fallback; ``(compiled, nncc's first output, onnxruntime's)`` on the
    builder's feeds."""
    import nncc  # lazy: the builders serve tests that never compile
    from tests.oracle import ort_run  # lazy: as above

    path = tmp_path / "m.onnx"
    builder.save(path)
    compiled = nncc.compile_model(path)
    assert compiled.native_partitions == 1 and len(compiled.plan.partitions) == 1, compiled.plan.fallbacks
    assert compiled.plan.fallbacks == []
    name = builder.outputs[0].name
    (want,) = ort_run(path, builder.feeds, [name])
    return compiled, compiled.run(builder.feeds)[name], want


def assert_one_native_partition_matches(tmp_path, builder: GraphBuilder, rtol: float = 1e-5) -> None:
    """``builder``'s model compiles to one native partition with no fallback, and every
    output agrees with onnxruntime's within ``rtol``, the absolute tolerance scaled by the
    output's largest magnitude (a deep chain's sums grow with it)."""
    from tests.oracle import ort_run  # lazy: the builders serve tests that never compile

    compiled, _, _ = one_native_partition(tmp_path, builder)
    names = [o.name for o in builder.outputs]
    got = compiled.run(builder.feeds)
    for name, want in zip(names, ort_run(tmp_path / "m.onnx", builder.feeds, names)):
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=rtol * scale, err_msg=name)


def dynamic_quantize_matmul(rng, shape, n, b_zero, bias, per_column) -> onnx.ModelProto:
    """One com.microsoft DynamicQuantizeMatMul of a float32 input ``shape`` by a constant int8
    (K, n) matrix: scale per column or one, with a zero point and a bias or not."""
    k = shape[-1]
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (k, n)).astype(np.int8), "b"),
             numpy_helper.from_array((rng.uniform(0.01, 0.03, n) if per_column else np.array(0.02)).astype(np.float32),
                                     "bs")]
    names = ["a", "b", "bs", "", ""]
    if b_zero:
        zero = rng.integers(-9, 10, n) if per_column else np.array(4)
        inits.append(numpy_helper.from_array(zero.astype(np.int8), "bz"))
        names[3] = "bz"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        names[4] = "bias"
    while not names[-1]:
        names.pop()
    node = helper.make_node("DynamicQuantizeMatMul", names, ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])
