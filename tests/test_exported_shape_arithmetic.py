"""Shape arithmetic as PyTorch's TorchScript exporter writes it: Swin's window partition
and MobileViT's patch folding divide an input's own sizes (0-d int64 from Shape ->
Gather) by 0-d int64 constants, then Cast, Concat and Reshape by the result.

tests/data/window_partition.onnx was written by that exporter
(tests/data/make_window_partition.py); onnxruntime is the oracle.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from tests.one_node import run_nncc
from tests.oracle import ort_run

import onnx  # noqa: E402

MODEL = pathlib.Path(__file__).resolve().parent / "data" / "window_partition.onnx"


def _with_static_input(model, shape):
    """The same model with its input's sizes written down: shape inference then folds the
    Div of two 0-d int64 constants itself."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, shape):
        dim.ClearField("dim_param")
        dim.dim_value = size
    return model


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("shape", [(2, 8, 12, 3), (1, 4, 16, 3)])
def test_window_partition_matches_onnxruntime(static, shape):
    model = onnx.load(MODEL)
    div_inputs = [n.input for n in model.graph.node if n.op_type == "Div"]
    assert div_inputs, "the exported model divides sizes"
    if static:
        model = _with_static_input(model, shape)
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    expected = ort_run(model, feeds)
    for route, got in run_nncc(model, feeds).items():
        for name, g, e in zip(("windows", "patches"), got, expected):
            assert g.shape == e.shape, f"{name} via {route}"
            np.testing.assert_array_equal(g, e, err_msg=f"{name} via {route}")
