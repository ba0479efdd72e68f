"""Floor, Ceil, Round and Sign in native code, exactly onnxruntime's: halves round to even,
NaN, infinities and signed zeros go through; over plain data and over the blocked layout
after a convolution."""

from __future__ import annotations

import numpy as np
import pytest

from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder, one_native_partition

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

VALUES = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 2.4, -2.6, 0.0, -0.0, 1e30, -1e30,
                   8388609.0, np.inf, -np.inf, np.nan], np.float32)


def compare(tmp_path, m: GraphBuilder, exact: bool = True):
    compiled, got, want = one_native_partition(tmp_path, m)
    if exact:
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want)), "a signed zero differs"
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sign"])
def test_over_awkward_values(tmp_path, op):
    m = GraphBuilder(18, 0, "rounding")
    x = m.input([3, VALUES.size])
    m.feeds[x] = np.stack([VALUES, VALUES * 3, VALUES / 7]).astype(np.float32)
    m.output(m.node(op, [m.node("Mul", [x, m.const(1.0)])]))
    compare(tmp_path, m)


@pytest.mark.parametrize("op", ["Floor", "Round", "Sign"])
def test_after_a_convolution(tmp_path, op):
    """Over the blocked layout a convolution leaves, then another convolution."""
    m = GraphBuilder(18, 1, "rounding_conv")
    x = m.input([1, 8, 6, 6], scale=4.0)
    y = m.node(op, [m.node("Conv", [x, m.weight([16, 8, 3, 3])], pads=[1, 1, 1, 1])])
    m.output(m.node("Conv", [y, m.weight([8, 16, 1, 1])]))
    compare(tmp_path, m, exact=False)
