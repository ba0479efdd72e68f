"""Dynamic quantization as one step (-O2).

onnxruntime's ``quantize_dynamic`` writes every product by a weight matrix as

    DynamicQuantizeLinear(X) -> (Xq, x_scale, x_zero)
    MatMulInteger(Xq, Bq, x_zero, b_zero) -> Cast(to float) -> Mul(Mul(x_scale, b_scale))
    [-> Add(bias)]

with Bq a constant int8 or uint8 matrix. ``fuse_dynamic_quantization`` makes that one
``com.microsoft::DynamicQuantizeMatMul(X, Bq, b_scale, b_zero, bias)``, the op onnxruntime
defines for exactly this computation (nncc/kernels/qlinear_contrib.py), which the native
backend generates as one int8 GEMM (nncc/native/int8_gemm_gen.py). The arithmetic is the
chain's own: X quantized with one scale and zero point for the whole tensor, an exact
integer product, converted to float32, times float32(x_scale * b_scale), plus the bias.

Each intermediate must have exactly one consumer (the next op of the chain) and be no
graph output; the DynamicQuantizeLinear and the scale product may feed several chains,
and drop out with dead-code elimination once nothing else reads them.
"""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node
from nncc.passes.fusion import Rewriter

MICROSOFT = "com.microsoft"
_FLOAT = 1  # TensorProto.FLOAT


def _matches(rw: Rewriter, producers: dict[str, Node], mmi: Node):
    """(fused node, nodes it replaces after ``mmi``) for one chain, or None."""
    if len(mmi.inputs) < 3 or len(mmi.outputs) != 1 or not mmi.inputs[2]:
        return None
    quantize = producers.get(mmi.inputs[0])
    if quantize is None or quantize.op_type != "DynamicQuantizeLinear" or quantize.domain != "":
        return None
    if len(quantize.outputs) != 3 or quantize.outputs[0] != mmi.inputs[0] or quantize.outputs[2] != mmi.inputs[2]:
        return None
    b = rw.constant(mmi.inputs[1])
    if b is None or b.ndim != 2 or b.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        return None
    n = b.shape[1]
    b_zero_name = mmi.inputs[3] if len(mmi.inputs) > 3 else ""
    if b_zero_name:
        b_zero = rw.constant(b_zero_name)
        if b_zero is None or b_zero.dtype != b.dtype or b_zero.size not in (1, n) or b_zero.ndim > 1:
            return None
    cast = rw.sole_consumer(mmi.outputs[0])
    if cast is None or cast.op_type != "Cast" or cast.domain != "" or int(cast.attrs.get("to", 0)) != _FLOAT:
        return None
    mul = rw.sole_consumer(cast.outputs[0])
    if mul is None or mul.op_type != "Mul" or mul.domain != "" or len(mul.inputs) != 2:
        return None
    scales = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
    product = producers.get(scales)
    if product is None or product.op_type != "Mul" or product.domain != "" or len(product.inputs) != 2:
        return None
    if quantize.outputs[1] not in product.inputs:
        return None
    b_scale_name = product.inputs[1] if product.inputs[0] == quantize.outputs[1] else product.inputs[0]
    b_scale = rw.constant(b_scale_name)
    if b_scale is None or b_scale.dtype != np.float32 or b_scale.size not in (1, n) or b_scale.ndim > 1:
        return None
    if b_scale_name == quantize.outputs[1]:
        return None
    out, gone, bias_name = mul.outputs[0], [cast, mul], ""
    add = rw.sole_consumer(out)
    if add is not None and add.op_type == "Add" and add.domain == "" and len(add.inputs) == 2:
        other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
        bias = rw.constant(other)
        if bias is not None and bias.dtype == np.float32 and bias.shape == (n,):
            out, bias_name = add.outputs[0], other
            gone.append(add)
    fused = Node("DynamicQuantizeMatMul", [quantize.inputs[0], mmi.inputs[1], b_scale_name, b_zero_name, bias_name],
                 [out], {}, MICROSOFT, mmi.name)
    while fused.inputs and not fused.inputs[-1]:
        fused.inputs.pop()
    return fused, gone


def fuse_dynamic_quantization(graph: Graph) -> Graph:
    rw = Rewriter(graph)
    producers = graph.producers()
    fused_any = False
    for mmi in graph.nodes:
        if mmi.op_type != "MatMulInteger" or mmi.domain != "" or id(mmi) in rw.drop:
            continue
        found = _matches(rw, producers, mmi)
        if found is None:
            continue
        fused, gone = found
        rw.replace[id(mmi)] = fused
        rw.drop.update(id(node) for node in gone)
        fused_any = True
    result = rw.result()
    if fused_any:
        result.opsets.setdefault(MICROSOFT, 1)
    return result
