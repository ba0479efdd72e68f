"""Cache benchmark: how fast does a cached model come back, next to onnxruntime (and OpenVINO)?

    python benchmarks/bench_cache.py [--runs 5] [--models light_resnet50,build/real-models/bert.onnx]

For each model (a name of the "light" ONNX model-zoo classics shipped in the onnx wheel, or
the path of an .onnx file: `python benchmarks/real_models.py --large` makes real-weight ones
into build/real-models/), median of --runs runs (at least 5) of the following, nncc and its
peers in mirrored blocks (see blocked_ms):

(a) in process, the runtime already imported:
    nncc         nncc.model.prepare(model, cache_dir) on a hit: token (direct mode: the
                 model file's identity, looked up in the index), model cache read + blake3
                 + compare, data cache mmap + size + one 1 MiB chunk's blake3,
                 bounds-checked parse, executor setup.
    onnxruntime  InferenceSession from the optimized model it saved earlier
                 (SessionOptions.optimized_model_filepath), reloaded with graph optimizations
                 disabled: onnxruntime's nearest equivalent of "prepare from the cache".
    OpenVINO     core.compile_model(model, "CPU", {"CACHE_DIR": dir}) on a cache hit, when
                 `import openvino` works (`pip install 'nncc[bench]'`, the benchmarks' extra);
                 otherwise "not installed".
    (context)    a cold compile: nncc without the cache vs onnxruntime creating a session from
                 the original model with all graph optimizations.

(b) whole process, to the first output: `python -m nncc run MODEL --random-inputs` on a hit
    (warm cache dir, holding the optimized native stage) and on a miss (fresh cache dir each
    time: the quick portable stage, which is what a first run compiles) vs onnxruntime's cold start
    `python -c "import onnxruntime; InferenceSession(model); run once"`.

Prints a markdown table; ratios are nncc / other (below 1: nncc is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ORT_COLD = """
import sys, numpy as np, onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32) for i in s.get_inputs()}
out = s.run(None, feeds)
print(out[0].shape)
"""


def light_dir() -> pathlib.Path:
    import onnx

    return pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def blocked_ms(fns, runs: int) -> list[float]:
    """The median of ``runs`` timed calls of each function, in blocks ordered A B C C B A:
    each side's calls run back to back (half of them in each of its two blocks), and a
    block that follows another side starts with one untimed call.

    Why not strict turns (A B A B ...): this VM hands memory a process freed back to its
    host after a second or two, and whatever runs next must have it backed anew (about 1 ms
    per MB). Right after an onnxruntime process that freed gigabytes (light_vgg19), an nncc
    run measured 1.2-1.8 s instead of 0.47 s; in turns each side would be timed in the
    other's aftermath, which the peer that frees more inflicts and the other pays. Blocks
    time each side after itself, as a user re-running one command sees it; the mirrored
    order spreads the machine's drift over both."""
    order = list(range(len(fns))) + list(reversed(range(len(fns))))
    times: list[list[float]] = [[] for _ in fns]
    previous = None
    for position, k in enumerate(order):
        count = runs // 2 if position < len(fns) else runs - runs // 2
        if previous != k:
            fns[k]()  # untimed: the first call after another side's
        for _ in range(count):
            t = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t)
        previous = k
    return [statistics.median(spent) * 1000 for spent in times]


def run_process(cmd, env=None, reports=None) -> None:
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"failed: {shlex.join(cmd)}\n{done.stderr}")
    if reports is not None:
        reports.append(json.loads(done.stdout))


def bench_model(name: str, runs: int, work: pathlib.Path) -> list[dict]:
    import onnxruntime as ort

    from nncc.model import prepare

    model = name if name.endswith(".onnx") else str(light_dir() / f"{name}.onnx")
    name = pathlib.Path(model).stem
    cache = work / f"{name}-cache"
    rows = []

    # (a) in process -----------------------------------------------------------------
    _, first = prepare(model, cache_dir=cache, stage="optimized")  # the entry a used model ends with
    assert first.outcome == "miss", first
    age = os.stat(model).st_ctime + 2.1 - time.time()  # direct mode records identities 2 s old
    if age > 0:
        time.sleep(age)
    prepare(model, cache_dir=cache)  # records the model's identity

    def nncc_hit():
        _, outcome = prepare(model, cache_dir=cache)
        assert outcome.outcome == "hit", outcome

    optimized = str(work / f"{name}.ort-optimized.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = optimized
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])

    def ort_reload():
        reload = ort.SessionOptions()
        reload.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort.InferenceSession(optimized, reload, providers=["CPUExecutionProvider"])

    peers = [nncc_hit, ort_reload]
    ov_hit = openvino_hit(model, work / f"{name}-ov-cache")
    if ov_hit is not None:
        peers.append(ov_hit)
    times = blocked_ms(peers, runs)  # each block warms up first, as a long-running process is
    nncc_prepare, ort_prepare = times[:2]
    ov = times[2] if ov_hit is not None else "not installed"
    rows.append(row(name, "(a) in-process prepare from cache (hit, verified)", nncc_prepare,
                    ort_prepare, "session from saved optimized model", ov))

    def ort_cold_session():
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])

    nncc_cold, ort_cold = blocked_ms([lambda: prepare(model, use_cache=False), ort_cold_session], runs)
    rows.append(row(name, "(context) in-process cold compile, no cache", nncc_cold, ort_cold,
                    "session from original model, all optimizations", None))

    # (b) whole process ---------------------------------------------------------------
    env = whole_process_env()
    nncc_cmd = [sys.executable, "-m", "nncc", "run", model, "--random-inputs", "--json"]
    hits, misses = [], []
    counter = iter(range(10**6))
    ort_cmd = [sys.executable, "-c", ORT_COLD, model]
    hit_ms, miss_ms, ort_ms = blocked_ms([
        lambda: run_process(nncc_cmd + ["--cache-dir", str(cache)], env, hits),
        lambda: run_process(nncc_cmd + ["--cache-dir", str(work / f"{name}-miss-{next(counter)}")], env, misses),
        lambda: run_process(ort_cmd),
    ], runs)
    assert {r["cache"]["outcome"] for r in hits} == {"hit"} and {r["cache"]["outcome"] for r in misses} == {"miss"}
    rows.append(row(name, "(b) whole process to first output, nncc hit", hit_ms, ort_ms, "cold start", None,
                    _inside(hits)))
    rows.append(row(name, "(b) whole process to first output, nncc miss", miss_ms, ort_ms, "cold start", None,
                    _inside(misses)))
    return rows


def whole_process_env() -> dict:
    """The environment of a user's process: byte code cached as an installed package has it
    (pip compiles it at install; PYTHONDONTWRITEBYTECODE, which some sandboxes set, would
    make every nncc start compile its sources again, ~100 ms that no user pays)."""
    import compileall

    import nncc

    compileall.compile_dir(os.path.dirname(nncc.__file__), quiet=1)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _inside(reports: list[dict]) -> str:
    """Where nncc's own time went inside the process (from its --json report)."""
    prepare_ms = statistics.median(r["cache"]["seconds"] for r in reports) * 1000
    run_ms = statistics.median(r["timing"]["run_seconds"] for r in reports) * 1000
    return f"{prepare_ms:.0f} ms prepare + {run_ms:.0f} ms first run"


def openvino_hit(model: str, cache_dir: pathlib.Path):
    """A function doing OpenVINO's compile_model on a CACHE_DIR hit (the cache filled here
    first), or None when `import openvino` fails."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    core.compile_model(model, "CPU", {"CACHE_DIR": str(cache_dir)})  # fills the cache
    return lambda: core.compile_model(model, "CPU", {"CACHE_DIR": str(cache_dir)})


def row(model, what, nncc_ms, ort_ms, ort_what, ov, inside="") -> dict:
    return {"model": model, "what": what, "nncc": nncc_ms, "ort": ort_ms, "ort_what": ort_what, "ov": ov,
            "inside": inside}


def render(rows: list[dict], runs: int, command: str) -> str:
    lines = [
        f"Command: `{command}`  (median of {runs} runs; times in ms; ratio = nncc / other, below 1 = nncc faster)",
        "",
        "| model | measurement | nncc | onnxruntime | nncc / ort | OpenVINO (CACHE_DIR hit) | nncc / OpenVINO "
        "| inside the nncc process |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ov = r["ov"]
        if ov is None:
            ov_cell, ov_ratio = "-", "-"
        elif isinstance(ov, str):
            ov_cell, ov_ratio = ov, "-"
        else:
            ov_cell, ov_ratio = f"{ov:.1f}", f"{r['nncc'] / ov:.2f}"
        lines.append(f"| {r['model']} | {r['what']} (ort: {r['ort_what']}) | {r['nncc']:.1f} | {r['ort']:.1f} | "
                     f"{r['nncc'] / r['ort']:.2f} | {ov_cell} | {ov_ratio} | {r['inside'] or '-'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (at least 5)")
    parser.add_argument("--models", default="light_resnet50,light_vgg19",
                        help="comma-separated light model names or .onnx paths")
    args = parser.parse_args(argv)
    runs = max(5, args.runs)
    command = shlex.join(["python", *sys.argv])
    rows = []
    with tempfile.TemporaryDirectory(prefix="nncc-bench-") as tmp:
        for name in args.models.split(","):
            rows += bench_model(name.strip(), runs, pathlib.Path(tmp))
    print(render(rows, runs, command))


if __name__ == "__main__":
    main()
