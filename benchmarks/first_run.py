"""First run after a cache hit against the steady state, each in a fresh process.

    python benchmarks/first_run.py MODEL.onnx [MODEL.onnx ...] [--processes 5] [--runs 30]

For each model: `nncc compile` stores its optimized (native) entry in a temporary cache,
then --processes fresh processes each prepare it (a hit), time the first run (with its
minor page faults, from getrusage) and the median of --runs further runs, in wall time and
in the process's CPU time (every thread's; on a loaded machine a run's wall time includes
the time slices other processes took, its CPU time does not). Prints one line per model
with the medians over the processes: "first / steady" near 1 means a process's first run
pays nothing the later ones do not.
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

_CHILD = r"""
import json, resource, sys, time
import numpy as np
from nncc.model import prepare
from nncc.runtime.random_inputs import random_feeds
path, runs = sys.argv[1], int(sys.argv[2])
model, outcome = prepare(path, background=None)
assert outcome.outcome == "hit" and outcome.stage == "optimized", (outcome.outcome, outcome.stage)
feeds = random_feeds(model.input_infos, seed=0)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
cpu, start = time.process_time(), time.perf_counter()
model.run(feeds)
first, first_cpu = time.perf_counter() - start, time.process_time() - cpu
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
steady, steady_cpu = [], []
for _ in range(runs):
    cpu, start = time.process_time(), time.perf_counter()
    model.run(feeds)
    steady.append(time.perf_counter() - start)
    steady_cpu.append(time.process_time() - cpu)
steady.sort()
steady_cpu.sort()
print(json.dumps({"first": first, "faults": faults, "steady": steady[len(steady) // 2], "first_cpu": first_cpu,
                  "steady_cpu": steady_cpu[len(steady_cpu) // 2], "native": model.native_partitions}))
"""


def measure(model: pathlib.Path, processes: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="nncc-first-run-") as cache:
        env = dict(os.environ, NNCC_CACHE_DIR=cache, NNCC_UPGRADE_AFTER="off")
        subprocess.run([sys.executable, "-m", "nncc", "compile", str(model), "-q", "-o",
                        os.path.join(cache, "artifact.nncc")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        seen = []
        for _ in range(processes):
            done = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(runs)], env=env,
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{model.name}: the measuring process failed:\n{done.stderr}")
            seen.append(json.loads(done.stdout.splitlines()[-1]))
    return {key: statistics.median(s[key] for s in seen) for key in seen[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=pathlib.Path)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    print("| model | native partitions | first run | minor faults | steady run | first / steady "
          "| first run CPU | steady CPU | CPU first / steady |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        m = measure(model, args.processes, args.runs)
        print(f"| {model.name} | {m['native']:.0f} | {m['first'] * 1000:.2f} ms | {m['faults']:.0f} "
              f"| {m['steady'] * 1000:.2f} ms | {m['first'] / m['steady']:.2f} | {m['first_cpu'] * 1000:.2f} ms "
              f"| {m['steady_cpu'] * 1000:.2f} ms | {m['first_cpu'] / max(m['steady_cpu'], 1e-6):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
