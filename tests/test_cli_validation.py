"""Arguments checked before any work, --dim on every command, warnings where nncc used to
stay silent, and messages that say what is wrong, with which file or tensor, and what to do.

The real `nncc` in subprocesses (helpers from test_cli_errors); models made with
onnx.helper; outputs compared with onnxruntime.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.models import relu_model
from tests.oracle import ort_outputs
from tests.test_cli_errors import assert_error, assert_usage_error, nncc, save


def cache_files() -> list[str]:
    """Every file in the test's cache directory (conftest gives each test its own): empty
    as long as nothing was compiled and stored."""
    root = os.environ["NNCC_CACHE_DIR"]
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def only_line(result) -> str:
    """The single stderr line of a command that failed before doing anything (not even a
    cache report)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def warnings(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("nncc: warning: ")]


def dynamic_model(path: pathlib.Path, opset: int = 17) -> pathlib.Path:
    """y = Relu(x @ W) + 1 with x [N, 4]: one symbolic dimension, several nodes."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "W")
    one = numpy_helper.from_array(np.ones(3, np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
         helper.make_node("Relu", ["m"], ["r"], name="relu"),
         helper.make_node("Add", ["r", "one"], ["y"], name="add")],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [w, one],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)


@pytest.fixture
def work(tmp_path: pathlib.Path) -> pathlib.Path:
    relu_model(tmp_path / "relu.onnx")
    dynamic_model(tmp_path / "dyn.onnx")
    np.save(tmp_path / "x.npy", np.array([[-1, 0, 1], [2, -3, 4]], np.float32))
    return tmp_path


# -- every argument is checked before compiling --------------------------------------------------


@pytest.mark.parametrize("args, fragments", [
    (["run", "relu.onnx", "--input", "x"], ["--input", "'x'"]),
    (["run", "relu.onnx", "--input", "x=missing.npy"], ["missing.npy", "no such file"]),
    (["run", "relu.onnx", "--random-inputs", "-o", "nodir/out.npz"], ["nodir/out.npz", "nodir does not exist"]),
    (["run", "relu.onnx", "--input", "x=notes.npy"], ["notes.npy", "text"]),
    (["run", "relu.onnx", "--random-inputs", "--steps", "3"], ["--steps", "--bind"]),
    (["run", "dyn.onnx", "--random-inputs", "--dim", "N"], ["--dim", "NAME=SIZE"]),
    (["compile", "relu.onnx", "-o", "nodir/x.nncc"], ["nodir/x.nncc", "nodir does not exist"]),
    (["compile", "relu.onnx", "-o", "x.nncc", "--depfile", "nodir/x.d"], ["nodir/x.d"]),
    (["compile", "relu.onnx", "-o", "."], ["directory"]),
])
@pytest.mark.slow
def test_bad_arguments_fail_before_any_compile(work, args, fragments):
    (work / "notes.npy").write_text("1 2 3\n4 5 6\n")
    result = nncc(*args, cwd=work)
    line = only_line(result)  # no "nncc: cache miss ... compiled" line before it
    assert line.startswith("nncc: error: ") and result.returncode == 2, result.stderr
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    assert cache_files() == [], "the model was compiled before the bad argument was noticed"


@pytest.mark.slow
def test_the_cache_check_would_see_a_compile(work):
    """The control for the test above: a good command does fill the cache."""
    assert nncc("run", "relu.onnx", "-i", "x=x.npy", cwd=work).returncode == 0
    assert cache_files()


# -- --dim on run, compile and inspect -----------------------------------------------------------


@pytest.mark.slow
def test_run_dim_fixes_the_size_and_matches_onnxruntime(work):
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.save(work / "x5.npy", x)
    result = nncc("run", "dyn.onnx", "--dim", "N=5", "-i", "x=x5.npy", "-o", "out.npz", cwd=work)
    assert result.returncode == 0, result.stderr
    expected = ort_outputs(work / "dyn.onnx", {"x": x})["y"]
    with np.load(work / "out.npz") as out:
        np.testing.assert_allclose(out["y"], expected, rtol=1e-5, atol=1e-6)
    # the model was compiled for N=5: another size is refused, naming the input and shapes
    np.save(work / "x3.npy", x[:3])
    assert_error(nncc("run", "dyn.onnx", "--dim", "N=5", "-i", "x=x3.npy", cwd=work), "'x'", "5")


@pytest.mark.slow
def test_random_inputs_take_the_dim_size_and_say_which_stay_at_one(work):
    sized = nncc("run", "dyn.onnx", "--random-inputs", "--dim", "N=6", "--json", cwd=work)
    assert sized.returncode == 0, sized.stderr
    assert json.loads(sized.stdout)["outputs"][0]["shape"] == [6, 3]
    assert "set to 1" not in sized.stderr
    default = nncc("run", "dyn.onnx", "--random-inputs", "--json", cwd=work)
    assert json.loads(default.stdout)["outputs"][0]["shape"] == [1, 3]
    said = [line for line in default.stderr.splitlines() if "set to 1" in line]
    assert len(said) == 1 and " N " in said[0] and "--dim" in said[0], default.stderr
    quiet = nncc("run", "dyn.onnx", "--random-inputs", "-q", cwd=work)
    assert "set to 1" not in quiet.stderr  # a status line: --quiet hides it


@pytest.mark.slow
def test_compile_dim_makes_a_static_artifact(work):
    assert nncc("compile", "dyn.onnx", "--dim", "N=2", "-o", "dyn2.nncc", cwd=work).returncode == 0
    report = json.loads(nncc("inspect", "dyn2.nncc", "--json", cwd=work).stdout)
    assert report["inputs"][0]["shape"] == [2, 4] and report["outputs"][0]["shape"] == [2, 3]
    assert report["options"]["dims"] == {"N": 2}
    assert_usage_error(nncc("inspect", "dyn2.nncc", "--dim", "N=3", cwd=work), "--dim", "dyn2.nncc")
    x = np.array([[1, -2, 3, -4], [0.5, 0.25, -1, 2]], np.float32)
    np.save(work / "x2.npy", x)
    result = nncc("run", "dyn2.nncc", "-i", "x=x2.npy", "-o", "out.npz", cwd=work)
    assert result.returncode == 0, result.stderr
    with np.load(work / "out.npz") as out:
        np.testing.assert_allclose(out["y"], ort_outputs(work / "dyn.onnx", {"x": x})["y"], rtol=1e-5)


@pytest.mark.slow
def test_a_different_dim_is_a_different_cache_entry(work):
    for size in ("2", "3", "2"):
        assert nncc("run", "dyn.onnx", "--random-inputs", "--dim", f"N={size}", cwd=work).returncode == 0
    entries = json.loads(nncc("cache", "ls", "--json", cwd=work).stdout)["entries"]
    assert len(entries) == 2


@pytest.mark.parametrize("command", [
    ["run", "dyn.onnx", "--random-inputs"],
    ["compile", "dyn.onnx", "-o", "out.nncc"],
    ["inspect", "dyn.onnx"],
])
@pytest.mark.slow
def test_unknown_dim_names_are_errors_naming_the_real_ones(work, command):
    line = assert_error(nncc(*command, "--dim", "batch=4", cwd=work), "'batch'", "'N'")
    assert not [f for f in cache_files() if f"{os.sep}entries{os.sep}" in f]  # nothing stored
    assert not (work / "out.nncc").exists()
    assert "(in x)" in line  # which input uses N


@pytest.mark.slow
def test_unknown_dim_on_an_artifact_and_a_static_model(work):
    assert nncc("compile", "dyn.onnx", "-o", "dyn.nncc", cwd=work).returncode == 0
    assert_error(nncc("run", "dyn.nncc", "--random-inputs", "--dim", "M=2", cwd=work), "'M'", "'N'")
    assert_error(nncc("run", "relu.onnx", "--random-inputs", "--dim", "N=2", cwd=work), "'N'", "static")


def test_bench_checks_dim_names(work):
    result = nncc("bench", "dyn.onnx", "-n", "1", "--warmup", "0", "--dim", "M=2", cwd=work)
    assert result.returncode == 2
    assert "'M'" in result.stderr and "'N'" in result.stderr


# -- warnings instead of silence -------------------------------------------------------------------


@pytest.mark.slow
def test_bench_threads_beyond_the_cpus_warns(work):
    cpus = len(os.sched_getaffinity(0))
    over = nncc("bench", "relu.onnx", "-n", "1", "--warmup", "0", "--threads", str(cpus + 1), "--json", cwd=work)
    assert over.returncode == 0, over.stderr
    said = [w for w in warnings(over) if "--threads" in w]
    assert len(said) == 1 and f"--threads {cpus + 1}" in said[0] and str(cpus) in said[0], over.stderr
    fits = nncc("bench", "relu.onnx", "-n", "1", "--warmup", "0", "--threads", str(cpus), "--json", cwd=work)
    assert not [w for w in warnings(fits) if "--threads" in w], fits.stderr


@pytest.mark.slow
def test_compile_options_on_an_artifact_are_named_in_a_warning(work):
    assert nncc("compile", "relu.onnx", "-o", "relu.nncc", "--backend", "numpy", cwd=work).returncode == 0
    run = nncc("run", "relu.nncc", "-i", "x=x.npy", "-O", "1", "--preference", "low-power", cwd=work)
    assert run.returncode == 0, run.stderr
    said = [w for w in warnings(run) if "ignored" in w]
    assert len(said) == 1 and "-O" in said[0] and "--preference" in said[0] and "relu.nncc" in said[0]
    inspect = nncc("inspect", "relu.nncc", "-O", "0", "--json", cwd=work)
    assert [w for w in warnings(inspect) if "-O ignored" in w], inspect.stderr
    plain = nncc("run", "relu.nncc", "-i", "x=x.npy", cwd=work)
    assert not [w for w in warnings(plain) if "ignored" in w], plain.stderr


@pytest.mark.slow
def test_a_newer_opset_than_nncc_knows_is_a_warning(work):
    from nncc.ir.opsets import KNOWN_OPSETS

    newest = KNOWN_OPSETS[""]
    dynamic_model(work / "newer.onnx", opset=newest + 1)
    for command in (["run", "newer.onnx", "--random-inputs"], ["inspect", "newer.onnx"]):
        result = nncc(*command, cwd=work)
        assert result.returncode == 0, result.stderr
        said = [w for w in warnings(result) if "opset" in w]
        assert len(said) == 1 and f"opset {newest + 1}" in said[0] and str(newest) in said[0], result.stderr
    again = nncc("run", "newer.onnx", "--random-inputs", cwd=work)  # a cache hit says it too
    assert "cache hit" in again.stderr and [w for w in warnings(again) if "opset" in w]
    current = nncc("run", "dyn.onnx", "--random-inputs", cwd=work)
    assert not [w for w in warnings(current) if "opset" in w]


def test_known_opsets_match_the_onnx_release_that_tests_them():
    """KNOWN_OPSETS says which opsets nncc implements; the installed onnx's newest schemas
    are the reference they are kept in step with."""
    import onnx.defs

    from nncc.ir.opsets import KNOWN_OPSETS

    newest: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        newest[schema.domain] = max(newest.get(schema.domain, 0), schema.since_version)
    assert KNOWN_OPSETS == newest


# -- inspect on a dynamic model ----------------------------------------------------------------------


@pytest.mark.slow
def test_inspect_groups_fallback_reasons_and_does_not_claim_a_peak(work):
    report = json.loads(nncc("inspect", "dyn.onnx", "--json", cwd=work).stdout)
    count = len(report["fallbacks"])  # each node is still in the JSON
    assert count >= 2
    assert [g["nodes"] for g in report["fallback_groups"]] == [count]
    assert report["dynamic_values"] > 0
    text = nncc("inspect", "dyn.onnx", cwd=work).stdout
    flat = " ".join(text.split())
    assert flat.count("no static shape") == 1, text
    assert f"{count} nodes:" in flat
    assert "peak activation memory: unknown for dynamic shapes" in flat, text
    assert "peak activation memory: 0 B" not in flat
    assert "--dim" in flat  # what to do about it
    verbose = " ".join(nncc("inspect", "dyn.onnx", "-v", cwd=work).stdout.split())
    assert verbose.count("no static shape") == 1 + count  # -v lists each node too
    fixed = " ".join(nncc("inspect", "dyn.onnx", "--dim", "N=8", cwd=work).stdout.split())
    assert "no static shape" not in fixed and "unknown" not in fixed
    assert "peak activation memory:" in fixed


# -- messages that said the wrong thing --------------------------------------------------------------


@pytest.mark.slow
def test_text_file_given_as_npy(work):
    (work / "notes.npy").write_text("1 2 3\n4 5 6\n")
    line = assert_error(nncc("run", "relu.onnx", "-i", "x=notes.npy", cwd=work), "notes.npy", "text")
    assert "pickle" not in line and "numpy.save" in line
    line = assert_error(nncc("run", "relu.onnx", "--inputs", "notes.npy", cwd=work), "notes.npy")
    assert "pickle" not in line


def test_missing_external_data_points_at_the_model_folder(work):
    folder = work / "models"
    folder.mkdir()
    model = dynamic_model(work / "tmp.onnx")
    loaded = onnx.load(str(model))
    onnx.save(loaded, str(folder / "ext.onnx"), save_as_external_data=True, location="ext.weights",
              size_threshold=0)
    (folder / "ext.weights").rename(work / "ext.weights")  # beside the working directory, not the model
    line = assert_error(nncc("run", "models/ext.onnx", "--random-inputs", cwd=work), "ext.weights")
    assert "working directory" in line and str(folder) in line
    assert "relative paths start at" not in line


@pytest.mark.slow
def test_bind_of_mismatched_shapes_names_both_and_what_fits(work):
    graph = helper.make_graph(
        [helper.make_node("Concat", ["h_in", "x"], ["h_out"], axis=2),
         helper.make_node("Relu", ["h_in"], ["s_out"])], "state",
        [helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, 16, 16]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16])],
        [helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, 16, 32]),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [1, 16, 16])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), work / "state.onnx")
    line = assert_error(nncc("run", "state.onnx", "--random-inputs", "--bind", "h_out=x", cwd=work),
                        "--bind h_out=x", "'h_out'", "[1, 16, 32]", "'x'", "[1, 16, 16]", "dimension 2")
    assert "roles" not in line
    # the hint names the inputs that would fit: here h_in and x fit s_out, none fits h_out
    assert "has none" in line
    ok = nncc("run", "state.onnx", "--random-inputs", "--bind", "s_out=h_in", "--steps", "2", cwd=work)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow
def test_a_damaged_artifact_names_its_file(work):
    assert nncc("compile", "relu.onnx", "-o", "relu.nncc", "--backend", "numpy", cwd=work).returncode == 0
    data = bytearray((work / "relu.nncc").read_bytes())
    at = data.index(b'"kernels"') + 2
    data[at] ^= 0x01  # one bit of the program section: its checksum fails
    (work / "bad.nncc").write_bytes(bytes(data))
    for command in (["run", "bad.nncc", "--random-inputs"], ["inspect", "bad.nncc"]):
        line = assert_error(nncc(*command, cwd=work), "bad.nncc", "checksum")
        assert "compile" in line  # what to do
    import nncc as api
    from nncc.errors import PlanFormatError

    with pytest.raises(PlanFormatError, match="bad.nncc"):
        api.load(work / "bad.nncc")


@pytest.mark.parametrize("backends", [("numpy",), ("native", "numpy")])
def test_wrong_output_buffer_is_named_never_broadcast(work, backends):
    import nncc as api
    from nncc.errors import InputError

    model = api.compile_model(work / "dyn.onnx", backends=backends)
    x = np.array([[1, -2, 3, -4], [0.5, 0.25, -1, 2]], np.float32)
    for shape in [(5, 3), (2, 4), (3,), (1, 3)]:  # (1, 3) would broadcast a [2, 3] result... or take one
        with pytest.raises(InputError) as caught:
            model.run({"x": x}, outputs={"y": np.empty(shape, np.float32)})
        assert "'y'" in str(caught.value) and "[2, 3]" in str(caught.value) and "broadcast" not in str(caught.value)
        assert caught.value.hint and "outputs=" in caught.value.hint
    one = x[:1]
    buffer = np.full((2, 3), 7.0, np.float32)  # a [1, 3] result must not be spread over it
    with pytest.raises(InputError, match=r"\[1, 3\]"):
        model.run({"x": one}, outputs={"y": buffer})
    good = np.empty((2, 3), np.float32)
    model.run({"x": x}, outputs={"y": good})
    np.testing.assert_allclose(good, ort_outputs(work / "dyn.onnx", {"x": x})["y"], rtol=1e-5)
