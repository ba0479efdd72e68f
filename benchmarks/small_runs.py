"""Single runs of a small corpus model, one by one, in fresh processes: how their times spread.

    python benchmarks/small_runs.py --model tabular_mlp                  # nncc cached and onnxruntime, 2 threads
    python benchmarks/small_runs.py --model tabular_mlp --processes 5 --runs 5000 --gap-us 200
    python benchmarks/small_runs.py --model lstm_stateful --runtimes nncc-cached --cache /tmp/warm

The corpus's rows of a few tens of microseconds are a median over few runs of few
processes, and a run's time there depends on things a median hides (a pool worker that
sleeps or spins, the Python path around the native call). This driver prepares the model
the way benchmarks/corpus.py's "nncc cached" column does (a warm cache that an earlier
process filled by running the manifest's feeds, dynamic dimensions left dynamic), or opens
onnxruntime at its defaults with only the thread count set, then times --runs single runs
after --warmup, each alone (``--gap-us`` idles that long between runs, by the clock, as a
caller that does other work between requests would). Each runtime runs in --processes
processes of its own, alternating; it prints, per process, p10/p50/p90/p99 of a run, the
process's CPU time per run (every thread: a worker that spins shows here) and a histogram
of the runs over all processes, in microseconds. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import corpus  # noqa: E402  (the corpus's children: model_inputs, warm_cache, open_cached)
import peer_runtimes  # noqa: E402

RUNTIMES = ("nncc-cached", "onnxruntime")


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def child_time(job: dict) -> dict:
    """In this fresh process: open the runtime, warm it, time single runs; the times in us."""
    import numpy as np  # lazy: the child's, with its runtime

    with np.load(job["feeds"]) as saved:
        feeds = {k: saved[k] for k in saved.files}
    if job["runtime"] == "nncc-cached":
        run, info, _ = corpus.open_cached(job["path"], job["threads"], job["cache"])
    else:
        run, info, _ = peer_runtimes.OPENERS[job["runtime"]](job["path"], job["threads"], job["cache"])
    for _ in range(job["warmup"]):
        run(feeds)
    if job["runtime"].startswith("nncc"):
        for _ in range(peer_runtimes.join_shape_builds()):
            run(feeds)
    clock, gap = time.perf_counter, job["gap_us"] / 1e6
    times = []
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), clock()
    idle = 0.0
    for _ in range(job["runs"]):
        start = clock()
        run(feeds)
        end = clock()
        times.append((end - start) * 1e6)
        if gap:
            while clock() - end < gap:  # the caller's other work: the calling thread stays busy
                pass
            idle += clock() - end
    cpu1, wall1 = resource.getrusage(resource.RUSAGE_SELF), clock()
    cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime - idle) / job["runs"] * 1e6
    info = {k: v for k, v in info.items() if isinstance(v, (int, float, str))}
    return {**info, "times_us": times, "cpu_us": cpu, "wall_us": (wall1 - wall0 - idle) / job["runs"] * 1e6,
            "switches": (cpu1.ru_nvcsw + cpu1.ru_nivcsw - cpu0.ru_nvcsw - cpu0.ru_nivcsw) / job["runs"]}


def spawn(job: dict) -> dict:
    from bench_peers import child_env  # lazy: the parent's

    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True,
                          env=child_env(), timeout=1800)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise SystemExit(f"small_runs: the child failed (exit {done.returncode}): "
                         f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(lines[-1])


def histogram(times: list[float], bins: int = 12) -> list[str]:
    """Rows of a log-spaced histogram from the fastest run to p99.9 (slower runs in the last row)."""
    ordered = sorted(times)
    low, high = ordered[0], max(percentile(ordered, 0.999), ordered[0] * 1.01)
    ratio = (high / low) ** (1 / bins)
    edges = [low * ratio ** i for i in range(bins + 1)]
    counts = [0] * bins
    for t in ordered:
        counts[min(bins - 1, sum(1 for e in edges[1:-1] if t >= e))] += 1
    peak = max(counts)
    return [f"  {edges[i]:8.1f}-{edges[i + 1]:<8.1f} {counts[i]:6d} {'#' * round(40 * counts[i] / peak)}"
            for i in range(bins)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model of the corpus manifest (required)")
    parser.add_argument("--manifest", default=str(corpus.MANIFEST))
    parser.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"from {', '.join(RUNTIMES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--processes", type=int, default=3, help="processes per runtime (default 3)")
    parser.add_argument("--runs", type=int, default=3000, help="timed runs in each process (default 3000)")
    parser.add_argument("--warmup", type=int, default=100, help="untimed runs in each process (default 100)")
    parser.add_argument("--gap-us", type=float, default=0.0, help="busy time of the caller between runs")
    parser.add_argument("--cache", help="a warm cache to reuse (default: a fresh one, warmed first)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        job = json.loads(args.child)
        print(json.dumps(corpus.warm_cache(job) if job.get("warm") else child_time(job)))
        return 0
    if not args.model:
        parser.error("--model is required")
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if not runtimes or set(runtimes) - set(RUNTIMES):
        parser.error(f"--runtimes: from {', '.join(RUNTIMES)}")
    if min(args.threads, args.processes, args.runs) < 1 or args.warmup < 0 or args.gap_us < 0:
        parser.error("--threads, --processes and --runs must be at least 1, --warmup and --gap-us at least 0")
    entries = {e["name"]: e for e in json.loads(pathlib.Path(args.manifest).read_text())["models"]}
    if args.model not in entries:
        parser.error(f"no model {args.model} in {args.manifest}")
    entry = entries[args.model]
    path = str(pathlib.Path(args.manifest).parent / entry["file"])
    with tempfile.TemporaryDirectory(prefix="nncc-small-runs-") as work:
        feeds = os.path.join(work, "feeds.npz")
        corpus.write_feeds(entry, feeds)
        cache = args.cache or os.path.join(work, "cache")
        warmed = spawn({"warm": True, "path": path, "feeds": feeds, "warm_cache": cache}) \
            if not args.cache or not os.path.isdir(args.cache) else {}
        if "error" in warmed:
            raise SystemExit(f"small_runs: warming the cache failed: {warmed['error']}")
        print(f"{args.model}: {args.threads} threads, {args.processes} processes x {args.runs} runs after "
              f"{args.warmup} warm-ups, gap {args.gap_us:g} us; load {os.getloadavg()[0]:.2f}; us per run")
        found = {r: [] for r in runtimes}
        for p in range(args.processes):
            for runtime in (runtimes if p % 2 == 0 else runtimes[::-1]):
                found[runtime].append(spawn({"runtime": runtime, "path": path, "feeds": feeds, "cache": cache,
                                             "threads": args.threads, "warmup": args.warmup, "runs": args.runs,
                                             "gap_us": args.gap_us}))
        for runtime in runtimes:
            print(f"{runtime}:")
            print(f"  {'process':>8} {'p10':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'cpu/run':>8} {'csw/run':>8}")
            every = []
            for p, res in enumerate(found[runtime]):
                ordered = sorted(res["times_us"])
                every += ordered
                print(f"  {p:>8} " + " ".join(f"{percentile(ordered, q):8.1f}" for q in (0.1, 0.5, 0.9, 0.99))
                      + f" {res['cpu_us']:8.1f} {res['switches']:8.2f}")
            ordered = sorted(every)
            print(f"  {'all':>8} " + " ".join(f"{percentile(ordered, q):8.1f}" for q in (0.1, 0.5, 0.9, 0.99)))
            print("\n".join(histogram(ordered)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
