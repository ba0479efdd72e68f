"""The compiler end to end: every fixture and light model, compiled at -O0 and -O2 and with
each execution preference, against onnxruntime; artifacts run in fresh processes exactly
as in-process; failed compiles leave nothing behind; `nncc inspect` for both inputs.

Oracles: onnxruntime on seeded random inputs for the fixtures (symbolic dims bound as in
tests/test_models.py); for the light models the stored output_0.pb with the input onnx's
backend test runner generates (tests/test_models.py shows onnxruntime reproduces it), and,
because those outputs are constant whatever the input, also the logits (the input of the
node producing the output) against onnxruntime.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nncc
from nncc.compiler import PREFERENCES
from nncc.errors import FileAccessError, UnsupportedOpError
from nncc.model import CompiledModel
from tests.conftest import FIXTURES, ROOT, light_models_dir
from tests.oracle import ort_outputs, ort_run

RTOL, ATOL = 1e-3, 1e-4
FIXTURE_MODELS = ["mlp", "resnet_block", "mobilenet", "transformer", "shape_ops"]
SYMBOLIC_DIMS = {"N": 3, "S": 16}
LIGHT_MODELS = sorted(p.name[len("light_"):-len(".onnx")] for p in light_models_dir().glob("light_*.onnx"))
REPORT_KEYS = {"format_version", "producer", "options", "inputs", "outputs", "instructions", "partitions",
               "fallbacks", "fallback_groups", "peak_activation_bytes", "dynamic_values", "constants",
               "artifact_bytes", "signature"}


# -- helpers -------------------------------------------------------------------------------


def _inputs(model) -> list:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _shape(vi, unknown) -> tuple[int, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else unknown(d.dim_param)
                 for d in vi.type.tensor_type.shape.dim)


def fixture_feeds(name: str) -> dict[str, np.ndarray]:
    model = onnx.load(FIXTURES / f"{name}.onnx")
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return {vi.name: rng.standard_normal(_shape(vi, SYMBOLIC_DIMS.__getitem__)).astype(np.float32)
            for vi in _inputs(model)}


def runner_feeds(model) -> dict[str, np.ndarray]:
    """onnx's backend test runner input for the light models (generate_dummy_data, random=False)."""
    feeds = {}
    for vi in _inputs(model):
        shape = _shape(vi, lambda _: 1)
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


@functools.lru_cache(maxsize=None)
def fixture_reference(name: str) -> dict[str, np.ndarray]:
    return ort_outputs(FIXTURES / f"{name}.onnx", fixture_feeds(name))


def assert_close(got: dict, want: dict, where: str):
    assert list(got) == list(want), where
    for name, value in want.items():
        assert got[name].dtype == value.dtype, f"{where}: {name} dtype {got[name].dtype}"
        assert got[name].shape == value.shape, f"{where}: {name} shape {got[name].shape}"
        np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=ATOL, err_msg=f"{where}: {name}")


def assert_identical(got: dict, want: dict, where: str):
    assert sorted(got) == sorted(want), where
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, f"{where}: {name}"
        np.testing.assert_array_equal(got[name], value, err_msg=f"{where}: {name}")


def nncc_cli(*args, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, **(env or {})})
    if check:
        assert result.returncode == 0, f"nncc {' '.join(map(str, args))}: {result.stderr}"
    return result


@functools.lru_cache(maxsize=None)
def no_cache_flag() -> tuple[str, ...]:
    """--no-cache where `nncc compile` has it (a compile test must really compile)."""
    return ("--no-cache",) if "--no-cache" in nncc_cli("compile", "--help").stdout else ()


def save_npz(path: pathlib.Path, arrays: dict) -> pathlib.Path:
    np.savez(path, **arrays)
    return path


def listing(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- fixtures: every optimization level and preference, against onnxruntime -------------------


@pytest.mark.slow
@pytest.mark.parametrize("preference", PREFERENCES)
@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_fixture_matches_onnxruntime(name, opt_level, preference):
    compiled = nncc.compile_model(FIXTURES / f"{name}.onnx", opt_level=opt_level, preference=preference)
    assert compiled.plan.options["preference"] == preference
    assert compiled.plan.options["opt_level"] == opt_level
    feeds = fixture_feeds(name)
    assert_close(compiled.run(feeds), fixture_reference(name), f"{name} -O{opt_level} {preference}")
    # the artifact computes exactly what the in-process model computes
    # (the same plan: compile_model's own runs of a dynamic model may go through the native
    # plan for one sample, which an artifact does not hold)
    same_plan = CompiledModel(compiled.plan, trust_native=True)
    assert_identical(nncc.load(compiled.to_bytes(), trust_native=True).run(feeds), same_plan.run(feeds), "reloaded")


def test_preferences_change_what_is_compiled():
    by_preference = {p: nncc.compile_model(FIXTURES / "mlp.onnx", preference=p) for p in PREFERENCES}
    assert by_preference["low-power"].plan.options["threads"] == 1
    assert by_preference["fast-single-answer"].plan.options["threads"] == 0
    assert len({m.to_bytes() for m in by_preference.values()}) == len(PREFERENCES)


@pytest.mark.slow
def test_optimization_shrinks_the_program():
    o0 = nncc.compile_model(FIXTURES / "resnet_block.onnx", opt_level=0)
    o2 = nncc.compile_model(FIXTURES / "resnet_block.onnx", opt_level=2)
    assert len(o2.plan.instructions) < len(o0.plan.instructions)
    kernels = {k.split("::")[1] for k in o2.plan.kernels}
    assert "BatchNormalization" not in kernels  # folded into the convolutions at -O2


# -- light models -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def light_case(name: str, directory: str):
    """(model path with the logits exposed as an extra output, feeds, expected outputs, and
    if the output is the logits' Softmax: (the logits' name, the axes it normalizes), else None)."""
    path = light_models_dir() / f"light_{name}.onnx"
    model = onnx.load(path)
    feeds = runner_feeds(model)
    prefix = str(path)[: -len(".onnx")]
    expected = {vi.name: numpy_helper.to_array(onnx.load_tensor(f"{prefix}_output_{i}.pb"))
                for i, vi in enumerate(model.graph.output)}
    out = model.graph.output[0].name
    last = next(n for n in model.graph.node if out in n.output)
    pre = last.input[0]
    model.graph.output.append(helper.make_tensor_value_info(pre, TensorProto.FLOAT, None))
    expected[pre] = ort_run(model, feeds, [pre])[0]
    exposed = pathlib.Path(directory) / f"light_{name}.onnx"
    onnx.save(model, exposed)
    if last.op_type != "Softmax":
        return exposed, feeds, expected, None
    rank = expected[pre].ndim
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    axis = next((a.i for a in last.attribute if a.name == "axis"), 1 if opset < 13 else -1) % rank
    # before opset 13, Softmax normalizes over every axis from `axis` on
    return exposed, feeds, expected, (pre, tuple(range(axis, rank)) if opset < 13 else (axis,))


def assert_softmax_close(got: dict, want: dict, out: str, softmax: tuple[str, tuple[int, ...]], where: str):
    """A Softmax is only as well defined as its logits: raising each logit by at most d
    scales each probability p by a factor within [exp(-2d), exp(2d)]. So the probabilities
    may differ by p * expm1(2d), d the logits' measured difference, which the logits' own
    comparison bounds. (The light models' weights are constant fills: some have logits near
    1e10 that are equal to within float32 rounding, and their Softmax is decided by the
    rounding of the BLAS kernel the machine picks, not by nncc.)"""
    logits, axes = softmax
    assert got[out].dtype == want[out].dtype and got[out].shape == want[out].shape, f"{where}: {out}"
    d = np.abs(got[logits].astype(np.float64) - want[logits]).max(axis=axes, keepdims=True)
    with np.errstate(over="ignore"):
        bound = ATOL + want[out] * np.expm1(2 * d)
    diff = np.abs(got[out].astype(np.float64) - want[out])
    assert np.all(diff <= bound), f"{where}: {out} off by {diff.max():.3g}, beyond its logits' {d.max():.3g}"
    np.testing.assert_allclose(got[out].sum(axis=axes), 1, rtol=RTOL, err_msg=f"{where}: {out} is no distribution")


@pytest.fixture(scope="module")
def light_dir(tmp_path_factory):
    yield str(tmp_path_factory.mktemp("light"))
    light_case.cache_clear()


LIGHT_CASES = [(name, level, "fast-single-answer") for name in LIGHT_MODELS for level in (0, 2)]
LIGHT_CASES += [("squeezenet", level, p) for p in PREFERENCES[1:] for level in (0, 2)]


@pytest.mark.slow  # whole light models
@pytest.mark.parametrize("name,opt_level,preference", LIGHT_CASES,
                         ids=[f"{n}-O{o}-{p}" for n, o, p in LIGHT_CASES])
def test_light_model_matches_reference(name, opt_level, preference, light_dir):
    path, feeds, expected, softmax = light_case(name, light_dir)
    compiled = nncc.compile_model(path, opt_level=opt_level, preference=preference)
    got = compiled.run(feeds)
    where = f"light_{name} -O{opt_level} {preference}"
    if softmax is None:
        assert_close(got, expected, where)
        return
    out, logits = next(iter(expected)), softmax[0]
    assert list(got) == list(expected), where
    assert_close({logits: got[logits]}, {logits: expected[logits]}, where)
    assert_softmax_close(got, expected, out, softmax, where)


def test_light_models_are_all_covered():
    assert {"bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
            "squeezenet", "vgg19", "zfnet512"} <= set(LIGHT_MODELS)


@pytest.mark.slow  # compiles vgg19
def test_folded_light_model_artifact_stays_small():
    """vgg19's 143 M weights are ConstantOfShape splats: -O2 stores one element of each, and
    loading keeps them as zero-stride views (nothing is materialized)."""
    path = light_models_dir() / "light_vgg19.onnx"
    compiled = nncc.compile_model(path, opt_level=2, backends=["numpy"])  # the constants, not native code
    raw = compiled.to_bytes()
    assert len(raw) < 64 * 1024
    loaded = nncc.load(raw)
    big = [a for a in loaded.plan.constants.values() if a.size > 1_000_000]
    assert big and all(a.strides == (0,) * a.ndim for a in big)
    from nncc.report import describe_plan

    report = describe_plan(loaded.plan, len(raw))["constants"]
    assert report["splat"]["count"] >= len(big) and report["splat"]["expanded_bytes"] > 500 * 2**20
    assert report["splat"]["bytes"] == 4 * report["splat"]["count"]
    assert report["referenced"] == {"count": 0, "bytes": 0}


# -- a compiled artifact in a fresh process ---------------------------------------------------

CLI_MODELS = [("fixture", n) for n in FIXTURE_MODELS] + [("light", "squeezenet")]


def _source(kind: str, name: str):
    if kind == "fixture":
        return FIXTURES / f"{name}.onnx", fixture_feeds(name)
    model_path = light_models_dir() / f"light_{name}.onnx"
    return model_path, runner_feeds(onnx.load(model_path))


@pytest.mark.slow
def test_cli_compile_then_run_in_new_processes_is_exact(tmp_path):
    jobs = []
    for kind, name in CLI_MODELS:
        path, feeds = _source(kind, name)
        out = tmp_path / f"{name}.nncc"
        jobs.append((name, path, out, save_npz(tmp_path / f"{name}-in.npz", feeds), tmp_path / f"{name}-out.npz"))

    def compile_and_run(job):
        name, path, out, inputs, outputs = job
        nncc_cli("compile", path, "-o", out, *no_cache_flag())
        # its own artifact, so its native code is trusted: the run must be bit-identical
        nncc_cli("run", out, "--inputs", inputs, "--output", outputs, "--json", "--trust-native")

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(compile_and_run, jobs))
    for (kind, name), (_, path, out, inputs, outputs) in zip(CLI_MODELS, jobs):
        _, feeds = _source(kind, name)
        in_process = nncc.compile_model(path)
        assert out.read_bytes() == in_process.to_bytes(), name
        with np.load(outputs) as archive:
            from_cli = {k: archive[k] for k in archive.files}
        same_plan = CompiledModel(in_process.plan, trust_native=True)  # without per-shape plans, as the artifact
        assert_identical(from_cli, same_plan.run(feeds), f"{name}: nncc run vs CompiledModel.run")


_NO_FRONTEND = textwrap.dedent("""
    import sys, numpy as np, nncc
    model = nncc.load(sys.argv[1])
    with np.load(sys.argv[2]) as archive:
        outputs = model.run({k: archive[k] for k in archive.files})
    heavy = sorted(m for m in sys.modules if m.startswith(("nncc.frontend", "nncc.passes", "onnx")))
    assert not heavy, heavy
    print("ok", len(outputs))
""")

_CLI_NO_FRONTEND = textwrap.dedent("""
    import sys
    from nncc.cli.main import main
    try:
        main(["run", sys.argv[1], "--inputs", sys.argv[2], "--json"])
    except SystemExit as exit:
        assert exit.code in (0, None), exit.code
    heavy = sorted(m for m in sys.modules if m.startswith(("nncc.frontend", "nncc.passes", "onnx")))
    assert not heavy, heavy
    print("ok")
""")


@pytest.mark.parametrize("script", [_NO_FRONTEND, _CLI_NO_FRONTEND], ids=["api", "cli"])
def test_running_an_artifact_never_imports_the_frontend(tmp_path, script):
    out = tmp_path / "m.nncc"
    nncc.compile_model(FIXTURES / "transformer.onnx").save(out)
    inputs = save_npz(tmp_path / "in.npz", fixture_feeds("transformer"))
    result = subprocess.run([sys.executable, "-c", script, str(out), str(inputs)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


# -- failed compiles leave nothing behind ------------------------------------------------------


@pytest.fixture
def unsupported_model(tmp_path) -> pathlib.Path:
    src = tmp_path / "src"
    src.mkdir()
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("FrobnicateXYZ", ["r"], ["y"], name="frob")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, src / "bad.onnx")
    return src / "bad.onnx"


def test_unsupported_op_leaves_no_output_and_no_temp_files(unsupported_model, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = nncc_cli("compile", unsupported_model, "-o", out_dir / "m.nncc", *no_cache_flag(), check=False)
    assert result.returncode == 2
    assert "unsupported op 'FrobnicateXYZ'" in result.stderr and "Traceback" not in result.stderr
    assert listing(out_dir) == []
    assert listing(unsupported_model.parent) == ["bad.onnx"]
    with pytest.raises(UnsupportedOpError, match="FrobnicateXYZ"):
        nncc.compile_model(unsupported_model)


def test_failed_compile_keeps_an_existing_output(unsupported_model, tmp_path):
    out = tmp_path / "m.nncc"
    out.write_bytes(b"previous artifact")
    result = nncc_cli("compile", unsupported_model, "-o", out, *no_cache_flag(), check=False)
    assert result.returncode == 2
    assert out.read_bytes() == b"previous artifact"
    assert listing(tmp_path) == ["m.nncc", "src"]


def _unwritable_dir(tmp_path) -> pathlib.Path:
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        return locked
    if os.path.isdir("/proc") and _cannot_create("/proc"):
        return pathlib.Path("/proc")  # root ignores permission bits; not procfs's refusal
    pytest.skip("no directory here is unwritable")


def _cannot_create(directory: str) -> bool:
    try:
        fd = os.open(os.path.join(directory, ".nncc-probe"), os.O_CREAT | os.O_WRONLY, 0o600)
    except OSError:
        return True
    os.close(fd)
    os.unlink(os.path.join(directory, ".nncc-probe"))
    return False


def test_unwritable_output_directory(tmp_path):
    directory = _unwritable_dir(tmp_path)
    before = listing(directory) if directory != pathlib.Path("/proc") else None
    result = nncc_cli("compile", FIXTURES / "mlp.onnx", "-o", directory / "m.nncc", *no_cache_flag(), check=False)
    assert result.returncode != 0
    assert "cannot write" in result.stderr and "Traceback" not in result.stderr
    assert not (directory / "m.nncc").exists()
    if before is not None:
        assert listing(directory) == before
        directory.chmod(0o755)


def test_missing_output_directory(tmp_path):
    result = nncc_cli("compile", FIXTURES / "mlp.onnx", "-o", tmp_path / "nope" / "m.nncc", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert listing(tmp_path) == []


def test_write_failure_midway_removes_the_temp_file(tmp_path, monkeypatch):
    compiled = nncc.compile_model(FIXTURES / "mlp.onnx")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(FileAccessError, match="No space left on device"):
        compiled.save(tmp_path / "m.nncc")
    assert listing(tmp_path) == []
    monkeypatch.undo()
    with pytest.raises(FileAccessError):
        compiled.save(tmp_path)  # a directory: the rename fails, the temp file goes
    assert listing(tmp_path) == []


# -- nncc inspect ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    """`nncc inspect` of resnet_block.onnx and of its compiled artifact, text and --json."""
    tmp = tmp_path_factory.mktemp("inspect")
    artifact = tmp / "resnet_block.nncc"
    nncc_cli("compile", FIXTURES / "resnet_block.onnx", "-o", artifact, *no_cache_flag())
    sources = {"onnx": FIXTURES / "resnet_block.onnx", "nncc": artifact}
    jobs = [(kind, fmt) for kind in sources for fmt in ("text", "json")]
    with ThreadPoolExecutor(2) as pool:
        results = pool.map(
            lambda job: nncc_cli("inspect", sources[job[0]], *(["--json"] if job[1] == "json" else []),
                                 env={"COLUMNS": "200"}),
            jobs)
    return {job: result.stdout for job, result in zip(jobs, results)}, sources


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["onnx", "nncc"])
def test_inspect_json_has_the_documented_keys(inspected, kind):
    outputs, sources = inspected
    report = json.loads(outputs[(kind, "json")])
    assert REPORT_KEYS <= set(report)
    assert report["path"] == str(sources[kind])
    assert report["format_version"] == 2 and report["producer"] == nncc.__version__
    assert report["options"]["preference"] == "fast-single-answer" and report["options"]["opt_level"] == 2
    assert report["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3, 32, 32]}]
    assert report["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [1, 10]}]
    compiled = nncc.compile_model(FIXTURES / "resnet_block.onnx")
    assert report["instructions"] == len(compiled.plan.instructions)
    assert sum(p["nodes"] for p in report["partitions"]) == report["instructions"]
    assert [(p["backend"], p["native"]) for p in report["partitions"]] == [("native", True)]
    assert report["native_code_bytes"] == len(compiled.plan.payloads["native"].data) > 0
    assert report["fallbacks"] == []
    assert report["peak_activation_bytes"] == compiled.plan.arena_bytes > 0
    constants = report["constants"]
    assert set(constants) == {"inline", "referenced", "splat"}
    total = sum(int(a.nbytes) for a in compiled.plan.constants.values())
    assert constants["inline"]["bytes"] + constants["referenced"]["bytes"] + constants["splat"]["expanded_bytes"] == total
    assert constants["referenced"]["count"] > 0
    assert report["artifact_bytes"] == len(compiled.to_bytes())


@pytest.mark.slow  # the inspected fixture compiles resnet_block natively three times
def test_inspect_onnx_and_artifact_agree(inspected):
    outputs, _ = inspected
    a, b = (json.loads(outputs[(kind, "json")]) for kind in ("onnx", "nncc"))
    a.pop("path"), b.pop("path")
    assert a.pop("signature") is None and b.pop("signature")["signed"]  # only a file has a signer
    assert a.pop("cache")["cached"] is False and b.pop("cache") is None  # compiled with --no-cache; a file runs as it is
    assert a == b


@pytest.mark.slow  # the inspected fixture compiles resnet_block natively three times
@pytest.mark.parametrize("kind", ["onnx", "nncc"])
def test_inspect_text(inspected, kind):
    outputs, sources = inspected
    text = outputs[(kind, "text")]
    report = json.loads(outputs[(kind, "json")])
    assert sources[kind].name in text
    assert f"{len(report['partitions'])} partition(s), {report['instructions']} instructions" in text
    assert "native" in text and "nncc_partition_0" in text
    assert "native code:" in text
    assert "peak activation memory:" in text
    assert "constants:" in text and "inline" in text and "referenced" in text
    assert "artifact size:" in text
    for op in report["partitions"][0]["ops"]:
        assert op in text


def test_inspect_text_lists_fallbacks():
    text = nncc_cli("inspect", FIXTURES / "mlp.onnx", env={"COLUMNS": "200"}).stdout
    assert "fallback node(s)" in text and "no static shape" in text


def test_artifact_gets_the_ordinary_file_mode(tmp_path):
    # a build output is a normal file: 0666 less the umask, not a private temp file's 0600
    import os
    import stat

    out = tmp_path / "mlp.nncc"
    nncc.compile_model(FIXTURES / "mlp.onnx").save(out)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
