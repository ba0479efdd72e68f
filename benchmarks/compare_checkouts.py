"""nncc against itself: the steady state of the same models under two checkouts of nncc,
so a change that rewrites generated code shows whether it kept its speed.

    python benchmarks/compare_checkouts.py OLD_TREE NEW_TREE --model build/real-models/resnet18.onnx ...

Each round runs one process per checkout, in alternating order (the VM drifts, so only
figures from one run compare). A process imports nncc from its tree (PYTHONPATH), prepares
the model's optimized (native) stage through that checkout's own cache, runs it ``--warmup`` times untimed and
``--iterations`` times timed, and reports its median; the table gives the median over
rounds of each checkout and NEW / OLD.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = False

CHILD = r"""
import json, sys, time
import numpy as np
import nncc
from nncc.runtime.random_inputs import random_feeds
from nncc.util.threads import set_blas_threads
job = json.loads(sys.argv[1])
set_blas_threads(job["threads"])
model, _ = nncc.prepare(job["model"], stage="optimized")  # the native stage, as a warm cache serves it
feeds = random_feeds(model.input_infos, 0)
for _ in range(job["warmup"]):
    model.run(feeds)
times = []
for _ in range(job["iterations"]):
    start = time.perf_counter()
    model.run(feeds)
    times.append(time.perf_counter() - start)
print(json.dumps({"p50": float(np.median(times)), "native": model.native_partitions, "nncc": nncc.__file__}))
"""


def run_child(tree: str, job: dict, cache: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, NNCC_CACHE_DIR=cache, NNCC_UPGRADE_AFTER="off",
               OMP_NUM_THREADS=str(job["threads"]), OPENBLAS_NUM_THREADS=str(job["threads"]))
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], env=env, cwd=tree,
                          capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float | None:
    values = sorted(values)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the first checkout (a directory holding nncc/)")
    parser.add_argument("new", help="the second checkout")
    parser.add_argument("--model", action="append", required=True, help="an .onnx path (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    trees = {"old": str(pathlib.Path(args.old).resolve()), "new": str(pathlib.Path(args.new).resolve())}
    print(f"| model | old ms | new ms | new / old | native partitions (old, new) |\n|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="nncc-compare-") as work:
        caches = {side: os.path.join(work, side) for side in trees}
        for path in args.model:
            job = {"model": str(pathlib.Path(path).resolve()), "threads": args.threads, "warmup": args.warmup,
                   "iterations": args.iterations}
            times: dict[str, list[float]] = {"old": [], "new": []}
            native: dict[str, object] = {}
            errors: dict[str, str] = {}
            for round_ in range(args.rounds):
                order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
                for side in order:
                    result = run_child(trees[side], job, caches[side])
                    if "error" in result:
                        errors[side] = result["error"]
                        continue
                    times[side].append(result["p50"] * 1e3)
                    native[side] = result["native"]
            old, new = median(times["old"]), median(times["new"])
            ratio = f"{new / old:.3f}" if old and new else "–"
            cells = [f"{v:.3f}" if v else errors.get(side, "–") for side, v in (("old", old), ("new", new))]
            print(f"| {pathlib.Path(path).stem} | {cells[0]} | {cells[1]} | {ratio} | "
                  f"{native.get('old', '?')}, {native.get('new', '?')} |", flush=True)


if __name__ == "__main__":
    main()
