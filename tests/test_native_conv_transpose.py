"""ConvTranspose in native code (1-D and 2-D, strides, pads, output_padding, dilations,
groups, bias, an output_shape), one native partition each, against onnxruntime; the
decoder shapes of U-Nets and text detectors (stride 2, kernel 2 or 4) among them, and
NaN and infinities propagated where onnxruntime's are."""

from __future__ import annotations

import numpy as np
import pytest

from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder, one_native_partition

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

CASES = {  # name: (input shape, weight shape, attributes)
    "unet_k2_s2": ([1, 16, 8, 8], [16, 8, 2, 2], dict(strides=[2, 2])),
    "detector_k4_s2_p1": ([2, 8, 7, 9], [8, 4, 4, 4], dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "grouped_dilated_output_padding": ([1, 6, 5, 7], [6, 2, 3, 3],
                                       dict(strides=[2, 3], pads=[1, 0, 2, 1], group=3, dilations=[2, 1],
                                            output_padding=[1, 2])),
    "depthwise": ([1, 4, 6, 6], [4, 1, 3, 3], dict(group=4, strides=[2, 2], pads=[1, 1, 1, 1])),
    "stride_1_same_as_conv": ([1, 3, 6, 5], [3, 5, 3, 3], dict(pads=[1, 1, 1, 1])),
    "output_shape": ([1, 2, 4, 4], [2, 3, 3, 3], dict(strides=[2, 2], output_shape=[9, 10])),
    "auto_pad_same_upper": ([1, 2, 5, 4], [2, 2, 3, 3], dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    "one_d": ([2, 3, 9], [3, 5, 3], dict(strides=[3], pads=[1, 2])),
}


def model(shape, wshape, attrs, bias: bool, seed: int = 0, then_conv: bool = False) -> GraphBuilder:
    """The ConvTranspose alone, or read by a 1x1 Conv (``then_conv``): a 2-D ungrouped one
    then scatters straight into the channel-blocked layout the Conv reads."""
    m = GraphBuilder(18, seed, "conv_transpose")
    x = m.input(shape)
    ins = [x, m.weight(wshape)]
    channels = wshape[1] * attrs.get("group", 1)
    if bias:
        ins.append(m.const(m.rng.standard_normal(channels)))
    y = m.node("ConvTranspose", ins, **attrs)
    if then_conv:
        y = m.node("Conv", [y, m.weight([3, channels, *[1] * (len(shape) - 2)])])
    m.output(y)
    return m


def compile_and_compare(tmp_path, m: GraphBuilder):
    compiled, got, want = one_native_partition(tmp_path, m)
    assert got.shape == want.shape
    scale = max(1.0, float(np.nanmax(np.abs(want[np.isfinite(want)]), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)  # NaN where onnxruntime has NaN
    return got


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_conv_transpose_is_native_and_matches(tmp_path, case, bias):
    compile_and_compare(tmp_path, model(*CASES[case], bias=bias))


@pytest.mark.parametrize("case", list(CASES))
def test_conv_transpose_read_by_a_conv_matches(tmp_path, case):
    compile_and_compare(tmp_path, model(*CASES[case], bias=True, then_conv=True))


@pytest.mark.parametrize("then_conv", [False, True], ids=["alone", "read_by_a_conv"])
def test_nan_and_infinities_propagate(tmp_path, then_conv):
    m = model(*CASES["detector_k4_s2_p1"], bias=True, seed=3, then_conv=then_conv)
    x = m.feeds[m.inputs[0].name]
    x[0, 1, 2, 3], x[1, 0, 0, 0], x[1, 5, 6, 8] = np.nan, np.inf, -np.inf
    got = compile_and_compare(tmp_path, m)
    assert np.isnan(got).any() and np.isinf(got).any()


@pytest.mark.slow
def test_a_unet_decoder_step_stays_one_partition(tmp_path):
    """Conv, ConvTranspose up, Concat with the skip, Conv: one native partition."""
    m = GraphBuilder(18, 5, "unet")
    x = m.input([1, 8, 12, 12])
    skip = m.node("Relu", [m.node("Conv", [x, m.weight([8, 8, 3, 3])], pads=[1, 1, 1, 1])])
    down = m.node("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2])
    inner = m.node("Relu", [m.node("Conv", [down, m.weight([16, 8, 3, 3])], pads=[1, 1, 1, 1])])
    up = m.node("ConvTranspose", [inner, m.weight([16, 8, 2, 2]), m.const(np.zeros(8))], strides=[2, 2])
    m.output(m.node("Conv", [m.node("Concat", [up, skip], axis=1), m.weight([4, 16, 3, 3])], pads=[1, 1, 1, 1]))
    compile_and_compare(tmp_path, m)
