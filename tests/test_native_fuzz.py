"""The native backend over random geometries (tests/native_fuzz_cases.py), against
onnxruntime (the onnx reference evaluator deciding where they disagree), once as plain
code and once built in the sanitize mode, where an out-of-bounds access or undefined
behaviour in generated code fails the test.

One case in eight is fed NaN, +inf and -inf at random places (native_fuzz_cases.NONFINITE),
in both runs: an output must be NaN exactly where onnxruntime's is, infinite where it is,
and the sanitized code must stay defined on them.

Every case must run as native code (a case that falls back to numpy proves nothing about
the C code, so it fails). Cases are compiled ``BATCH`` to a model, so one compile builds
many kernels in parallel, and kernels already built in the process are reused.

Scale it up with ``NNCC_FUZZ_CASES=N`` (plain cases; the sanitized run takes a third as
many, at least 1), pick other geometries with ``NNCC_FUZZ_SEED=S``, only some kinds with
``NNCC_FUZZ_KINDS=casts,qconv`` (each case keeps its index, so its geometry) and NaN and
infinities in every case with ``NNCC_FUZZ_NONFINITE=1``, e.g.::

    NNCC_FUZZ_CASES=3000 NNCC_FUZZ_SEED=7 PYTHONPATH=$PWD python -m pytest -q tests/test_native_fuzz.py
    NNCC_FUZZ_KINDS=casts,dynamic_int8 NNCC_FUZZ_NONFINITE=1 NNCC_FUZZ_CASES=300 PYTHONPATH=$PWD \
        python -m pytest -q tests/test_native_fuzz.py -k sanitizers

A failure names each failing case's geometry and the one-line command that reproduces it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest


from nncc.native.toolchain import find_toolchain  # noqa: E402
from tests import native_fuzz_cases as F  # noqa: E402
from tests.test_native_sanitize import have_sanitizer_runtime, sanitized_env  # noqa: E402

pytestmark = pytest.mark.skipif(find_toolchain(sanitize=False) is None,
                                reason="no C compiler: the native backend takes nothing")

SEED = int(os.environ.get("NNCC_FUZZ_SEED") or 20261127)
PLAIN = int(os.environ.get("NNCC_FUZZ_CASES") or 480)
SANITIZED = max(1, PLAIN // 3)
KINDS = [kind for kind in (os.environ.get("NNCC_FUZZ_KINDS") or "").split(",") if kind]
INDICES = F.indices(PLAIN, KINDS)


def _outputs(cases, tmp_path):
    """nncc's outputs and the native-written names for a batch; when the batch does not
    compile or run at all, the cases that fail alone, each with its reproduction."""
    try:
        return F.run_nncc(cases, tmp_path / "batch.onnx")
    except Exception:  # noqa: BLE001 - narrowed to the culprits below
        broken = []
        for case in cases:
            try:
                F.run_nncc([case], tmp_path / "case.onnx")
            except Exception as exc:  # noqa: BLE001
                broken.append(f"{case.describe()}: {type(exc).__name__}: {exc}\n    reproduce: {case.reproduce}")
        raise AssertionError("\n".join(broken) or "the batch fails, but no case alone does") from None


def _judge_all(cases, got, native) -> list[str]:
    want = F.run_onnxruntime(cases)
    return [report for case in cases if (report := F.judge(case, got, want, native))]


@pytest.mark.slow  # fuzzing
@pytest.mark.parametrize("start", range(0, PLAIN, F.BATCH))
def test_native_code_matches_the_oracles(tmp_path, start):
    cases = [F.make_case(SEED, i) for i in INDICES[start:start + F.BATCH]]
    got, native = _outputs(cases, tmp_path)
    failures = _judge_all(cases, got, native)
    assert not failures, f"{len(failures)} of {len(cases)} cases fail:\n" + "\n".join(failures)


def _run_sanitized(indices, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.native_fuzz_cases", "--run", str(SEED), str(out),
                           *map(str, indices)], env=sanitized_env(), capture_output=True, text=True,
                          cwd=F.__file__.rsplit("/tests/", 1)[0])


def _first_crash(indices, tmp_path) -> tuple[int, str]:
    """The first case that makes a sanitized run fail on its own (by halving), and its report."""
    lo, hi, report = 0, len(indices), ""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        done = _run_sanitized(indices[lo:mid], tmp_path / "bisect.npz")
        if done.returncode != 0:
            hi, report = mid, done.stderr
        else:
            lo = mid
    if not report:
        report = _run_sanitized(indices[lo:hi], tmp_path / "bisect.npz").stderr
    return indices[lo], report


@pytest.mark.slow  # fuzzing, built with sanitizers
@pytest.mark.skipif(not have_sanitizer_runtime(), reason="the C compiler has no ASan/UBSan runtime to preload")
def test_native_code_is_clean_under_sanitizers(tmp_path):
    """The first cases again (their mix of kinds is the same), built and run with
    AddressSanitizer and UBSan in a process that preloads their runtimes, with every
    argument of a native call in its own exactly-sized heap block: any access past a
    tensor, or undefined behaviour, ends the process with the sanitizer's report."""
    indices = INDICES[:SANITIZED]
    done = _run_sanitized(indices, tmp_path / "out.npz")
    if done.returncode != 0:
        index, report = _first_crash(indices, tmp_path)
        case = F.make_case(SEED, index)
        lines = [line for line in report.splitlines() if "ERROR" in line or "runtime error" in line or
                 "SUMMARY" in line] or report.splitlines()[-5:]
        pytest.fail(f"the sanitized run stops (exit {done.returncode}); {case.describe()} alone:\n  "
                    + "\n  ".join(lines) + "\n    reproduce: NNCC_NATIVE_SANITIZE=1 "
                    f"LD_PRELOAD=\"{sanitized_env()['LD_PRELOAD']}\" ASAN_OPTIONS=detect_leaks=0 {case.reproduce}")
    with np.load(tmp_path / "out.npz") as saved:
        got = {name: saved[name] for name in saved.files if name != "__native__"}
        native = set(saved["__native__"].tolist())
    cases = [F.make_case(SEED, i) for i in indices]
    failures = _judge_all(cases, got, native)
    assert not failures, f"{len(failures)} of {len(cases)} sanitized cases fail:\n" + "\n".join(failures)
