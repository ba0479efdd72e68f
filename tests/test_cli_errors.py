"""The real `nncc run` CLI, in subprocesses: bad input gives one clear line, never a
traceback; good input gives JSON and .npz files that load back.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.models import relu_model

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NNCC_DEBUG", None)  # the debugging switch would show tracebacks on purpose
    # Import nncc from this checkout whatever the working directory and the install state.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def nncc(*args, cwd) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "nncc", *map(str, args)],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


# `run` reports what the compilation cache did in one informational "nncc: cache ..." line
# on stderr before anything can fail, and --random-inputs which symbolic dimensions it set
# to 1; those lines are allowed, no other noise is.
INFO_LINE = re.compile(r"^nncc: (cache (hit|miss|entry|unavailable|disabled)\b|random inputs: )")


def _split_stderr(result: subprocess.CompletedProcess) -> list[str]:
    lines = result.stderr.splitlines()
    while lines and INFO_LINE.match(lines[0]):
        lines.pop(0)
    return lines


def assert_error(result: subprocess.CompletedProcess, *fragments: str, code: int = 2) -> str:
    """Exactly one line on stderr, 'nncc: error: ...' naming every fragment (after at most
    the cache report); nothing on stdout."""
    lines = _split_stderr(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nncc: error: "), lines[0]
    assert len(result.stderr.splitlines()) <= 3, result.stderr  # the error after at most two info lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert result.returncode == code, (result.returncode, lines[0])
    assert result.stdout == ""
    return lines[0]


def assert_usage_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """A usage error (click found the command line wrong): like every user error one line
    'nncc: error: ...', here with a hint naming the --help to read; exit code 2."""
    line = assert_error(result, *fragments, code=2)
    assert re.search(r"\(hint: see 'nncc [a-z ]*--help'\)$", line), line


# -- models and files -----------------------------------------------------------------------------


def save(model: onnx.ModelProto, path: pathlib.Path) -> pathlib.Path:
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def work(tmp_path: pathlib.Path) -> pathlib.Path:
    relu_model(tmp_path / "relu.onnx")
    np.save(tmp_path / "x.npy", np.array([[-1, 0, 1], [2, -3, 4]], np.float32))
    return tmp_path


def test_relu_is_registered():
    from nncc.kernels.registry import registered_ops

    assert any(op == "Relu" and domain == "" for domain, op, _ in registered_ops())


# -- model files ---------------------------------------------------------------------------------------


def test_missing_model_file(work):
    assert_error(nncc("run", "nope.onnx", "--random-inputs", cwd=work), "nope.onnx")


def test_model_is_a_directory(work):
    (work / "models").mkdir()
    assert_error(nncc("run", "models", cwd=work), "models", "directory")


@pytest.mark.parametrize("content", [
    b"hello, this is a text file\nnot a model\n",
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10",
    b"",
    b"\x00" * 64,
    b"\xff" * 64,
    b"PK\x03\x04" + b"\x00" * 30,  # a zip (e.g. an .npz) passed as a model
], ids=["text", "png", "empty", "zeros", "ff", "zip"])
@pytest.mark.slow
def test_not_an_onnx_file(work, content):
    (work / "bad.onnx").write_bytes(content)
    line = assert_error(nncc("run", "bad.onnx", "--random-inputs", cwd=work), "bad.onnx")
    assert "ONNX" in line


@pytest.mark.slow
@pytest.mark.parametrize("keep", [0.25, 0.5, 0.9])
def test_truncated_model(work, keep):
    data = (work / "relu.onnx").read_bytes()
    (work / "cut.onnx").write_bytes(data[: int(len(data) * keep)])
    assert_error(nncc("run", "cut.onnx", "--random-inputs", cwd=work), "cut.onnx",
                 "not a valid ONNX model")


def test_truncated_light_model(work):
    from tests.conftest import light_models_dir

    data = (light_models_dir() / "light_squeezenet.onnx").read_bytes()
    (work / "sq.onnx").write_bytes(data[: len(data) // 3])
    assert_error(nncc("run", "sq.onnx", "--random-inputs", cwd=work), "sq.onnx")


def test_unknown_op_names_op_domain_and_opset(work):
    graph = helper.make_graph(
        [helper.make_node("FooBar", ["x"], ["y"], domain="com.example")], "foo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 3)])
    save(model, work / "foo.onnx")
    assert_error(nncc("run", "foo.onnx", "--random-inputs", cwd=work),
                 "FooBar", "com.example", "opset 3")


def test_external_data_escaping_the_folder(work):
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2])
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", "../secret.bin"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["w"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [t])
    save(helper.make_model(graph), work / "ext.onnx")
    assert_error(nncc("run", "ext.onnx", cwd=work), "../secret.bin", "leaves the model folder")


# -- inputs -------------------------------------------------------------------------------------------


def test_missing_input_is_named(work):
    assert_error(nncc("run", "relu.onnx", cwd=work), "missing input 'x'", "float32[2,3]")


def test_wrong_input_shape(work):
    np.save(work / "x33.npy", np.zeros((3, 3), np.float32))
    line = assert_error(nncc("run", "relu.onnx", "-i", "x=x33.npy", cwd=work), "'x'")
    assert "[3,3]" in line and "[2,3]" in line
    assert line.index("[3,3]") < line.index("expected") < line.index("[2,3]")


def test_wrong_input_rank(work):
    np.save(work / "x6.npy", np.zeros(6, np.float32))
    assert_error(nncc("run", "relu.onnx", "-i", "x=x6.npy", cwd=work), "'x'", "[6]", "[2,3]")


def test_wrong_input_dtype(work):
    np.save(work / "x64.npy", np.zeros((2, 3), np.float64))
    line = assert_error(nncc("run", "relu.onnx", "--input", "x=x64.npy", cwd=work), "'x'",
                        "float64", "float32")
    assert line.index("float64") < line.index("expected") < line.index("float32")


def test_unreadable_npy(work):
    (work / "junk.npy").write_bytes(b"\x93NUMPY\x01\x00garbage garbage garbage")
    assert_error(nncc("run", "relu.onnx", "-i", "x=junk.npy", cwd=work), "junk.npy")
    (work / "random.npy").write_bytes(os.urandom(200))
    assert_error(nncc("run", "relu.onnx", "-i", "x=random.npy", cwd=work), "random.npy")
    (work / "empty.npy").write_bytes(b"")
    assert_error(nncc("run", "relu.onnx", "-i", "x=empty.npy", cwd=work), "empty.npy")


def test_truncated_npy(work):
    np.save(work / "big.npy", np.zeros((2, 3), np.float32))
    data = (work / "big.npy").read_bytes()
    (work / "short.npy").write_bytes(data[:-8])
    assert_error(nncc("run", "relu.onnx", "-i", "x=short.npy", cwd=work), "short.npy")


def test_missing_npy(work):
    assert_error(nncc("run", "relu.onnx", "-i", "x=absent.npy", cwd=work), "absent.npy")


class _Trap:
    """Unpickling this creates a marker file: proof that nncc unpickled user data."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_object_npy_is_refused_never_unpickled(work):
    marker = work / "UNPICKLED"
    array = np.empty(2, dtype=object)
    array[:] = [_Trap(str(marker)), None]
    np.save(work / "obj.npy", array, allow_pickle=True)
    assert not marker.exists()
    assert_error(nncc("run", "relu.onnx", "-i", "x=obj.npy", cwd=work), "obj.npy")
    assert not marker.exists()
    np.savez(work / "obj.npz", x=array)
    assert_error(nncc("run", "relu.onnx", "--inputs", "obj.npz", cwd=work), "obj.npz")
    assert not marker.exists()


def test_npz_passed_as_npy_and_npy_as_npz(work):
    np.savez(work / "feeds.npz", x=np.zeros((2, 3), np.float32))
    assert_error(nncc("run", "relu.onnx", "-i", "x=feeds.npz", cwd=work), "feeds.npz", "--inputs")
    assert_error(nncc("run", "relu.onnx", "--inputs", "x.npy", cwd=work), "x.npy", "--input")


def test_unreadable_npz(work):
    (work / "junk.npz").write_bytes(b"PK\x03\x04 not really a zip")
    assert_error(nncc("run", "relu.onnx", "--inputs", "junk.npz", cwd=work), "junk.npz")


@pytest.mark.parametrize("spec", ["x", "x.npy", "=x.npy", "x="])
def test_input_spec_without_name_or_file(work, spec):
    assert_usage_error(nncc("run", "relu.onnx", "--input", spec, cwd=work), "--input", spec)


@pytest.mark.slow
def test_unknown_input_name(work):
    assert_error(nncc("run", "relu.onnx", "-i", "z=x.npy", cwd=work), "'z'", "x")
    np.savez(work / "extra.npz", x=np.zeros((2, 3), np.float32), bogus=np.zeros(1))
    assert_error(nncc("run", "relu.onnx", "--inputs", "extra.npz", cwd=work), "'bogus'")


@pytest.mark.parametrize("args", [
    ["--bogus"],
    ["--seed", "abc", "--random-inputs"],
    ["--input"],
])
def test_bad_flags_are_usage_errors(work, args):
    assert_usage_error(nncc("run", "relu.onnx", *args, cwd=work))


def test_no_model_argument(work):
    assert_usage_error(nncc("run", cwd=work), "MODEL")


def test_unknown_command(work):
    assert_usage_error(nncc("frobnicate", cwd=work), "frobnicate")


# -- happy path and outputs ------------------------------------------------------------------------


def test_random_inputs_json(work):
    result = nncc("run", "relu.onnx", "--random-inputs", "--json", cwd=work)
    assert result.returncode == 0, result.stderr
    assert _split_stderr(result) == [], result.stderr
    payload = json.loads(result.stdout)
    assert payload["model"] == "relu.onnx"
    [output] = payload["outputs"]
    assert output["name"] == "y"
    assert output["shape"] == [2, 3]
    assert output["dtype"] == "float32"
    assert output["min"] >= 0


@pytest.mark.slow
def test_random_inputs_are_seeded(work):
    runs = [json.loads(nncc("run", "relu.onnx", "--random-inputs", "--json", "--seed", s,
                            cwd=work).stdout)["outputs"] for s in ("1", "1", "2")]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_output_npz(work):
    result = nncc("run", "relu.onnx", "-i", "x=x.npy", "--output", "out.npz", "--json", cwd=work)
    assert result.returncode == 0, result.stderr
    with np.load(work / "out.npz", allow_pickle=False) as archive:
        assert archive.files == ["y"]
        y = archive["y"]
    x = np.load(work / "x.npy")
    assert y.dtype == np.float32 and y.shape == (2, 3)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert not list(work.glob(".nncc-*"))  # no temporary left behind


@pytest.mark.slow
def test_output_named_like_savez_arguments(work):
    """Regression: np.savez(f, **outputs) broke on outputs named 'file' or 'allow_pickle'."""
    for name in ("file", "allow_pickle"):
        relu_model(work / f"{name}.onnx", output=name)
        result = nncc("run", f"{name}.onnx", "--random-inputs", "-o", f"{name}.npz", cwd=work)
        assert result.returncode == 0, result.stderr
        with np.load(work / f"{name}.npz") as archive:
            assert archive.files == [name]


def test_human_readable_output(work):
    result = nncc("run", "relu.onnx", "-i", "x=x.npy", cwd=work)
    assert result.returncode == 0, result.stderr
    assert "y" in result.stdout and "float32" in result.stdout


@pytest.mark.parametrize("bad", [
    ["-i", "x=missing.npy"],
    ["-i", "z=x.npy"],
    [],  # missing input
])
@pytest.mark.slow
def test_failing_run_writes_no_output(work, bad):
    result = nncc("run", "relu.onnx", *bad, "--output", "out.npz", cwd=work)
    assert result.returncode == 2
    assert not (work / "out.npz").exists()
    assert not list(work.glob(".nncc-*"))
    # and an existing file is left exactly as it was
    (work / "out.npz").write_bytes(b"previous contents")
    nncc("run", "relu.onnx", *bad, "--output", "out.npz", cwd=work)
    assert (work / "out.npz").read_bytes() == b"previous contents"


def test_output_into_missing_folder(work):
    assert_error(nncc("run", "relu.onnx", "--random-inputs", "-o", "no/such/dir/out.npz", cwd=work),
                 "no/such/dir/out.npz")


def test_save_npz_failure_mid_write_leaves_nothing(tmp_path):
    from nncc.runtime.arrays_io import save_npz

    class Exploding:
        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("boom")

    target = tmp_path / "out.npz"
    with pytest.raises(RuntimeError, match="boom"):
        save_npz(str(target), {"a": np.ones(3), "b": Exploding()})
    assert list(tmp_path.iterdir()) == []
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        save_npz(str(target), {"a": np.ones(3), "b": Exploding()})
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]


# -- start-up cost -------------------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


HEAVY = ("numpy", "rich", "onnx", "onnxruntime")


def test_cli_import_defers_heavy_modules():
    code = (
        "import sys, json\n"
        "import nncc.cli.main\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["--version"]])
def test_help_and_version_stay_light(argv):
    code = (
        "import sys, json\n"
        "from nncc.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]), file=sys.stderr)\n"
    )
    result = _python(code)
    code, loaded = json.loads(result.stderr.strip().splitlines()[-1])
    assert code == 0
    assert loaded == []


def test_cli_import_loads_only_the_standard_library_click_and_nncc():
    """What keeps a command's start-up short, checked by what is imported rather than by a
    clock: every module `import nncc.cli.main` adds is the standard library's, click's or
    nncc's own (a third-party import would cost its own start-up on every command)."""
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import nncc.cli.main\n"
        "added = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(json.dumps(sorted(m for m in added if m not in sys.stdlib_module_names)))\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["click", "nncc"]
