"""ONNX's own backend node test cases, run through nncc.backend (an onnx Backend).

Cases come from onnx.backend.test.case.node in memory (the wheel ships no node data
files); expected outputs are the ones ONNX computed for each case.
"""

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the node suite needs the onnx test extra")

from onnx import numpy_helper  # noqa: E402

import nncc.backend  # noqa: E402
from tests.onnx_node_exclusions import EXCLUDED  # noqa: E402

# The ops the issue requires, plus those added since; a case is run when its graph is
# one node of one of these types.
OPS = {
    "Conv", "ConvTranspose", "BatchNormalization", "Relu", "LeakyRelu", "Sigmoid", "Tanh",
    "Clip", "Erf", "Gelu", "HardSigmoid", "HardSwish", "Softmax", "LogSoftmax", "LRN",
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Gemm", "MatMul", "Add",
    "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Sum",
    "Mean", "Max", "Min", "Equal", "Less", "Greater", "Not", "And", "Or", "Where",
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "Concat",
    "Split", "Slice", "Gather", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze",
    "Expand", "Tile", "Pad", "Shape", "Size", "Cast", "ConstantOfShape", "Constant",
    "Identity", "Dropout", "LayerNormalization", "InstanceNormalization", "Resize", "Range",
    "ArgMax", "TopK", "CumSum", "Einsum", "GRU", "LSTM", "RNN",
}


def _collect():
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases(None)
    selected = []
    for case in cases:
        nodes = case.model.graph.node
        if len(nodes) == 1 and nodes[0].op_type in OPS and "_expanded" not in case.name:
            selected.append(case)
    return sorted(selected, key=lambda c: c.name)


CASES = _collect()


def _as_array(value):
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    if case.name in EXCLUDED:
        pytest.skip(EXCLUDED[case.name])
    rep = nncc.backend.prepare(case.model)
    for inputs, outputs in case.data_sets:
        got = rep.run([_as_array(x) for x in inputs])
        assert len(got) >= len(outputs)
        for actual, expected in zip(got, outputs):
            expected = _as_array(expected)
            assert actual.dtype == expected.dtype
            assert actual.shape == expected.shape
            if expected.dtype.kind == "V":  # bfloat16, float8, int4... (ml_dtypes)
                # their values, exactly, in float32: assert_array_equal takes NaN == NaN
                # only for numpy's own float types
                np.testing.assert_array_equal(actual.astype(np.float32), expected.astype(np.float32))
            elif expected.dtype.kind in "fc":
                np.testing.assert_allclose(
                    actual, expected, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6)
                )
            else:
                np.testing.assert_array_equal(actual, expected)


def test_every_required_op_has_cases():
    covered = {c.model.graph.node[0].op_type for c in CASES}
    assert OPS - covered == set()
