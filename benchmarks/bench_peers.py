"""nncc next to onnxruntime and OpenVINO, each run the way its users run it, each in a
process of its own.

    python benchmarks/bench_peers.py                                   # every model, 2 threads
    python benchmarks/bench_peers.py --model resnet18 --model bert --markdown
    python benchmarks/bench_peers.py --model light_squeezenet --rounds 5 --json > peers.json
    python benchmarks/bench_peers.py --render peers.json --markdown    # its tables, measuring nothing

The rules:

- Peers at their defaults, only the thread count set: onnxruntime's CPU provider with
  ``intra_op_num_threads``; OpenVINO's CPU device, compiled from the .onnx file, with
  ``INFERENCE_NUM_THREADS`` (on a CPU with bfloat16 support its default inference
  precision is bfloat16: the table says which precision it chose). No peer feature is
  switched off: onnxruntime's idle threads spin, as they do for its users.
- nncc as its users run it: ``nncc.prepare`` through the cache, default options (the native
  backend), the BLAS and native thread count set as ``nncc run --threads`` sets it. The
  cache is filled once per model beforehand with the optimized (native) stage, what the
  default flow reaches after a few runs, so every measured process is a cache hit.
- Each runtime runs alone in a process of its own, in alternating order (round 1: nncc,
  onnxruntime, OpenVINO; round 2: the reverse; ...), after one untimed warm round that
  writes byte code and brings the model file into the page cache. Processes run with byte
  code written, as an installed package has it.
- In each process: the time from the process's start to its first answer (interpreter,
  imports, prepare or session, first run), the first run alone, then --warmup untimed runs
  and --iterations timed runs: the steady-state p50. A figure is the median over rounds.
- Ratios are nncc / the faster peer of the same run (below 1: nncc is faster).

Also: nncc's partitions (how many native), its cold native compile, the largest
difference between nncc's outputs and each peer's; batch-N against batch-1 cost per image
for the real-weight conv models (--batch, default 4); and the native steps' GFLOP/s per
convolution class next to numpy's float32 sgemm peak at the same thread count, measured
in the same run (benchmarks/step_classes.py; --profile-runs 0 leaves it out).

Models (--model NAME, repeatable; or a path to an .onnx file): the real-weight models of
benchmarks/real_models.py (resnet18, resnet50, mobilenetv2, bert, gpt2, gpt2_kv, lstm; generated on first
use into build/real-models), their quantized forms made with onnxruntime's quantization tool
(bert_int8_dynamic, mobilenetv2_int8_qdq, resnet18_int8_qop: benchmarks/quantized_models.py;
not in the default list), bert with a padding mask through onnxruntime's transformer optimizer
(bert_ort_fused: com.microsoft Attention; not in the default list), the light models that ship with onnx (light_resnet50,
light_squeezenet, light_shufflenet, light_densenet121, light_inception_v1,
light_inception_v2, where present), and the fixtures (symbolic dimensions 1 unless --dim).

A peer that is not installed, or refuses a model, is said so in the output and left out.
Install the peers with ``pip install 'nncc[bench]'``. A script, not a test: it asserts
nothing about speed.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
# this tree's nncc, as its children get it through PYTHONPATH, whatever is installed
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from machine_load import busy_seconds, children_cpu, other_load  # noqa: E402
from peer_runtimes import median, child  # noqa: E402
RUNTIMES = ("nncc", "onnxruntime", "openvino")
# on request: nncc's portable backend alone, nncc with its products by constant weights in
# bfloat16 (--precision bf16, as OpenVINO computes by default on a CPU with bfloat16), and
# OpenVINO told to compute in float32 (not its default there, so never counted as a peer)
EXTRA_RUNTIMES = ("nncc-numpy", "nncc-bf16", "openvino-f32")
PEERS = ("onnxruntime", "openvino")
REAL = ("resnet18", "resnet50", "mobilenetv2", "bert", "gpt2", "gpt2_kv", "lstm")
QUANTIZED = ("bert_int8_dynamic", "mobilenetv2_int8_qdq", "resnet18_int8_qop")  # quantized_models.py
ORT_FUSED = ("bert_ort_fused",)  # real_models.py, through onnxruntime's transformer optimizer
CONV_REAL = ("resnet18", "resnet50", "mobilenetv2")
LIGHT = ("light_resnet50", "light_squeezenet", "light_shufflenet", "light_densenet121", "light_inception_v1",
         "light_inception_v2")
INSTALL_HINT = "pip install 'nncc[bench]'"


# -- the parent ------------------------------------------------------------------------------------------


def child_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # byte code written and reused, as installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "benchmarks"), env.get("PYTHONPATH")]))
    return env


# A child imports peer_runtimes (so its byte code is cached too) and runs one job.
CHILD = "import json, sys, peer_runtimes; peer_runtimes.child(json.loads(sys.argv[1]))"


def spawn(job: dict) -> tuple[dict, float]:
    """Run one child job; (its result, the wall-clock time it was started at). The result
    also says how many cores other processes kept busy meanwhile (``other_load``)."""
    import subprocess

    busy, ours, began = busy_seconds(), children_cpu(), time.perf_counter()
    started = time.time()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True, text=True,
                          env=child_env(), timeout=1800)
    wall = time.perf_counter() - began
    other = other_load(busy, ours, wall)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the child process failed (exit {done.returncode}): {tail[:300]}"}, started
    result = json.loads(lines[-1])
    if isinstance(result, dict):
        result["other_load"] = other
    return result, started


def light_dir() -> pathlib.Path | None:
    try:
        import onnx
    except ImportError:
        return None
    return pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _label(name: str) -> str:
    """A model's name in the tables and its work files: a path's file name without .onnx."""
    return pathlib.Path(name).stem if name.endswith(".onnx") else name


def resolve(name: str, batch: int = 1) -> pathlib.Path:
    """A model name (see the module docstring) or a path -> the .onnx file."""
    if name in REAL or name in ORT_FUSED:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from real_models import write_one

        return pathlib.Path(write_one(str(ROOT / "build" / "real-models"), name, batch))
    if name in QUANTIZED:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from quantized_models import quantize

        return pathlib.Path(quantize(str(ROOT / "build" / "real-models"), name))
    light = light_dir()
    if light is not None and (light / f"{name}.onnx").exists():
        return light / f"{name}.onnx"
    if (ROOT / "fixtures" / f"{name}.onnx").exists():
        return ROOT / "fixtures" / f"{name}.onnx"
    path = pathlib.Path(name)
    if path.suffix == ".onnx" and path.is_file():
        return path
    raise SystemExit(f"bench_peers: error: no model {name!r} (a real-weight, light or fixture model name, "
                     "or an .onnx file)")


def default_models() -> list[str]:
    light = light_dir()
    names = list(REAL)
    names += [n for n in LIGHT if light is not None and (light / f"{n}.onnx").exists()]
    names += sorted(p.stem for p in (ROOT / "fixtures").glob("*.onnx"))
    return names


def measure_model(label: str, path: pathlib.Path, args, runtimes: list[str], cache: str, work: str,
                  missing: dict[str, str], profile: bool) -> dict:
    """Setup, the warm round, then --rounds alternating rounds; medians per runtime."""
    feeds = os.path.join(work, f"{label}.npz")
    setup, _ = spawn({"job": "setup", "path": str(path), "cache": cache, "threads": args.threads,
                      "feeds": feeds, "dims": args.dims, "runtimes": runtimes})
    row: dict = {"model": label, "path": str(path), "setup": setup, "runtimes": {}, "rounds": []}
    if "error" in setup:  # nncc cannot compile it: no feeds either
        row["error"] = f"nncc: {setup['error']}"
        return row
    active = [r for r in runtimes if r not in missing]
    outputs: dict[str, str] = {}
    for rnd in range(args.rounds + 1):  # round 0: untimed, writes byte code, keeps the outputs
        order = active if rnd % 2 == 1 or rnd == 0 else active[::-1]
        results = {}
        for runtime in order:
            job = {"job": "measure", "runtime": runtime, "path": str(path), "feeds": feeds, "cache": cache,
                   "threads": args.threads, "warmup": args.warmup, "iterations": args.iterations}
            if rnd == 0:
                job["outputs"] = outputs[runtime] = os.path.join(work, f"{label}-{runtime}-out.npz")
            result, started = spawn(job)
            if "answered_at" in result:
                result["to_first_answer_s"] = result["answered_at"] - started
            if result.get("missing") and runtime not in missing:
                missing[runtime] = result["error"]
            results[runtime] = result
        if rnd:
            row["rounds"].append({"order": order, "results": results})
        else:
            row["warm"] = results
            active = [r for r in active if "error" not in results[r]]
    for runtime in runtimes:
        per = [rd["results"][runtime] for rd in row["rounds"] if runtime in rd["results"]]
        ok = [p for p in per if "error" not in p]
        warm = row.get("warm", {}).get(runtime, {})
        error = missing.get(runtime) if runtime in missing else warm.get("error") or next(
            (p["error"] for p in per if "error" in p), None)
        summary = {"error": error if not ok else None}
        if ok:
            summary.update({k: median(p.get(k) for p in ok)
                            for k in ("p50_s", "min_s", "first_s", "open_s", "to_first_answer_s")})
            summary["first_over_p50"] = median(p["first_s"] / p["p50_s"] for p in ok)
            summary["rounds"] = len(ok)
            summary.update({k: ok[0][k] for k in ("version", "precision", "cache", "stage", "partitions",
                                                  "native_partitions") if k in ok[0]})
        if summary.get("precision") and quantized_file(str(path)):
            summary["precision"] = "int8"  # the file's own arithmetic, the same in every runtime
        row["runtimes"][runtime] = summary
    row["other_load"] = median(res.get("other_load") for rd in row["rounds"] for res in rd["results"].values())
    # the ratio compares like with like: the peers that computed at nncc's own precision
    mine = row["runtimes"].get("nncc", {})
    peers = {p: row["runtimes"][p]["p50_s"] for p in PEERS if row["runtimes"].get(p, {}).get("p50_s")
             and same_precision(row["runtimes"][p].get("precision"), mine.get("precision"))}
    nncc = mine.get("p50_s")
    if peers:
        best = min(peers, key=peers.get)
        row["best_peer"], row["nncc_over_best_peer"] = best, (nncc / peers[best] if nncc else None)
    # nncc's bfloat16 column against the peers that computed in bfloat16 (OpenVINO's default
    # where the CPU has it), so a lower precision is judged like for like too
    low = row["runtimes"].get("nncc-bf16", {})
    low_peers = {p: row["runtimes"][p]["p50_s"] for p in PEERS if row["runtimes"].get(p, {}).get("p50_s")
                 and same_precision(row["runtimes"][p].get("precision"), low.get("precision"))}
    if low_peers and low.get("p50_s"):
        best = min(low_peers, key=low_peers.get)
        row["best_bf16_peer"], row["nncc_bf16_over_best_peer"] = best, low["p50_s"] / low_peers[best]
    row["max_rel_diff"] = output_diffs(outputs, row.get("warm", {}))
    if profile and setup.get("native_partitions"):
        row["classes"], _ = spawn({"job": "profile", "path": str(path), "threads": args.threads,
                                   "runs": args.profile_runs, "dims": args.dims})
    return row


# the operators of a quantized model: its products are int8 in every runtime, whatever the
# float precision each runtime was told, so its columns all compare as int8
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                 "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "QGemm", "QLinearAdd"}


@functools.lru_cache(maxsize=None)
def quantized_file(path) -> bool:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type in QUANTIZED_OPS for node in graph.node)


def same_precision(a: str | None, b: str | None) -> bool:
    """Whether two runtimes' figures compare like with like: both float32 (f32), or both
    in bfloat16 arithmetic (nncc's bf16, its bf16amx tiles and its bf16w weights count as bf16)."""
    family = {"bf16w": "bf16", "bf16amx": "bf16"}
    return a is not None and b is not None and family.get(a, a) == family.get(b, b)


def output_diffs(outputs: dict[str, str], warm: dict) -> dict:
    """Largest |nncc - peer| per output relative to the output's scale, worst output: nncc
    against each peer (and the peers against each other), from the warm round's first runs."""
    import numpy as np

    from nncc.bench import max_rel_diff

    loaded = {}
    for runtime, path in outputs.items():
        if "error" not in warm.get(runtime, {"error": 1}) and os.path.exists(path):
            with np.load(path) as saved:
                loaded[runtime] = {k: saved[k] for k in saved.files}
    found = {}
    for peer in PEERS:
        for mine in ("nncc", "nncc-bf16"):
            if mine in loaded and peer in loaded:
                found[f"{mine} vs {peer}"] = max_rel_diff(loaded[mine], loaded[peer])
    if all(p in loaded for p in PEERS):
        found["openvino vs onnxruntime"] = max_rel_diff(loaded["openvino"], loaded["onnxruntime"])
    return found


# -- rendering ---------------------------------------------------------------------------------------------


def milliseconds(seconds) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def _x(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _e(value) -> str:
    """A relative difference, or "-" where none was measured (an output missing or not comparable)."""
    return "-" if value is None else f"{value:.1e}"


def table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def render(report: dict, markdown: bool) -> str:
    runtimes, rows = report["runtimes"], report["models"]
    main = [r for r in rows if not r.get("batch_of")]
    out = []
    peers = [p for p in PEERS if p in runtimes]
    versions = {}
    for r in rows:
        for name, s in r.get("runtimes", {}).items():
            if s.get("version"):
                versions.setdefault(name, s["version"])
    machine = report.get("machine", {})
    blas = machine.get("blas", {}) or {}
    if report.get("command"):
        out.append(f"`{report['command']}`, {report['date']}.")
    out.append(f"Steady state, {report['threads']} threads, median over {report['rounds']} rounds of per-process "
               f"p50 ({report['iterations']} timed runs after {report['warmup']} warm-up runs); "
               f"{machine.get('cpu_model') or 'unknown CPU'}, {machine.get('cpus', '?')} CPUs usable; "
               + ", ".join(f"{k} {v}" for k, v in versions.items())
               + f"; OpenBLAS kernel {blas.get('corename') or 'unknown'}.")
    precisions = sorted({r["runtimes"]["openvino"].get("precision") for r in main
                         if r.get("runtimes", {}).get("openvino", {}).get("precision") not in (None, "int8")})
    if precisions:
        out.append(f"OpenVINO's inference precision (its default on this CPU): {', '.join(precisions)}.")
    out.append("Each column names the precision its runtime computed in (nncc: of its products by weights, bf16w "
               "being bfloat16 weights widened to float32 on a CPU without AVX-512 BF16, bf16amx bfloat16 "
               "products on AMX tiles; OpenVINO: the "
               "INFERENCE_PRECISION_HINT it reports; int8: a quantized model, whose products are int8 in every "
               "runtime). nncc / best peer compares columns of the same precision only, as does nncc-bf16 / best "
               "bf16 peer.")
    out.append("nncc compile s: the native compile, a prepare into an empty cache. Max rel diff: the largest "
               "|nncc - peer| of an output over that output's largest |peer| value, worst output. Other load: the "
               "cores other processes kept busy while the row was measured, median over its processes (/proc/stat "
               "less this benchmark's own children).")
    for why in report["missing"].values():
        out.append(f"{why}: left out ({INSTALL_HINT}).")
    out.append("")
    # every column says the precision it computed in (one per runtime over the models)
    shown = {k: "/".join(sorted({r["runtimes"][k]["precision"] for r in main
                                 if r.get("runtimes", {}).get(k, {}).get("precision")})) or "?" for k in runtimes}
    bf16_ratio = any(r.get("nncc_bf16_over_best_peer") is not None for r in main)
    header = ["model"] + [f"{r} ({shown[r]}) ms" for r in runtimes] + ["nncc / best peer", "best peer"] + \
        (["nncc-bf16 / best bf16 peer"] if bf16_ratio else []) + \
        [f"nncc / {p}" for p in peers if p != "openvino"] + ["nncc native partitions",
                                                          "nncc compile s", "other load",
                                                          "nncc max rel diff (" + ", ".join(f"vs {p}" for p in peers)
                                                          + ")"]
    body = []
    for r in main:
        if r.get("error"):
            body.append([r["model"]] + ["-"] * (len(header) - 2) + [r["error"][:60]])
            continue
        s = r["runtimes"]
        nn = s.get("nncc", {})
        diffs = r.get("max_rel_diff", {})
        body.append([r["model"]] + [milliseconds(s[k].get("p50_s")) if not s[k].get("error") else
                                    "not installed" if k in report["missing"] else "failed" for k in runtimes]
                    + [_x(r.get("nncc_over_best_peer")), r.get("best_peer", "-")]
                    + ([_x(r.get("nncc_bf16_over_best_peer"))] if bf16_ratio else [])
                    + [_x(nn["p50_s"] / s[p]["p50_s"] if nn.get("p50_s") and s[p].get("p50_s")
                          and same_precision(s[p].get("precision"), nn.get("precision")) else None)
                       for p in peers if p != "openvino"]
                    + [f"{nn.get('native_partitions', '-')}/{nn.get('partitions', '-')}",
                       _x(r["setup"].get("compile_s")), _x(r.get("other_load")),
                       ", ".join(_e(diffs.get(f"nncc vs {p}")) for p in peers)])
    out.append(table(header, body, markdown))
    errors = [(r["model"], k, s["error"]) for r in rows for k, s in r.get("runtimes", {}).items()
              if s.get("error") and k not in report["missing"]]
    for model, runtime, error in errors:
        out.append(f"- {model}: {runtime} failed: {error}")
    for r in main:  # nncc in bfloat16 is not exact: how far it is, next to the table's float32 figure
        diffs = r.get("max_rel_diff", {})
        if any(f"nncc-bf16 vs {p}" in diffs for p in peers):
            out.append(f"- {r['model']}: nncc-bf16 max rel diff " + ", ".join(
                f"vs {p} {_e(diffs[f'nncc-bf16 vs {p}'])}" for p in peers if f"nncc-bf16 vs {p}" in diffs))

    out += ["", "Getting started, per runtime: the whole process from its start to its first answer (ms) / of it, "
                "importing the runtime and preparing the model (nncc: a cache hit; onnxruntime: the session; "
                "OpenVINO: compile_model) (ms) / the first run against the steady-state p50."]
    header = ["model"] + list(runtimes)
    body = []
    for r in main:
        if r.get("error"):
            continue
        s = r["runtimes"]
        body.append([r["model"]] + ["-" if s[k].get("error") else
                                    f"{milliseconds(s[k].get('to_first_answer_s'))} / "
                                    f"{milliseconds(s[k].get('open_s'))} / "
                                    f"{_x(s[k].get('first_over_p50'), 1)}x" for k in runtimes])
    out.append(table(header, body, markdown))

    batched = [r for r in rows if r.get("batch_of") and not r.get("error")]
    if batched:
        out += ["", f"Batch {batched[0]['batch']} against batch 1, per image (ms per image; ratio below 1: the batch "
                    "is cheaper per image)."]
        header = ["model"] + [f"{r} b1, b{batched[0]['batch']} ms/image (ratio)" for r in runtimes]
        body = []
        for r in batched:
            one = next((m for m in main if m["model"] == r["batch_of"]), None)
            if one is None or one.get("error"):
                continue
            cells = []
            for k in runtimes:
                a, b = one["runtimes"][k].get("p50_s"), r["runtimes"][k].get("p50_s")
                cells.append("-" if a is None or b is None else
                             f"{milliseconds(a)}, {milliseconds(b / r['batch'])} ({b / r['batch'] / a:.2f})")
            body.append([r["batch_of"]] + cells)
        out.append(table(header, body, markdown))

    profiled = [r for r in main if isinstance(r.get("classes"), dict) and "classes" in r["classes"]]
    if profiled:
        from step_classes import CLASSES

        sg = report["sgemm"]
        peak = sg.get("gflop_per_second")
        out += ["", f"nncc's native steps per class: GFLOP/s, % of the sgemm peak, ms per run. sgemm peak: "
                    f"{_x(peak, 0)} GFLOP/s (numpy float32 {sg.get('n')}x{sg.get('n')} matmul, "
                    f"{report['threads']} threads, the best of sizes {', '.join(map(str, sg.get('by_size', {})))})."]
        used = [c for c in CLASSES if any(c in r["classes"]["classes"] for r in profiled)]
        header = ["model"] + used + ["native steps ms"]
        body = []
        for r in profiled:
            cls = r["classes"]["classes"]
            cells = []
            for c in used:
                e = cls.get(c)
                if e is None:
                    cells.append("-")
                elif e.get("gflop_per_second") is None:
                    cells.append(f"{milliseconds(e['ms'] / 1000)} ms")
                else:
                    pct = f", {100 * e['gflop_per_second'] / peak:.0f}%" if peak else ""
                    cells.append(f"{e['gflop_per_second']:.0f}{pct}, {milliseconds(e['ms'] / 1000)} ms")
            body.append([r["model"]] + cells + [_x(r["classes"].get("native_ms"))])
        out.append(table(header, body, markdown))
    return "\n".join(out)


def parse_args(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--model", action="append", metavar="NAME",
                        help="a model name or an .onnx path (repeatable; default: every model)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every runtime (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of one process per runtime "
                                                              "(default 3)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs in each process (default 5)")
    parser.add_argument("--iterations", type=int, default=20, help="timed runs in each process (default 20)")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES),
                        help=f"comma-separated, from {', '.join(RUNTIMES + EXTRA_RUNTIMES)} (default: "
                             f"{','.join(RUNTIMES)})")
    parser.add_argument("--batch", type=int, default=4, help="batch size compared with batch 1 on the real-weight "
                                                              "conv models (0: none; default 4)")
    parser.add_argument("--profile-runs", type=int, default=20, help="runs of the per-class profile (0: no profile)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="size of a symbolic input dimension (default 1)")
    parser.add_argument("--render", metavar="FILE", help="print the tables of a report saved with --json, "
                                                         "measuring nothing")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="markdown tables")
    out.add_argument("--json", action="store_true", help="every figure as JSON")
    args = parser.parse_args(argv)
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    bad = [r for r in args.runtimes if r not in RUNTIMES + EXTRA_RUNTIMES]
    if bad or "nncc" not in args.runtimes:
        parser.error(f"--runtimes: unknown {', '.join(bad)}" if bad else "--runtimes must include nncc")
    for name, value in (("--threads", args.threads), ("--rounds", args.rounds), ("--iterations", args.iterations)):
        if value < 1:
            parser.error(f"{name} must be at least 1")
    try:
        args.dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    except ValueError:
        parser.error("--dim takes NAME=SIZE")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if args.render:
        with open(args.render) as f:
            print(render(json.load(f), args.markdown))
        return
    names = args.model or default_models()
    plan = [(_label(n), resolve(n), None) for n in names]
    if args.batch > 1:
        plan += [(f"{n}_batch{args.batch}", resolve(n, args.batch), n) for n in names if n in CONV_REAL]
    missing: dict[str, str] = {}
    import shlex

    command = "python benchmarks/bench_peers.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = {"command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "threads": args.threads, "rounds": args.rounds, "warmup": args.warmup, "iterations": args.iterations,
              "runtimes": args.runtimes, "missing": missing, "models": []}
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nncc-bench-peers-") as work:
        report["machine"], _ = spawn({"job": "machine", "threads": args.threads})
        if args.profile_runs > 0:
            report["sgemm"], _ = spawn({"job": "sgemm", "threads": args.threads})
            print(f"bench_peers: sgemm peak {report['sgemm'].get('gflop_per_second', 0):.0f} GFLOP/s", file=sys.stderr)
        else:
            report["sgemm"] = {}
        for label, path, batch_of in plan:
            began = time.perf_counter()
            cache = os.path.join(work, f"cache-{label}")  # a cold compile per model
            row = measure_model(label, path, args, args.runtimes, cache, work, missing,
                                profile=args.profile_runs > 0 and batch_of is None)
            if batch_of:
                row.update(batch_of=batch_of, batch=args.batch)
            report["models"].append(row)
            figures = ", ".join(f"{k} {milliseconds(v.get('p50_s'))} ms" if not v.get("error") else f"{k} -"
                                for k, v in row.get("runtimes", {}).items())
            print(f"bench_peers: {label}: {row.get('error') or figures}; nncc / best peer "
                  f"{_x(row.get('nncc_over_best_peer'))}"
                  + (f", nncc-bf16 / best bf16 peer {_x(row['nncc_bf16_over_best_peer'])}"
                     if row.get("nncc_bf16_over_best_peer") is not None else "")
                  + f" ({time.perf_counter() - began:.0f} s)", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render(report, args.markdown))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":  # one child job here, its JSON on stdout
        child(json.loads(sys.argv[2]))
    else:
        main()
