"""Steady-state latency of the native backend next to onnxruntime (and nncc's numpy path).

    python benchmarks/bench_native.py                      # every model, 2 threads
    python benchmarks/bench_native.py --model build/real-models/bert.onnx --threads 1
    python benchmarks/bench_native.py --markdown           # a table for RESULTS.md

Models: the static fixtures, a few light models, and the real-weight models of
benchmarks/real_models.py (generated on first use into build/real-models). Each nncc runner
(the native backend; the numpy backend alone) is timed against an onnxruntime session
(intra-op threads = --threads, spinning off; nncc's BLAS and native pool sized likewise) in
a process of its own: OpenBLAS's idle threads spin after a multi-threaded GEMM, so a numpy
runner in the same process would tax the native one that runs next. Within a process the
two runners are timed in blocks in mirrored order (A B, then B A, ...), which charges each
for its own aftermath rather than the other's; each block runs --iterations calls after
one untimed call; a runner's figure is the median of its per-block means, and its ratio is
taken against the onnxruntime figure of the same process. Also reported: the native
compile time (passes + C generation + the compiler, cold: no cache).

A script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

FIXTURES = ["resnet_block", "mobilenet"]
LIGHT = ["light_resnet50", "light_vgg19", "light_shufflenet", "light_squeezenet"]


def models() -> list[pathlib.Path]:
    import onnx

    from real_models import write_all

    light = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    found = [ROOT / "fixtures" / f"{n}.onnx" for n in FIXTURES]
    found += [light / f"{n}.onnx" for n in LIGHT if (light / f"{n}.onnx").exists()]
    found += [pathlib.Path(p) for p in write_all(str(ROOT / "build" / "real-models"))]
    return found


def feeds_for(session) -> dict:
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
            for i in session.get_inputs()}


def ort_session(path: pathlib.Path, threads: int):
    """The onnxruntime peer: ``threads`` intra-op threads that do not spin when idle."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure(path: pathlib.Path, threads: int, blocks: int, iterations: int, runner: str) -> dict:
    """One process: nncc's ``runner`` ("native" or "numpy") against onnxruntime."""
    import nncc
    from nncc.runtime.threads import set_blas_threads

    set_blas_threads(threads)
    session = ort_session(path, threads)
    feeds = feeds_for(session)
    start = time.perf_counter()
    model = nncc.compile_model(path) if runner == "native" else nncc.compile_model(path, backends=["numpy"])
    compile_s = time.perf_counter() - start
    runners = {runner: lambda: model.run(feeds), "onnxruntime": lambda: session.run(None, feeds)}
    got = model.run(feeds)
    want = session.run(None, feeds)
    error = max(float(np.max(np.abs(got[n] - w))) / max(1.0, float(np.max(np.abs(w))))
                for n, w in zip(model.output_names, want))
    times: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners)
    for block in range(blocks):
        for name in (order if block % 2 == 0 else order[::-1]):
            run = runners[name]
            run()  # untimed: the block starts from this runner's own state
            t0 = time.perf_counter()
            for _ in range(iterations):
                run()
            times[name].append((time.perf_counter() - t0) / iterations * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"ms": med[runner], "ort_ms": med["onnxruntime"], "ratio": med[runner] / med["onnxruntime"],
            "compile_s": compile_s, "native_partitions": model.native_partitions,
            "partitions": len(model.plan.partitions), "max_rel_error": error}


def measure_apart(path: pathlib.Path, args) -> dict:
    """Both pairings, each in a fresh process."""
    import json
    import subprocess

    row = {"model": path.stem}
    for runner in ("native", "numpy"):
        done = subprocess.run([sys.executable, __file__, "--one", runner, "--model", str(path), "--threads",
                               str(args.threads), "--blocks", str(args.blocks), "--iterations", str(args.iterations)],
                              capture_output=True, text=True, check=True)
        result = json.loads(done.stdout)
        row[f"{runner}_ms"], row[f"{runner}_ort_ms"], row[f"{runner}_vs_ort"] = (
            result["ms"], result["ort_ms"], result["ratio"])
        if runner == "native":
            row.update(compile_s=result["compile_s"], native_partitions=result["native_partitions"],
                       partitions=result["partitions"], max_rel_error=result["max_rel_error"])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", type=pathlib.Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--one", choices=["native", "numpy"], help=argparse.SUPPRESS)  # a child's pairing
    args = parser.parse_args()
    if args.one:
        import json

        print(json.dumps(measure(args.model[0], args.threads, args.blocks, args.iterations, args.one)))
        return
    rows = [measure_apart(p, args) for p in (args.model or models())]
    if args.markdown:
        print("| model | native ms (ort ms) | native / ort | numpy ms (ort ms) | numpy / ort | native partitions "
              "| native compile s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['model']} | {r['native_ms']:.2f} ({r['native_ort_ms']:.2f}) | {r['native_vs_ort']:.2f} | "
                  f"{r['numpy_ms']:.2f} ({r['numpy_ort_ms']:.2f}) | {r['numpy_vs_ort']:.2f} | "
                  f"{r['native_partitions']}/{r['partitions']} | {r['compile_s']:.2f} |")
        return
    for r in rows:
        print(f"{r['model']:18s} native {r['native_ms']:8.2f} ms (ort {r['native_ort_ms']:7.2f})  native/ort "
              f"{r['native_vs_ort']:.2f}   numpy {r['numpy_ms']:8.2f} ms (ort {r['numpy_ort_ms']:7.2f})  numpy/ort "
              f"{r['numpy_vs_ort']:.2f}   partitions {r['native_partitions']}/{r['partitions']}  compile "
              f"{r['compile_s']:.2f} s  max rel error {r['max_rel_error']:.1e}")


if __name__ == "__main__":
    main()
