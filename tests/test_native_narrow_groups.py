"""Grouped convolutions whose groups (as many channels in as out) are narrower than a vector
block, RegNet's groups of 8 and ResNeXt's of 4, run over the blocked layout with lane
permutes (nncc/native/narrow_group_conv.py): which layers take that kernel at each width,
and a RegNet-like chain at two input sizes checked against onnxruntime, a NaN and an
infinity in one group's input included (they must not reach any other group's outputs)."""

from __future__ import annotations

import numpy as np
import pytest

from nncc.backends.base import Partition
from nncc.frontend.onnx import parse_model
from nncc.native.codegen import generate
from nncc.native.toolchain import find_toolchain
from nncc.passes.pipeline import run_passes
from nncc.passes.shape_inference import infer_shapes
from tests.models import GraphBuilder, one_native_partition


def _chain(x_shape) -> GraphBuilder:
    """1x1 to 104 channels, 13 groups of 8 at stride 2 (the last block half empty), 26
    groups of 4 at stride 1 with a residual Add, then 52 groups of 2 with a 5x3 kernel."""
    m = GraphBuilder(17, 5, "narrow", weight_gain=np.sqrt(2))
    x = m.input(x_shape)
    y = m.node("Relu", [m.node("Conv", [x, m.weight([104, x_shape[1], 1, 1]), m.weight([104])])])
    y = m.node("Relu", [m.node("Conv", [y, m.weight([104, 8, 3, 3]), m.weight([104])], group=13,
                               kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])])
    z = m.node("Conv", [y, m.weight([104, 4, 3, 3])], group=26, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = m.node("Relu", [m.node("Add", [z, y])])
    y = m.node("Conv", [y, m.weight([104, 2, 5, 3]), m.weight([104])], group=52, kernel_shape=[5, 3],
               pads=[2, 0, 2, 1], dilations=[1, 2])
    m.output(y)
    return m


def _narrow_steps(m: GraphBuilder, vl: int) -> tuple[int, bool]:
    """(steps calling the narrow-group kernel, whether some step calls BLAS) of the code
    generated for vector width ``vl``."""
    graph = run_passes(parse_model(m.model().SerializeToString()), 2)
    part = Partition(0, "native", list(graph.nodes), list(graph.inputs), list(graph.outputs))
    unit = generate(part, graph, infer_shapes(graph), "entry", vl)
    return sum("narrow_task" in k.support for k in unit.kernels), unit.blas


def test_narrow_groups_take_the_permute_kernel_where_they_divide_a_block():
    m = _chain([1, 24, 12, 12])
    # 16: groups of 8, 4 and 2; 8 (AVX2): groups of 8 are whole blocks (the dense kernel)
    assert _narrow_steps(m, 16) == (3, False)
    assert _narrow_steps(m, 8) == (2, False)


def test_a_grouped_pointwise_layer_over_nchw_keeps_the_nchw_tiles():
    """A grouped 1x1 stride-1 convolution reading a model input (NCHW): the reorders the
    blocked kernel would need cost more than it saves, the tiles over NCHW stay."""
    m = GraphBuilder(17, 1, "pointwise")
    x = m.input([1, 32, 6, 6])
    m.output(m.node("Conv", [x, m.weight([32, 8, 1, 1])], group=4, kernel_shape=[1, 1]))
    assert _narrow_steps(m, 16) == (0, False)


def _assert_matches(got: np.ndarray, want: np.ndarray) -> None:
    """NaN where onnxruntime's is, the same infinities, the finite values within float32
    rounding of the longest sum (scaled by the output's largest finite magnitude)."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    scale = max(1.0, float(np.abs(want[finite]).max()))
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.slow
@pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")
@pytest.mark.parametrize("x_shape", [[1, 24, 20, 20], [2, 24, 33, 17]])
def test_a_narrow_group_chain_matches_onnxruntime(tmp_path, x_shape):
    _, got, want = one_native_partition(tmp_path, _chain(x_shape))
    _assert_matches(got, want)


@pytest.mark.slow
@pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")
def test_a_nan_and_an_infinity_stay_in_their_groups(tmp_path):
    """Groups of 8, then of 4 (each reading one group of the first layer): a NaN in group 1's
    input and an infinity in group 2's reach channels 8..23 only, as onnxruntime gives them."""
    m = GraphBuilder(17, 7, "narrow_nan")
    x = m.input([1, 32, 9, 21])
    y = m.node("Conv", [x, m.weight([32, 8, 3, 3]), m.weight([32])], group=4, kernel_shape=[3, 3],
               pads=[1, 1, 1, 1])
    m.output(m.node("Conv", [y, m.weight([32, 4, 3, 3])], group=8, kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    m.feeds["x0"][0, 9, 4, 10] = np.nan
    m.feeds["x0"][0, 17, 2, 3] = np.inf
    _, got, want = one_native_partition(tmp_path, m)
    _assert_matches(got, want)
    reached = ~np.isfinite(got[0]).all(axis=(1, 2))
    assert reached[8:24].all() and not reached[:8].any() and not reached[24:].any()
