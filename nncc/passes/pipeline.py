"""Optimization levels: which passes run, in which order.

-O0 runs nothing; -O1 removes no-ops, folds constants (including static shape arithmetic)
and removes dead code; -O2 adds the algebraic fusions, then removes dead code again (and,
before folding, carries quantized tensors as float images).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from nncc.ir.graph import Graph
from nncc.passes.attention import fuse_attention
from nncc.passes.cleanup import remove_noops
from nncc.passes.conv1d import conv1d_as_2d
from nncc.passes.dce import eliminate_dead_code
from nncc.passes.fold import fold_constants
from nncc.passes.gemm_batchnorm import fold_batchnorm_into_gemm
from nncc.passes.qlinear_float import carry_quantized_as_float
from nncc.passes.quant_fusion import fuse_dynamic_quantization
from nncc.passes.transposes import sink_transposes
from nncc.passes.fusion import (
    batchnorm_to_scale_shift,
    fold_batchnorm_into_conv,
    fold_pad_into_conv,
    fold_scale_shift_into_conv,
    fuse_activation,
    fuse_spelled_activations,
    fuse_spelled_gelu,
    matmul_add_to_gemm,
)

MAX_LEVEL = 2


class PassInfo(NamedTuple):
    name: str
    level: int  # the lowest optimization level that runs it
    description: str


PASSES: list[PassInfo] = [
    PassInfo("remove_noops", 1, "remove Identity, inference-mode Dropout and Casts to the type their input has"),
    PassInfo("carry_quantized_as_float", 2,
             "quantized tensors as their exact float images: QuantizeLinear -> nncc "
             "QuantizeDequantize, QLinearConv/QLinearAdd/QGemm... and QDQ-wrapped Conv/Add/Gemm "
             "-> nncc QConv/QAdd/QGemm...; runs before folding, which would dequantize the weights"),
    PassInfo("fold_constants", 1,
             "evaluate constant subgraphs and static Shape/Size once; ConstantOfShape "
             "becomes a zero-copy splat"),
    PassInfo("eliminate_dead_code", 1, "drop nodes and initializers that reach no output"),
    PassInfo("sink_transposes", 2,
             "a Transpose moves down past the elementwise ops, Concats and Softmaxes that alone "
             "read it (their constants permuted, their axis renumbered) until it cancels or composes with another Transpose or turns "
             "into a Reduce's axes; runs before the fusions, which then see a plain chain"),
    PassInfo("fold_batchnorm_into_conv", 2,
             "fold inference BatchNormalization into the preceding Conv's weights and bias"),
    PassInfo("fold_batchnorm_into_gemm", 2,
             "fold inference BatchNormalization into the preceding Gemm's B columns and bias"),
    PassInfo("fold_scale_shift_into_conv", 2,
             "fold a per-channel constant Mul or Add after a Conv into its weights and bias"),
    PassInfo("fold_pad_into_conv", 2,
             "a Pad of zeros on the spatial axes before a Conv -> the Conv's own pads"),
    PassInfo("batchnorm_to_scale_shift", 2,
             "inference BatchNormalization not after a Conv, with any per-channel constant "
             "Mul/Add/Sub after it -> one nncc ScaleShift"),
    PassInfo("matmul_add_to_gemm", 2,
             "MatMul by a constant 2-D matrix + constant bias -> nncc FusedMatMul"),
    PassInfo("fuse_dynamic_quantization", 2,
             "DynamicQuantizeLinear -> MatMulInteger by a constant matrix -> Cast -> Mul(scales) "
             "[-> Add(bias)] -> one com.microsoft DynamicQuantizeMatMul"),
    PassInfo("fuse_spelled_activations", 2,
             "HardSwish, SiLU and Mish spelled out in elementwise ops -> one HardSwish, Mish or "
             "Swish node (nncc's before the opset that has it)"),
    PassInfo("fuse_activation", 2,
             "Conv/Gemm/MatMul/ScaleShift followed by Relu, LeakyRelu, Clip, Sigmoid, Tanh, "
             "HardSigmoid, HardSwish, SiLU or Mish -> one nncc fused node"),
    PassInfo("conv1d_as_2d", 2,
             "Conv/FusedConv over [N, C, L] with constant weights -> Unsqueeze, the 2-D convolution "
             "over [N, C, 1, L], Squeeze"),
    PassInfo("fuse_gelu", 2,
             "GELU spelled out in elementwise ops after a value no product absorbed -> one "
             "nncc Gelu"),
    PassInfo("fuse_attention", 2,
             "MatMul(Q, Kᵀ) -> scale -> [Add bias] -> Softmax -> MatMul(., V), with the head "
             "Transposes around it and K/V heads repeated per query head, and the ONNX and "
             "com.microsoft Attention ops -> one nncc FusedAttention"),
    PassInfo("eliminate_dead_code", 2, "drop what the fusions left unused"),
]

_FUNCTIONS: dict[str, Callable[[Graph], Graph]] = {
    "remove_noops": remove_noops,
    "fold_constants": fold_constants,
    "eliminate_dead_code": eliminate_dead_code,
    "sink_transposes": sink_transposes,
    "fold_batchnorm_into_conv": fold_batchnorm_into_conv,
    "fold_pad_into_conv": fold_pad_into_conv,
    "fold_batchnorm_into_gemm": fold_batchnorm_into_gemm,
    "fold_scale_shift_into_conv": fold_scale_shift_into_conv,
    "batchnorm_to_scale_shift": batchnorm_to_scale_shift,
    "matmul_add_to_gemm": matmul_add_to_gemm,
    "fuse_activation": fuse_activation,
    "fuse_spelled_activations": fuse_spelled_activations,
    "conv1d_as_2d": conv1d_as_2d,
    "fuse_attention": fuse_attention,
    "fuse_gelu": fuse_spelled_gelu,
    "fuse_dynamic_quantization": fuse_dynamic_quantization,
    "carry_quantized_as_float": carry_quantized_as_float,
}


def pass_function(name: str) -> Callable[[Graph], Graph]:
    return _FUNCTIONS[name]


def passes_for(level: int) -> list[PassInfo]:
    """The passes -O``level`` runs, in order (levels above the highest act as the highest)."""
    if level < 0:
        raise ValueError(f"optimization level must be 0 or more, got {level}")
    return [p for p in PASSES if p.level <= level]


def run_passes(graph: Graph, level: int) -> Graph:
    """Optimize ``graph`` at -O``level``; the input graph is left untouched."""
    for info in passes_for(level):
        graph = _FUNCTIONS[info.name](graph)
    return graph
