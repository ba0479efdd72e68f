"""The runtimes as their users run them, and the jobs one child process of
benchmarks/bench_peers.py does (a child imports only this module, so its start-up is the
runtime's own):

    python -c "import json, sys, peer_runtimes; peer_runtimes.child(json.loads(sys.argv[1]))" JOB

- onnxruntime: its CPU session at its defaults, only ``intra_op_num_threads`` set;
- OpenVINO: its CPU device at its defaults, compiled from the .onnx file, only
  ``INFERENCE_NUM_THREADS`` set;
- nncc: the thread count set as ``nncc run --threads`` sets it, then ``nncc.prepare``
  through the cache with default options.

A job is a JSON object; the child prints its result as one JSON line. A peer that is not
installed gives ``{"error": ..., "missing": true}``; any other failure ``{"error": ...}``.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def median(values):
    """The median of the values that are not None (None if there are none)."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# -- the runtimes, as their users run them (used in the child processes) -------------------------------


class PeerMissing(Exception):
    """A runtime this benchmark compares with is not installed."""


def _peer(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PeerMissing(f"{module} is not installed ({exc})") from None


def ort_session(path, threads: int):
    """onnxruntime's CPU session at its defaults, only the intra-op thread count set."""
    ort = _peer("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def openvino_model(path, threads: int, precision: str | None = None):
    """OpenVINO's CPU device at its defaults, compiled from the .onnx file, only
    INFERENCE_NUM_THREADS set; ``precision`` (not a default: the "openvino-f32" runtime,
    on request) sets INFERENCE_PRECISION_HINT, which on a CPU with bfloat16 is bf16."""
    ov = _peer("openvino")
    config = {"INFERENCE_NUM_THREADS": threads}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    return ov.Core().compile_model(str(path), "CPU", config)


def open_nncc(path, threads: int, cache: str, backends=None, precision: str | None = None):
    """What a user does: the thread count, then prepare through the cache. ``precision``:
    the compile option ("bf16": the "nncc-bf16" runtime)."""
    import nncc
    from nncc.util.threads import set_blas_threads

    set_blas_threads(threads)
    options = {"backends": backends} if backends else {}
    if precision:
        options["precision"] = precision
    model, outcome = nncc.prepare(path, cache_dir=cache, **options)
    info = {"version": nncc.__version__, "cache": outcome.outcome, "stage": outcome.stage,
            "partitions": len(model.plan.partitions), "native_partitions": model.native_partitions,
            # what its products by weights compute in: f32, bf16 (vdpbf16ps) or bf16w (bfloat16 weights)
            "precision": model.plan.options.get("arithmetic", "f32") if model.native_partitions else "f32"}
    return model.run, info, lambda outputs: dict(outputs)


def open_onnxruntime(path, threads: int, cache: str):
    session = ort_session(path, threads)
    names = [o.name for o in session.get_outputs()]
    return (lambda feeds: session.run(None, feeds), {"version": _peer("onnxruntime").__version__, "precision": "f32"},
            lambda outputs: dict(zip(names, outputs)))


def open_openvino(path, threads: int, cache: str, precision: str | None = None):
    compiled = openvino_model(path, threads, precision)
    request = compiled.create_infer_request()
    ports = compiled.outputs
    info = {"version": _peer("openvino").__version__,
            "precision": compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name(),  # f32, bf16, f16
            "threads": int(compiled.get_property("INFERENCE_NUM_THREADS"))}
    return (request.infer, info, lambda outputs: {p.get_any_name(): outputs[p] for p in ports})


OPENERS = {"nncc": open_nncc, "onnxruntime": open_onnxruntime, "openvino": open_openvino,
           "nncc-numpy": lambda path, threads, cache: open_nncc(path, threads, cache, ["numpy"]),
           "nncc-bf16": lambda path, threads, cache: open_nncc(path, threads, cache, precision="bf16"),
           "openvino-f32": lambda path, threads, cache: open_openvino(path, threads, cache, "f32")}


# -- child processes ------------------------------------------------------------------------------------


def join_shape_builds() -> int:
    """Wait for the native plans of input shapes nncc builds in background threads (named
    nncc-shape-...: nncc.preparing.shapes); how many there were."""
    import threading

    building = [t for t in threading.enumerate() if t.name.startswith("nncc-shape-")]
    for thread in building:
        thread.join()
    return len(building)


def child_measure(job: dict) -> dict:
    """One runtime in this fresh process: first answer, first run, steady state."""
    import numpy as np

    with np.load(job["feeds"]) as saved:
        feeds = {k: saved[k] for k in saved.files}
    clock = time.perf_counter
    t0 = clock()
    run, info, named = OPENERS[job["runtime"]](job["path"], job["threads"], job["cache"])
    t1 = clock()
    first = run(feeds)
    t2 = clock()
    answered = time.time()
    if job.get("outputs"):
        np.savez(job["outputs"], **{k: np.asarray(v) for k, v in named(first).items()})
    del first
    for _ in range(job["warmup"]):
        run(feeds)
    if job["runtime"].startswith("nncc"):  # a shape's own native plan builds in the background: wait
        for _ in range(join_shape_builds()):
            run(feeds)
    times = timed_runs(run, feeds, job["iterations"], job.get("min_seconds", 0.0))
    return {**info, "pid": os.getpid(), "answered_at": answered, "open_s": t1 - t0, "first_s": t2 - t1,
            "p50_s": median(times), "min_s": min(times), "timed_runs": len(times)}


def timed_runs(run, feeds, runs: int, min_seconds: float) -> list[float]:
    """Each run's seconds: at least ``runs`` runs, and on until they took ``min_seconds`` in
    all, so that a run of microseconds is a median over hundreds, whatever the runtime."""
    clock = time.perf_counter
    times: list[float] = []
    spent = 0.0
    while len(times) < runs or spent < min_seconds:
        start = clock()
        run(feeds)
        times.append(clock() - start)
        spent += times[-1]
    return times


def child_setup(job: dict) -> dict:
    """Fill the cache with the model's optimized (native) stage, timed, and write the feeds."""
    import numpy as np

    import nncc
    from nncc.runtime.random_inputs import random_feeds
    from nncc.util.threads import set_blas_threads

    set_blas_threads(job["threads"])
    start = time.perf_counter()
    model, outcome = nncc.prepare(job["path"], cache_dir=job["cache"], stage="optimized")
    compile_s = time.perf_counter() - start
    if "nncc-numpy" in job["runtimes"]:
        nncc.prepare(job["path"], cache_dir=job["cache"], stage="optimized", backends=["numpy"])
    if "nncc-bf16" in job["runtimes"]:
        nncc.prepare(job["path"], cache_dir=job["cache"], stage="optimized", precision="bf16")
    feeds = random_feeds(model.input_infos, 0, job["dims"])
    np.savez(job["feeds"], **feeds)
    return {"compile_s": compile_s, "cache": outcome.outcome, "partitions": len(model.plan.partitions),
            "native_partitions": model.native_partitions,
            "inputs": {k: list(v.shape) for k, v in feeds.items()}}


def child_sgemm(job: dict) -> dict:
    """numpy float32 matmul of squares at the run's thread count: the best size's rate."""
    from nncc.bench import matmul_peak
    from nncc.util.threads import set_blas_threads

    set_blas_threads(job["threads"])
    rates = {n: matmul_peak(n, runs=7, threads=job["threads"])["gflops_per_second"]
             for n in (256, 512, 1024, 2048, 3072)}
    best = max(rates, key=rates.get)
    return {"gflop_per_second": rates[best], "n": best, "by_size": rates}


def child_machine(job: dict) -> dict:
    """The CPU, and the BLAS numpy (and so nncc's native code) runs on at the run's threads."""
    from nncc.bench import machine_info
    from nncc.util.threads import set_blas_threads

    set_blas_threads(job["threads"])
    return machine_info()


def child_profile(job: dict) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from step_classes import profile_classes

    return profile_classes(job["path"], job["threads"], job["runs"], job["dims"])


CHILD_JOBS = {"measure": child_measure, "setup": child_setup, "sgemm": child_sgemm, "profile": child_profile,
              "machine": child_machine}


def print_reported(work) -> None:
    """A child's answer, one JSON line: ``work()``'s result, or why it has none (a peer not
    installed, or a runtime that refuses the model: the parent says so and goes on)."""
    try:
        result = work()
    except PeerMissing as exc:
        result = {"error": str(exc), "missing": True}
    except Exception as exc:  # a runtime that refuses the model: say so, the others go on
        text = str(exc).strip().splitlines()
        result = {"error": f"{type(exc).__name__}: {text[0][:300] if text else ''}"}
    print(json.dumps(result))


def child(job: dict) -> None:
    print_reported(lambda: CHILD_JOBS[job["job"]](job))
