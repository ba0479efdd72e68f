"""Opens at once from several threads of one C program: one model's weights and a damaged
copy of them through the same library (the copy refused every time, the good file never:
each open's hash has a job of its own), and another exported model beside them; both
answers match onnxruntime, in a plain build, under AddressSanitizer and UBSan (the
libraries' code too), and under ThreadSanitizer (the program's side) where the compiler
has it."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from tests.export_build import SANITIZE, compiler, driver_env, export, mlp
from tests.conftest import ROOT
from tests.oracle import ort_outputs

pytestmark = [pytest.mark.skipif(compiler() is None, reason="no C compiler: nothing can be exported or linked"),
              pytest.mark.slow]  # every test builds, links or runs a C library

PROGRAM = ROOT / "tests" / "export_two_models.c"
SPLIT = 1 << 20  # blake3_threads.c's SPLIT_BYTES: from this size on an open hashes on several threads
WIDTHS = {"first": 24000, "second": 20000}  # hidden widths whose weights pass SPLIT (5.5 and 4.6 MB)


def tsan_works() -> bool:
    probe = subprocess.run([compiler(), "-fsanitize=thread", "-x", "c", "-", "-o", "/dev/null"],
                           input="int main(void) { return 0; }", capture_output=True, text=True)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """mode ("plain", "asan") -> {name: (model, feeds, export folder)}."""
    root = tmp_path_factory.mktemp("export-two")
    out = {}
    for mode, env in (("plain", None), ("asan", {"NNCC_NATIVE_SANITIZE": "1"})):
        out[mode] = {}
        for seed, (name, width) in enumerate(WIDTHS.items()):
            model, feeds = mlp(root / f"{name}.onnx", seed=seed, width=width)
            folder = root / mode / name
            export(root / f"{name}.onnx", folder, "--name", name, cache=root / "cache", env=env)
            out[mode][name] = (model, feeds, folder)
    return out


@pytest.mark.parametrize("mode", ["plain", "asan", "tsan"])
def test_opens_at_once_from_three_threads_refuse_and_answer_each_their_own(models, mode, tmp_path):
    if mode == "tsan" and not tsan_works():
        pytest.skip("the C compiler cannot build with -fsanitize=thread")
    built = models["asan" if mode == "asan" else "plain"]
    flags = {"plain": [], "asan": list(SANITIZE), "tsan": ["-fsanitize=thread"]}[mode]
    exe = tmp_path / "two_models"
    folders = [folder for _, _, folder in built.values()]
    done = subprocess.run([compiler(), "-O1", "-std=c11", "-g", *flags, *(f"-I{f}" for f in folders), str(PROGRAM),
                           *(str(f / f"lib{f.name}.a") for f in folders), "-lm", "-lpthread", "-o", str(exe)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    args, wants = ["2"], []
    for name, (model, feeds, folder) in built.items():
        weights = folder / f"{name}.weights"
        assert weights.stat().st_size - 128 >= SPLIT  # the open's hash goes to several threads
        (tmp_path / f"{name}.in").write_bytes(np.ascontiguousarray(feeds["x0"], np.float32).tobytes())
        args += [str(weights), str(tmp_path / f"{name}.in"), str(tmp_path / f"{name}.out")]
        if name == "first":  # one data byte changed, deep in the data (a subtree of its own)
            damaged = bytearray(weights.read_bytes())
            damaged[len(damaged) * 3 // 4] ^= 0x40
            (tmp_path / "damaged.weights").write_bytes(damaged)
            args.append(str(tmp_path / "damaged.weights"))
        wants.append((name, ort_outputs(model, feeds)[model.graph.output[0].name]))
    env = driver_env(mode == "asan")
    if mode == "tsan":
        env["TSAN_OPTIONS"] = "halt_on_error=1"
    done = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and not done.stderr, done.stderr
    for name, want in wants:
        got = np.frombuffer((tmp_path / f"{name}.out").read_bytes(), np.float32).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))
