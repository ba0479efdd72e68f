"""`nncc bench`: compile, cache-hit load, first-inference and steady-state figures of a model.

The measuring is nncc.bench.run_benchmark; this module only parses options, shows the
core's progress on a terminal (stderr; nncc.cli.progress, hidden by --quiet) and renders
the figures: a rich table on stdout, or --json (schema: docs/bench.md).
"""

from __future__ import annotations

import math

import click

from nncc.cli.options import (command_cache_dir, compile_options, options_dict, parse_dims, verbosity_options,
                              warn_compile_options_on_artifact)
from nncc.preparing.deviation import summary
from nncc.util.units import format_bytes


@click.command()
@click.argument("model", type=click.Path())  # a directory or missing file: nncc says so itself
@click.option("--warmup", type=int, default=3, show_default=True, metavar="N",
              help="Untimed runs before the steady state (per runtime).")
@click.option("--iterations", "-n", type=int, default=None, metavar="N",
              help="Timed runs (per runtime). Default: about 3 s and at least 10 runs.")
@click.option("--duration", type=float, default=None, metavar="SECONDS",
              help="Time the steady state for this long instead (both runtimes together).")
@compile_options
@click.option("--threads", type=int, default=2, show_default=True, metavar="N",
              help="BLAS threads for nncc and intra-op threads for onnxruntime.")
@click.option("--compare", type=click.Choice(["onnxruntime"]), default=None,
              help="Also run onnxruntime (at its defaults, --threads intra-op threads) on the same inputs, "
                   "interleaved, and print ratios nncc / ort.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--dim", "dim_specs", multiple=True, metavar="NAME=SIZE",
              help="Size of a symbolic input dimension (default 1). Repeatable.")
@click.option("--cache-dir", type=click.Path(file_okay=False), metavar="DIR", callback=command_cache_dir,
              help="Cache directory for the cache-hit measurement (default: a temporary one, removed after).")
@click.option("--json", "as_json", is_flag=True, help="Print every figure as JSON on stdout (schema: docs/bench.md).")
@verbosity_options
def bench(model, warmup, iterations, duration, preference, opt_level, backends, plugins, target, precision, threads,
          compare,
          seed, dim_specs, cache_dir, as_json):
    """Benchmark MODEL (an .onnx model, or a compiled .nncc artifact): cold compile (cache
    bypassed), verified cache-hit load, first inference, steady-state latency and throughput,
    peak resident memory; with --compare onnxruntime, the same next to onnxruntime."""
    from nncc.bench import BenchSettings, run_benchmark  # lazy: start-up
    from nncc.cli.progress import live_progress  # lazy: start-up

    settings = BenchSettings(
        warmup=warmup, iterations=iterations, duration=duration, threads=threads, compare=compare, seed=seed,
        dims=parse_dims(dim_specs), cache_dir=cache_dir,
        compile_options=options_dict(preference, opt_level, backends, plugins, target, precision=precision),
    )
    settings.check()  # bad settings fail before any progress bar appears
    from nncc.util.files import is_artifact  # lazy: start-up

    if is_artifact(model):
        warn_compile_options_on_artifact(model)
    with live_progress():  # a bar on stderr when it is a terminal (not with --quiet)
        result = run_benchmark(model, settings)
    if as_json:
        from nncc.cli.output import emit_json  # lazy: start-up

        emit_json(_finite(result))
    else:
        render(result)


def _finite(value):
    """JSON has no Infinity or NaN: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _ms(seconds) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.3f} ms" if ms < 1 else f"{ms:.2f} ms" if ms < 100 else f"{ms:.1f} ms"


def _x(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def render(result: dict) -> None:
    from rich.table import Table  # lazy: rich

    from nncc.cli.output import console  # lazy: start-up

    cmp = result["compare"] if result["compare"] and result["compare"].get("available") else None
    ratios = cmp["ratios"] if cmp else {}
    lat, ort_lat = result["latency_seconds"], (cmp["latency_seconds"] if cmp else {})
    settings = result["settings"]
    title = (f"{result['model']}: {settings['preference']}, -O{settings['opt_level']}, "
             f"{settings['threads']} threads, {result['iterations']} iterations"
             f"{' interleaved with onnxruntime ' + cmp['version'] if cmp else ''}")
    arithmetic = settings.get("arithmetic", "f32")  # what nncc's products by weights computed in
    peer = "f32"  # onnxruntime computes in float32, or in int8 where the model is quantized
    if settings.get("quantized"):
        arithmetic = peer = "int8"
    like = arithmetic == peer  # a ratio compares like with like only
    table = Table()
    table.add_column("measurement")
    table.add_column(f"nncc ({arithmetic})", justify="right")
    if cmp:
        table.add_column(f"onnxruntime ({peer})", justify="right")
        if like:
            table.add_column("nncc / ort", justify="right")

    def row(label, ours, theirs=None, ratio=None):
        table.add_row(label, ours, *(((theirs or "-",) + ((_x(ratio),) if like else ())) if cmp else ()))

    c = result["compile"]
    if result["model_kind"] == "artifact":
        row("load artifact (median)", _ms(c["load_seconds"]))
    else:
        row("cold compile, first in process", _ms(c["cold_first_seconds"]))
        row(f"cold compile (median of {max(1, c['cold_runs'] - 1)})", _ms(c["cold_seconds"]),
            _ms(cmp["session_seconds"]) + " (session)" if cmp else None, ratios.get("compile"))
        hit = _ms(c["cache_hit_seconds"]) if c["cache_hit_seconds"] is not None else \
            f"- (cache {c['cache_store_outcome']})"
        row(f"cache-hit load (median of {c['cache_hits']})", hit + (" (slower!)" if c.get("cache_hit_slower") else ""))
    row("first inference", _ms(result["first_inference_seconds"]),
        _ms(cmp["first_inference_seconds"]) if cmp else None, ratios.get("first_inference"))
    for key in ("min", "p50", "p90", "p99", "mean"):
        row(f"latency {key}", _ms(lat[key]), _ms(ort_lat.get(key)) if cmp else None, ratios.get(key))
    row("latency stddev", _ms(lat["stddev"]), _ms(ort_lat.get("stddev")) if cmp else None)
    tp = result["throughput_per_second"]
    ort_tp = cmp["throughput_per_second"] if cmp else None
    row("throughput", f"{tp:.1f}/s" if tp else "-", f"{ort_tp:.1f}/s" if ort_tp else None, ratios.get("throughput"))
    if result["flops"]:
        gf = result["gflops_per_second"]
        ort_gf = result["flops"] / ort_lat["p50"] / 1e9 if cmp and ort_lat.get("p50") else None
        row(f"GFLOP/s at p50 ({result['flops'] / 1e9:.3g} GFLOP)", f"{gf:.2f}" if gf else "-",
            f"{ort_gf:.2f}" if ort_gf else None)
    mem = result["memory"]
    row("peak RSS (process)", format_bytes(mem["peak_rss_bytes"]))
    row("peak RSS before onnxruntime" if cmp else "peak RSS after warm-up", format_bytes(mem["peak_rss_nncc_bytes"]))
    out = console()
    if not out.is_terminal:  # piped: lines as long as they are, never wrapped at 80 columns
        from rich.console import Console  # lazy: rich

        out = Console(width=10_000)
    out.print(title, style="italic", soft_wrap=True)  # soft_wrap: the title is one line, never broken
    out.print(table)
    blas = result["blas"]
    notes = [f"BLAS: {blas['corename'] or 'unknown'} kernel, {blas['threads'] or '?'} threads"
             + ("" if blas["threads_applied"] else " (thread count not applied: no known BLAS)")]
    if c.get("cache_hit_slower"):
        notes.append(f"a cache hit ({_ms(c['cache_hit_seconds'])}) is slower than a cold compile "
                     f"({_ms(c['cold_seconds'])}) for this model: the cache does not pay here (--no-cache)")
    if cmp:
        diff, rel = cmp["max_abs_diff"], cmp.get("max_rel_diff")
        notes.append(f"largest |nncc - onnxruntime| over {cmp['outputs_compared']} outputs: "
                     + ("-" if diff is None else f"{diff:.3g}")
                     + ("" if rel is None or diff is None else f" (relative to the output's scale: {rel:.2g})"))
        notes.append("ratios are nncc / onnxruntime: below 1 nncc is faster (throughput: above 1)" if like else
                     f"no nncc / onnxruntime ratios: nncc computed its products by weights in {arithmetic}, "
                     "onnxruntime in f32")
        set_options = ", ".join(f"{k}={v}" for k, v in cmp.get("session_options", {}).items())
        notes.append("onnxruntime at its defaults" + (f" except {set_options}" if set_options else "")
                     + "; it runs in this process, interleaved with nncc")
    elif result["compare"]:
        notes.append(f"no comparison: {result['compare']['reason']}")
    check = settings.get("precision_check")
    if check:
        notes.insert(0, f"precision {settings['precision']}: {summary(check)}")
    for note in notes:
        out.print(note, style="dim")
