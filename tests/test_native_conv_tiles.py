"""Blocked convolutions over rows the register tile does not divide, and reorders of planes
larger than one run of pixels, against onnxruntime.

A row of 32, 16 or 8 output columns is cut into tiles of 5 pixels (two channel blocks with
AVX2) and a last, narrower one; TensorFlow's SAME padding (an explicit Pad [0, 0, 1, 1]
before a stride-2 3x3 Conv with no pads of its own, and [1, 1, 1, 1] before a depthwise one)
puts the padding on one side only. The blocked layout's reorders move a plane's pixels run
by run, so planes whose pixel count is not a whole number of runs (100 x 100) are here too.
The fuzzer (tests/native_fuzz_cases.py) covers small planes; these are the sizes of real
networks' layers."""

from __future__ import annotations

import pytest

from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder, assert_one_native_partition_matches

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


def _tf_same_chain(batch: int, size: int, widths) -> GraphBuilder:
    """Per stage: Pad, stride-2 Conv, Relu, Pad, depthwise Conv, Relu (tf2onnx's SAME)."""
    m = GraphBuilder(13, 5, "tf_same", weight_gain=2 ** 0.5)
    x, c = m.input([batch, 3, size, size]), 3
    for k in widths:
        x = m.node("Pad", [x, m.ints([0, 0, 0, 0, 0, 0, 1, 1])], mode="constant")
        x = m.node("Relu", [m.node("Conv", [x, m.weight([k, c, 3, 3]), m.weight([k])],
                                   kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0])])
        x = m.node("Pad", [x, m.ints([0, 0, 1, 1, 0, 0, 1, 1])], mode="constant")
        x = m.node("Relu", [m.node("Conv", [x, m.weight([k, 1, 3, 3]), m.weight([k])], kernel_shape=[3, 3],
                                   group=k, pads=[0, 0, 0, 0])])
        c = k
    m.output(x)
    return m


def _wide_rows(size: int) -> GraphBuilder:
    """3x3 and 1x1 convolutions over planes of ``size`` x ``size``, stride 1, a SiLU and a
    residual in the epilogue, 16 to 48 channels (two and three blocks a tile with AVX2)."""
    m = GraphBuilder(13, 6, "wide_rows", weight_gain=2 ** 0.5)
    x = m.input([1, 16, size, size])
    y = m.node("Conv", [x, m.weight([32, 16, 3, 3]), m.weight([32])], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = m.node("Mul", [y, m.node("Sigmoid", [y])])
    z = m.node("Conv", [y, m.weight([48, 32, 1, 1])], kernel_shape=[1, 1])
    z = m.node("Conv", [z, m.weight([32, 48, 3, 3]), m.weight([32])], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    m.output(m.node("Relu", [m.node("Add", [z, y])]))
    return m


def _swept_groups() -> GraphBuilder:
    """Convolutions whose input outweighs their weights, so each task sweeps every block of
    output channels over its rows (blocked_conv.sweeps_groups): a 1x1 over 512 channels (its
    input channels cut into two chunks whose partial sums wait in the output), a 3x3 and a
    stride-2 1x1, with bias, Relu and a residual in the epilogues."""
    m = GraphBuilder(13, 7, "swept_groups", weight_gain=2 ** 0.5)
    x = m.input([1, 512, 28, 28])
    y = m.node("Relu", [m.node("Conv", [x, m.weight([256, 512, 1, 1]), m.weight([256])], kernel_shape=[1, 1])])
    z = m.node("Conv", [y, m.weight([256, 256, 3, 3]), m.weight([256])], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    z = m.node("Relu", [m.node("Add", [z, y])])
    m.output(m.node("Conv", [z, m.weight([40, 256, 1, 1])], kernel_shape=[1, 1], strides=[2, 2]))
    return m


CASES = {
    "swept_groups": _swept_groups,
    "tf_same_128": lambda: _tf_same_chain(1, 128, (16, 32, 64, 128)),  # rows of 64, 32, 16, 8
    "tf_same_batch_odd": lambda: _tf_same_chain(2, 75, (16, 24, 40)),  # rows of 38, 19, 10
    "wide_rows_100": lambda: _wide_rows(100),  # planes of 10000 pixels: 156 runs of 64 and 16
    "wide_rows_33": lambda: _wide_rows(33),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_blocked_convolutions_match_onnxruntime(tmp_path, case):
    assert_one_native_partition_matches(tmp_path, CASES[case]())
