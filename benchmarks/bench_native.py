"""Steady-state latency of the native backend next to onnxruntime (and nncc's numpy path).

    python benchmarks/bench_native.py                      # every model, 2 threads
    python benchmarks/bench_native.py --model build/real-models/bert.onnx --threads 1
    python benchmarks/bench_native.py --markdown           # a table for RESULTS.md

Models: the static fixtures, a few light models, and the real-weight models of
benchmarks/real_models.py (generated on first use into build/real-models). For each model
one process holds three prepared runners: nncc with the native backend, nncc with the numpy
backend only, and an onnxruntime session (intra-op threads = --threads, spinning off; nncc's
BLAS and native pool sized likewise). They are timed in blocks in mirrored order (A B C,
then C B A, ...): onnxruntime's and OpenBLAS's threads leave the cores busy for a while
after they finish, which taxes whoever runs next, so strict turns would charge one runner
for another's aftermath. Each block runs --iterations calls after one untimed call; a
runner's figure is the median of its per-block means. Also reported: the native compile
time (passes + C generation + the compiler, cold: no cache).

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


def measure(path: pathlib.Path, threads: int, blocks: int, iterations: int) -> dict:
    import onnxruntime as ort

    import nncc
    from nncc.runtime.threads import set_blas_threads

    set_blas_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = feeds_for(session)
    start = time.perf_counter()
    native = nncc.compile_model(path)
    compile_s = time.perf_counter() - start
    numpy_only = nncc.compile_model(path, backends=["numpy"])
    runners = {
        "native": lambda: native.run(feeds),
        "numpy": lambda: numpy_only.run(feeds),
        "onnxruntime": lambda: session.run(None, feeds),
    }
    got = native.run(feeds)
    want = session.run(None, feeds)
    error = max(float(np.max(np.abs(got[n] - w))) / max(1.0, float(np.max(np.abs(w))))
                for n, w in zip(native.output_names, want))
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
    return {"model": path.stem, "native_ms": med["native"], "numpy_ms": med["numpy"], "ort_ms": med["onnxruntime"],
            "native_vs_ort": med["native"] / med["onnxruntime"], "numpy_vs_ort": med["numpy"] / med["onnxruntime"],
            "compile_s": compile_s, "native_partitions": native.native_partitions,
            "partitions": len(native.plan.partitions), "max_rel_error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", type=pathlib.Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = [measure(p, args.threads, args.blocks, args.iterations) for p in (args.model or models())]
    if args.markdown:
        print("| model | native ms | numpy ms | onnxruntime ms | native / ort | numpy / ort | native partitions | "
              "native compile s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['model']} | {r['native_ms']:.2f} | {r['numpy_ms']:.2f} | {r['ort_ms']:.2f} | "
                  f"{r['native_vs_ort']:.2f} | {r['numpy_vs_ort']:.2f} | {r['native_partitions']}/{r['partitions']} | "
                  f"{r['compile_s']:.2f} |")
        return
    for r in rows:
        print(f"{r['model']:18s} native {r['native_ms']:8.2f} ms  numpy {r['numpy_ms']:8.2f} ms  "
              f"ort {r['ort_ms']:8.2f} ms  native/ort {r['native_vs_ort']:.2f}  numpy/ort {r['numpy_vs_ort']:.2f}  "
              f"partitions {r['native_partitions']}/{r['partitions']}  compile {r['compile_s']:.2f} s  "
              f"max rel error {r['max_rel_error']:.1e}")


if __name__ == "__main__":
    main()
