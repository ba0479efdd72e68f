"""Low-precision element types (bfloat16, float8, float4, int4/uint4, int2/uint2) through
ml_dtypes: loaded only when a model names one, read from every ONNX storage form, carried
through plans and artifacts, converted by Cast with ONNX's rules, and moved by the layout
ops. Oracles: onnx's numpy_helper (storage), onnxruntime (Cast), ONNX's reference
evaluator (layout ops onnxruntime lacks for these types), and the spec's definition of
float8e8m0 (powers of two) where neither has it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
import pytest

import nncc
from nncc.compiler import CompileOptions, compile_graph
from nncc.errors import ModelFormatError, PlanFormatError
from nncc.frontend.onnx import load_model, parse_model
from nncc.model import CompiledModel
from nncc.runtime.interpreter import Interpreter
from tests.conftest import FIXTURES, ROOT
from tests.oracle import ort_run
from tests.test_plan_format import hostile, parts

RNG = np.random.default_rng(99)

TYPES = {  # ONNX type -> ml_dtypes type
    TensorProto.BFLOAT16: ml_dtypes.bfloat16,
    TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    TensorProto.FLOAT8E8M0: ml_dtypes.float8_e8m0fnu,
    TensorProto.FLOAT4E2M1: ml_dtypes.float4_e2m1fn,
    TensorProto.INT4: ml_dtypes.int4,
    TensorProto.UINT4: ml_dtypes.uint4,
    TensorProto.INT2: ml_dtypes.int2,
    TensorProto.UINT2: ml_dtypes.uint2,
}
INTEGERS = (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)


def sample(dtype, shape) -> np.ndarray:
    """Values spread over the type's range: every code of the small ones, with NaN."""
    count = int(np.prod(shape))
    if dtype in INTEGERS:
        info = ml_dtypes.iinfo(dtype)
        return (np.arange(count) % (info.max - info.min + 1) + info.min).astype(dtype).reshape(shape)
    if dtype == ml_dtypes.float8_e8m0fnu:
        return (2.0 ** (np.arange(count) - count // 2)).astype(dtype).reshape(shape)
    values = RNG.standard_normal(count) * 3
    values[::7] = np.nan
    return values.astype(np.float32).astype(dtype).reshape(shape)


def same_values(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))  # NaN == NaN


def model_of(nodes, inputs, outputs, initializers=(), opset=23):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=11)


def both_routes(model, feeds):
    graph = parse_model(model.SerializeToString())
    interpreted = Interpreter(graph).run(feeds)
    compiled = CompiledModel(compile_graph(graph, CompileOptions(opt_level=2))).run(feeds)
    return [[r[n] for n in graph.outputs] for r in (interpreted, compiled)]


# ------------------------------------------------------------------------- lazy import


def _in_fresh_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.slow
def test_float32_models_never_import_ml_dtypes():
    code = (
        "import sys, numpy as np, nncc, nncc.cli.main\n"
        f"m = nncc.compile_model({str(FIXTURES / 'mlp.onnx')!r})\n"
        "x = np.ones((4, 64), np.float32)\n"
        "m.run({'x': x})\n"
        "nncc.load(m.to_bytes()).run({'x': x})\n"
        "print('ml_dtypes' in sys.modules)\n"
    )
    assert _in_fresh_python(code) == "False"


def test_a_model_naming_bfloat16_imports_ml_dtypes(tmp_path):
    model = model_of([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                     [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])])
    onnx.save(model, tmp_path / "bf16.onnx")
    code = (
        "import sys, nncc.frontend.onnx as f\n"
        "print('ml_dtypes' in sys.modules)\n"
        f"f.load_model({str(tmp_path / 'bf16.onnx')!r})\n"
        "print('ml_dtypes' in sys.modules)\n"
    )
    assert _in_fresh_python(code).split() == ["False", "True"]


def test_without_ml_dtypes_such_a_model_is_a_clear_error(tmp_path):
    model = model_of([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E5M2)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT8E5M2, [2])])
    onnx.save(model, tmp_path / "f8.onnx")
    code = (  # a None entry makes `import ml_dtypes` fail, as if it were not installed
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "from nncc.cli.main import main\n"
        f"main(['run', {str(tmp_path / 'f8.onnx')!r}, '--random-inputs'])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "nncc: error: this model uses a low-precision element type (bfloat16, float8, int4...), "
        "which needs the ml_dtypes package: pip install ml_dtypes")


# -------------------------------------------------------------------------- the reader


@pytest.mark.parametrize("raw", [True, False], ids=["raw_data", "int32_data"])
@pytest.mark.parametrize("code", list(TYPES), ids=[TensorProto.DataType.Name(c) for c in TYPES])
def test_initializers_and_constant_attributes_read_as_onnx_does(code, raw):
    array = sample(TYPES[code], (3, 5))  # an odd count: the last packed byte is half (or 1/4) full
    if raw:
        tensor = numpy_helper.from_array(array, "w")
    else:
        tensor = helper.make_tensor("w", code, array.shape, array.reshape(-1).tolist() if code != TensorProto.BFLOAT16
                                    else array.astype(np.float32).reshape(-1).tolist())
        assert not tensor.HasField("raw_data")
    want = numpy_helper.to_array(tensor)
    constant = helper.make_node("Constant", [], ["c"], value=tensor)
    model = model_of([constant, helper.make_node("Identity", ["w"], ["y"])], [],
                     [helper.make_tensor_value_info("y", code, None), helper.make_tensor_value_info("c", code, None)],
                     [tensor])
    graph = parse_model(model.SerializeToString())
    same_values(graph.initializers["w"], want)
    same_values(np.asarray(graph.nodes[0].attrs["value"]), want)
    assert graph.values["y"].dtype == np.dtype(TYPES[code])
    for route in both_routes(model, {}):
        same_values(route[0], want)
        same_values(route[1], want)


def test_packed_external_data(tmp_path):
    array = sample(ml_dtypes.int4, (7, 3))
    tensor = numpy_helper.from_array(array, "w")
    model = model_of([helper.make_node("Cast", ["w"], ["y"], to=TensorProto.INT8)], [],
                     [helper.make_tensor_value_info("y", TensorProto.INT8, None)], [tensor])
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").stat().st_size == 11  # 21 four-bit values: 11 bytes
    graph = load_model(tmp_path / "m.onnx")
    same_values(graph.initializers["w"], array)


@pytest.mark.parametrize("code, size", [(TensorProto.INT4, 3), (TensorProto.UINT2, 2), (TensorProto.BFLOAT16, 5)])
def test_raw_data_of_the_wrong_size_is_refused(code, size):
    tensor = TensorProto(name="w", dims=[9], data_type=code, raw_data=b"\0" * size)
    model = model_of([], [], [helper.make_tensor_value_info("w", code, None)], [tensor])
    with pytest.raises(ModelFormatError, match="bytes of raw data"):
        parse_model(model.SerializeToString())


# ------------------------------------------------------------------------ Cast, CastLike


def _through_float(code):
    """x -> Cast(to=code) -> Cast(to=FLOAT): onnxruntime returns no low-precision arrays, and
    the cast back is exact."""
    return [helper.make_node("Cast", ["x"], ["q"], to=code), helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)]


EDGES = np.array([0.0, -0.0, 1.0, -3.3, 0.1, 1e-7, -1e-7, 1e-3, 57344.0, 61440.0, 65504.0, 240.0, 248.0, 256.0,
                  448.0, 460.0, 464.0, 465.0, 480.0, 1e6, -1e6, np.inf, -np.inf, np.nan, 17.0, 18.0, 19.0, 0.0009765625],
                 np.float32)


# Without saturation, onnxruntime departs from the spec's table just above the largest
# float8e4m3fn and float8e5m2 values: it gives 448 for 480 and NaN for 465 (e4m3fn), NaN
# for 61440 and 65504 (e5m2). The spec rounds first, [x] = x to the target's precision,
# then [x] > FLT_MAX gives NaN (e4m3fn) or Inf (e5m2); ml_dtypes and ONNX's stored node
# outputs agree with it. Those values are checked against the table instead.
BEYOND_MAX = {TensorProto.FLOAT8E4M3FN: (448.0, [465.0, 480.0, 500.0], np.nan),
              TensorProto.FLOAT8E5M2: (57344.0, [61440.0, 61441.0, 65504.0], np.inf)}


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("code", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                                  TensorProto.FLOAT8E5M2FNUZ])
@pytest.mark.parametrize("source", [np.float32, np.float16])
def test_cast_to_float8_matches_onnxruntime(code, saturate, source):
    with np.errstate(over="ignore"):  # 1e6 is infinite in float16
        x = np.concatenate([EDGES, RNG.standard_normal(200).astype(np.float32) * 100]).astype(source)
    if not saturate and code in BEYOND_MAX:
        limit = BEYOND_MAX[code][0]
        magnitude = np.abs(x.astype(np.float32))
        x = x[~((magnitude > limit) & (magnitude < limit * 1.25))]
    nodes = _through_float(code)
    nodes[0].attribute.append(helper.make_attribute("saturate", saturate))
    model = model_of(nodes, [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), None)],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], opset=21)
    expected = ort_run(model, {"x": x})[0]
    for (got,) in both_routes(model, {"x": x}):
        assert got.tobytes() == expected.tobytes()  # bit for bit: -0, NaN and infinities included


@pytest.mark.parametrize("code", list(BEYOND_MAX))
@pytest.mark.parametrize("source", [np.float32, np.float16])
def test_cast_without_saturation_just_beyond_the_largest_value(code, source):
    limit, values, overflow = BEYOND_MAX[code]
    x = np.array([limit, limit * 1.03, *values, *(-v for v in values)], source)  # 1.03: rounds down
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=code, saturate=0)]
    model = model_of(nodes, [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), None)],
                     [helper.make_tensor_value_info("y", code, None)], opset=21)
    signs = np.array([1.0] * (2 + len(values)) + [-1.0] * len(values))
    want = np.concatenate([[limit, limit], np.full(2 * len(values), overflow)]) * signs
    for (got,) in both_routes(model, {"x": x}):
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_cast_to_bfloat16_and_4_bit_integers_match_onnxruntime():
    # float to 4-bit integer: onnxruntime rounds non-integral values where ONNX's reference
    # (and nncc, as for every float to integer Cast) truncates; integral values, including
    # the out-of-range ones that wrap, are compared here, the rest below
    x = np.concatenate([EDGES, RNG.standard_normal(100).astype(np.float32) * 5, np.arange(-20, 20)]).astype(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) < 1e5)]
    for code, back in ((TensorProto.BFLOAT16, TensorProto.FLOAT), (TensorProto.INT4, TensorProto.INT8),
                       (TensorProto.UINT4, TensorProto.UINT8)):
        if code != TensorProto.BFLOAT16:
            x = np.rint(x)
        nodes = [helper.make_node("Cast", ["x"], ["q"], to=code), helper.make_node("Cast", ["q"], ["y"], to=back)]
        model = model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                         [helper.make_tensor_value_info("y", back, None)], opset=21)
        expected = ort_run(model, {"x": x})[0]
        for (got,) in both_routes(model, {"x": x}):
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("code", [TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2])
def test_cast_fractions_to_small_integers_truncate_like_onnx_reference(code):
    x = np.array([0.4, 0.5, 1.5, 1.9, 2.5, -0.5, -1.5, -1.9, 3.7, 7.6, 9.2, -9.2], np.float32)
    model = model_of([helper.make_node("Cast", ["x"], ["y"], to=code)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                     [helper.make_tensor_value_info("y", code, None)], opset=25)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for (got,) in both_routes(model, {"x": x}):
        same_values(got, want)


def test_castlike_takes_the_type_and_saturate_rule():
    x = np.array([1000.0, -1000.0, 0.3], np.float32)
    like = np.zeros(1, ml_dtypes.float8_e4m3fn)
    node = helper.make_node("CastLike", ["x", "like"], ["y"], saturate=0)
    model = model_of([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, None)],
                     [numpy_helper.from_array(like, "like")], opset=21)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for (got,) in both_routes(model, {"x": x}):
        same_values(got, want)
        assert np.isnan(got.astype(np.float32)[:2]).all()  # no saturation: out of range is NaN


E8M0 = [  # x, up, down, nearest (exponents of two; None is NaN), per the spec's rounding modes
    (1.0, 0, 0, 0), (1.25, 1, 0, 0), (1.5, 1, 0, 1), (1.75, 1, 0, 1), (3.0, 2, 1, 2), (0.75, 0, -1, 0),
    (2.0 ** -127, -127, -127, -127), (2.0 ** 127, 127, 127, 127),
]


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_cast_to_float8e8m0_rounding_modes(mode):
    x = np.array([row[0] for row in E8M0], np.float32)
    column = {"up": 1, "down": 2, "nearest": 3}[mode]
    want = np.array([2.0 ** row[column] for row in E8M0], np.float32)
    model = model_of([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, round_mode=mode)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, None)], opset=24)
    for (got,) in both_routes(model, {"x": x}):
        assert got.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
        np.testing.assert_array_equal(got.astype(np.float32), want)


@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_to_float8e8m0_out_of_range(saturate):
    x = np.array([np.inf, 0.0, 2.0 ** 127 * 1.5, np.nan], np.float32)
    model = model_of([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, saturate=saturate)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, None)], opset=24)
    # the spec's table: saturation gives the largest (2**127) or smallest (2**-127) power
    want = [2.0 ** 127, 2.0 ** -127, 2.0 ** 127, np.nan] if saturate else [np.nan] * 4
    for (got,) in both_routes(model, {"x": x}):
        np.testing.assert_array_equal(got.astype(np.float32), np.array(want, np.float32))


# ---------------------------------------------------------------------- layout ops


@pytest.mark.parametrize("code", [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.INT4, TensorProto.UINT2])
def test_layout_ops_move_low_precision_values(code):
    x = sample(TYPES[code], (2, 3, 4))
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Concat", ["r", "r"], ["c"], axis=0),
        helper.make_node("Slice", ["c", "starts", "ends"], ["s"]),
        helper.make_node("Gather", ["s", "index"], ["g"], axis=1),
        helper.make_node("Unsqueeze", ["g", "axes"], ["u"]),
        helper.make_node("Squeeze", ["u", "axes"], ["q"]),
        helper.make_node("Identity", ["q"], ["y"]),
        helper.make_node("Flatten", ["x"], ["f"], axis=2),
    ]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("shape", [4, 6]), ("starts", [1]), ("ends", [7]), ("index", [5, 0, 2]), ("axes", [0]))]
    model = model_of(nodes, [helper.make_tensor_value_info("x", code, [2, 3, 4])],
                     [helper.make_tensor_value_info("y", code, None), helper.make_tensor_value_info("f", code, None)],
                     consts, opset=23)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for route in both_routes(model, {"x": x}):
        for got, expected in zip(route, want):
            same_values(got, expected)


# ----------------------------------------------------------------------- artifacts


def test_artifact_round_trip_names_low_precision_dtypes(tmp_path):
    big = sample(ml_dtypes.float8_e5m2, (40, 40))  # 1600 bytes: stored in DATA, memory-mapped
    small = sample(ml_dtypes.int4, (3, 4))
    nodes = [
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
        helper.make_node("Transpose", ["xb"], ["xt"]),
        helper.make_node("Cast", ["xt"], ["y"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["big"], ["bigf"], to=TensorProto.FLOAT),
        helper.make_node("Identity", ["small"], ["s"]),
    ]
    model = model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                     [helper.make_tensor_value_info(n, t, None) for n, t in
                      (("y", TensorProto.FLOAT), ("bigf", TensorProto.FLOAT), ("s", TensorProto.INT4))],
                     [numpy_helper.from_array(big, "big"), numpy_helper.from_array(small, "small")], opset=21)
    onnx.save(model, tmp_path / "m.onnx")
    compiled = nncc.compile_model(tmp_path / "m.onnx")
    compiled.save(tmp_path / "m.nncc")
    loaded = nncc.load(tmp_path / "m.nncc")
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    expected = ReferenceEvaluator(model).run(None, {"x": x})  # onnxruntime has no int4 Identity
    for run in (compiled.run({"x": x}), loaded.run({"x": x})):
        np.testing.assert_array_equal(run["y"], expected[0])
        np.testing.assert_array_equal(run["bigf"], expected[1])
        same_values(run["s"], expected[2])
    _, program, _, _ = parts((tmp_path / "m.nncc").read_bytes())
    names = {slot[1] for slot in program["slots"]}
    assert {"bfloat16", "int4"} <= names
    assert not any(name and name.startswith("|V") or name and name.startswith("<V") for name in names)


@pytest.mark.parametrize("name", ["<V2", "|V1", "float8_e4m3b11fnuz", "ml_dtypes.bfloat16"])
def test_artifact_refuses_dtypes_outside_the_list(tmp_path, name):
    model = model_of([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16)],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                     [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, None)])
    onnx.save(model, tmp_path / "m.onnx")
    raw = nncc.compile_model(tmp_path / "m.onnx").to_bytes()

    def edit(program, sections):
        for slot in program["slots"]:
            if slot[1] == "bfloat16":
                slot[1] = name

    with pytest.raises(PlanFormatError, match="unsupported dtype"):
        nncc.load(hostile(raw, edit))


# ---------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_nncc_run_with_bfloat16_npy_input_and_random_inputs(tmp_path):
    model = model_of([helper.make_node("Transpose", ["x"], ["t"]),
                      helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT)],
                     [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(model, tmp_path / "m.onnx")
    x = np.array([[1.5, -2.25, 3.0], [0.125, 7.0, -0.5]], np.float32).astype(ml_dtypes.bfloat16)
    np.save(tmp_path / "x.npy", x)  # .npy keeps bfloat16 only as raw two-byte records
    base = [sys.executable, "-m", "nncc", "run", str(tmp_path / "m.onnx")]
    done = subprocess.run(base + ["--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o.npz"),
                                  "--json"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], x.astype(np.float32).T)
    summary = json.loads(done.stdout)["outputs"][0]
    assert summary["max"] == 7.0 and summary["min"] == -2.25
    done = subprocess.run(base + ["--random-inputs"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
