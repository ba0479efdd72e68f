"""Benchmark measurement behind `nncc bench` and benchmarks/suite.py (no click, no rich).

One call, ``run_benchmark(model, BenchSettings(...))``, measures in this order and returns
a JSON-ready dict (the schema is in docs/bench.md):

1. cold compile: ``prepare(use_cache=False)``; the first compile of the process (it pays
   the lazy imports of the frontend and passes) and the median of a few more;
2. cache-hit load: compile once into a cache directory (a temporary one unless given),
   then the median of several ``prepare()`` hits, each verified against the hash index;
3. first inference on the model the last hit prepared;
4. warm-up runs, then the steady state: latency min/p50/p90/p99/mean/stddev, throughput;
5. peak resident memory: getrusage's ru_maxrss (on Linux /proc/self/status VmHWM, the same
   figure without a parent's peak carried over fork + exec); no tracemalloc, which would
   slow every allocation the timings include;
6. with ``compare="onnxruntime"``: an onnxruntime session on the same inputs, at its
   defaults with the same thread count, timed INTERLEAVED with nncc in this process (the
   order alternates every iteration, so machine noise and cache effects hit both alike);
   ratios nncc / ort and the largest absolute difference between their outputs.
   benchmarks/bench_peers.py runs each runtime in a process of its own instead.

``count_flops(plan, dims)`` counts 2 x MACs of Conv, ConvTranspose, Gemm and MatMul
(fused variants included) from the plan's slot shapes; ``matmul_peak()`` measures the
machine's numpy float32 matmul rate, for "% of peak" figures.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

import nncc
from nncc._version import __version__
from nncc.backends.registry import load_plugin
from nncc.errors import NnccError
from nncc.ir.dims import check_dim_names, symbolic_dims
from nncc.model import preparer
from nncc.preparing.deviation import PLAN_KEY
from nncc.runtime.random_inputs import random_feeds
from nncc.util import progress
from nncc.util.files import is_artifact
from nncc.util.notice import warn
from nncc.util.threads import blas_info, blas_threads, limit_blas_threads

SCHEMA = "nncc-bench/1"
DEFAULT_DURATION = 3.0  # seconds of steady state when neither iterations nor duration is given
DEFAULT_MIN_ITERATIONS = 10  # ... and at least this many iterations
COMPARE_RUNTIMES = ("onnxruntime",)
MAX_ITERATIONS = 1_000_000  # a --duration loop on a tiny model stops here whatever the clock says


class BenchError(NnccError):
    """Bad benchmark settings or a model that cannot be benchmarked as asked."""

    exit_code = 2


@dataclass
class BenchSettings:
    warmup: int = 3
    iterations: int | None = None  # timed iterations (per runtime with compare)
    duration: float | None = None  # or: seconds of timed loop (both runtimes together)
    min_iterations: int | None = None  # with a duration: at least this many (default 1; 10 without either)
    threads: int | None = 2  # BLAS threads for nncc, intra-op threads for onnxruntime; None: leave as is
    compare: str | None = None  # "onnxruntime"
    seed: int = 0
    dims: dict[str, int] = field(default_factory=dict)  # symbolic input dims; unnamed ones are 1
    cache_dir: str | None = None  # None: a temporary directory, removed afterwards
    compile_runs: int = 3  # cold compiles after the first one
    cache_hits: int = 5  # timed prepare() hits
    compile_options: dict[str, Any] = field(default_factory=dict)  # preference, opt_level, backends, plugins

    def check(self) -> None:
        if self.warmup < 0:
            raise BenchError(f"--warmup must be 0 or more, not {self.warmup}")
        if self.iterations is not None and self.duration is not None:
            raise BenchError("give --iterations or --duration, not both")
        if self.iterations is not None and self.iterations < 1:
            raise BenchError(f"--iterations must be at least 1, not {self.iterations}")
        if self.min_iterations is not None and self.min_iterations < 1:
            raise BenchError(f"the minimum number of iterations must be at least 1, not {self.min_iterations}")
        if self.duration is not None and not (self.duration > 0 and math.isfinite(self.duration)):
            raise BenchError(f"--duration must be a positive number of seconds, not {self.duration}")
        if self.threads is not None and self.threads < 1:
            raise BenchError(f"--threads must be at least 1, not {self.threads}")
        if self.compare is not None and self.compare not in COMPARE_RUNTIMES:
            raise BenchError(f"cannot compare with {self.compare!r}; choose from {', '.join(COMPARE_RUNTIMES)}")
        for name, value in self.dims.items():
            if not isinstance(value, int) or value < 0:
                raise BenchError(f"dimension {name!r} must be a non-negative integer, not {value!r}")


# -- statistics ---------------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def latency_stats(samples: list[float]) -> dict[str, float]:
    """min, p50, p90, p99, mean and (sample) stddev of latencies in seconds."""
    ordered = sorted(samples)
    return {
        "min": ordered[0],
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "mean": statistics.fmean(ordered),
        "stddev": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# -- FLOPs ---------------------------------------------------------------------------------------------

FLOP_OPS = ("Conv", "FusedConv", "ConvTranspose", "Gemm", "FusedGemm", "MatMul", "FusedMatMul", "FusedAttention")


def bind_dims(declared: Mapping[str, Any], feeds: Mapping[str, Any]) -> dict[str, int]:
    """Symbolic dimension name -> the size the feeds give it."""
    bound: dict[str, int] = {}
    for name, info in declared.items():
        shape = getattr(info, "shape", None)
        value = feeds.get(name)
        if shape is None or value is None:
            continue
        for dim, size in zip(shape, getattr(value, "shape", ())):
            if isinstance(dim, str):
                bound.setdefault(dim, int(size))
    return bound


def _concrete(shape, dims: Mapping[str, int]) -> tuple[int, ...] | None:
    if shape is None:
        return None
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and d in dims:
            out.append(int(dims[d]))
        else:
            return None
    return tuple(out)


def _prod(values) -> int:
    result = 1
    for v in values:
        result *= int(v)
    return result


def instruction_flops(plan, ins, dims: Mapping[str, int] | None = None) -> tuple[str, int | None] | None:
    """(op family, 2 x MACs) of one plan instruction; None when it is not a counted op;
    (family, None) when its shapes are unknown."""
    key = plan.kernels[ins.kernel]
    parts = key.split("::")
    op = parts[1] if len(parts) == 3 else key
    if op not in FLOP_OPS:
        return None
    dims = dims or {}

    def shape(position: int, of=ins.inputs):
        if position >= len(of) or of[position] < 0:
            return None
        return _concrete(plan.slots[of[position]].shape, dims)

    a, w, y = shape(0), shape(1), shape(0, ins.outputs)
    macs = None
    if op in ("Conv", "FusedConv") and w is not None and y is not None and len(w) >= 2:
        macs = _prod(y) * _prod(w[1:])  # each output: C/group x kernel MACs
    elif op == "ConvTranspose" and a is not None and w is not None and len(w) >= 2:
        macs = _prod(a) * _prod(w[1:])  # each input element: M/group x kernel MACs
    elif op in ("Gemm", "FusedGemm") and a is not None and y is not None and len(a) == 2:
        k = a[0] if ins.attrs.get("transA", 0) else a[1]
        macs = _prod(y) * k
    elif op in ("MatMul", "FusedMatMul") and a is not None and y is not None and a:
        macs = _prod(y) * a[-1]
    elif op == "FusedAttention":  # its two products: Q·Kᵀ (D per score), then P·V (Skv per output)
        k, v = shape(1), shape(2)
        if k is not None and v is not None and y is not None and min(len(k), len(v)) >= 2:
            k_perm, v_perm = ins.attrs.get("k_perm") or range(len(k)), ins.attrs.get("v_perm") or range(len(v))
            k, v = [k[int(i)] for i in k_perm], [v[int(i)] for i in v_perm]
            skv, d, dv = k[-2], k[-1], v[-1]
            macs = _prod(y) * skv + (_prod(y) // dv if dv else 0) * skv * d
        return "MatMul", None if macs is None else 2 * macs
    return op.replace("Fused", ""), None if macs is None else 2 * macs


def count_flops(plan, dims: Mapping[str, int] | None = None) -> dict[str, Any]:
    """2 x multiply-accumulates of the plan's Conv/ConvTranspose/Gemm/MatMul instructions (a
    fused attention counts as the two matrix products it computes).

    Returns {"total": int | None, "by_op": {op: flops}, "unresolved": [node names]}; total
    is None when some counted instruction has a shape the plan leaves unknown.
    """
    by_op: dict[str, int] = {}
    unresolved: list[str] = []
    for ins in plan.instructions:
        counted = instruction_flops(plan, ins, dims)
        if counted is None:
            continue
        family, flops = counted
        if flops is None:
            unresolved.append(ins.node or family)
            continue
        by_op[family] = by_op.get(family, 0) + flops
    total = None if unresolved else sum(by_op.values())
    return {"total": total, "by_op": by_op, "unresolved": unresolved}


# -- machine -------------------------------------------------------------------------------------------


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "processor\t: arm")):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_info() -> dict[str, Any]:
    return {
        "cpus": usable_cpus(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_info(),
        "env": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                           "OMP_NUM_THREADS") if k in os.environ},
    }


def matmul_peak(n: int = 1024, runs: int = 15, threads: int | None = None) -> dict[str, float]:
    """numpy float32 (n x n) @ (n x n): median seconds and GFLOP/s (the machine's BLAS peak)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), np.float32)
    with limit_blas_threads(threads):
        for _ in range(3):
            np.matmul(a, b, out=out)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            np.matmul(a, b, out=out)
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"n": n, "seconds": median, "gflops_per_second": 2.0 * n ** 3 / median / 1e9,
            "best_gflops_per_second": 2.0 * n ** 3 / min(times) / 1e9}


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far.

    getrusage's ru_maxrss (KiB on Linux, bytes on macOS), except that on Linux VmHWM of
    /proc/self/status is preferred: ru_maxrss carries a parent's peak over fork + exec, so
    a small benchmark started by a big process would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # lazy: Unix only (so that the module imports anywhere)
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# -- onnxruntime ---------------------------------------------------------------------------------------


def onnxruntime_session(model: str, threads: int | None):
    """An onnxruntime CPU session as its users create one: its defaults (every graph
    optimisation; idle intra-op threads spin), with only ``intra_op_num_threads`` set, to
    ``threads`` (None: onnxruntime's own choice). Raises ImportError when onnxruntime is
    not installed."""
    import onnxruntime as ort  # lazy: optional extra

    options = ort.SessionOptions()
    options.log_severity_level = 3  # models with unused initializers: no warnings
    for name, value in onnxruntime_settings(threads).items():
        setattr(options, name, value)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def onnxruntime_settings(threads: int | None) -> dict[str, int]:
    """The session options --compare sets, every other one left at onnxruntime's default."""
    return {"intra_op_num_threads": threads} if threads else {}


def max_abs_diff(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[float | None, int]:
    """Largest |a - b| over the outputs both have (NaN where both are NaN counts as equal;
    a shape mismatch is infinite). Returns (value or None when nothing compared, count)."""
    diffs = _output_diffs(ours, theirs)
    return (max((d for d, _ in diffs), default=0.0) if diffs else None), len(diffs)


def max_rel_diff(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> float | None:
    """Largest |a - b| of each output relative to that output's largest |b| (the reference's
    scale, so that values near zero do not blow it up), worst over the outputs: 0.156 on
    logits of magnitude 3e5 is 5e-7. None when nothing was compared."""
    diffs = _output_diffs(ours, theirs)
    if not diffs:
        return None
    worst = 0.0
    for diff, scale in diffs:
        worst = max(worst, 0.0 if diff == 0 else diff / scale if 0 < scale < math.inf else math.inf)
    return worst


def _output_diffs(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(largest |a - b|, largest finite |b|) of each output both have."""
    found = []
    for name, a in ours.items():
        if name not in theirs:
            continue
        a, b = np.asarray(a), np.asarray(theirs[name])
        if a.shape != b.shape:
            found.append((math.inf, 0.0))
            continue
        if a.size == 0:
            found.append((0.0, 0.0))
            continue
        if a.dtype.kind not in "fiub" or b.dtype.kind not in "fiub":
            found.append((0.0 if np.array_equal(a, b) else math.inf, 0.0))
            continue
        x, y = a.astype(np.float64), b.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: handled below
            diff = np.abs(x - y)
        diff[np.isnan(x) & np.isnan(y)] = 0.0
        diff[(x == y)] = 0.0  # equal infinities
        finite = np.abs(y[np.isfinite(y)])
        found.append((float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))),
                      float(finite.max()) if finite.size else 0.0))
    return found


# -- the benchmark -------------------------------------------------------------------------------------


def _timed(fn) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _time_only(fn) -> float:
    """Seconds ``fn()`` took; its result is dropped before the next one is made."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _stderr_notice(message: str) -> None:
    sys.stderr.write(f"nncc: warning: {message}\n")
    sys.stderr.flush()


def run_benchmark(model: str, settings: BenchSettings | None = None,
                  notice: Callable[[str], None] | None = _stderr_notice) -> dict[str, Any]:
    """Measure ``model`` (an .onnx file or a compiled .nncc artifact); see the module docstring.

    Progress goes to nncc.util.progress (one task per phase); ``notice`` gets the one line
    saying a comparison cannot be made (default: stderr)."""
    prepare = preparer()  # the settings resolved once per command

    settings = settings or BenchSettings()
    settings.check()
    _warn_oversubscribed(settings)
    model = os.fspath(model)
    baseline_rss = current_rss_bytes()
    artifact = is_artifact(model)
    if artifact and settings.compare:
        raise BenchError(f"--compare needs an ONNX model; {model} is a compiled nncc artifact")
    options = dict(settings.compile_options)
    if not artifact and "dims" not in options:
        options = _fixed_to_the_timed_sizes(model, settings, options)
    compile_info = _empty_compile_info(settings, artifact)

    with limit_blas_threads(settings.threads) as threads_applied:
        if artifact:
            compiled = _time_artifact_loads(model, settings, options, compile_info)
        else:
            compiled = _time_compiles(model, settings, options, compile_info, prepare)

        if settings.dims and artifact:  # a misspelt --dim must not leave its dimension at 1 unnoticed
            check_dim_names(settings.dims, compiled.input_infos, os.fspath(model))  # (a model: checked before)
        feeds = random_feeds(compiled.input_infos, settings.seed, settings.dims)
        dims = {**options.get("dims", {}), **bind_dims(compiled.input_infos, feeds)}
        flops = count_flops(compiled.plan, dims)

        first_seconds, first_outputs = _first_inference(compiled, feeds, settings.warmup)
        peak_nncc = peak_rss_bytes()

        ort = None
        compare: dict[str, Any] | None = None
        if settings.compare:
            compare, ort = _start_onnxruntime(model, settings, feeds, first_outputs, notice)

        nncc_times, ort_times = _steady_state(compiled, ort, feeds, settings)
        threads_now = blas_threads()

    stats = latency_stats(nncc_times)
    throughput = 1.0 / stats["mean"] if stats["mean"] > 0 else None
    gflops = flops["total"] / stats["p50"] / 1e9 if flops["total"] and stats["p50"] > 0 else None
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "model": model,
        "model_kind": "artifact" if artifact else "onnx",
        "nncc_version": __version__,
        "settings": _settings_record(compiled, options, settings, dims),
        "inputs": [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()],
        "flops": flops["total"],
        "flops_by_op": flops["by_op"],
        "flops_unresolved": flops["unresolved"],
        "compile": compile_info,
        "first_inference_seconds": first_seconds,
        "iterations": len(nncc_times),
        "latency_seconds": stats,
        "throughput_per_second": throughput,
        "gflops_per_second": gflops,
        "memory": {
            "peak_rss_bytes": peak_rss_bytes(),
            "peak_rss_nncc_bytes": peak_nncc,
            "baseline_rss_bytes": baseline_rss,
            "arena_bytes": _arena_bytes(compiled),
        },
        "blas": None,
        "machine": machine_info(),
        "compare": compare,
    }
    # the BLAS numpy ran on: library, kernel (core name), build, thread count during the runs
    result["blas"] = {**result["machine"].pop("blas"), "threads": threads_now,
                      "threads_applied": bool(threads_applied)}
    if compare is not None and compare.get("available"):
        _finish_compare(compare, ort_times, stats, first_seconds, throughput, compile_info)
    return result


def _warn_oversubscribed(settings) -> None:
    """More threads than usable CPUs measure their contention: say so."""
    if settings.threads is not None and settings.threads > usable_cpus():
        warn(f"--threads {settings.threads} is more than the {usable_cpus()} CPU(s) this process may use: "
             "the extra threads share those CPUs and the figures measure their contention")


def _empty_compile_info(settings, artifact) -> dict[str, Any]:
    """The "compile" record, every figure None until its phase measures it."""
    return {
        "cold_first_seconds": None, "cold_seconds": None, "cold_runs": 0, "cache_store_outcome": None,
        "cache_hit_seconds": None, "cache_hit_min_seconds": None, "cache_hits": 0, "cache_hit_slower": None,
        "cache_dir": None,
        "cache_dir_temporary": settings.cache_dir is None and not artifact, "load_seconds": None,
    }


def _time_artifact_loads(model, settings, options, info):
    """The median of a few loads of a compiled artifact; returns the last one loaded."""
    for module in options.get("plugins", ()):  # an artifact may name plugin kernels
        load_plugin(module)
    loads = []
    with progress.task("loading the artifact", total=max(1, settings.cache_hits)) as task:
        for _ in range(max(1, settings.cache_hits)):
            seconds, compiled = _timed(lambda: nncc.load(model))
            loads.append(seconds)
            task.advance()
    info["load_seconds"] = statistics.median(loads)
    return compiled


def _fixed_to_the_timed_sizes(model: str, settings, options: dict) -> dict:
    """The compile options with the model's named symbolic input dimensions fixed to the
    sizes the runs use (--dim, else 1): bench times the code compiled for those sizes, as
    ``nncc compile --dim`` builds it, rather than a dynamic model's general plan, whose
    per-shape native plans a temporary cache never gets to build."""
    from nncc.frontend.onnx import load_model  # lazy: start-up (bench's own path reads the model once more)

    graph = load_model(model)
    infos = {name: graph.values.get(name) for name in graph.inputs}
    check_dim_names(settings.dims, infos, model)  # a misspelt --dim is an error, not a size left at 1
    names = symbolic_dims(infos)
    if not names:
        return options
    return dict(options, dims={name: int(settings.dims.get(name, 1)) for name in names})


def _time_compiles(model, settings, options, info, prepare):
    """Cold compiles, then cache hits; returns the model the last hit prepared (compiled in
    memory when no cache is usable here)."""
    runs = 1 + max(0, settings.compile_runs)
    colds = []
    with progress.task("cold compile (no cache)", total=runs) as task:
        for _ in range(runs):
            colds.append(_time_only(lambda: prepare(model, use_cache=False, **options)))
            task.advance()
    info["cold_first_seconds"] = colds[0]
    info["cold_seconds"] = statistics.median(colds[1:] or colds)
    info["cold_runs"] = len(colds)
    gc.collect()
    compiled = _cache_hits(model, settings, options, info, prepare)
    if compiled is None:  # no usable cache here: a model compiled in memory
        compiled, _ = prepare(model, use_cache=False, **options)
    return compiled


def _first_inference(compiled, feeds, warmup) -> tuple[float, dict[str, Any]]:
    """The first run's seconds and a copy of its outputs, then the warm-up runs."""
    with progress.task("first inference, warm-up", total=1 + warmup) as task:
        gc.collect()
        first_seconds, first_outputs = _timed(lambda: compiled.run(feeds))
        first_outputs = {k: v.copy() for k, v in first_outputs.items()}  # safe from later runs
        task.advance()
        for _ in range(warmup):
            compiled.run(feeds)
            task.advance()
    return first_seconds, first_outputs


def _settings_record(compiled, options, settings, dims) -> dict[str, Any]:
    """The settings measured under: the compile options the plan records, else those asked."""
    return {
        "preference": compiled.plan.options.get("preference", options.get("preference")),
        "opt_level": compiled.plan.options.get("opt_level", options.get("opt_level")),
        "backends": list(compiled.plan.options.get("backends", options.get("backends", ()))),
        "plugins": list(compiled.plan.options.get("plugins", options.get("plugins", ()))),
        "threads": settings.threads,
        "warmup": settings.warmup,
        "iterations": settings.iterations,
        "duration": settings.duration,
        "seed": settings.seed,
        "dims": dims,
        "compare": settings.compare,
        # what nncc computed in: the precision asked, the arithmetic its native code used
        # (f32 where no native code runs) and the deviation from float32 the compile measured
        "precision": compiled.plan.options.get("precision", options.get("precision", "f32")),
        "arithmetic": compiled.plan.options.get("arithmetic", "f32") if compiled.native_partitions else "f32",
        # int8 where the model itself is quantized: its products are int8 in every runtime
        "quantized": _quantized(compiled.plan),
        "native_partitions": compiled.native_partitions,  # of the model timed (0: portable code only)
        "precision_check": compiled.plan.options.get(PLAN_KEY),
    }


# the operators whose products are integer: a model with one is quantized by its file
_INTEGER_PRODUCTS = {"DynamicQuantizeMatMul", "QConv", "QGemm", "QLinearConv", "QLinearMatMul", "MatMulInteger",
                     "ConvInteger", "QAttention", "QLinearAdd", "QAdd"}


def _quantized(plan) -> bool:
    return any(kernel.split("::")[1] in _INTEGER_PRODUCTS for kernel in plan.kernels if kernel.count("::") >= 2)


def _arena_bytes(compiled) -> int:
    """The executor's preallocated arena for intermediates, else what the plan declares."""
    arena = getattr(getattr(compiled, "_executor", None), "arena", None)
    if arena is not None and hasattr(arena, "nbytes"):
        return int(arena.nbytes)
    return int(getattr(compiled.plan, "arena_bytes", 0) or 0)


def _cache_hits(model, settings, options, info, prepare):
    """Fill the cache once, then time verified hits. Returns the last hit's model (or None)."""
    temporary = settings.cache_dir is None
    directory = tempfile.mkdtemp(prefix="nncc-bench-cache-") if temporary else settings.cache_dir
    info["cache_dir"] = os.path.abspath(directory)
    if temporary:  # no background upgrade or shape build: it would outlive the folder, and
        options = dict(options, background=None)  # compete with the runs timed next
    compiled = None
    try:
        with progress.task("cache store, then cache hits", total=1 + max(1, settings.cache_hits)) as task:
            # the store builds every stage asked for, as ``nncc compile`` does: the hits then
            # serve (and the runs time) the code a user's warm cache gives, native included,
            # not the quick portable stage a miss returns at once
            outcome = prepare(model, cache_dir=directory, **dict(options, stage=options.get("stage", "optimized")))[1]
            task.advance()
            info["cache_store_outcome"] = outcome.outcome
            if outcome.outcome not in ("hit", "miss", "recompiled"):
                return None  # the cache is unusable here: no hit path to time
            hits = []
            for _ in range(max(1, settings.cache_hits)):
                compiled = None  # one copy alive at a time
                seconds, (compiled, outcome) = _timed(lambda: prepare(model, cache_dir=directory, **options))
                if outcome.outcome != "hit":
                    info["cache_store_outcome"] = f"{info['cache_store_outcome']}, then {outcome.outcome}"
                    return compiled
                hits.append(seconds)
                task.advance()
        info["cache_hit_seconds"] = statistics.median(hits)
        if info["cold_seconds"] is not None:  # a cache that costs more than it saves, for this model
            info["cache_hit_slower"] = info["cache_hit_seconds"] > info["cold_seconds"]
        info["cache_hit_min_seconds"] = min(hits)
        info["cache_hits"] = len(hits)
        return compiled
    finally:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)


def _start_onnxruntime(model, settings, feeds, nncc_outputs, notice):
    compare: dict[str, Any] = {"runtime": settings.compare, "available": False, "reason": None, "version": None,
                               "threads": settings.threads,
                               "session_options": onnxruntime_settings(settings.threads), "session_seconds": None,
                               "first_inference_seconds": None, "latency_seconds": None,
                               "iterations": 0, "throughput_per_second": None, "ratios": None,
                               "max_abs_diff": None, "max_rel_diff": None, "outputs_compared": 0}
    try:
        import onnxruntime  # lazy: optional extra
    except ImportError as exc:
        compare["reason"] = f"onnxruntime is not installed ({exc})"
        if notice:
            notice("onnxruntime is not installed: measuring nncc alone (pip install onnxruntime to compare)")
        return compare, None
    compare["version"] = onnxruntime.__version__
    with progress.task("onnxruntime session, warm-up", total=2 + settings.warmup) as task:
        try:
            session_seconds, session = _timed(lambda: onnxruntime_session(model, settings.threads))
            names = [i.name for i in session.get_inputs()]
            missing = [n for n in names if n not in feeds]
            if missing:
                raise BenchError(f"onnxruntime wants inputs nncc does not declare: {', '.join(missing)}")
            ort_feeds = {n: feeds[n] for n in names}
            output_names = [o.name for o in session.get_outputs()]
            task.advance()
            first, values = _timed(lambda: session.run(output_names, ort_feeds))
            task.advance()
        except BenchError:
            raise
        except Exception as exc:  # onnxruntime refuses the model: say so, measure nncc alone
            text = str(exc).strip().splitlines()
            compare["reason"] = f"onnxruntime failed: {type(exc).__name__}: {text[0] if text else ''}"
            if notice:
                notice(f"{compare['reason'][:200]}; measuring nncc alone")
            return compare, None
        theirs = dict(zip(output_names, values))
        diff, compared = max_abs_diff(nncc_outputs, theirs)
        compare.update(available=True, session_seconds=session_seconds, first_inference_seconds=first,
                       max_abs_diff=diff, max_rel_diff=max_rel_diff(nncc_outputs, theirs),
                       outputs_compared=compared)
        for _ in range(settings.warmup):
            session.run(output_names, ort_feeds)
            task.advance()

    def run_ort():
        session.run(output_names, ort_feeds)

    return compare, run_ort


def _steady_state(compiled, run_ort, feeds, settings) -> tuple[list[float], list[float]]:
    """Timed loop; with onnxruntime, alternating nncc-ort / ort-nncc each iteration."""
    run_nncc = compiled.run
    nncc_times: list[float] = []
    ort_times: list[float] = []
    if settings.iterations is not None:
        iterations, duration, minimum = settings.iterations, None, settings.iterations
    elif settings.duration is None:
        minimum = settings.min_iterations or DEFAULT_MIN_ITERATIONS
        iterations, duration = MAX_ITERATIONS, DEFAULT_DURATION
    else:
        iterations, duration, minimum = MAX_ITERATIONS, settings.duration, settings.min_iterations or 1
    label = "steady state" + (", interleaved with onnxruntime" if run_ort is not None else "")
    with progress.task(label, total=iterations if duration is None else None) as task:
        _timed_loop(run_nncc, run_ort, feeds, iterations, duration, minimum, nncc_times, ort_times, task, label)
    return nncc_times, ort_times


def _timed_loop(run_nncc, run_ort, feeds, iterations, duration, minimum, nncc_times, ort_times, task, label):
    clock = time.perf_counter
    shown, last = 0, 0.0
    gc.collect()
    began = clock()
    for i in range(iterations):
        if run_ort is not None and i % 2:
            start = clock()
            run_ort()
            middle = clock()
            run_nncc(feeds)
            end = clock()
            ort_times.append(middle - start)
            nncc_times.append(end - middle)
        else:
            start = clock()
            run_nncc(feeds)
            middle = clock()
            nncc_times.append(middle - start)
            if run_ort is not None:
                run_ort()
                ort_times.append(clock() - middle)
        now = clock()
        elapsed = now - began
        if duration is not None and elapsed >= duration and i + 1 >= minimum:
            break
        if now - last >= 0.1:  # report progress at most ten times a second
            last = now
            if duration is None:
                task.advance(i + 1 - shown)
                shown = i + 1
            else:
                task.describe(f"{label}: {elapsed:.1f} of {duration:g} s, {i + 1} runs")


def _finish_compare(compare, ort_times, stats, first_seconds, throughput, compile_info) -> None:
    ort_stats = latency_stats(ort_times)
    ort_throughput = 1.0 / ort_stats["mean"] if ort_stats["mean"] > 0 else None
    compare["latency_seconds"] = ort_stats
    compare["iterations"] = len(ort_times)
    compare["throughput_per_second"] = ort_throughput
    ratios = {key: _ratio(stats[key], ort_stats[key]) for key in ("min", "p50", "p90", "p99", "mean")}
    ratios["first_inference"] = _ratio(first_seconds, compare["first_inference_seconds"])
    ratios["compile"] = _ratio(compile_info["cold_seconds"], compare["session_seconds"])
    ratios["throughput"] = _ratio(throughput, ort_throughput)
    compare["ratios"] = ratios
