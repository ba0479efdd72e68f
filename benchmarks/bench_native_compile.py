"""Native-stage compile time through the kernel object cache, cold and warm.

    python benchmarks/bench_native_compile.py                        # ResNet-50, real weights
    python benchmarks/bench_native_compile.py --model MODEL.onnx [--runs 3]

Compiles MODEL through a fresh cache directory (a miss: passes, C generation, the compiler,
the link, the store), with $CC pointing at a wrapper script that logs every call and execs
the real compiler, then times it three ways:
- cold: an empty cache, every translation unit is compiled;
- warm: the same model again after its entry was removed, its objects kept (a recompile
  after eviction or corruption): only the link runs;
- sibling: a second model with the same layers and other weights (seed + 1 for a model
  made here; skipped with --model): its own entry, the objects of the first.
Each figure is the median of --runs fresh processes' wall time for the compile (the
model's file already read), with the compiler invocations (its version query left out).
Without --model the model is benchmarks/real_models.py's resnet50(), written once into
build/real-models/. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

_ONE = """
import json, sys, time
sys.path.insert(0, {root!r})
from nncc.cache.store import Cache, prepare
path, cache_dir, drop = sys.argv[1], sys.argv[2], sys.argv[3] == "drop"
if drop:
    with Cache.open(cache_dir) as c:
        for e in c.index.entries():
            c.remove(e.token)
start = time.perf_counter()
model, outcome = prepare(path, cache_dir=cache_dir)
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "outcome": outcome.outcome, "native": "native" in model._executor.loaded}}))
"""


def resnet50_path() -> pathlib.Path:
    path = ROOT / "build" / "real-models" / "resnet50.onnx"
    if not path.exists():
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import onnx

        from real_models import resnet50

        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(resnet50(), str(path))
    return path


def sibling_of(path: pathlib.Path, folder: pathlib.Path) -> pathlib.Path | None:
    """The same graph with other weights (every float initializer perturbed)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    rng = np.random.default_rng(1)
    for i, init in enumerate(model.graph.initializer):
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32:
            noisy = (array + rng.standard_normal(array.shape).astype(np.float32) * 0.01).astype(np.float32)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(noisy, init.name))
    out = folder / "sibling.onnx"
    onnx.save(model, str(out))
    return out


def compile_once(model: pathlib.Path, cache: pathlib.Path, wrapper: pathlib.Path, log: pathlib.Path,
                 drop: bool) -> tuple[float, int]:
    log.write_text("")
    env = dict(os.environ, CC=str(wrapper))
    done = subprocess.run([sys.executable, "-c", _ONE.format(root=str(ROOT)), str(model), str(cache),
                           "drop" if drop else "keep"], capture_output=True, text=True, env=env, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["outcome"] not in ("miss", "recompiled") or not result["native"]:
        raise SystemExit(f"unexpected outcome {result}: {done.stderr}")
    calls = [line for line in log.read_text().splitlines() if line.strip() != "--version"]
    return result["seconds"], len(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=pathlib.Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    model = args.model or resnet50_path()
    real = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc") or shutil.which("clang")
    if real is None:
        raise SystemExit("no C compiler: nothing to measure")
    figures: dict[str, list[tuple[float, int]]] = {"cold": [], "warm": [], "sibling": []}
    with tempfile.TemporaryDirectory(prefix="nncc-bench-compile-") as tmp:
        tmp = pathlib.Path(tmp)
        log, wrapper = tmp / "cc.log", tmp / "cc"
        wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real}" "$@"\n')
        wrapper.chmod(0o755)
        sibling = None if args.model else sibling_of(model, tmp)
        for run in range(args.runs):
            cache = tmp / f"cache-{run}"
            figures["cold"].append(compile_once(model, cache, wrapper, log, drop=False))
            figures["warm"].append(compile_once(model, cache, wrapper, log, drop=True))
            if sibling is not None:
                figures["sibling"].append(compile_once(sibling, cache, wrapper, log, drop=False))
    print(f"{model.name}: native-stage compile through the kernel object cache "
          f"(median of {args.runs} runs, {os.cpu_count()} cores, compiler {real})")
    for name, rows in figures.items():
        if rows:
            seconds = statistics.median(s for s, _ in rows)
            calls = sorted({c for _, c in rows})
            print(f"  {name:8s} {seconds:6.2f} s   compiler invocations {', '.join(map(str, calls))}"
                  f"   (runs: {', '.join(f'{s:.2f}' for s, _ in rows)} s)")


if __name__ == "__main__":
    main()
