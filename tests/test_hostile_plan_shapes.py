"""Artifacts whose declared shapes contradict their operators are bad input, found before
anything is sized by them: no arena, no dense copy of a broadcast constant, no random
input. The memory bound is raised (NNCC_MAX_MEMORY) so that only this check can stop
them, and each nncc runs with its address space capped below the sizes declared, so an
allocation made before the check ends in a different message (or a crash), failing the test.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from nncc.compiler import CompileOptions, compile_graph
from nncc.frontend.onnx import load_model
from nncc.runtime.plan_shapes import check_plan_shapes
from tests.conftest import FIXTURES
from tests.test_cli_errors import _env
from tests.test_hostile_inputs import _artifact, _slot, _splat_of_3_gib

CAP = 1 << 30  # bytes of address space: below the 3 GiB constant and the 1 GiB input


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def run_capped(*args, cwd) -> subprocess.CompletedProcess:
    env = _env() | {"OPENBLAS_NUM_THREADS": "1", "NNCC_MAX_MEMORY": "1T"}
    return subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=_capped)


def _input_of_1_gib(program):
    """Input x ([N, 64] float32) declared [2**22, 63]: 1 GiB, and too narrow for the
    first Gemm's weights."""
    program["slots"][_slot(program, "x")][2] = [2**22, 63]


@pytest.mark.parametrize("edit,fragments", [
    (_splat_of_3_gib, ["n_Gemm_0", "C (805306368,) does not broadcast to (N, 128)"]),
    (_input_of_1_gib, ["n_Gemm_0", "inner dimensions differ", "A (4194304, 63)"]),
], ids=["broadcast constant of 3 GiB", "input of 1 GiB"])
def test_contradicting_shapes_are_bad_input_before_allocating(tmp_path, edit, fragments):
    path = _artifact(tmp_path / "hostile.nncc", edit)
    assert path.stat().st_size < 100_000
    result = run_capped("run", path, "--random-inputs", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nncc: error: ") and "hostile.nncc" in lines[0]
    assert "declared shapes contradict its operators" in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_the_same_artifact_unedited_runs_under_the_cap(tmp_path):
    """The cap leaves room for nncc itself: the check, not the cap, stops the ones above."""
    path = _artifact(tmp_path / "mlp.nncc", lambda program: None)
    result = run_capped("run", path, "--random-inputs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_random_input_beyond_the_memory_available_is_bad_input(tmp_path):
    """Consistent shapes, a 1 GiB input within NNCC_MAX_MEMORY but beyond the process's
    memory: a limit (exit 2), not a MemoryError."""
    path = _artifact(tmp_path / "wide.nncc", lambda p: p["slots"][_slot(p, "x")].__setitem__(2, [2**22, 64]))
    result = run_capped("run", path, "--random-inputs", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "nncc: error: the random input 'x' of shape [4194304, 64] needs more memory than is available "
        "(hint: raise the bound with NNCC_MAX_MEMORY=SIZE if the machine really has the memory)"]


@pytest.mark.parametrize("fixture", ["mlp", "mobilenet", "resnet_block", "shape_ops", "transformer",
                                     "gru_cell"])
def test_plans_nncc_compiles_pass_the_check(fixture):
    """Portable plans (the native backend builds nothing the check reads): fused kernels,
    symbolic dimensions, shape arithmetic and a recurrent cell all agree with themselves."""
    check_plan_shapes(compile_graph(load_model(FIXTURES / f"{fixture}.onnx"), CompileOptions(backends=("numpy",))))
