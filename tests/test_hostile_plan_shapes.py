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

import numpy as np
import pytest

from nncc.compiler import CompileOptions, compile_graph
from nncc.frontend.onnx import load_model
from nncc.runtime.plan_shapes import check_plan_shapes
from tests.conftest import FIXTURES
from tests.test_cli_errors import _env
from tests.test_hostile_inputs import _artifact, _slot, _splat_of_3_gib

HUGE = 3 * 2**28  # elements: 3 GiB of float32

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


def _splat(program, slot: int, count: int = HUGE) -> None:
    """Slot ``slot`` declared 1-D of ``count`` elements; a constant becomes one stored value."""
    program["slots"][slot][2] = [count]
    entry = next((c for c in program["constants"] if c[0] == slot), None)
    if entry is not None:
        entry[1:] = ["splat", 0, np.dtype(program["slots"][slot][1]).itemsize]


def test_a_fused_products_bias_of_3_gib_is_bad_input_before_allocating(tmp_path):
    """The bias the fusion folded into a MatMul (FusedMatMul) declared 3 GiB: refused by
    the check in one line, exit 2, while the process stays far below the declared size
    (it once expanded the bias to 3.2 GB and failed in the kernel, exit 1)."""
    from tests.peak_rss import run_measured

    path = _artifact(tmp_path / "hostile.nncc", lambda program: _splat(program, _slot(program, "b_1")))
    assert path.stat().st_size < 100_000
    env = _env() | {"OPENBLAS_NUM_THREADS": "1", "NNCC_MAX_MEMORY": "1T"}
    done, peak = run_measured([sys.executable, "-m", "nncc", "run", str(path), "--random-inputs"], cwd=tmp_path,
                              env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nncc: error: ") and "hostile.nncc" in lines[0], done.stderr
    for fragment in ("declared shapes contradict its operators", "FusedMatMul node 'n_MatMul_0'", "bias",
                     f"({HUGE},)"):
        assert fragment in lines[0], lines[0]
    assert peak < 1 << 30, f"peak RSS {peak / 1e9:.2f} GB for a plan refused before allocating"


def _batch_norm_model(path):
    """BatchNormalization on its own: -O2 folds it into an nncc ScaleShift."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    params = [numpy_helper.from_array(np.linspace(0.5, 1.5, 6, dtype=np.float32) + i, name)
              for i, name in enumerate(("scale", "bias", "mean", "var"))]
    graph = helper.make_graph([helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"])],
                              "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], params)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _plans_with_fused_ops(tmp_path):
    """Plans holding every op nncc's passes create, compiled portable at -O2."""
    import onnx

    from tests import native_fuzz_cases as NF
    from tests.test_qlinear_float import _qdq_conv_model

    paths = [FIXTURES / "mlp.onnx", _batch_norm_model(tmp_path / "bn.onnx")]
    onnx.save(_qdq_conv_model()[0], str(tmp_path / "qdq.onnx"))
    paths.append(tmp_path / "qdq.onnx")
    cases = [NF.make_case(7, i) for i in range(3 * len(NF.ROUND))]  # three rounds: every kind, most variants
    for level in (0, 2):  # the -O0 round keeps DynamicQuantizeMatMul as written
        path = tmp_path / f"fuzz{level}.onnx"
        onnx.save(NF.batch_model([c for c in cases if c.precision == "f32" and c.opt_level == level]), str(path))
        paths.append(path)
    return [compile_graph(load_model(path), CompileOptions(backends=("numpy",), opt_level=2)) for path in paths]


FUSED = {"nncc::FusedConv::1", "nncc::FusedGemm::1", "nncc::FusedMatMul::1", "nncc::FusedAttention::1",
         "nncc::ScaleShift::1", "nncc::QConv::1", "nncc::QAdd::1", "nncc::QGlobalAveragePool::1", "nncc::QGemm::1",
         "nncc::QuantizeDequantize::1", "com.microsoft::DynamicQuantizeMatMul::1"}


@pytest.mark.slow
def test_every_operand_of_every_fused_op_is_checked(tmp_path):
    """Each constant operand and each graph input of every op nncc's passes create,
    declared 1-D of 3 GiB in turn: the check refuses every one (a shape the operator's own
    rules cannot take), from declared shapes alone (splats are never expanded here)."""
    import json

    from nncc.errors import PlanFormatError
    from nncc.plan import format as F
    from nncc.plan.reader import deserialize
    from nncc.plan.writer import serialize

    seen, missed = set(), []
    for plan in _plans_with_fused_ops(tmp_path):
        producer, sections = F.read_sections(serialize(plan))
        program = json.loads(bytes(sections[b"PROG"]))
        constants = {c[0] for c in program["constants"]}
        for kernel, inputs, _, _, node in program["instructions"]:
            key = program["kernels"][kernel]
            if key not in FUSED:
                continue
            seen.add(key)
            for at, slot in enumerate(inputs):
                if slot < 0 or (slot not in constants and slot not in program["inputs"]):
                    continue  # computed inside: its producer's declared output is checked
                edited = json.loads(json.dumps(program))
                _splat(edited, slot)
                body = json.dumps(edited, sort_keys=True, separators=(",", ":")).encode()
                hostile = deserialize(F.assemble(producer, [(tag, body if tag == b"PROG" else bytes(part))
                                                            for tag, part in sections.items()]))
                try:
                    check_plan_shapes(hostile)
                except PlanFormatError:
                    continue
                missed.append(f"{key} {node!r} operand {at} ({program['slots'][slot][0]})")
    assert seen == FUSED, f"no plan here holds {sorted(FUSED - seen)}"
    assert not missed, "declared 3 GiB and not refused:\n" + "\n".join(missed)
