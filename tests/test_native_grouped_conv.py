"""Grouped convolutions whose groups are whole channel blocks (RegNet's and ResNeXt's groups
of 8, 16 or more channels) run over the blocked layout, each group as a dense convolution
over its own input blocks, instead of im2col and a BLAS GEMM per group in NCHW; grouped 1x1
convolutions whose groups are not (ShuffleNet's 4 groups of 34 channels) as one step of
register tiles over NCHW; checked against onnxruntime, and for the path taken by the
generated code itself."""

from __future__ import annotations

import pytest

from nncc.backends.base import Partition
from nncc.frontend.onnx import parse_model
from nncc.native.codegen import generate
from nncc.native.toolchain import find_toolchain
from nncc.passes.pipeline import run_passes
from nncc.passes.shape_inference import infer_shapes
from tests.models import GraphBuilder, assert_one_native_partition_matches

# (input [N, C, H, W], group, output channels, kernel, strides, pads, dilations, epilogue)
CASES = {
    "regnet_strided": ([1, 48, 20, 20], 6, 48, 3, [2, 2], [1, 1, 1, 1], [1, 1], "Relu"),
    "regnet_same": ([1, 32, 10, 10], 4, 32, 3, [1, 1], [1, 1, 1, 1], [1, 1], "residual_relu"),
    "wide_groups_batch": ([2, 32, 9, 11], 2, 64, 3, [1, 2], [0, 1, 2, 1], [1, 1], "Silu"),
    "pointwise_grouped": ([1, 48, 7, 7], 3, 24, 1, [1, 1], [0, 0, 0, 0], [1, 1], None),  # one long row
    "dilated_5x5": ([1, 16, 12, 12], 2, 32, 5, [1, 1], [4, 4, 4, 4], [2, 2], "Sigmoid"),
}


def _model(x_shape, group, k, kernel, strides, pads, dilations, epilogue) -> GraphBuilder:
    m = GraphBuilder(17, 3, "grouped")
    x = m.input(x_shape)
    c = x_shape[1]
    y = m.node("Conv", [x, m.weight([k, c // group, kernel, kernel]), m.weight([k])], group=group,
               strides=strides, pads=pads, dilations=dilations, kernel_shape=[kernel, kernel])
    if epilogue == "Relu":
        y = m.node("Relu", [y])
    elif epilogue == "Sigmoid":
        y = m.node("Sigmoid", [y])
    elif epilogue == "Silu":
        y = m.node("Mul", [y, m.node("Sigmoid", [y])])
    elif epilogue == "residual_relu":
        y = m.node("Relu", [m.node("Add", [y, x])])
    m.output(y)
    return m


def _blas_steps(m: GraphBuilder, vl: int) -> bool:
    """Whether the generated code for vector width ``vl`` calls the runtime's BLAS-backed
    convolution (im2col per group) rather than a blocked kernel of its own."""
    graph = run_passes(parse_model(m.model().SerializeToString()), 2)
    part = Partition(0, "native", list(graph.nodes), list(graph.inputs), list(graph.outputs))
    return generate(part, graph, infer_shapes(graph), "entry", vl).blas


@pytest.mark.parametrize("case", sorted(CASES))
def test_whole_block_groups_are_written_blocked_at_either_width(case):
    """Groups of 16 channels are whole blocks at both widths; groups of 8 only with AVX2's 8,
    and narrow groups (as many channels in as out) with AVX-512's 16."""
    m = _model(*CASES[case])
    x, group, k = CASES[case][:3]
    per_group = min(x[1], k) // group
    assert not _blas_steps(m, 8)
    pointwise = CASES[case][3] == 1  # every such case is stride 1, unpadded
    # groups of 8 in and 8 out are narrow ones at 16 (nncc/native/narrow_group_conv.py)
    narrow = x[1] == k and per_group < 16
    assert _blas_steps(m, 16) == (per_group % 16 != 0 and not pointwise and not narrow)


# ShuffleNet's grouped 1x1 layers, groups not whole blocks at either width: (input, group,
# output channels, epilogue); pixels past the last whole vector, rows past the last whole tile
POINTWISE = {
    "shufflenet_stage2": ([1, 136, 9, 11], 4, 136, "Relu"),
    "expand_from_few": ([2, 24, 8, 7], 4, 112, None),
    "residual_sum": ([1, 102, 5, 5], 3, 102, "residual_relu"),
}


@pytest.mark.parametrize("case", sorted(POINTWISE))
def test_grouped_pointwise_layers_run_without_blas(case):
    x, group, k, epilogue = POINTWISE[case]
    m = _model(x, group, k, 1, [1, 1], [0, 0, 0, 0], [1, 1], epilogue)
    assert not _blas_steps(m, 8) and not _blas_steps(m, 16)


@pytest.mark.slow
@pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")
@pytest.mark.parametrize("case", sorted(POINTWISE))
def test_grouped_pointwise_layers_match_onnxruntime(tmp_path, case):
    x, group, k, epilogue = POINTWISE[case]
    assert_one_native_partition_matches(tmp_path, _model(x, group, k, 1, [1, 1], [0, 0, 0, 0], [1, 1], epilogue))


@pytest.mark.slow
@pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")
@pytest.mark.parametrize("case", sorted(CASES))
def test_grouped_convolutions_match_onnxruntime(tmp_path, case):
    assert_one_native_partition_matches(tmp_path, _model(*CASES[case]))
