"""Stages benchmark: what does the first `nncc run` of a new model cost?

    python benchmarks/bench_stages.py [--runs 3] [--models light_squeezenet,path/to/model.onnx]

For each model (a name of the "light" ONNX model-zoo classics shipped in the onnx wheel, or
the path of an .onnx file), the median of --runs whole-process runs of
`python -m nncc run MODEL --random-inputs`, each into a fresh cache directory (a miss):

    first run        the default: the quick stage (portable plan; no C compiler runs)
    quick miss       `--backend numpy`: today's quick compile, stored in the cache likewise
    no cache         `--no-cache --backend numpy`: the portable compile alone, no cache
    native miss      `--stage optimized`: what a miss cost before stages (C compiler included)

and, once, how long the detached worker then takes to commit the optimized stage (the
entry is polled in the index after the third run, NNCC_UPGRADE_AFTER=2). Prints a
markdown table; "first / quick" near 1 means the first run costs a quick compile.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time


def light_dir() -> pathlib.Path:
    import onnx

    return pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def model_path(name: str) -> pathlib.Path:
    path = pathlib.Path(name)
    return path if path.suffix == ".onnx" else light_dir() / f"{name}.onnx"


def timed_run(model: pathlib.Path, cache: str, *extra: str) -> float:
    env = dict(os.environ, NNCC_CACHE_DIR=cache, NNCC_UPGRADE_AFTER="2")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nncc", "run", str(model), "--random-inputs", "-q", *extra],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def stage_of(cache: str) -> str | None:
    conn = sqlite3.connect(f"file:{cache}/index.sqlite3?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT stage FROM entries").fetchall()
    finally:
        conn.close()
    return rows[0][0] if rows else None


def upgrade_seconds(model: pathlib.Path, limit: float = 600.0) -> float | None:
    """Seconds from the hit that starts the worker to the optimized stage's commit."""
    with tempfile.TemporaryDirectory(prefix="nncc-bench-stages-") as cache:
        timed_run(model, cache)
        timed_run(model, cache)
        start = time.perf_counter()
        timed_run(model, cache)  # the second hit starts the worker
        while stage_of(cache) != "optimized":
            if time.perf_counter() - start > limit:
                return None
            time.sleep(0.05)
        return time.perf_counter() - start


def median_miss(model: pathlib.Path, runs: int, *extra: str) -> float:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="nncc-bench-stages-") as cache:
            times.append(timed_run(model, cache, *extra))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="light_squeezenet")
    args = parser.parse_args()
    print("| model | first run (default miss) | quick miss (--backend numpy) | first / quick "
          "| no cache (numpy) | native miss (--stage optimized) | worker to optimized |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        model = model_path(name)
        first = median_miss(model, args.runs)
        quick = median_miss(model, args.runs, "--backend", "numpy")
        uncached = median_miss(model, args.runs, "--no-cache", "--backend", "numpy")
        native = median_miss(model, args.runs, "--stage", "optimized")
        upgrade = upgrade_seconds(model)
        print(f"| {model.stem} | {first * 1000:.0f} ms | {quick * 1000:.0f} ms | {first / quick:.2f} "
              f"| {uncached * 1000:.0f} ms | {native * 1000:.0f} ms | {'-' if upgrade is None else f'{upgrade:.1f} s'} |")


if __name__ == "__main__":
    main()
