"""Gather by run-time indices in native code: token ids (int64 or int32, the model's input)
into an embedding table, negative ids counted from the end, other axes, a table computed at
run time; one native partition, exactly onnxruntime's rows. An id outside the table fails
the run with an error, as the portable plan does, and never reads outside it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import nncc
from nncc.errors import NnccError
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder, one_native_partition

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


def embedding(ids: np.ndarray, table_shape, axis: int = 0, computed_table: bool = False) -> GraphBuilder:
    m = GraphBuilder(18, 2, "embedding")
    kind = TensorProto.INT64 if ids.dtype == np.int64 else TensorProto.INT32
    m.inputs.append(helper.make_tensor_value_info("ids", kind, list(ids.shape)))
    m.feeds["ids"] = ids
    table = m.node("Tanh", [m.input(table_shape)]) if computed_table else m.weight(table_shape)
    rows = m.node("Gather", [table, "ids"], axis=axis)
    m.output(m.node("Mul", [rows, m.const(2.0)]))
    return m


def compile_and_compare(tmp_path, m: GraphBuilder, rtol: float = 0.0):
    """Rows copied exactly (``rtol``: a computed table's Tanh rounds as its own)."""
    compiled, got, want = one_native_partition(tmp_path, m)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    return compiled


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_token_ids_into_an_embedding_table(tmp_path, dtype):
    ids = np.array([[0, 7, 3, 3, 11], [1, 0, 11, 5, 2]], dtype)
    compile_and_compare(tmp_path, embedding(ids, [12, 16]))


def test_negative_ids_count_from_the_end(tmp_path):
    compile_and_compare(tmp_path, embedding(np.array([-1, -12, 4, -5], np.int64), [12, 8]))


@pytest.mark.parametrize("axis", [1, 2, -1])
def test_other_axes_of_a_computed_table(tmp_path, axis):
    ids = np.array([[2, 0], [1, 3], [3, 3]], np.int64)
    compile_and_compare(tmp_path, embedding(ids, [2, 4, 4, 3][:3] if axis != 2 else [2, 3, 4], axis,
                                            computed_table=True), rtol=1e-6)


def test_a_scalar_index(tmp_path):
    compile_and_compare(tmp_path, embedding(np.array(5, np.int64), [9, 6]))


def test_an_id_outside_the_table_fails_the_run(tmp_path):
    m = embedding(np.array([[0, 1, 2]], np.int64), [4, 8])
    compiled = compile_and_compare(tmp_path, m)
    portable = nncc.compile_model(tmp_path / "m.onnx", backends=("numpy",))
    for bad in (4, -5, 2**40):
        feeds = {"ids": np.array([[0, bad, 1]], np.int64)}
        with pytest.raises(NnccError, match="out of range"):
            compiled.run(feeds)
        with pytest.raises(NnccError):
            portable.run(feeds)
    # and the model keeps working after a refused run
    np.testing.assert_array_equal(compiled.run(m.feeds)[m.outputs[0].name],
                                  portable.run(m.feeds)[m.outputs[0].name])
