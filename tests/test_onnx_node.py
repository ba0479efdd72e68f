"""ONNX's own backend node test cases, run through nncc by two routes.

Cases come from onnx.backend.test.case.node in memory (the wheel ships no node data
files); expected outputs are the ones ONNX computed for each case. The case list is made
from nncc's kernel registry, not kept by hand: every case whose ops (subgraphs included)
all resolve to a registered kernel at the model's opset is collected, so a new kernel
brings its cases in. Each case runs twice: through the reference interpreter, and through
the full compile at -O2 (passes, partitioning, the plan, its arena and the executor).
"""

import warnings

import numpy as np
import onnx
from onnx import numpy_helper
import pytest

from nncc.errors import UnsupportedOpError
from nncc.ir.graph import normalize_domain
from nncc.kernels.registry import resolve
from tests import onnx_backend
from tests.onnx_node_exclusions import EXCLUDED

pytestmark = pytest.mark.slow  # some 4,500 models, each through both routes

ROUTES = ("interpreter", "compiled")


def _nodes(graph):
    """Every node of a graph and of the subgraphs in its attributes."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _nodes(sub)


def _implemented(model) -> bool:
    opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
    for node in _nodes(model.graph):
        domain = normalize_domain(node.domain)
        try:
            resolve(node.op_type, domain, opsets.get(domain, 1))
        except UnsupportedOpError:
            return False
    return True


def _collect():
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases(None)
    return sorted((c for c in cases if _implemented(c.model)), key=lambda c: c.name)


def _native_may_take(model) -> bool:
    """A case with an op type the native backend generates C for gets the native route too
    (whether it takes the node depends on shapes and dtypes: the test says when it does not)."""
    from nncc.native import mask_gen, plain_ops
    from nncc.native.codegen import ALIASES, BINARY, POOL_OPS, UNARY

    ops = UNARY.keys() | BINARY.keys() | POOL_OPS | plain_ops.OPS | mask_gen.OPS | {
        "Cast", "Conv", "ConvTranspose", "Gemm", "Gather", "MatMul", "Softmax", "LogSoftmax", "LayerNormalization",
        "Transpose", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sum", "Concat", "Floor", "Ceil", "Round",
        "Sign"}
    return any(node.op_type in ops and node.op_type not in ALIASES and not node.domain for node in model.graph.node)


CASES = _collect()
PARAMS = [pytest.param(case, route, id=f"{case.name}-{route}") for case in CASES for route in ROUTES]
PARAMS += [pytest.param(case, "native", id=f"{case.name}-native") for case in CASES if _native_may_take(case.model)]


def _as_array(value):
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _compare(actual, expected, case):
    if isinstance(expected, list):  # a sequence value
        assert isinstance(actual, list) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _compare(a, e, case)
        return
    expected = _as_array(expected)
    if expected is None:  # an empty optional
        assert actual is None
        return
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if expected.dtype.kind == "V":  # bfloat16, float8, int4... (ml_dtypes)
        # their values, exactly, in float32: assert_array_equal takes NaN == NaN only for
        # numpy's own float types
        np.testing.assert_array_equal(actual.astype(np.float32), expected.astype(np.float32))
    elif expected.dtype.kind in "fc":
        np.testing.assert_allclose(actual, expected, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6))
    else:
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("case, route", PARAMS)
def test_node_case(case, route):
    if case.name in EXCLUDED:
        pytest.skip(EXCLUDED[case.name])
    rep = onnx_backend.prepare(case.model, route=route)
    if route == "native" and rep.compiled.native_partitions == 0:
        pytest.skip("the native backend takes none of this case's nodes (dtype or dynamic shapes): the "
                    "compiled route covers it")
    for inputs, outputs in case.data_sets:
        got = rep.run([_as_array(x) for x in inputs])
        assert len(got) >= len(outputs)
        for actual, expected in zip(got, outputs):
            _compare(actual, expected, case)


def test_exclusions_name_collected_cases():
    """An exclusion for a case that is no longer collected (renamed, or its kernel gone)
    would hide nothing and mislead: every entry must name a case this suite runs."""
    names = {case.name for case in CASES}
    assert sorted(set(EXCLUDED) - names) == []
