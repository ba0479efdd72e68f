"""Steady state of models with dynamic input dimensions, per concrete input shape, next to
onnxruntime: the general plan (every shape alike), the shape's own portable plan, and the
shape's native plan built through the cache.

    python benchmarks/bench_dynamic.py                 # every model and shape, 2 threads
    python benchmarks/bench_dynamic.py --markdown      # a table for RESULTS.md

Models (real weights, benchmarks/real_models.py): bert_dynamic and gpt2_dynamic (symbolic
batch and sequence axes, reshapes computed from the runtime shape as an export with dynamic
axes writes them), and mobilenetv2 with a symbolic batch axis. Each (model, shape) is
measured by each runner and by onnxruntime (at its defaults, only the intra-op thread
count set: peer_runtimes.ort_session), each alone in a process of its own, in an order
reversed every round (--rounds); a process times --blocks blocks of --iterations calls,
each block after one untimed call, and reports the median block mean; a figure is the
median over rounds, and ratios are against onnxruntime's. Runners:

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
    """One process, one runner (an nncc runner or onnxruntime) at input ``shape``: the median
    of ``blocks`` block means of ``iterations`` calls, each block after one untimed call."""
    if runner == "general":
        os.environ["NNCC_SHAPE_PLANS"] = "off"
    os.environ["NNCC_UPGRADE_AFTER"] = "2" if runner == "native shape plan" else "off"
    from peer_runtimes import ort_session

    feeds = None
    if runner == "onnxruntime":
        session = ort_session(path, threads)
        feeds = {session.get_inputs()[0].name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        run = lambda: session.run(None, feeds)  # noqa: E731
    else:
        import nncc
        from nncc.util.threads import set_blas_threads

        set_blas_threads(threads)
        if runner == "native shape plan":
            model, _ = nncc.prepare(path, cache_dir=tempfile.mkdtemp(prefix="nncc-bench-dynamic-"))
        else:
            model = nncc.compile_model(path)
        name = next(iter(model.input_infos))
        feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        for _ in range(2):  # a shape's second run specialises it
            model.run(feeds)
        for thread in threading.enumerate():
            if thread.name.startswith("nncc-shape-"):
                thread.join()
        run = lambda: model.run(feeds)  # noqa: E731
    times = []
    for _ in range(blocks):
        run()
        t0 = time.perf_counter()
        for _ in range(iterations):
            run()
        times.append((time.perf_counter() - t0) / iterations * 1000)
    result = {"ms": statistics.median(times)}
    if runner != "onnxruntime":  # checked against onnxruntime once the timing is done
        got = model.run(feeds)
        want = ort_session(path, threads).run(None, feeds)
        result["max_rel_error"] = max(float(np.max(np.abs(got[n] - w))) / max(1.0, float(np.max(np.abs(w))))
                                      for n, w in zip(model.output_names, want))
        plans = model._shape_plans
        executor = plans._plans.get(tuple([shape])) if plans is not None else None
        result["native"] = 0 if executor is None else executor.native_partitions
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
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
    order = list(RUNNERS) + ["onnxruntime"]
    for name, path in models().items():
        for shape in SHAPES[name]:
            row = {"model": name, "shape": "x".join(map(str, shape))}
            runs: dict[str, list[dict]] = {r: [] for r in order}
            for rnd in range(args.rounds):  # each runner alone in its process, the order reversed each round
                for runner in (order if rnd % 2 == 0 else order[::-1]):
                    job = json.dumps({"path": str(path), "shape": shape, "runner": runner})
                    done = subprocess.run([sys.executable, __file__, "--one", job, "--threads", str(args.threads),
                                           "--blocks", str(args.blocks), "--iterations", str(args.iterations)],
                                          capture_output=True, text=True, check=True)
                    runs[runner].append(json.loads(done.stdout))
            ort_ms = statistics.median(r["ms"] for r in runs["onnxruntime"])
            for runner in RUNNERS:
                ms = statistics.median(r["ms"] for r in runs[runner])
                row[runner] = {"ms": ms, "ort_ms": ort_ms, "ratio": ms / ort_ms, "native": runs[runner][0]["native"],
                               "max_rel_error": max(r["max_rel_error"] for r in runs[runner])}
            rows.append(row)
            if not args.markdown:
                print(f"{name:18s} {row['shape']:12s} " + "   ".join(
                    f"{r} {row[r]['ms']:7.2f} ms {row[r]['ratio']:.2f}" for r in RUNNERS)
                    + f"   onnxruntime {ort_ms:6.2f} ms   native partitions {row['native shape plan']['native']}",
                    flush=True)
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
