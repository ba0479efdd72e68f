"""A channel Concat whose inputs come in both layouts: a convolution's output (blocked) and
a value in NCHW (a graph input). It is joined in the layout that moves fewer elements:
blocked when a convolution reads the result, so only the plain inputs are reordered,
instead of the blocked ones to NCHW and the joined result back. A U-Net decoder's
ConvTranspose, read by the Concat, scatters straight into the blocked layout. Checked
against onnxruntime, and for the reorders the generated code itself holds."""

from __future__ import annotations

import pytest

from nncc.backends.base import Partition
from nncc.frontend.onnx import parse_model
from nncc.native.codegen import generate
from nncc.native.toolchain import find_toolchain
from nncc.passes.pipeline import run_passes
from nncc.passes.shape_inference import infer_shapes
from tests.models import GraphBuilder, assert_one_native_partition_matches

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


def _decoder(skip_channels: int, up_channels: int, then_conv: bool = True) -> GraphBuilder:
    """Conv (the skip, blocked), MaxPool, Conv, ConvTranspose up (NCHW), Concat [up, skip],
    then a Conv reading the joined channels (or the Concat as the output)."""
    m = GraphBuilder(18, 7, "decoder", weight_gain=2 ** 0.5)
    x = m.input([1, 4, 12, 10])
    skip = m.node("Relu", [m.node("Conv", [x, m.weight([skip_channels, 4, 3, 3]), m.weight([skip_channels])],
                                  pads=[1, 1, 1, 1])])
    down = m.node("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2])
    inner = m.node("Relu", [m.node("Conv", [down, m.weight([16, skip_channels, 3, 3])], pads=[1, 1, 1, 1])])
    up = m.node("ConvTranspose", [inner, m.weight([16, up_channels, 2, 2]), m.weight([up_channels])],
                strides=[2, 2])
    joined = m.node("Concat", [up, skip], axis=1)
    if then_conv:
        joined = m.node("Conv", [joined, m.weight([6, up_channels + skip_channels, 3, 3])], pads=[1, 1, 1, 1])
    m.output(joined)
    m.names = {"inner": inner}
    return m


def _labels(m: GraphBuilder, vl: int) -> list[str]:
    graph = run_passes(parse_model(m.model().SerializeToString()), 2)
    part = Partition(0, "native", list(graph.nodes), list(graph.inputs), list(graph.outputs))
    return generate(part, graph, infer_shapes(graph), "entry", vl).labels


@pytest.mark.parametrize("channels", [(8, 8), (16, 8), (5, 3), (8, 13)],
                         ids=["whole_blocks", "wider_skip", "partial_blocks", "partial_up"])
def test_a_decoder_concat_matches_onnxruntime(tmp_path, channels):
    """Whole blocks are copied at once; a part block, channel by channel."""
    assert_one_native_partition_matches(tmp_path, _decoder(*channels), rtol=1e-4)


def test_the_concat_output_as_the_graph_output_matches_onnxruntime(tmp_path):
    assert_one_native_partition_matches(tmp_path, _decoder(8, 8, then_conv=False), rtol=1e-4)


@pytest.mark.parametrize("vl", [8, 16])
def test_no_reorder_enters_the_layout(vl):
    """The skip stays blocked (no reorder of it to NCHW), the ConvTranspose scatters into
    the layout, and the joined value is not reordered back: the only reorders are the
    ConvTranspose's input out of the layout (its product reads NCHW) and the graph output."""
    m = _decoder(16, 16)
    labels = [label for label in _labels(m, vl) if label.startswith("reorder")]
    assert sorted(labels) == sorted([f"reorder {m.names['inner']} to NCHW", f"reorder {m.outputs[0].name} to NCHW"])


def test_a_plain_input_is_reordered_into_the_layout():
    """A graph input joined to a convolution's output: that input is the one reorder in."""
    m = GraphBuilder(18, 9, "join_input")
    x, side = m.input([1, 4, 9, 9]), m.input([1, 8, 9, 9])
    conv = m.node("Relu", [m.node("Conv", [x, m.weight([16, 4, 3, 3])], pads=[1, 1, 1, 1])])
    m.output(m.node("Conv", [m.node("Concat", [conv, side], axis=1), m.weight([4, 24, 1, 1])]))
    labels = [label for label in _labels(m, 8) if label.startswith("reorder")]
    assert sorted(labels) == sorted([f"reorder {side} to NCHW8c", f"reorder {m.outputs[0].name} to NCHW"])
