"""Hostile files in place of models, artifacts, cache entries and external data: FIFOs,
links to /dev/zero, pipes. nncc never hangs on them and never reads without bound; what
is not a regular file is bad input (a model, an artifact) or a corrupt entry (the cache),
and a model read once from a pipe is read correctly.

Real processes: each `nncc` runs in a subprocess with its address space capped (so reading
/dev/zero without bound fails the test instead of filling the machine) and a timeout as a
safety net against a hang (the assertions are about exit codes and messages).
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import threading

import numpy as np
import pytest

from nncc.preparing.token import external_files
from nncc.errors import ModelFormatError
from nncc.frontend.onnx import load_model
from tests.conftest import FIXTURES
from tests.oracle import ort_session
from tests.test_cache import make_external_model
from tests.test_cli_errors import _env, assert_error

MLP = FIXTURES / "mlp.onnx"
MEMORY_CAP = 2 << 30  # bytes of address space for each nncc subprocess
SAFETY_TIMEOUT = 120  # seconds; only a hang comes near this


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def nncc(*args, cwd, cache_dir=None, stdin=None, input=None, extra_env=None) -> subprocess.CompletedProcess:
    # one BLAS thread: OpenBLAS reserves address space per thread, which on a many-core
    # machine would eat into MEMORY_CAP before nncc reads a byte
    env = _env() | {"OPENBLAS_NUM_THREADS": "1"} | (extra_env or {})
    if cache_dir is not None:
        env["NNCC_CACHE_DIR"] = str(cache_dir)
    result = subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], cwd=cwd, env=env,
                            stdin=stdin, input=input, capture_output=True, timeout=SAFETY_TIMEOUT,
                            preexec_fn=_cap_memory)
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    return result


def mlp_reference(x: np.ndarray) -> dict[str, np.ndarray]:
    sess = ort_session(MLP)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))


@pytest.fixture
def work(tmp_path) -> pathlib.Path:
    np.save(tmp_path / "x.npy", np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(3, 64))
    return tmp_path


def assert_mlp_outputs(npz: pathlib.Path, work: pathlib.Path) -> None:
    got = np.load(npz)
    want = mlp_reference(np.load(work / "x.npy"))
    assert sorted(got.files) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


# -- models and artifacts given on the command line -----------------------------------------


@pytest.mark.parametrize("command", [["run", "--random-inputs"], ["inspect"], ["compile", "-o", "out.nncc"]])
def test_a_device_as_the_model_is_refused(work, command):
    result = nncc(command[0], "/dev/zero", *command[1:], cwd=work)
    assert_error(result, "/dev/zero", "character device")


def test_a_fifo_without_a_writer_is_an_empty_model(work):
    os.mkfifo(work / "model.onnx")
    assert_error(nncc("run", "model.onnx", "--random-inputs", cwd=work), "model.onnx", "empty")


def test_bench_refuses_a_pipe_it_would_have_to_read_several_times(work):
    os.mkfifo(work / "model.onnx")
    assert_error(nncc("bench", "model.onnx", "--iterations", "2", cwd=work), "model.onnx", "pipe")


def test_a_model_from_a_pipe_is_read_once_and_correctly(work):
    result = nncc("run", "/dev/stdin", "--input", "x=x.npy", "-o", "out.npz", cwd=work,
                  input=MLP.read_bytes())
    assert result.returncode == 0, result.stderr
    assert_mlp_outputs(work / "out.npz", work)


@pytest.mark.slow
def test_an_artifact_from_a_fifo_is_read_once_and_correctly(work):
    assert nncc("compile", MLP, "-o", "mlp.nncc", cwd=work).returncode == 0
    os.mkfifo(work / "fifo")
    data = (work / "mlp.nncc").read_bytes()

    def writer():
        with open(work / "fifo", "wb") as f:  # blocks until nncc opens the FIFO
            f.write(data)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    result = nncc("run", "fifo", "--input", "x=x.npy", "-o", "out.npz", cwd=work)
    thread.join(timeout=SAFETY_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert_mlp_outputs(work / "out.npz", work)


@pytest.mark.slow  # a piped model is read once in the quick tier by test_a_model_from_a_pipe_is_read_once_and_correctly
def test_compile_reads_a_piped_model_once(work):
    result = nncc("compile", "/dev/stdin", "-o", "mlp.nncc", cwd=work, input=MLP.read_bytes())
    assert result.returncode == 0, result.stderr
    result = nncc("run", "mlp.nncc", "--input", "x=x.npy", "-o", "out.npz", cwd=work)
    assert result.returncode == 0, result.stderr
    assert_mlp_outputs(work / "out.npz", work)


# -- cache entries ----------------------------------------------------------------------------


def _entry_files(cache_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    files = {p.suffix: p for p in (cache_dir / "entries").rglob("*") if p.is_file()}
    assert sorted(files) == [".data", ".plan"], files
    return files


def _replace_with_fifo(path: pathlib.Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _replace_with_dev_zero(path: pathlib.Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".plan", ".data"])
@pytest.mark.parametrize("replace", [_replace_with_fifo, _replace_with_dev_zero], ids=["fifo", "dev-zero"])
def test_a_cache_file_that_is_not_a_regular_file_is_a_corrupt_entry(work, suffix, replace):
    cache = work / "cache"
    first = nncc("run", MLP, "--input", "x=x.npy", cwd=work, cache_dir=cache)
    assert first.returncode == 0 and "cache miss" in first.stderr, first.stderr
    replace(_entry_files(cache)[suffix])
    kind = "pipe" if replace is _replace_with_fifo else "character device"

    verify = nncc("cache", "verify", "--json", cwd=work, cache_dir=cache)
    assert verify.returncode == 1, verify.stderr
    findings = json.loads(verify.stdout)["findings"]
    corrupt = [f for f in findings if f["status"] == "CORRUPT"]
    assert len(corrupt) == 1 and kind in corrupt[0]["detail"], findings

    again = nncc("run", MLP, "--input", "x=x.npy", "-o", "out.npz", cwd=work, cache_dir=cache)
    assert again.returncode == 0, again.stderr
    warnings = [line for line in again.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "rejected" in warnings[0] and kind in warnings[0], again.stderr
    assert "recompiled" in again.stderr
    assert_mlp_outputs(work / "out.npz", work)
    assert nncc("cache", "verify", "--fix", cwd=work, cache_dir=cache).returncode in (0, 1)


# -- external data: the token follows the reader's rule -----------------------------------


def test_the_token_never_reads_external_data_the_reader_refuses(tmp_path):
    path = make_external_model(tmp_path / "m", 1.0)
    inside = tmp_path / "m" / "weights.bin"
    outside = tmp_path / "secret.bin"
    inside.rename(outside)
    inside.symlink_to(outside)  # a file in the folder, leading out of it
    data = path.read_bytes()
    with pytest.raises(ModelFormatError, match="leaves the model folder"):
        load_model(path)
    assert external_files(path, data) == []  # not hashed, so never read

    inside.unlink()
    (tmp_path / "m" / "real.bin").write_bytes(outside.read_bytes())
    inside.symlink_to("real.bin")  # a link that stays inside is followed, by both
    assert [rel for rel, _ in external_files(path, data)] == ["weights.bin"]
    load_model(path)


# -- index rows someone edited ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("column, value", [("plan_size", "abc"), ("data_size", 1.5), ("created", "yesterday"),
                                           ("last_used", b"\x00"), ("hits", -3)])
def test_edited_index_rows_are_corrupt_entries_never_a_crash(work, column, value):
    import sqlite3

    cache = work / "cache"
    for model in (MLP, FIXTURES / "resnet_block.onnx"):
        assert nncc("run", model, "--random-inputs", cwd=work, cache_dir=cache).returncode == 0
    db = sqlite3.connect(cache / "index.sqlite3")
    with db:
        token = db.execute("SELECT token FROM entries WHERE source_path LIKE '%mlp.onnx'").fetchone()[0]
        db.execute(f"UPDATE entries SET {column} = ? WHERE token = ?", (value, token))
    db.close()

    listing = nncc("cache", "ls", "--json", cwd=work, cache_dir=cache)
    assert listing.returncode == 0, listing.stderr
    assert [e["token"] for e in json.loads(listing.stdout)["entries"]] != [] and \
        token not in {e["token"] for e in json.loads(listing.stdout)["entries"]}
    assert "malformed index row" in listing.stderr and column in listing.stderr
    table = nncc("cache", "ls", "--sort", "size", cwd=work, cache_dir=cache)
    assert table.returncode == 0 and "resnet_block.onnx" in table.stdout, table.stderr
    assert nncc("cache", "info", cwd=work, cache_dir=cache).returncode == 0

    verify = nncc("cache", "verify", "--json", cwd=work, cache_dir=cache)
    assert verify.returncode == 1
    findings = json.loads(verify.stdout)["findings"]
    assert [(f["status"], f["token"]) for f in findings if f["status"] != "OK"] == [("CORRUPT", token)]
    assert any("malformed" in f["detail"] for f in findings)
    if column == "hits":  # one case also checks that --fix drops the row and its files
        assert nncc("cache", "verify", "--fix", cwd=work, cache_dir=cache).returncode == 0
        assert "malformed" not in nncc("cache", "ls", cwd=work, cache_dir=cache).stderr

    again = nncc("run", MLP, "--input", "x=x.npy", "-o", "out.npz", cwd=work, cache_dir=cache)
    assert again.returncode == 0, again.stderr  # the row is replaced by a fresh compile
    assert_mlp_outputs(work / "out.npz", work)
    assert nncc("cache", "verify", cwd=work, cache_dir=cache).returncode == 0


# -- input files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--input", "--inputs"])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_fifo_or_device_as_an_input_file_is_refused(work, option, special):
    if special == "fifo":
        os.mkfifo(work / "fifo")
    path = str(work / special) if special == "fifo" else special
    arg = f"x={path}" if option == "--input" else path
    result = nncc("run", MLP, option, arg, cwd=work)
    assert_error(result, path, "pipe" if special == "fifo" else "character device")


def test_an_npz_member_declaring_terabytes_is_refused_before_inflating(work):
    """A 64 KiB compressed member whose .npy header declares 2**40 float32 values."""
    import zipfile

    with zipfile.ZipFile(work / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_2_0(member, {"descr": "<f4", "fortran_order": False,
                                                          "shape": (2**40,)})
            for _ in range(64):
                member.write(bytes(1 << 20))
    assert (work / "bomb.npz").stat().st_size < 1 << 20
    assert_error(nncc("run", MLP, "--inputs", "bomb.npz", cwd=work), "bomb.npz", "'x.npy'", "nncc may allocate")
