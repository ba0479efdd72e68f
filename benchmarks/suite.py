"""Benchmark suite: every fixture and every ONNX "light" model, nncc next to onnxruntime.

    python benchmarks/suite.py                         # all models, writes benchmarks/RESULTS.md
    python benchmarks/suite.py --duration 5 --model fixtures/mlp.onnx --output -
    python benchmarks/suite.py --profile light_vgg19 --profile transformer

For each model (fixtures/*.onnx with symbolic dims bound to 1, then
onnx/backend/test/data/light/*.onnx) it runs nncc.bench.run_benchmark with
--compare onnxruntime: both runtimes on the same seeded inputs, 2 intra-op/BLAS threads,
onnxruntime at its defaults otherwise, the timed runs interleaved in one process, so each
ratio comes from one run in which machine noise hit both sides alike (and onnxruntime's
idle threads spin on the cores nncc runs on next). benchmarks/bench_peers.py measures
each runtime, OpenVINO too, in a process of its own: quote its ratios. FLOPs are 2 x MACs of Conv/Gemm/MatMul from
the nncc plan; "% of peak" relates the achieved rate to numpy's float32
1024 x 1024 @ 1024 x 1024 matmul rate measured in the same process (the better of a
measurement before and after the models).

BLAS kernel. Some machines set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for the sake of older
OpenBLAS builds; they pin a current numpy's OpenBLAS to an older kernel (e.g. Haswell on an
AVX-512 CPU). When either is set, the suite measures in a subprocess of its own with both
unset (the calling environment is left alone), checks there that float32 matmul still
agrees with float64, and reports the kernel OpenBLAS picked; --keep-blas-env measures
with the environment as it is. Either way the kernel is in the report.

--profile NAME (a fixture or light model name, repeatable) prints, instead of the table,
per-kernel time for nncc (each executor step timed) next to onnxruntime's own per-node
profile, grouped by op, and cProfile's top functions inside nncc's run.

This is a script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import pathlib
import pstats
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from machine_load import busy_seconds, children_cpu, other_load  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
UNSET_MARK = "NNCC_SUITE_UNSET"  # tells the child which variables its parent unset (name=value,...)
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"
BLAS_WRONG = 3  # the child's exit code when the native kernel computes wrong results


def light_dir() -> pathlib.Path:
    import onnx

    return pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def all_models() -> list[pathlib.Path]:
    fixtures = sorted((ROOT / "fixtures").glob("*.onnx"))
    light = sorted(pathlib.Path(p) for p in glob.glob(str(light_dir() / "*.onnx")))
    return fixtures + light


def find_model(name: str) -> pathlib.Path:
    path = pathlib.Path(name)
    if path.exists():
        return path
    for model in all_models():
        if model.stem in (name, f"light_{name}"):
            return model
    raise SystemExit(f"suite: no model named {name!r}")


def short(path: pathlib.Path) -> str:
    return path.stem


# -- the parent: choose the BLAS environment ---------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0,
                        help="seconds of interleaved steady state per model (default 20)")
    parser.add_argument("--min-iterations", type=int, default=5, help="timed runs per model at least (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per runtime (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="BLAS / intra-op threads (default 2)")
    parser.add_argument("--model", action="append", help="model path or name (repeatable; default: all)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "RESULTS.md"),
                        help="markdown file to update between its suite markers ('-': print only)")
    parser.add_argument("--keep-blas-env", action="store_true",
                        help="measure with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as they are set")
    parser.add_argument("--profile", action="append", metavar="NAME",
                        help="per-kernel profile of this model instead of the table (repeatable)")
    parser.add_argument("--profile-runs", type=int, default=10, help="runs per profile (default 10)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="with --profile: size of a symbolic input dimension (default 1)")
    parser.add_argument("--retries", type=int, default=1,
                        help="re-measure models run while other processes kept the machine busy (default 1)")
    parser.add_argument("--busy-threshold", type=float, default=0.25,
                        help="other processes' CPU use, in cores, that makes a model's row busy (default 0.25)")
    parser.add_argument("--budget", type=float, default=9.5,
                        help="minutes after which no model is re-measured (default 9.5)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # measure one model, print its JSON
    args = parser.parse_args(argv)
    if args.one:
        return measure_one(args)
    if args.child:
        return child(args)

    own_argv = sys.argv[1:] if argv is None else argv
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), *own_argv, "--child"]
    env = dict(os.environ)
    env.pop(UNSET_MARK, None)
    set_vars = {k: env[k] for k in BLAS_ENV if k in env}
    if set_vars and not args.keep_blas_env:
        for name in set_vars:
            del env[name]
        env[UNSET_MARK] = ",".join(f"{k}={v}" for k, v in set_vars.items())
        code = subprocess.call(command, env=env)
        if code != BLAS_WRONG:
            raise SystemExit(code)
        print("suite: the native OpenBLAS kernel gave wrong float32 matmul results; measuring with "
              f"{', '.join(f'{k}={v}' for k, v in set_vars.items())} as set", file=sys.stderr)
        env = dict(os.environ, **{UNSET_MARK: "wrong-results"})
    raise SystemExit(subprocess.call(command, env=env))


# -- the child: measure ------------------------------------------------------------------------------


def blas_agrees() -> bool:
    import numpy as np

    rng = np.random.default_rng(1)
    for n in (7, 64, 515, 1024):
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        if not np.allclose(a @ b, exact, rtol=1e-4, atol=1e-3 * np.sqrt(n)):
            return False
    return True


def blas_env_note() -> str:
    mark = os.environ.get(UNSET_MARK)
    present = {k: os.environ[k] for k in BLAS_ENV if k in os.environ}
    if mark == "wrong-results":
        return ("the machine sets " + ", ".join(f"`{k}={v}`" for k, v in present.items())
                + "; with them unset OpenBLAS computed wrong results, so they were kept")
    if mark:
        return ("the machine sets " + ", ".join(f"`{v}`" for v in mark.split(","))
                + "; the suite measured in its own subprocess with both unset (float32 matmul checked "
                  "against float64 there first)")
    if present:
        return "measured with " + ", ".join(f"`{k}={v}`" for k, v in present.items()) + " as set (--keep-blas-env)"
    return "no OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the environment"


def child(args) -> None:
    sys.path.insert(0, str(ROOT))
    if os.environ.get(UNSET_MARK) not in (None, "wrong-results") and not blas_agrees():
        raise SystemExit(BLAS_WRONG)
    if args.profile:
        return profile(args)
    import onnxruntime

    import nncc
    from nncc.bench import machine_info, matmul_peak

    models = [find_model(m) for m in args.model] if args.model else all_models()
    machine = machine_info()
    started = time.time()
    peaks = [matmul_peak(1024, runs=15, threads=args.threads)]
    print(f"suite: numpy float32 matmul {peaks[0]['gflops_per_second']:.1f} GFLOP/s "
          f"({machine['blas']['corename']} kernel); {len(models)} models", file=sys.stderr)
    results = []
    for model in models:
        results.append(measure(model, args, peaks))
    # rows measured while other work kept the machine busy: measure again while time allows,
    # keeping the attempt with the least other load
    deadline = started + args.budget * 60
    for attempt in range(args.retries):
        busy = [i for i, r in enumerate(results) if r["suite"]["other_load_cores"] > args.busy_threshold]
        for i in busy:
            expected = results[i]["suite"]["seconds"]
            if time.time() + expected > deadline:
                print(f"suite: no time left to re-measure {short(models[i])}", file=sys.stderr)
                continue
            again = measure(models[i], args, peaks)
            again["suite"]["attempts"] = results[i]["suite"]["attempts"] + 1
            if again["suite"]["other_load_cores"] < results[i]["suite"]["other_load_cores"]:
                results[i] = again
            else:
                results[i]["suite"]["attempts"] = again["suite"]["attempts"]
    report = render(results, machine, peaks, args, onnxruntime.__version__, nncc.__version__,
                    time.time() - started)
    if args.output == "-":
        print(report)
    else:
        update(pathlib.Path(args.output), report)
        print(f"suite: wrote {args.output}", file=sys.stderr)


def measure(model: pathlib.Path, args, peaks: list) -> dict:
    """One model in a fresh process (its own peak RSS, nothing left over from the last one),
    with the CPU time other processes took meanwhile, and the matmul rate right after."""
    from nncc.bench import matmul_peak

    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--one", str(model),
               "--duration", str(args.duration), "--min-iterations", str(args.min_iterations),
               "--warmup", str(args.warmup), "--threads", str(args.threads)]
    t, busy, ours = time.perf_counter(), busy_seconds(), children_cpu()
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    other = other_load(busy, ours, wall)
    if done.returncode:
        raise SystemExit(f"suite: {shlex.join(command)} failed with exit code {done.returncode}")
    result = json.loads(done.stdout)
    peaks.append(matmul_peak(1024, runs=15, threads=args.threads))
    result["suite"] = {"other_load_cores": other, "matmul_after": peaks[-1]["gflops_per_second"],
                       "seconds": wall, "attempts": 1}
    cmp = result["compare"]
    ratio = cmp["ratios"]["p50"] if cmp and cmp["available"] else None
    print(f"suite: {short(model):24s} nncc p50 {result['latency_seconds']['p50'] * 1e3:9.2f} ms  "
          f"ratio {ratio if ratio is None else round(ratio, 2)}  ({result['iterations']} runs, {wall:.0f} s); "
          f"other load {other:.2f} cores, matmul after {peaks[-1]['gflops_per_second']:.0f} GFLOP/s",
          file=sys.stderr)
    return result


def measure_one(args) -> None:
    sys.path.insert(0, str(ROOT))
    from nncc.bench import BenchSettings, run_benchmark

    settings = BenchSettings(warmup=args.warmup, duration=args.duration, min_iterations=args.min_iterations,
                             threads=args.threads, compare="onnxruntime", compile_runs=2, cache_hits=3)
    result = run_benchmark(args.one, settings)
    json.dump(result, sys.stdout)


def _ms(seconds) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def _num(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(results, machine, peaks, args, ort_version, nncc_version, seconds) -> str:
    import numpy as np

    rates = [p["gflops_per_second"] for p in peaks]
    peak = max(rates)

    blas = results[0]["blas"] if results else machine["blas"]
    command = "python benchmarks/suite.py " + shlex.join(
        a for a in (sys.argv[1:] if not args.child else [x for x in sys.argv[1:] if x != "--child"]))
    lines = [
        BEGIN,
        f"Generated by `{command.strip()}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        f"in {seconds / 60:.1f} min.",
        "",
        "Machine:",
        "",
        f"- CPU: {machine['cpu_model'] or 'unknown'}, {machine['cpus']} CPUs usable (`nproc`), "
        f"{machine['platform']}",
        f"- Python {machine['python']}, numpy {machine['numpy']}, nncc {nncc_version}, onnxruntime {ort_version}",
        f"- BLAS: {blas['config'] or 'unknown'}; kernel in use: **{blas['corename'] or 'unknown'}** "
        f"({blas_env_note()})",
        f"- numpy float32 1024x1024 @ 1024x1024 with {args.threads} threads, median of 15, measured "
        f"{len(peaks)} times (before the models and after each): {min(rates):.0f} to {peak:.0f} GFLOP/s "
        f"(median {statistics.median(rates):.0f}); **peak = {peak:.1f} GFLOP/s** (the best median: the "
        "spread is other load on this shared machine)",
        "",
        f"Each model: {args.warmup} warm-up runs per runtime, then nncc and onnxruntime interleaved for "
        f"{args.duration:g} s (at least {args.min_iterations} runs each); {args.threads} BLAS threads for nncc, "
        f"onnxruntime at its defaults with intra_op_num_threads={args.threads}; seeded random inputs, "
        "symbolic dims = 1. Latencies in ms. Ratios are nncc / onnxruntime (below 1: nncc faster); "
        "GFLOP = 2 x MACs of Conv/Gemm/MatMul per inference; % of peak = nncc GFLOP/s / matmul peak. "
        "Other load = CPU time other processes took while the model was measured, in cores (from "
        "/proc/stat less the suite's own); rows above "
        f"{args.busy_threshold:g} were measured again (up to {args.retries} more time(s), marked *) and the "
        "quieter attempt kept; matmul after = the matmul rate (GFLOP/s) right after the model.",
        "",
        "| model | GFLOP | nncc p50 | ORT p50 | ratio p50 | ratio min | nncc GFLOP/s | % of peak "
        "| ORT GFLOP/s | runs | max abs diff | other load | matmul after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = []
    for r in results:
        machine_cells = (f"{r['suite']['other_load_cores']:.2f}{'*' if r['suite']['attempts'] > 1 else ''} | "
                         f"{r['suite']['matmul_after']:.0f}")
        cmp = r["compare"] if r["compare"] and r["compare"]["available"] else None
        flops = r["flops"]
        ort_p50 = cmp["latency_seconds"]["p50"] if cmp else None
        gf = r["gflops_per_second"]
        ort_gf = flops / ort_p50 / 1e9 if flops and ort_p50 else None
        if cmp:
            ratios.append(cmp["ratios"]["p50"])
        diff = cmp["max_abs_diff"] if cmp else None
        lines.append(
            f"| {short(pathlib.Path(r['model']))} | {flops / 1e9:.4g} | {_ms(r['latency_seconds']['p50'])} | "
            f"{_ms(ort_p50)} | {_num(cmp['ratios']['p50'] if cmp else None)} | "
            f"{_num(cmp['ratios']['min'] if cmp else None)} | {_num(gf)} | "
            f"{_num(100 * gf / peak if gf else None, 1)}% | {_num(ort_gf)} | {r['iterations']} | "
            f"{'-' if diff is None else f'{diff:.2g}'} | {machine_cells} |"
            if flops else
            f"| {short(pathlib.Path(r['model']))} | 0 | {_ms(r['latency_seconds']['p50'])} | {_ms(ort_p50)} | "
            f"{_num(cmp['ratios']['p50'] if cmp else None)} | {_num(cmp['ratios']['min'] if cmp else None)} | "
            f"- | - | - | {r['iterations']} | {'-' if diff is None else f'{diff:.2g}'} | {machine_cells} |")
    if ratios:
        lines += ["", f"Geometric mean of the p50 ratios: **{float(np.exp(np.mean(np.log(ratios)))):.2f}x** "
                      f"over {len(ratios)} models."]
    lines += [
        "",
        "Getting started (ms): cold compile = median `prepare(use_cache=False)` after the process's first; "
        "cache hit = median verified `prepare()` hit; ORT session = `InferenceSession()` with all graph "
        "optimizations; first inference = first `run()`; peak RSS = process peak after nncc's warm-up "
        "(before onnxruntime is loaded; each model runs in a process of its own).",
        "",
        "| model | cold compile | cache hit | ORT session | first inference | ORT first | nncc p90 | ORT p90 "
        "| peak RSS (nncc) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cmp = r["compare"] if r["compare"] and r["compare"]["available"] else None
        c = r["compile"]
        lines.append(
            f"| {short(pathlib.Path(r['model']))} | {_ms(c['cold_seconds'])} | {_ms(c['cache_hit_seconds'])} | "
            f"{_ms(cmp['session_seconds'] if cmp else None)} | {_ms(r['first_inference_seconds'])} | "
            f"{_ms(cmp['first_inference_seconds'] if cmp else None)} | {_ms(r['latency_seconds']['p90'])} | "
            f"{_ms(cmp['latency_seconds']['p90'] if cmp else None)} | "
            f"{r['memory']['peak_rss_nncc_bytes'] / 2**20:.0f} MiB |")
    lines.append(END)
    return "\n".join(lines)


def update(path: pathlib.Path, report: str) -> None:
    """Replace the text between the suite markers (or create the file with it)."""
    if path.exists():
        text = path.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            path.write_text(head + report + tail)
            return
        path.write_text(text.rstrip() + "\n\n" + report + "\n")
        return
    path.write_text("# Benchmark results\n\n" + report + "\n")


# -- per-kernel profiles ----------------------------------------------------------------------------------

FAMILY = {
    "FusedConv": "Conv", "Conv": "Conv", "FusedGemm": "Gemm/MatMul", "Gemm": "Gemm/MatMul",
    "MatMul": "Gemm/MatMul", "FusedMatMul": "Gemm/MatMul",
}


def _family(op: str) -> str:
    return FAMILY.get(op, op)


def nncc_kernel_times(compiled, feeds, runs: int):
    """Seconds per run by op type, each executor step timed (Executor.steps holds one
    (fn, ...) tuple per plan instruction; the fn is wrapped); plus instruction counts, the
    seconds per run of each instruction, and the whole run's seconds (median) with the
    timers in place."""
    executor = compiled._executor
    plan = compiled.plan
    per_step = [0.0] * len(plan.instructions)
    clock = time.perf_counter
    original = list(executor.steps)

    def timed(fn, index):
        def wrapper(*a, **k):
            start = clock()
            try:
                return fn(*a, **k)
            finally:
                per_step[index] += clock() - start

        return wrapper

    executor.steps = [(timed(step[0], i),) + tuple(step[1:]) for i, step in enumerate(original)]
    try:
        compiled.run(feeds)  # warm
        per_step[:] = [0.0] * len(per_step)
        walls = []
        for _ in range(runs):
            start = clock()
            compiled.run(feeds)
            walls.append(clock() - start)
    finally:
        executor.steps = original
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for ins, t in zip(plan.instructions, per_step):
        op = plan.kernels[ins.kernel].split("::")[1]
        totals[op] = totals.get(op, 0.0) + t / runs
        counts[op] = counts.get(op, 0) + 1
    return totals, counts, [t / runs for t in per_step], statistics.median(walls)


def ort_kernel_times(model: str, feeds, runs: int, threads: int) -> tuple[dict[str, float], dict[str, int], float]:
    import onnxruntime as ort

    from nncc.bench import onnxruntime_settings

    options = ort.SessionOptions()  # its defaults, the thread count as --compare sets it, and profiling
    options.log_severity_level = 3
    for name, value in onnxruntime_settings(threads).items():
        setattr(options, name, value)
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="nncc-ort-prof-"), "ort")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    ort_feeds = {n: feeds[n] for n in names}
    session.run(None, ort_feeds)
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, ort_feeds)
        walls.append(time.perf_counter() - start)
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    totals: dict[str, float] = {}
    seen: dict[str, set] = {}
    model_runs = 0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            model_runs += 1
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        op = e.get("args", {}).get("op_name", "?")
        totals[op] = totals.get(op, 0.0) + e["dur"] / 1e6
        seen.setdefault(op, set()).add(e["name"])
    model_runs = max(1, model_runs)  # the warm run is in the profile too
    return ({op: t / model_runs for op, t in totals.items()}, {op: len(v) for op, v in seen.items()},
            statistics.median(walls))


def profile(args) -> None:
    import nncc
    from nncc.bench import bind_dims, count_flops, instruction_flops, machine_info
    from nncc.runtime.random_inputs import random_feeds
    from nncc.util.threads import set_blas_threads

    set_blas_threads(args.threads)
    info = machine_info()
    print(f"BLAS kernel {info['blas']['corename']}, {args.threads} threads; {blas_env_note()}\n")
    for name in args.profile:
        model = find_model(name)
        compiled = nncc.compile_model(model)
        feeds = random_feeds(compiled.input_infos, 0, {k: int(v) for k, v in (d.split("=") for d in args.dim)})
        dims = bind_dims(compiled.input_infos, feeds)
        flops = count_flops(compiled.plan, dims)
        ours, our_counts, per_step, our_wall = nncc_kernel_times(compiled, feeds, args.profile_runs)
        theirs, their_counts, their_wall = ort_kernel_times(str(model), feeds, args.profile_runs, args.threads)
        fam_ours: dict[str, float] = {}
        fam_theirs: dict[str, float] = {}
        for op, t in ours.items():
            fam_ours[_family(op)] = fam_ours.get(_family(op), 0.0) + t
        for op, t in theirs.items():
            fam_theirs[_family(op)] = fam_theirs.get(_family(op), 0.0) + t
        total_ours = sum(ours.values())
        shapes = ", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in feeds.items())
        print(f"### {short(model)} ({shapes}): nncc {our_wall * 1e3:.1f} ms/run (kernels {total_ours * 1e3:.1f} ms), "
              f"onnxruntime {their_wall * 1e3:.1f} ms/run (kernels {sum(theirs.values()) * 1e3:.1f} ms); "
              f"median of {args.profile_runs} runs\n")
        print("| nncc op | instructions | nncc ms/run | share of kernel time |")
        print("|---|---:|---:|---:|")
        for op, t in sorted(ours.items(), key=lambda kv: -kv[1])[:10]:
            print(f"| {op} | {our_counts[op]} | {t * 1e3:.2f} | {100 * t / total_ours:.0f}% |")
        family_flops = {"Conv": flops["by_op"].get("Conv", 0),
                        "Gemm/MatMul": flops["by_op"].get("Gemm", 0) + flops["by_op"].get("MatMul", 0)}
        print("\n| op family | nncc ms/run | ORT ms/run | nncc / ORT | nncc GFLOP/s | ORT GFLOP/s |")
        print("|---|---:|---:|---:|---:|---:|")
        for fam, t in sorted(fam_ours.items(), key=lambda kv: -kv[1])[:8]:
            ort_t = fam_theirs.get(fam)
            fl = family_flops.get(fam, 0)
            print(f"| {fam} | {t * 1e3:.2f} | {'-' if ort_t is None else f'{ort_t * 1e3:.2f}'} | "
                  f"{'-' if not ort_t else f'{t / ort_t:.1f}x'} | {f'{fl / t / 1e9:.1f}' if fl and t else '-'} | "
                  f"{f'{fl / ort_t / 1e9:.1f}' if fl and ort_t else '-'} |")
        plan = compiled.plan
        print("\nslowest nncc instructions:\n")
        print("| instruction | op | input -> output | weight | group | ms/run | GFLOP/s |")
        print("|---|---|---|---|---:|---:|---:|")
        for i in sorted(range(len(per_step)), key=lambda i: -per_step[i])[:8]:
            ins = plan.instructions[i]
            shp = [plan.slots[s].shape if s >= 0 else None for s in ins.inputs]
            out = plan.slots[ins.outputs[0]].shape if ins.outputs and ins.outputs[0] >= 0 else None
            counted = instruction_flops(plan, ins, dims)
            rate = f"{counted[1] / per_step[i] / 1e9:.1f}" if counted and counted[1] and per_step[i] else "-"
            fmt = lambda shape: "x".join(map(str, shape)) if shape else "?"  # noqa: E731
            print(f"| {ins.node or i} | {plan.kernels[ins.kernel].split('::')[1]} | {fmt(shp[0] if shp else None)}"
                  f" -> {fmt(out)} | {fmt(shp[1]) if len(shp) > 1 else '-'} | {ins.attrs.get('group', 1)} | "
                  f"{per_step[i] * 1e3:.2f} | {rate} |")
        print("\nonnxruntime's nodes by op (ms/run, node count):",
              ", ".join(f"{op} {t * 1e3:.2f} ({their_counts[op]})"
                        for op, t in sorted(theirs.items(), key=lambda kv: -kv[1])[:10]))
        # where the time goes inside nncc's kernels
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.profile_runs):
            compiled.run(feeds)
        profiler.disable()
        stats = pstats.Stats(profiler)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:12]  # by tottime
        print(f"\ncProfile, top functions by own time (per run, {args.profile_runs} runs):\n")
        print("| function | calls/run | own ms/run | cumulative ms/run |")
        print("|---|---:|---:|---:|")
        for (file, line, func), (cc, nc, tt, ct, _) in rows:
            where = f"{pathlib.Path(file).name}:{line}({func})" if file != "~" else func
            print(f"| `{where}` | {nc / args.profile_runs:.0f} | {tt / args.profile_runs * 1e3:.2f} | "
                  f"{ct / args.profile_runs * 1e3:.2f} |")
        print()


if __name__ == "__main__":
    main()
