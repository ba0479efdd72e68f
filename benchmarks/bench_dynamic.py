"""Steady state of models with dynamic input dimensions, per concrete input shape, next to
onnxruntime: the general plan (every shape alike), the shape's own portable plan, and the
shape's native plan built through the cache.

    python benchmarks/bench_dynamic.py                 # every model and shape, 2 threads
    python benchmarks/bench_dynamic.py --markdown      # a table for RESULTS.md

Models (real weights, benchmarks/real_models.py): bert_dynamic and gpt2_dynamic (symbolic
batch and sequence axes, reshapes computed from the runtime shape as an export with dynamic
axes writes them), and mobilenetv2 with a symbolic batch axis. Each (model, shape, runner)
is measured in a process of its own against an onnxruntime session in that process (at
its defaults, only the intra-op thread count set: bench_peers.ort_session), in
blocks of mirrored order (A B, B A, ...), each block --iterations calls after one untimed
call; a figure is the median of the per-block means, and its ratio is taken against the
onnxruntime figure of the same process. Runners:

- general: ``run.shape_plans`` off, so every run uses the plan compiled for any shape;
- shape plan: the default, a shape run twice gets its own portable plan;
- native shape plan: prepared through a fresh cache with upgrades on: the shape's native
  plan is built in the background and waited for before timing.

A script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

RUNNERS = ("general", "shape plan", "native shape plan")
SHAPES = {"bert_dynamic": [(1, 128, 512), (2, 77, 512)],
          "gpt2_dynamic": [(1, 128, 512), (2, 77, 512)],
          "mobilenetv2_batch": [(1, 3, 224, 224), (4, 3, 224, 224)]}


def models() -> dict[str, pathlib.Path]:
    """The dynamic models, written on first use into build/real-models."""
    import onnx

    from real_models import write_all

    out = ROOT / "build" / "real-models"
    paths = {pathlib.Path(p).stem: pathlib.Path(p) for p in write_all(str(out))}
    batch = out / "mobilenetv2_batch.onnx"
    if not batch.exists():  # the static model with its batch axis made symbolic
        model = onnx.load(str(paths["mobilenetv2"]))
        for value in (model.graph.input[0], model.graph.output[0]):
            value.type.tensor_type.shape.dim[0].dim_param = "batch"
        onnx.save(model, str(batch))
    return {"bert_dynamic": paths["bert_dynamic"], "gpt2_dynamic": paths["gpt2_dynamic"],
            "mobilenetv2_batch": batch}


def measure(path: pathlib.Path, shape: tuple, runner: str, threads: int, blocks: int, iterations: int) -> dict:
    """One process: nncc's ``runner`` at input ``shape`` against onnxruntime."""
    from bench_peers import ort_session

    if runner == "general":
        os.environ["NNCC_SHAPE_PLANS"] = "off"
    os.environ["NNCC_UPGRADE_AFTER"] = "2" if runner == "native shape plan" else "off"
    import nncc
    from nncc.runtime.threads import set_blas_threads

    set_blas_threads(threads)
    session = ort_session(path, threads)
    name = session.get_inputs()[0].name
    feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    if runner == "native shape plan":
        model, _ = nncc.prepare(path, cache_dir=tempfile.mkdtemp(prefix="nncc-bench-dynamic-"))
    else:
        model = nncc.compile_model(path)
    for _ in range(2):  # a shape's second run specialises it
        got = model.run(feeds)
    for thread in threading.enumerate():
        if thread.name.startswith("nncc-shape-"):
            thread.join()
    got = model.run(feeds)
    want = session.run(None, feeds)
    error = max(float(np.max(np.abs(got[n] - w))) / max(1.0, float(np.max(np.abs(w))))
                for n, w in zip(model.output_names, want))
    runners = {runner: lambda: model.run(feeds), "onnxruntime": lambda: session.run(None, feeds)}
    times: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners)
    for block in range(blocks):
        for key in (order if block % 2 == 0 else order[::-1]):
            run = runners[key]
            run()
            t0 = time.perf_counter()
            for _ in range(iterations):
                run()
            times[key].append((time.perf_counter() - t0) / iterations * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    plans = model._shape_plans
    executor = plans._plans.get(tuple([shape])) if plans is not None else None
    return {"ms": med[runner], "ort_ms": med["onnxruntime"], "ratio": med[runner] / med["onnxruntime"],
            "native": 0 if executor is None else executor.native_partitions, "max_rel_error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's JSON job
    args = parser.parse_args()
    if args.one:
        job = json.loads(args.one)
        print(json.dumps(measure(pathlib.Path(job["path"]), tuple(job["shape"]), job["runner"], args.threads,
                                 args.blocks, args.iterations)))
        return
    rows = []
    for name, path in models().items():
        for shape in SHAPES[name]:
            row = {"model": name, "shape": "x".join(map(str, shape))}
            for runner in RUNNERS:
                job = json.dumps({"path": str(path), "shape": shape, "runner": runner})
                done = subprocess.run([sys.executable, __file__, "--one", job, "--threads", str(args.threads),
                                       "--blocks", str(args.blocks), "--iterations", str(args.iterations)],
                                      capture_output=True, text=True, check=True)
                row[runner] = json.loads(done.stdout)
            rows.append(row)
            if not args.markdown:
                print(f"{name:18s} {row['shape']:12s} " + "   ".join(
                    f"{r} {row[r]['ms']:7.2f} ms (ort {row[r]['ort_ms']:6.2f}) {row[r]['ratio']:.2f}"
                    for r in RUNNERS) + f"   native partitions {row['native shape plan']['native']}", flush=True)
    if args.markdown:
        print("| model | input | general / ort | shape plan / ort | native shape plan / ort | nncc ms: general, "
              "shape, native (ort) |")
        print("|---|---|---:|---:|---:|---|")
        for row in rows:
            g, s, n = (row[r] for r in RUNNERS)
            print(f"| {row['model']} | {row['shape']} | {g['ratio']:.2f} | {s['ratio']:.2f} | {n['ratio']:.2f} | "
                  f"{g['ms']:.1f}, {s['ms']:.1f}, {n['ms']:.1f} ({n['ort_ms']:.1f}) |")


if __name__ == "__main__":
    main()
