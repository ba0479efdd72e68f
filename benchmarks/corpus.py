"""nncc on the corpus of real model exports (benchmarks/build_corpus.py) next to its peers:
one row per model with nncc's partitions and fallback reasons, whether its outputs match
onnxruntime's, and the steady-state time of each runtime.

    python benchmarks/build_corpus.py                      # once: build/corpus/ and its manifest
    python benchmarks/corpus.py                            # every model, 3 rounds, 2 threads
    python benchmarks/corpus.py --model bert --model unet --rounds 1 --runs 10 --markdown
    python benchmarks/corpus.py --json corpus.json         # the table, and every figure as JSON

Columns, each runtime in float32 unless its header says otherwise:

- partitions: nncc's native partitions / all partitions, compiled with the dynamic
  dimensions left dynamic (``nncc.compile_model(path)``) and with them fixed to the
  manifest's sizes (``dims=``, what ``--dim`` does); the fallback reasons of each compile
  are listed below the table, grouped as ``nncc inspect`` groups them (nncc.report), and
  counted over the corpus: the work queue.
- native cached: the native partitions of the plan nncc-cached ran (see ms).
- match: nncc's outputs (each column) against onnxruntime's on the same feeds: the
  largest |nncc - onnxruntime| of an output (abs), and that over the output's largest
  |onnxruntime| value (rel), worst output; pass when rel <= --tolerance.
- ms: steady-state p50 (each process times at least --runs runs and on until they took
  --min-seconds, every runtime alike) of nncc dynamic, nncc fixed, nncc cached (the model prepared through a
  cache that an earlier process filled by running it at the manifest's sizes, dynamic
  dimensions left dynamic: what a user's later processes run), onnxruntime at its defaults, OpenVINO
  with INFERENCE_PRECISION_HINT=f32 (the precision-matched peer), OpenVINO at its defaults
  (bfloat16 on a CPU that has it: the header names the precision it chose); then nncc
  (each compile) / the faster float32 peer.

Method, the rules of benchmarks/bench_peers.py (whose child-process machinery this
reuses): each runtime alone in a process of its own, in alternating order across rounds,
after one untimed round that writes byte code and keeps the outputs; peers at their
defaults with only the thread count (and OpenVINO's precision) set; byte code written;
figures are medians over rounds. nncc is compiled once per model in a setup process and
saved; each measuring process loads that artifact (the plan compile_model built, native
code trusted as compile_model's is). A model nncc refuses or crashes on is a row with the
error's first line, and the run goes on. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import peer_runtimes  # noqa: E402  (the child's only benchmark import: its start-up stays the runtime's)

MANIFEST = ROOT / "build" / "corpus" / "manifest.json"
NNCC = ("nncc-dynamic", "nncc-fixed", "nncc-cached")
PEERS_F32 = ("onnxruntime", "openvino-f32")
RUNTIMES = NNCC + PEERS_F32 + ("openvino",)
COMPILES = {"nncc-dynamic": "dynamic", "nncc-fixed": "fixed"}  # compiled once, saved, loaded by each process
VARIANTS = dict(COMPILES, **{"nncc-cached": "cached"})  # every nncc column matched and compared


# -- the child processes ------------------------------------------------------------------------------------


def open_artifact(path, threads: int, cache: str, artifact: str):
    """nncc as compile_model left it: the saved plan, its native code trusted (built by
    this benchmark's own setup process), the thread count set as ``nncc run --threads``."""
    import nncc  # lazy: the child's own start-up, as a user's process has it
    from nncc.util.threads import set_blas_threads  # lazy: as above

    set_blas_threads(threads)
    model = nncc.load(artifact, trust_native=True)
    info = {"version": nncc.__version__, "partitions": len(model.plan.partitions),
            "native_partitions": model.native_partitions}
    return model.run, info, lambda outputs: dict(outputs)


def child_compile(job: dict) -> dict:
    """Compile the model both ways, save each artifact, describe its partitions and
    fallbacks; a compile that fails gives its error's first line."""
    import nncc  # lazy: only the compile child needs nncc
    from nncc.report import describe_plan  # lazy: as above
    from nncc.util.threads import set_blas_threads  # lazy: as above

    set_blas_threads(job["threads"])
    found = {}
    for runtime, variant in COMPILES.items():
        options = {"dims": job["dims"]} if variant == "fixed" and job["dims"] else {}
        start = time.perf_counter()
        try:
            model = nncc.compile_model(job["path"], **options)
            seconds = time.perf_counter() - start
            model.save(job["artifacts"][runtime])
        except Exception as exc:  # a finding for the table, not a reason to stop
            found[variant] = {"error": first_line(exc)}
            continue
        report = describe_plan(model.plan)
        portable = {}  # the ops of partitions that do not run as native code, fallback reason or not
        for part in report["partitions"]:
            if not part["native"]:
                for op, count in part["ops"].items():
                    portable[op] = portable.get(op, 0) + count
        found[variant] = {"compile_s": seconds, "partitions": len(report["partitions"]),
                          "native_partitions": model.native_partitions, "fallbacks": report["fallback_groups"],
                          "portable_ops": dict(sorted(portable.items()))}
    found["cached"] = warm_cache(job)
    return found


def warm_cache(job: dict) -> dict:
    """What a user's earlier processes leave in the cache for "nncc-cached": the model
    prepared through it, dynamic dimensions left dynamic, and run on the feeds until every
    plan its input shapes ask for (built in the background) is there; how many native
    partitions the plan that then runs holds."""
    import numpy as np  # lazy: as child_compile's
    import nncc  # lazy: as above

    with np.load(job["feeds"]) as saved:
        feeds = {k: saved[k] for k in saved.files}
    start = time.perf_counter()
    try:
        model, _ = nncc.prepare(job["path"], cache_dir=job["warm_cache"], stage="optimized")
        for _ in range(3):
            model.run(feeds)
            peer_runtimes.join_shape_builds()
        model.run(feeds)
    except Exception as exc:  # a finding for the table
        return {"error": first_line(exc)}
    return {"compile_s": time.perf_counter() - start, "native_partitions": model.last_run_native_partitions}


def open_cached(path, threads: int, cache: str):
    """nncc as a user's later process has it: prepared from a warm cache hit, the model's
    dynamic dimensions left dynamic; the info says how many native partitions the plan of
    the last run held (a plan of the input shape, or of one sample)."""
    import nncc  # lazy: the child's own start-up, as a user's process has it
    from nncc.util.threads import set_blas_threads  # lazy: as above

    set_blas_threads(threads)
    model, outcome = nncc.prepare(path, cache_dir=cache)
    info = {"version": nncc.__version__, "cache": outcome.outcome}

    def run(feeds):
        outputs = model.run(feeds)
        info["native_partitions"] = model.last_run_native_partitions
        return outputs

    return run, info, lambda outputs: dict(outputs)


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def child(job: dict) -> None:
    """One job in this fresh process, its result one JSON line (peer_runtimes.child)."""
    if job["job"] == "compile":
        peer_runtimes.print_reported(lambda: child_compile(job))
        return
    if job["runtime"] == "nncc-cached":
        peer_runtimes.OPENERS["nncc-cached"] = open_cached
    elif job.get("artifact"):
        artifact = job["artifact"]
        peer_runtimes.OPENERS[job["runtime"]] = lambda path, threads, cache: open_artifact(path, threads, cache,
                                                                                             artifact)
    peer_runtimes.child(job)


CHILD = "import json, sys, corpus; corpus.child(json.loads(sys.argv[1]))"


# -- the parent ----------------------------------------------------------------------------------------------


def spawn(job: dict) -> dict:
    """One child job in a process of its own, with the environment bench_peers gives its
    children (byte code written, this tree's nncc); its result, with the other load."""
    from bench_peers import child_env  # lazy: the parent's; a child imports only peer_runtimes
    from machine_load import busy_seconds, children_cpu, other_load  # lazy: as above

    busy, ours, began = busy_seconds(), children_cpu(), time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True, text=True,
                              env=child_env(), timeout=1800)
    except subprocess.TimeoutExpired:
        return {"error": "the child process took over 30 minutes"}
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:  # a crash in native code: the last line it wrote
        tail = (done.stderr.strip().splitlines() or [f"no output, signal {-done.returncode}"
                                                     if done.returncode < 0 else "no output"])[-1]
        return {"error": f"the process failed (exit {done.returncode}): {tail[:300]}"}
    result = json.loads(lines[-1])
    result["other_load"] = other_load(busy, ours, time.perf_counter() - began)
    return result


def write_feeds(entry: dict, path: str) -> None:
    """The model's inputs (model_inputs) saved as an .npz for the children."""
    import numpy as np  # lazy: the parent's; a child imports it with its runtime

    np.savez(path, **model_inputs(entry))


def model_inputs(entry: dict) -> dict:
    """The model's inputs at the manifest's shapes, from a generator seeded by its name:
    floats standard normal, integers uniform in the input's range, fills as given."""
    import numpy as np  # lazy: the parent's; a child imports it with its runtime

    rng = np.random.default_rng(zlib.crc32(entry["name"].encode()))
    feeds = {}
    for spec in entry["inputs"]:
        shape, dtype = spec["shape"], np.dtype(spec["dtype"])
        if "fill" in spec:
            feeds[spec["name"]] = np.full(shape, spec["fill"], dtype)
        elif dtype.kind == "f":
            feeds[spec["name"]] = rng.standard_normal(shape).astype(dtype)
        else:
            low, high = spec.get("range", [0, 2])
            feeds[spec["name"]] = rng.integers(low, high, size=shape).astype(dtype)
    return feeds


def compare(ours_path: str, reference_path: str, tolerance: float) -> dict:
    """nncc's outputs against onnxruntime's: worst output's largest abs difference and
    that over the output's largest |reference| (nncc.bench.max_rel_diff's scale)."""
    import numpy as np  # lazy: as write_feeds

    from nncc.bench import max_rel_diff  # lazy: the parent's

    with np.load(ours_path) as a, np.load(reference_path) as b:
        ours, ref = {k: a[k] for k in a.files}, {k: b[k] for k in b.files}
    missing = sorted(set(ref) - set(ours))
    if missing:
        return {"pass": False, "error": f"no output {', '.join(missing)}"}
    worst_abs = 0.0
    for name, value in ref.items():
        if ours[name].shape != value.shape:
            return {"pass": False, "error": f"{name}: shape {list(ours[name].shape)}, onnxruntime {list(value.shape)}"}
        if value.size:
            a, b = ours[name].astype(np.float64), value.astype(np.float64)
            diff = np.abs(a - b)
            diff[np.isnan(a) & np.isnan(b)] = 0.0  # NaN where onnxruntime has NaN agrees
            diff[np.isnan(a) != np.isnan(b)] = np.inf
            worst_abs = max(worst_abs, float(diff.max()))
    rel = max_rel_diff(ours, ref)
    return {"abs": worst_abs, "rel": rel, "pass": rel is not None and rel <= tolerance and worst_abs < np.inf}


def measure_model(entry: dict, corpus: pathlib.Path, args, work: str) -> dict:
    label = entry["name"]
    path = str(corpus / entry["file"])
    feeds = os.path.join(work, f"{label}.npz")
    write_feeds(entry, feeds)
    artifacts = {r: os.path.join(work, f"{label}-{COMPILES[r]}.nncc") for r in COMPILES}
    warm = os.path.join(work, f"{label}-cache")
    compiled = spawn({"job": "compile", "path": path, "dims": entry.get("dims", {}), "threads": args.threads,
                      "artifacts": artifacts, "feeds": feeds, "warm_cache": warm})
    compiled.pop("other_load", None)
    if "error" in compiled:  # the compile process itself died
        compiled = {v: {"error": compiled["error"]} for v in VARIANTS.values()}
    row = {"model": label, "exporter": entry["exporter"], "opset": entry.get("opset"), "compile": compiled,
           "runtimes": {}, "rounds": []}
    active = [r for r in args.runtimes if r not in VARIANTS or "error" not in compiled[VARIANTS[r]]]
    outputs = {r: os.path.join(work, f"{label}-{r}-out.npz") for r in active}
    for rnd in range(args.rounds + 1):  # round 0: untimed, writes byte code, keeps the outputs
        order = active if rnd % 2 == 0 else active[::-1]
        results = {}
        for runtime in order:
            job = {"job": "measure", "runtime": runtime, "path": path, "feeds": feeds,
                   "cache": warm if runtime == "nncc-cached" else work,
                   "threads": args.threads, "warmup": args.warmup, "iterations": args.runs,
                   "min_seconds": args.min_seconds, "artifact": artifacts.get(runtime)}
            if rnd == 0:
                job["outputs"] = outputs[runtime]
            results[runtime] = spawn(job)
        if rnd == 0:
            row["warm"] = results
            active = [r for r in active if "error" not in results[r]]
        else:
            row["rounds"].append({"order": order, "results": results})
    median = peer_runtimes.median
    for runtime in args.runtimes:
        per = [rd["results"][runtime] for rd in row["rounds"] if runtime in rd["results"]]
        ok = [p for p in per if "error" not in p]
        error = (compiled[VARIANTS[runtime]].get("error") if runtime in VARIANTS else None) \
            or row["warm"].get(runtime, {}).get("error") or next((p["error"] for p in per if "error" in p), None)
        summary = {"error": None if ok else error, "p50_s": median(p["p50_s"] for p in ok) if ok else None}
        if ok:
            summary.update({k: ok[0][k] for k in ("version", "precision", "partitions", "native_partitions")
                            if k in ok[0]})
        row["runtimes"][runtime] = summary
    row["other_load"] = median(res.get("other_load") for rd in row["rounds"] for res in rd["results"].values())
    warm_ok = lambda r: r in row["warm"] and "error" not in row["warm"][r]  # noqa: E731
    row["match"] = {VARIANTS[r]: (compare(outputs[r], outputs["onnxruntime"], args.tolerance)
                                  if warm_ok(r) and warm_ok("onnxruntime") else None) for r in NNCC}
    peers = {p: row["runtimes"][p]["p50_s"] for p in PEERS_F32 if row["runtimes"].get(p, {}).get("p50_s")}
    if peers:
        best = min(peers, key=peers.get)
        row["best_f32_peer"] = best
        for r in NNCC:
            mine = row["runtimes"].get(r, {}).get("p50_s")
            row[f"{VARIANTS[r]}_over_best_f32"] = mine / peers[best] if mine else None
    return row


# -- rendering ----------------------------------------------------------------------------------------------


def partitions(compiled: dict) -> str:
    if "error" in compiled:
        return "error"
    return f"{compiled['native_partitions']}/{compiled['partitions']}"


def match_cell(m: dict | None) -> str:
    if m is None:
        return "-"
    if "error" in m:
        return "FAIL (" + m["error"][:40] + ")"
    rel = "-" if m["rel"] is None else f"{m['rel']:.1e}"
    return f"{'pass' if m['pass'] else 'FAIL'} {m['abs']:.1e}/{rel}"


def render(report: dict, markdown: bool) -> str:
    from bench_peers import milliseconds, table  # lazy: the parent's

    rows = report["models"]
    ov_precision = sorted({r["runtimes"]["openvino"].get("precision") for r in rows
                           if r["runtimes"].get("openvino", {}).get("precision")}) or ["default"]
    out = [f"`{report['command']}`, {report['date']}.",
           f"Steady state, {report['threads']} threads, median over {report['rounds']} rounds of per-process p50 "
           f"(at least {report['runs']} timed runs and {report.get('min_seconds', 0):g} s of them, after "
           f"{report['warmup']} warm-up runs); "
           + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".",
           "partitions: nncc's native / all, dynamic dimensions left dynamic, then fixed to the manifest's sizes. "
           "match: nncc (dynamic; fixed) against onnxruntime, worst output's max abs / max rel difference (rel: over "
           f"the output's largest |onnxruntime|), pass at rel <= {report['tolerance']:g}. Other load: cores other "
           "processes kept busy meanwhile.", ""]
    measured = [k for k in RUNTIMES if k in report.get("runtimes", RUNTIMES)]
    titles = {"nncc-dynamic": "nncc dyn ms (f32)", "nncc-fixed": "nncc fixed ms (f32)",
              "nncc-cached": "nncc cached ms (f32)",
              "onnxruntime": "onnxruntime ms (f32)", "openvino-f32": "openvino ms (f32)",
              "openvino": f"openvino ms ({'/'.join(ov_precision)}, its default)"}
    header = ["model", "exporter", "partitions dyn", "partitions fixed", "native cached", "match dyn (abs/rel)",
              "match fixed (abs/rel)", "match cached (abs/rel)"] + [titles[k] for k in measured] + [
              "nncc dyn / best f32 peer", "nncc fixed / best f32 peer", "nncc cached / best f32 peer", "other load"]
    body = []
    for r in rows:
        s = r["runtimes"]
        cached = r["compile"].get("cached", {})
        body.append([r["model"], r["exporter"], partitions(r["compile"]["dynamic"]), partitions(r["compile"]["fixed"]),
                     "error" if "error" in cached else str(cached.get("native_partitions", "-")),
                     match_cell(r["match"]["dynamic"]), match_cell(r["match"]["fixed"]),
                     match_cell(r["match"].get("cached"))]
                    + [milliseconds(s[k]["p50_s"]) if s[k]["p50_s"] else "failed" for k in measured]
                    + [fmt(r.get(key)) for key in ("dynamic_over_best_f32", "fixed_over_best_f32",
                                                   "cached_over_best_f32", "other_load")])
    out.append(table(header, body, markdown))
    out += ["", summary(rows), ""]
    for r in rows:  # what failed, one line each
        for variant, c in r["compile"].items():
            if "error" in c:
                out.append(f"- {r['model']}: nncc ({variant}) compile failed: {c['error']}")
        for k in measured:
            err = r["runtimes"][k]["error"]
            if err and not (k in VARIANTS and "error" in r["compile"].get(VARIANTS[k], {})):
                out.append(f"- {r['model']}: {k} failed: {err}")
    out += ["", "Fallback reasons over the corpus (nodes nncc's native backend left to numpy), most models "
                "first: models with the reason (dynamic compile, fixed compile), nodes (dynamic, fixed), ops.", ""]
    out.append(table(["reason", "models dyn", "models fixed", "nodes dyn", "nodes fixed", "ops"],
                     reason_counts(rows), markdown))
    portable = portable_counts(rows)
    if portable:
        out += ["", "Ops in the partitions that do not run as native code, whether or not the compile recorded a "
                    "fallback reason for them, over the corpus, most models (fixed compile) first: models (dynamic, "
                    "fixed), nodes (dynamic, fixed).", ""]
        out.append(table(["op", "models dyn", "models fixed", "nodes dyn", "nodes fixed"], portable, markdown))
    out += ["", "Per model: fallback nodes by reason (dynamic compile; fixed compile), and the ops of the fixed "
                "compile's non-native partitions (the dynamic compile's are its fallback nodes).", ""]
    for r in rows:
        parts = []
        for variant in COMPILES.values():
            groups = r["compile"][variant].get("fallbacks")
            if groups:
                parts.append(f"{variant}: " + "; ".join(f"{g['nodes']} {g['reason']} ({', '.join(g['ops'])})"
                                                        for g in groups))
        portable = r["compile"]["fixed"].get("portable_ops")
        if portable:
            parts.append("fixed, non-native ops: " + ", ".join(f"{op} {n}" for op, n in portable.items()))
        if parts:
            out.append(f"- {r['model']}: " + " | ".join(parts))
    return "\n".join(out)


def portable_counts(rows: list[dict]) -> list[list[str]]:
    counts: dict[str, dict] = {}
    for r in rows:
        for variant in COMPILES.values():
            for op, nodes in (r["compile"][variant].get("portable_ops") or {}).items():
                c = counts.setdefault(op, {"dynamic": set(), "fixed": set(), "nodes dynamic": 0, "nodes fixed": 0})
                c[variant].add(r["model"])
                c[f"nodes {variant}"] += nodes
    ordered = sorted(counts.items(), key=lambda kv: (-len(kv[1]["fixed"]), -len(kv[1]["dynamic"]), kv[0]))
    return [[op, str(len(c["dynamic"])), str(len(c["fixed"])), str(c["nodes dynamic"]), str(c["nodes fixed"])]
            for op, c in ordered]


def summary(rows: list[dict]) -> str:
    median = peer_runtimes.median
    parts = []
    for variant in COMPILES.values():
        ratios = [r[f"{variant}_over_best_f32"] for r in rows if r.get(f"{variant}_over_best_f32")]
        worst = max(ratios) if ratios else None
        worst_model = next((r["model"] for r in rows if worst and r.get(f"{variant}_over_best_f32") == worst), "-")
        single = sum(1 for r in rows if r["compile"][variant].get("partitions") == 1
                     and r["compile"][variant].get("native_partitions") == 1)
        passed = sum(1 for r in rows if (r["match"].get(variant) or {}).get("pass"))
        parts.append(f"nncc {variant}: / best f32 peer median {fmt(median(ratios))}, worst {fmt(worst)} "
                     f"({worst_model}); one native partition {single}/{len(rows)}; matches onnxruntime "
                     f"{passed}/{len(rows)}")
    ratios = [r["cached_over_best_f32"] for r in rows if r.get("cached_over_best_f32")]
    if ratios:
        worst = max(ratios)
        native = sum(1 for r in rows if (r["compile"].get("cached") or {}).get("native_partitions"))
        passed = sum(1 for r in rows if (r["match"].get("cached") or {}).get("pass"))
        parts.append(f"nncc cached (dynamic dimensions left dynamic, prepared from a warm cache): / best f32 peer "
                     f"median {fmt(median(ratios))}, worst {fmt(worst)} "
                     f"({next(r['model'] for r in rows if r.get('cached_over_best_f32') == worst)}); runs native "
                     f"code {native}/{len(rows)}; matches onnxruntime {passed}/{len(rows)}")
    return "Summary: " + ". ".join(parts) + "."


def fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def reason_counts(rows: list[dict]) -> list[list[str]]:
    counts: dict[str, dict] = {}
    for r in rows:
        for variant in COMPILES.values():
            for g in r["compile"][variant].get("fallbacks") or []:
                c = counts.setdefault(g["reason"], {"models dynamic": set(), "models fixed": set(), "nodes dynamic": 0,
                                                    "nodes fixed": 0, "ops": set()})
                c[f"models {variant}"].add(r["model"])
                c[f"nodes {variant}"] += g["nodes"]
                c["ops"].update(g["ops"])
    ordered = sorted(counts.items(), key=lambda kv: (-len(kv[1]["models dynamic"] | kv[1]["models fixed"]),
                                                     -kv[1]["nodes dynamic"]))
    return [[reason[:120], str(len(c["models dynamic"])), str(len(c["models fixed"])), str(c["nodes dynamic"]),
             str(c["nodes fixed"]), ", ".join(sorted(c["ops"]))] for reason, c in ordered]


# -- the command ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--model", action="append", metavar="NAME", help="a model of the manifest (repeatable; "
                                                                           "default: every model)")
    parser.add_argument("--manifest", default=str(MANIFEST), help=f"the corpus manifest (default {MANIFEST})")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of one process per runtime "
                                                              "(default 3)")
    parser.add_argument("--runs", type=int, default=20, help="timed runs in each process (default 20)")
    parser.add_argument("--min-seconds", type=float, default=0.5,
                        help="each process also times runs until they took this long in all, every runtime "
                             "alike (default 0.5): a row of microseconds is a median over hundreds of runs")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs in each process (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every runtime (default 2)")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest relative difference from onnxruntime that passes (default 1e-4)")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES),
                        help=f"comma-separated, from {', '.join(RUNTIMES)} (default: all); the match needs "
                             "onnxruntime and a nncc runtime")
    parser.add_argument("--markdown", action="store_true", help="markdown tables")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE as JSON (rewritten after "
                                                       "each model)")
    parser.add_argument("--render", metavar="FILE", help="print the tables of a report saved with --json, "
                                                         "measuring nothing")
    args = parser.parse_args(argv)
    for name in ("rounds", "runs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0 or not args.tolerance > 0 or not args.min_seconds >= 0:
        parser.error("--warmup and --min-seconds must be at least 0 and --tolerance above 0")
    if args.render:
        try:
            args.report = json.loads(pathlib.Path(args.render).read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"cannot read the report {args.render} ({exc})")
        return args
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    unknown = [r for r in args.runtimes if r not in RUNTIMES]
    if unknown or not set(args.runtimes) & set(NNCC):
        parser.error(f"--runtimes: unknown {', '.join(unknown)}" if unknown else "--runtimes needs a nncc runtime")
    try:
        args.entries = json.loads(pathlib.Path(args.manifest).read_text())["models"]
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"cannot read the manifest {args.manifest} ({exc}); build it with "
                     "python benchmarks/build_corpus.py")
    if args.model:
        unknown = sorted(set(args.model) - {e["name"] for e in args.entries})
        if unknown:
            parser.error(f"no model {', '.join(unknown)} in {args.manifest}")
        args.entries = [e for e in args.entries if e["name"] in args.model]
    return args


def versions(rows: list[dict]) -> dict:
    found = {}
    for r in rows:
        for name, s in r["runtimes"].items():
            key = "nncc" if name in VARIANTS else "openvino" if name.startswith("openvino") else name
            if s.get("version"):
                found.setdefault(key, s["version"])
    return found


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        print(render(args.report, args.markdown))
        return 0
    corpus = pathlib.Path(args.manifest).parent
    command = "python benchmarks/corpus.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = {"command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "threads": args.threads, "rounds": args.rounds, "runs": args.runs, "warmup": args.warmup,
              "min_seconds": args.min_seconds, "tolerance": args.tolerance, "runtimes": args.runtimes, "models": []}
    with tempfile.TemporaryDirectory(prefix="nncc-corpus-") as work:
        for entry in args.entries:
            began = time.perf_counter()
            row = measure_model(entry, corpus, args, work)
            report["models"].append(row)
            if args.json:  # after every model: a long run that is stopped keeps what it measured
                report["versions"] = versions(report["models"])
                pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
            print(f"corpus: {row['model']}: partitions {partitions(row['compile']['dynamic'])} dynamic, "
                  f"{partitions(row['compile']['fixed'])} fixed; match {match_cell(row['match']['dynamic'])}; "
                  f"({time.perf_counter() - began:.0f} s)", file=sys.stderr)
    report["versions"] = versions(report["models"])
    print(render(report, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
