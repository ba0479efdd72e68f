"""Steady state of models with dynamic input dimensions, per concrete input shape, against
the faster of onnxruntime and OpenVINO: nncc's general plan (every shape alike), the
shape's own portable plan, and the shape's native plan built through the cache, in
float32 and with precision="bf16".

    python benchmarks/bench_dynamic.py                      # every model and shape, 2 threads
    python benchmarks/bench_dynamic.py --markdown           # a table for RESULTS.md
    python benchmarks/bench_dynamic.py --model bert_dynamic --rounds 1 --blocks 2 --json

Models (real weights, benchmarks/real_models.py): bert_dynamic and gpt2_dynamic (symbolic
batch and sequence axes, reshapes computed from the runtime shape as an export with dynamic
axes writes them), and mobilenetv2 with a symbolic batch axis.

Each (model, shape) is measured by each runner, each alone in a process of its own, in an
order reversed every round (--rounds). A process times --blocks blocks of --iterations
calls, each block after one untimed call, and reports the median block mean; a figure is
the median over rounds. Ratios are against the faster peer of the row (below 1: nncc is
faster); the JSON also has each runner's ratio against onnxruntime alone.

Peers, at their defaults with only the thread count set (benchmarks/peer_runtimes.py):

- onnxruntime: its CPU session, ``intra_op_num_threads``;
- OpenVINO: its CPU device, compiled from the .onnx file with its dynamic shapes and fed
  each concrete shape, ``INFERENCE_NUM_THREADS``. On a CPU with bfloat16 its default
  inference precision is bfloat16; the output says which precision it chose.

nncc runners:

- general: ``run.shape_plans`` off, so every run uses the plan compiled for any shape;
- shape plan: the default, a shape run twice gets its own portable plan;
- native shape plan: prepared through a fresh cache with upgrades on: the shape's native
  plan is built in the background and waited for before timing;
- native shape plan bf16: the same, prepared with precision="bf16" (products by constant
  weights in bfloat16, as OpenVINO computes by default on such a CPU).

After the timing every runner but onnxruntime checks its outputs against onnxruntime's:
the largest |difference| over the output's largest |value| (at least 1), worst output.
Other load: the cores other processes kept busy while a row was measured (/proc/stat less
this benchmark's own children), median over the row's processes.

A peer that is not installed is said so and left out. A script, not a test: it asserts
nothing about speed.
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

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
# this tree's nncc, in the children too (they run this file), whatever is installed
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from bench_peers import table  # noqa: E402
from machine_load import busy_seconds, children_cpu, other_load  # noqa: E402
from peer_runtimes import join_shape_builds, openvino_model, ort_session, print_reported  # noqa: E402

NNCC_RUNNERS = ("general", "shape plan", "native shape plan", "native shape plan bf16")
PEERS = ("onnxruntime", "openvino")
SHORT = {"general": "general", "shape plan": "shape", "native shape plan": "native",
         "native shape plan bf16": "native bf16"}  # the runners' names in the table's header
SHAPES = {"bert_dynamic": [(1, 128, 512), (2, 77, 512)],
          "gpt2_dynamic": [(1, 128, 512), (2, 77, 512)],
          "mobilenetv2_batch": [(1, 3, 224, 224), (4, 3, 224, 224)]}


def models() -> dict[str, pathlib.Path]:
    """The dynamic models, written on first use into build/real-models."""
    import onnx  # lazy: onnx

    from real_models import write_all  # lazy: onnx

    out = ROOT / "build" / "real-models"
    paths = {pathlib.Path(p).stem: pathlib.Path(p) for p in write_all(str(out))}
    batch = out / "mobilenetv2_batch.onnx"
    if not batch.exists():  # the static model with its batch axis made symbolic
        model = onnx.load(str(paths["mobilenetv2"]))
        for value in (model.graph.input[0], model.graph.output[0]):
            value.type.tensor_type.shape.dim[0].dim_param = "batch"
        onnx.save(model, str(batch))
    return {"bert_dynamic": paths["bert_dynamic"], "gpt2_dynamic": paths["gpt2_dynamic"],
            "mobilenetv2_batch": batch}


# -- one child process: one runner at one shape ----------------------------------------------------------


def open_runner(path: pathlib.Path, runner: str, threads: int, cache: str):
    """``(run, input name, info, model)``: ``run(feeds)`` gives {output name: array}; the
    nncc model (None for a peer) is kept to read its shape plans afterwards."""
    if runner == "onnxruntime":
        session = ort_session(path, threads)
        names = [o.name for o in session.get_outputs()]
        info = {"version": sys.modules["onnxruntime"].__version__}
        return lambda feeds: dict(zip(names, session.run(None, feeds))), session.get_inputs()[0].name, info, None
    if runner == "openvino":
        compiled = openvino_model(path, threads)  # dynamic dimensions stay dynamic: compiled once for all
        request = compiled.create_infer_request()
        ports = compiled.outputs
        info = {"version": sys.modules["openvino"].__version__,
                "precision": compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name(),  # f32, bf16, f16
                "threads": int(compiled.get_property("INFERENCE_NUM_THREADS"))}

        def run(feeds):
            outputs = request.infer(feeds)
            return {p.get_any_name(): outputs[p] for p in ports}

        return run, compiled.inputs[0].get_any_name(), info, None
    import nncc  # lazy: start-up (a peer's process never imports nncc)
    from nncc.util.threads import set_blas_threads  # lazy: start-up

    set_blas_threads(threads)
    if runner.startswith("native shape plan"):
        options = {"precision": "bf16"} if runner.endswith("bf16") else {}
        model, _ = nncc.prepare(path, cache_dir=cache, **options)
    else:
        model = nncc.compile_model(path)
    return model.run, next(iter(model.input_infos)), {"version": nncc.__version__}, model


def measure(path: pathlib.Path, shape: tuple, runner: str, threads: int, blocks: int, iterations: int,
            cache: str) -> dict:
    """One process, one runner at input ``shape``: the median of ``blocks`` block means of
    ``iterations`` calls, each block after one untimed call."""
    if runner == "general":
        os.environ["NNCC_SHAPE_PLANS"] = "off"
    os.environ["NNCC_UPGRADE_AFTER"] = "2" if runner.startswith("native shape plan") else "off"
    run, name, info, model = open_runner(path, runner, threads, cache)
    feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    if model is not None:
        for _ in range(2):  # a shape's second run specialises it
            run(feeds)
        join_shape_builds()  # the shape's native plan, built in the background
    times = []
    for _ in range(blocks):
        run(feeds)
        t0 = time.perf_counter()
        for _ in range(iterations):
            run(feeds)
        times.append((time.perf_counter() - t0) / iterations * 1000)
    result = {"ms": statistics.median(times), **info}
    if runner != "onnxruntime":  # checked against onnxruntime once the timing is done
        got = run(feeds)
        session = ort_session(path, threads)
        want = dict(zip((o.name for o in session.get_outputs()), session.run(None, feeds)))
        result["max_rel_error"] = max(float(np.max(np.abs(got[n] - w))) / max(1.0, float(np.max(np.abs(w))))
                                      for n, w in want.items())
    if model is not None:
        plans = model._shape_plans
        executor = plans._plans.get((shape,)) if plans is not None else None
        result["native"] = 0 if executor is None else executor.native_partitions
    return result


def child(job: dict, args) -> None:
    """Run one job, its result as one JSON line; a peer missing or failing is said so."""
    print_reported(lambda: measure(pathlib.Path(job["path"]), tuple(job["shape"]), job["runner"], args.threads,
                                   args.blocks, args.iterations, job["cache"]))


# -- the parent --------------------------------------------------------------------------------------------


def spawn(job: dict, args) -> dict:
    """One child process; its result, with how many cores other processes kept busy meanwhile."""
    busy, ours, began = busy_seconds(), children_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--one", json.dumps(job), "--threads", str(args.threads),
                           "--blocks", str(args.blocks), "--iterations", str(args.iterations)],
                          capture_output=True, text=True, check=False)
    load = other_load(busy, ours, time.perf_counter() - began)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the child process failed (exit {done.returncode}): {tail[:300]}", "other_load": load}
    return {**json.loads(lines[-1]), "other_load": load}


def measure_row(name: str, path: pathlib.Path, shape: tuple, args, work: str) -> dict:
    """Every runner at one shape, alternating order, and the row's figures."""
    order = list(NNCC_RUNNERS) + list(PEERS)
    runs: dict[str, list[dict]] = {r: [] for r in order}
    for rnd in range(args.rounds):  # each runner alone in its process, the order reversed each round
        for runner in (order if rnd % 2 == 0 else order[::-1]):
            cache = tempfile.mkdtemp(prefix="cache-", dir=work)  # a fresh cache: the native plan built anew
            runs[runner].append(spawn({"path": str(path), "shape": shape, "runner": runner, "cache": cache}, args))
    return summarise(name, shape, runs)


def summarise(name: str, shape: tuple, runs: dict[str, list[dict]]) -> dict:
    row = {"model": name, "shape": "x".join(map(str, shape)), "runners": {},
           "other_load": statistics.median(r["other_load"] for rs in runs.values() for r in rs)}
    for runner, results in runs.items():
        good = [r for r in results if "error" not in r]
        if not good:
            row["runners"][runner] = {"error": results[0]["error"], "missing": results[0].get("missing", False)}
            continue
        entry = {"ms": statistics.median(r["ms"] for r in good), "rounds": len(good)}
        if len(good) < len(results):
            entry["failed_rounds"] = len(results) - len(good)
        if "max_rel_error" in good[0]:
            entry["max_rel_error"] = max(r["max_rel_error"] for r in good)
        for key in ("native", "precision", "threads", "version"):
            if key in good[0]:
                entry[key] = good[0][key]
        row["runners"][runner] = entry
    peers = {p: row["runners"][p]["ms"] for p in PEERS if "ms" in row["runners"][p]}
    if peers:
        row["best_peer"] = min(peers, key=peers.get)
    for runner in NNCC_RUNNERS:
        entry = row["runners"][runner]
        if "ms" in entry and peers:
            entry["over_best_peer"] = entry["ms"] / peers[row["best_peer"]]
        if "ms" in entry and "onnxruntime" in peers:
            entry["over_onnxruntime"] = entry["ms"] / peers["onnxruntime"]
    return row


# -- rendering ---------------------------------------------------------------------------------------------


def _cell(entry: dict, key: str, fmt: str) -> str:
    if entry.get("missing"):
        return "not installed"
    if "error" in entry:
        return "failed"
    return "-" if entry.get(key) is None else format(entry[key], fmt)


def render(report: dict, markdown: bool) -> str:
    rows = report["rows"]
    out = [(f"`{report['command']}`, {report['date']}: {report['threads']} threads, median over "
            f"{report['rounds']} rounds of per-process medians of {report['blocks']} blocks of "
            f"{report['iterations']} calls.")]
    versions: dict[str, str] = {}
    precisions: set[str] = set()
    missing: dict[str, str] = {}
    for row in rows:
        for runner, entry in row["runners"].items():
            label = "nncc" if runner in NNCC_RUNNERS else runner
            if entry.get("version"):
                versions.setdefault(label, entry["version"])
            if runner == "openvino" and entry.get("precision"):
                precisions.add(entry["precision"])
            if entry.get("missing"):
                missing[runner] = entry["error"]
    if versions:
        out.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    if precisions:
        out.append(f"OpenVINO's inference precision (its default on this CPU): {', '.join(sorted(precisions))}.")
    for runner, why in missing.items():
        out.append(f"{runner}: {why}: left out.")
    out.append("Runners: general plan, shape plan, native shape plan, native shape plan in bfloat16. Ratios: nncc "
               "over the faster peer of the row (below 1: nncc is faster). Max rel error: against onnxruntime, "
               "worst output. Other load: cores other processes kept busy, median over the row's processes.")
    out.append("")
    header = (["model", "input"] + [f"{SHORT[r]} / best peer" for r in NNCC_RUNNERS]
              + ["best peer", "nncc ms: general, shape, native, native bf16", "onnxruntime ms", "openvino ms",
                 "native partitions: f32, bf16", "max rel error: native, native bf16, openvino", "other load"])
    body = []
    for row in rows:
        rs = row["runners"]
        body.append([row["model"], row["shape"]] + [_cell(rs[r], "over_best_peer", ".2f") for r in NNCC_RUNNERS]
                    + [row.get("best_peer", "-"),
                       ", ".join(_cell(rs[r], "ms", ".1f") for r in NNCC_RUNNERS),
                       _cell(rs["onnxruntime"], "ms", ".1f"), _cell(rs["openvino"], "ms", ".1f"),
                       ", ".join(_cell(rs[r], "native", "d") for r in NNCC_RUNNERS[2:]),
                       ", ".join(_cell(rs[r], "max_rel_error", ".1e")
                                 for r in ("native shape plan", "native shape plan bf16", "openvino")),
                       f"{row['other_load']:.2f}"])
    out.append(table(header, body, markdown))
    for row in rows:
        for runner, entry in row["runners"].items():
            if "error" in entry and not entry.get("missing"):
                out.append(f"- {row['model']} {row['shape']}: {runner} failed: {entry['error']}")
            elif entry.get("failed_rounds"):
                out.append(f"- {row['model']} {row['shape']}: {runner} failed in {entry['failed_rounds']} round(s)")
    return "\n".join(out)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--model", action="append", choices=sorted(SHAPES),
                        help="a model to measure (repeatable; default: every model)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every runner (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of one process per runner "
                                                              "(default 3)")
    parser.add_argument("--blocks", type=int, default=8, help="timed blocks in each process (default 8)")
    parser.add_argument("--iterations", type=int, default=5, help="calls in each block (default 5)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="a markdown table")
    out.add_argument("--json", action="store_true", help="every figure as JSON")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's JSON job
    args = parser.parse_args(argv)
    for flag, value in (("--threads", args.threads), ("--rounds", args.rounds), ("--blocks", args.blocks),
                        ("--iterations", args.iterations)):
        if value < 1:
            parser.error(f"{flag} must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.one:
        child(json.loads(args.one), args)
        return
    command = "python benchmarks/bench_dynamic.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = {"command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "threads": args.threads, "rounds": args.rounds, "blocks": args.blocks,
              "iterations": args.iterations, "rows": []}
    chosen = models()
    with tempfile.TemporaryDirectory(prefix="nncc-bench-dynamic-") as work:
        for name in args.model or list(SHAPES):
            for shape in SHAPES[name]:
                began = time.perf_counter()
                row = measure_row(name, chosen[name], shape, args, work)
                report["rows"].append(row)
                print(f"bench_dynamic: {name} {row['shape']}: " + ", ".join(
                    f"{r} {_cell(e, 'ms', '.2f')} ms" for r, e in row["runners"].items())
                    + f"; best peer {row.get('best_peer', '-')} ({time.perf_counter() - began:.0f} s)",
                    file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1) if args.json else render(report, args.markdown))


if __name__ == "__main__":
    main()
