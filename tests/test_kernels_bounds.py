"""nncc.kernels.bounds: Relu/Clip bounds applied row by row against a cached row must give
exactly what numpy's ufunc gives against the scalar, for every size and special value."""

import numpy as np
import pytest

from nncc.kernels.bounds import ROW, bound

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.0, -3.0, 6.0, 6.5]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1, 7, ROW - 1, ROW, ROW + 3, 3 * ROW + 5])
@pytest.mark.parametrize("ufunc, value", [(np.maximum, 0.0), (np.maximum, -1.5), (np.minimum, 6.0)])
def test_bound_is_bit_identical_to_the_ufunc(dtype, size, ufunc, value):
    rng = np.random.default_rng(size)
    y = (rng.standard_normal(size) * 4).astype(dtype)
    y[: min(size, len(SPECIAL))] = SPECIAL[: min(size, len(SPECIAL))]
    want = ufunc(y, dtype(value))
    got = y.copy().reshape(1, -1) if size % 2 else y.copy()
    bound(got, ufunc, value)
    assert got.reshape(-1).tobytes() == want.tobytes()  # NaN payloads and -0.0 included


def test_bound_keeps_the_shape_and_works_in_place():
    y = np.arange(-12, 12, dtype=np.float32).reshape(2, 3, 4)
    view = y
    bound(y, np.maximum, 0.0)
    assert y is view and y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y, np.maximum(np.arange(-12, 12, dtype=np.float32), 0).reshape(2, 3, 4))


def test_bound_into_another_array_leaves_the_source_alone():
    x = np.array([-1.0, np.nan, 2.0, -0.0] * 5000, np.float32)
    before = x.copy()
    out = np.empty_like(x)
    assert bound(x, np.maximum, 0.0, out) is out
    assert out.tobytes() == np.maximum(x, np.float32(0)).tobytes()
    assert x.tobytes() == before.tobytes()
