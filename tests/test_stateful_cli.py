"""`nncc run --bind OUT=IN --steps N --inputs-per-step DIR` and `--output-dir DIR`."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import nncc
from tests.conftest import FIXTURES, ROOT
from tests.models import relu_model
from tests.oracle import ort_session

GRU = FIXTURES / "gru_cell.onnx"


def nncc_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_bound_steps_equal_separate_runs_fed_back_by_hand(tmp_path):
    steps = 12
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((steps, 1, 1, 16)).astype(np.float32)
    h0 = rng.standard_normal((1, 1, 32)).astype(np.float32)
    per_step = tmp_path / "steps"
    per_step.mkdir()
    for k, x in enumerate(xs):
        np.savez(per_step / f"step_{k:03d}.npz", x=x)
    np.save(tmp_path / "h0.npy", h0)
    result = nncc_cli("run", GRU, "--bind", "h_out=h_in", "--steps", steps, "--inputs-per-step", per_step,
                      "--input", f"h_in={tmp_path / 'h0.npy'}", "--output-dir", tmp_path / "out", "--json",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["steps"] == steps
    # the oracle: onnxruntime, one run per step, h_out fed back into h_in by hand
    session = ort_session(GRU)
    h = h0
    for x in xs:
        y, h = session.run(["y", "h_out"], {"x": x, "h_in": h})
    np.testing.assert_allclose(np.load(tmp_path / "out" / "h_out.npy"), h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), y, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_binding_errors_are_one_line(tmp_path):
    for args, needle in [
        (["--bind", "nope=h_in", "--steps", "2"], "no output 'nope'"),
        (["--bind", "h_out=nope", "--steps", "2"], "no input 'nope'"),
        (["--bind", "h_out", "--steps", "2"], "OUT=IN"),
        (["--inputs-per-step", tmp_path], "no .npz"),
    ]:
        result = nncc_cli("run", GRU, "--random-inputs", *args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("nncc: error:")]
        assert len(errors) == 1 and needle in errors[0], result.stderr
        assert "Traceback" not in result.stderr


def test_inputs_running_out_is_an_error(tmp_path):
    per_step = tmp_path / "steps"
    per_step.mkdir()
    np.savez(per_step / "step_000.npz", x=np.zeros((1, 1, 16), np.float32))
    result = nncc_cli("run", GRU, "--bind", "h_out=h_in", "--steps", 3, "--inputs-per-step", per_step,
                      cwd=tmp_path)
    assert result.returncode == 2 and "ran out after 1 of 3 steps" in result.stderr


@pytest.fixture
def big_relu(tmp_path):
    return relu_model(tmp_path / "big.onnx", [1024, 512], opset=17)


def test_large_outputs_are_written_in_place_through_a_memory_map(big_relu, tmp_path):
    from nncc.runtime.arrays_io import MAP_THRESHOLD, OutputDir

    model = nncc.compile_model(big_relu)
    x = np.random.default_rng(0).standard_normal((1024, 512)).astype(np.float32)
    with OutputDir(str(tmp_path / "out"), model) as targets:
        assert x.nbytes >= MAP_THRESHOLD and isinstance(targets.buffers["y"], np.memmap)
        outputs = model.run({"x": x}, outputs=targets.buffers)
        assert np.shares_memory(outputs["y"], targets.buffers["y"])  # no copy: the kernel wrote the map
        targets.finish(outputs)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), np.maximum(x, 0))
    assert sorted(os.listdir(tmp_path / "out")) == ["y.npy"]


def test_a_failed_run_leaves_no_partial_output_files(big_relu, tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((3, 3), np.float32))
    result = nncc_cli("run", big_relu, "--input", f"x={tmp_path / 'bad.npy'}", "--output-dir", tmp_path / "out",
                      cwd=tmp_path)
    assert result.returncode == 2 and "shape" in result.stderr
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
