"""Whole models through nncc: the fixtures in fixtures/ and the "light" models that ship
in the onnx wheel.

For every model nncc must
  * compute what the oracle computes (rtol 1e-3, atol 1e-4), and
  * infer a static dtype and shape for every value (inputs bound to the fed arrays), and
    produce exactly those at run time (Interpreter.run(..., expected=infos) asserts it).

The oracles:
  * fixtures: onnxruntime (CPUExecutionProvider, 2 intra-op threads) on seeded random
    inputs; symbolic batch dims are bound to 3, the transformer's sequence dim to 16.
  * light models: see the comment above LIGHT_MODELS.

Each model is run through nncc once per test session; the shape test and the numeric
test share that run (the big light models, vgg19 and alexnet, stay affordable).
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.frontend.onnx import load_model
from nncc.ir.graph import Graph, TensorInfo
from nncc.passes.shape_inference import infer_shapes
from nncc.runtime.interpreter import Interpreter
from tests.conftest import FIXTURES, ROOT, light_models_dir
from tests.oracle import ort_session

RTOL, ATOL = 1e-3, 1e-4

FIXTURE_MODELS = ["mlp", "resnet_block", "mobilenet", "transformer", "shape_ops", "gru_cell"]
SYMBOLIC_DIMS = {"N": 3, "S": 16}
MAX_FIXTURE_BYTES = 2 * 1024 * 1024

# The light models (light_<name>.onnx + light_<name>_output_0.pb) are the ONNX model zoo
# classics with every weight replaced by ConstantOfShape(value=0.02). They ship no input.
# onnx's backend test runner (onnx/backend/test/runner/__init__.py, Runner._add_model_test
# -> generate_dummy_data(random=False)) feeds each non-initializer input with
#     (np.arange(n).reshape(shape) / n).astype(np.float32)     (unknown dims -> 1)
# and compares with the stored output_0.pb. onnxruntime reproduces the stored outputs
# exactly for that input (asserted below), so nncc is compared against the stored
# output_0.pb with that same input.
# Caveat: with constant weights every class gets the same logit, so the stored output is
# a constant (softmax -> 0.001 everywhere; densenet -> 0.46095502) whatever the input.
# It proves little about the numerics, so the input of the node producing the output
# (the logits, or densenet's last feature map) is exposed as an extra output and compared
# with onnxruntime on the same input: it does depend on every conv/pool/LRN/BN on the way.
LIGHT_MODELS = sorted(
    p.name[len("light_"):-len(".onnx")] for p in light_models_dir().glob("light_*.onnx")
)


# -- helpers ---------------------------------------------------------------------------


def _fixture_path(name: str) -> pathlib.Path:
    return FIXTURES / f"{name}.onnx"


def _light_path(name: str) -> pathlib.Path:
    return light_models_dir() / f"light_{name}.onnx"


def _declared_shape(value_info, unknown) -> tuple[int, ...]:
    dims = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append(unknown(d.dim_param))
    return tuple(dims)


def _graph_inputs(model) -> list:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _random_feeds(model, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in _graph_inputs(model):
        assert vi.type.tensor_type.elem_type == TensorProto.FLOAT, vi.name
        shape = _declared_shape(vi, lambda p: SYMBOLIC_DIMS[p])
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _runner_feeds(model) -> dict[str, np.ndarray]:
    """The input onnx's backend test runner generates for light models (random=False)."""
    feeds = {}
    for vi in _graph_inputs(model):
        shape = _declared_shape(vi, lambda p: 1)
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def _ort_session(model: str | bytes):
    return ort_session(model)


@dataclasses.dataclass
class NnccRun:
    graph: Graph
    outputs: dict[str, np.ndarray]
    infos: dict[str, TensorInfo] | None
    inference_error: BaseException | None  # infer_shapes raised
    runtime_mismatch: AssertionError | None  # a produced value differed from its inferred info


_RUNS: dict[str, NnccRun] = {}


def _nncc_run(key: str, path: pathlib.Path, feeds: dict[str, np.ndarray],
              extra_outputs: tuple[str, ...] = ()) -> NnccRun:
    """Run once per session: nncc.load_onnx(path).run(feeds), checking inferred shapes.

    ``extra_outputs`` keeps intermediate values alive and returns them too.
    """
    if key in _RUNS:
        return _RUNS[key]
    interpreter = nncc.load_onnx(path)
    graph = interpreter.graph
    if extra_outputs:
        graph = dataclasses.replace(graph, outputs=list(graph.outputs) + list(extra_outputs))
        interpreter = Interpreter(graph)
    bound = {name: TensorInfo(a.dtype, tuple(a.shape)) for name, a in feeds.items()}
    infos = inference_error = mismatch = None
    try:
        infos = infer_shapes(graph, bound)
    except Exception as exc:  # reported by the shape test; the numeric test still runs
        inference_error = exc
    copies = {name: a.copy() for name, a in feeds.items()}  # kernels must not see shared arrays
    if infos is not None:
        try:
            outputs = interpreter.run(copies, expected=infos)
        except AssertionError as exc:
            mismatch = exc
            outputs = interpreter.run({name: a.copy() for name, a in feeds.items()})
    else:
        outputs = interpreter.run(copies)
    run = NnccRun(graph, outputs, infos, inference_error, mismatch)
    _RUNS[key] = run
    return run


def _assert_close(name: str, got: np.ndarray, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=name)


def _assert_shapes(run: NnccRun) -> None:
    if run.inference_error is not None:
        raise run.inference_error
    graph, infos = run.graph, run.infos
    names = list(graph.inputs) + list(graph.initializers)
    names += [out for node in graph.nodes for out in node.outputs if out]
    problems = []
    for name in names:
        info = infos.get(name)
        if info is None:
            problems.append(f"{name}: no info")
        elif info.dtype is None or not info.is_static:
            problems.append(f"{name}: {info.describe()}")
    assert not problems, (
        f"{len(problems)} values without a static dtype and shape:\n  " + "\n  ".join(problems[:20])
    )
    if run.runtime_mismatch is not None:
        raise run.runtime_mismatch


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("fixtures")
    subprocess.run(
        [sys.executable, str(ROOT / "fixtures" / "make_fixtures.py"), str(out)],
        check=True, capture_output=True, timeout=120,
    )
    return out


@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_fixture_regenerates_identically(name, regenerated):
    fresh = (regenerated / f"{name}.onnx").read_bytes()
    committed = _fixture_path(name).read_bytes()
    assert fresh == committed, (
        f"fixtures/{name}.onnx differs from what fixtures/make_fixtures.py writes; "
        "regenerate it with `python fixtures/make_fixtures.py`"
    )


@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_fixture_is_valid(name):
    path = _fixture_path(name)
    assert path.stat().st_size < MAX_FIXTURE_BYTES
    model = onnx.load(path)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    onnx.checker.check_model(model, full_check=True)
    # nncc's reader sees the declared inputs and outputs as onnx does (symbolic dims kept
    # by name); read with the frontend alone, so this does not depend on kernels
    graph = load_model(path)
    for declared, names in ((_graph_inputs(model), graph.inputs),
                            (list(model.graph.output), graph.outputs)):
        assert list(names) == [vi.name for vi in declared]
        for vi in declared:
            assert graph.values[vi.name].dtype == np.float32
            assert graph.values[vi.name].shape == _declared_shape(vi, lambda p: p)


def _fixture_run(name: str):
    path = _fixture_path(name)
    feeds = _random_feeds(onnx.load(path), seed=zlib.crc32(name.encode()))
    return path, feeds, _nncc_run(f"fixture:{name}", path, feeds)


@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_fixture_matches_onnxruntime(name):
    path, feeds, run = _fixture_run(name)
    session = _ort_session(str(path))
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(None, feeds)))
    assert list(run.outputs) == names
    for out in names:
        _assert_close(out, run.outputs[out], expected[out])


@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_fixture_shapes_static_and_match_runtime(name):
    _, _, run = _fixture_run(name)
    _assert_shapes(run)


# -- light models from the onnx wheel ---------------------------------------------------


def _stored_outputs(name: str, model) -> dict[str, np.ndarray]:
    prefix = str(_light_path(name))[: -len(".onnx")]
    stored = {}
    for i, vi in enumerate(model.graph.output):
        tensor = onnx.load_tensor(f"{prefix}_output_{i}.pb")
        stored[vi.name] = numpy_helper.to_array(tensor)
    return stored


def _pre_final_value(model) -> str:
    """The first input of the node producing the model's first output."""
    out = model.graph.output[0].name
    producer = next(n for n in model.graph.node if out in n.output)
    return producer.input[0]


def _light_run(name: str):
    path = _light_path(name)
    model = onnx.load(path)
    feeds = _runner_feeds(model)
    pre = _pre_final_value(model)
    return model, feeds, pre, _nncc_run(f"light:{name}", path, feeds, extra_outputs=(pre,))


@pytest.mark.slow  # whole light models
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_reference(name):
    model, feeds, pre, run = _light_run(name)
    stored = _stored_outputs(name, model)

    # onnxruntime on the runner's input: reproduces the stored outputs (so this input is
    # the one they were made with) and provides the pre-final value
    model.graph.output.append(helper.make_tensor_value_info(pre, TensorProto.FLOAT, None))
    ort_values = _ort_session(model.SerializeToString()).run(None, feeds)
    for (out, want), got in zip(stored.items(), ort_values):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"onnxruntime no longer reproduces {out}")

    for out, want in stored.items():
        _assert_close(out, run.outputs[out], want)
    _assert_close(f"pre-final value {pre}", run.outputs[pre], ort_values[-1])


@pytest.mark.slow  # whole light models
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_shapes_static_and_match_runtime(name):
    *_, run = _light_run(name)
    _assert_shapes(run)


def _onnx_attribute(attr):
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


READER_CASES = [("fixture", n) for n in FIXTURE_MODELS] + [("light", n) for n in LIGHT_MODELS]


@pytest.mark.parametrize("kind,name", READER_CASES, ids=[f"{k}-{n}" for k, n in READER_CASES])
def test_reader_agrees_with_onnx(kind, name):
    """nncc's own protobuf reader against onnx's: nodes, attributes and initializers."""
    path = _fixture_path(name) if kind == "fixture" else _light_path(name)
    model = onnx.load(path)
    graph = load_model(path)
    assert graph.opsets == {o.domain: o.version for o in model.opset_import}
    assert len(graph.nodes) == len(model.graph.node)
    for ours, theirs in zip(graph.nodes, model.graph.node):
        where = f"node {theirs.name or theirs.op_type}"
        assert (ours.op_type, ours.domain, ours.name) == (theirs.op_type, theirs.domain, theirs.name), where
        assert (ours.inputs, ours.outputs) == (list(theirs.input), list(theirs.output)), where
        assert set(ours.attrs) == {a.name for a in theirs.attribute}, where
        for attr in theirs.attribute:
            want = _onnx_attribute(attr)
            got = ours.attrs[attr.name]
            if isinstance(want, np.ndarray):
                assert isinstance(got, np.ndarray) and got.dtype == want.dtype, (where, attr.name)
                np.testing.assert_array_equal(got, want, err_msg=f"{where}.{attr.name}")
            else:
                assert got == want, (where, attr.name, got, want)
    assert set(graph.initializers) == {t.name for t in model.graph.initializer}
    for tensor in model.graph.initializer:
        want = numpy_helper.to_array(tensor)
        got = graph.initializers[tensor.name]
        assert got.dtype == want.dtype and got.shape == want.shape, tensor.name
        np.testing.assert_array_equal(got, want, err_msg=tensor.name)


def test_light_models_are_present():
    assert set(LIGHT_MODELS) >= {
        "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
        "shufflenet", "squeezenet", "vgg19", "zfnet512",
    }
