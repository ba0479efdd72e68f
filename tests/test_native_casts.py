"""Cast between float32, int32, int64, uint8 and bool in native code, against onnxruntime
exactly: truncation toward zero, and on this CPU the same integers onnxruntime gives for
NaN, infinities and values out of range (ONNX leaves those undefined; the C never performs
an undefined conversion, which the sanitized fuzz build checks). The integer side of a
Cast lives inside its partition (an int32 or int64 input comes in as it is); a bool graph
input keeps its Cast portable, saying why."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import nncc
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

# in range, fractional both signs, around each type's edges, beyond them, non-finite
AWKWARD = np.array([0.0, -0.0, 0.4, 0.5, 0.99, 1.5, -1.5, -2.7, 2.7, 127.9, 128.0, 255.9, 256.0, 300.5, -300.5,
                    16777217.0, 2147483520.0, 2147483648.0, -2147483648.0, -2147483904.0, 3e9, -3e9, 9.2e18,
                    9.3e18, -9.2e18, -9.3e18, 1e30, -1e30, np.inf, -np.inf, np.nan, -np.nan], np.float32)
TYPES = {"int32": TensorProto.INT32, "int64": TensorProto.INT64, "uint8": TensorProto.UINT8, "bool": TensorProto.BOOL}


def awkward_input(m: GraphBuilder, rows: int = 3) -> str:
    x = m.input([rows, AWKWARD.size])
    m.feeds[x] = np.stack([AWKWARD * s for s in (1.0, -1.0, 0.25)][:rows]).astype(np.float32)
    return x


def compile_and_compare(tmp_path, m: GraphBuilder, native_only: bool = True):
    """onnxruntime unoptimized: its optimizer merges a chain of Casts into one, which
    changes what an out-of-range integer becomes."""
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path)
    names = [o.name for o in m.outputs]
    got = compiled.run(m.feeds)
    for name, want in zip(names, ort_run(path, m.feeds, names, optimized=False)):
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    if native_only:
        assert compiled.native_partitions == 1 and len(compiled.plan.partitions) == 1, compiled.plan.fallbacks
        assert compiled.plan.fallbacks == []
    return compiled


@pytest.mark.parametrize("kind", list(TYPES))
def test_float_to_integer_and_back_is_native_and_matches(tmp_path, kind):
    m = GraphBuilder(18, 1, "casts")
    x = awkward_input(m)
    there = m.node("Cast", [m.node("Mul", [x, m.const(1.0)])], to=TYPES[kind])
    m.output(m.node("Add", [m.node("Cast", [there], to=TensorProto.FLOAT), m.const(0.0)]))
    compile_and_compare(tmp_path, m)


@pytest.mark.parametrize("path", [("int64", "int32"), ("int32", "uint8"), ("int64", "uint8"), ("int32", "bool"),
                                  ("int64", "int32", "int64"), ("uint8", "int32"), ("bool", "int64")])
def test_integer_to_integer_keeps_the_low_bytes(tmp_path, path):
    """A narrowing conversion of an integer that does not fit is not defined by ONNX (and
    onnxruntime's differs by path): native code keeps its low bytes, as the portable plan
    does, and matches onnxruntime exactly on values every step holds."""
    m = GraphBuilder(18, 2, "int_casts")
    value = m.node("Mul", [awkward_input(m), m.const(1.0)])
    for kind in path:
        value = m.node("Cast", [value], to=TYPES[kind])
    m.output(m.node("Cast", [value], to=TensorProto.FLOAT))
    m.save(tmp_path / "m.onnx")
    compiled = nncc.compile_model(tmp_path / "m.onnx")
    assert compiled.native_partitions == 1 and compiled.plan.fallbacks == [], compiled.plan.fallbacks
    got = compiled.run(m.feeds)[value := m.outputs[0].name]
    portable = nncc.compile_model(tmp_path / "m.onnx", backends=("numpy",)).run(m.feeds)[value]
    np.testing.assert_array_equal(got, portable)
    (want,) = ort_run(tmp_path / "m.onnx", m.feeds, [value], optimized=False)
    x = m.feeds[m.inputs[0].name]
    held = np.isfinite(x) & (x >= (0 if "uint8" in path else -2**31)) & (x < (256 if "uint8" in path else 2**31))
    np.testing.assert_array_equal(got[held], want[held])


def test_a_comparison_cast_to_float_is_one_partition(tmp_path):
    """Cast(Greater(x, 0), float) times x: a mask used as numbers."""
    m = GraphBuilder(18, 3, "mask_cast")
    x = awkward_input(m, rows=2)
    positive = m.node("Cast", [m.node("Greater", [x, m.const(0.0)])], to=TensorProto.FLOAT)
    m.output(m.node("Mul", [positive, m.node("Cast", [m.node("Cast", [x], to=TensorProto.BOOL)],
                                             to=TensorProto.FLOAT)]))
    compile_and_compare(tmp_path, m)


def test_an_integer_graph_input_is_cast_natively(tmp_path):
    """Token ids as the model's int64 input come into native code as they are."""
    from onnx import helper

    m = GraphBuilder(18, 4, "ids")
    m.inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5]))
    m.feeds["ids"] = np.arange(10, dtype=np.int64).reshape(2, 5) * 1000003 - 4
    m.output(m.node("Relu", [m.node("Cast", ["ids"], to=TensorProto.FLOAT)]))
    compile_and_compare(tmp_path, m)


def test_a_bool_graph_input_keeps_its_cast_portable_saying_why(tmp_path):
    from onnx import helper

    m = GraphBuilder(18, 4, "flags")
    m.inputs.append(helper.make_tensor_value_info("flags", TensorProto.BOOL, [2, 5]))
    m.feeds["flags"] = np.arange(10).reshape(2, 5) % 3 == 0
    m.output(m.node("Relu", [m.node("Cast", ["flags"], to=TensorProto.FLOAT)]))
    compiled = compile_and_compare(tmp_path, m, native_only=False)
    reasons = {f["op"]: f["reason"] for f in compiled.plan.fallbacks}
    assert "its bool value 'flags' would cross a native partition's edge" in reasons["Cast"], reasons
