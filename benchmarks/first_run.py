"""First run after a cache hit against the steady state, each in a fresh process.

    python benchmarks/first_run.py MODEL.onnx [MODEL.onnx ...] [--processes 5] [--runs 30]
    python benchmarks/first_run.py --corpus [--model NAME ...] [--processes 5] [--runs 30]

Models given as files: `nncc compile` stores their optimized (native) entry in a temporary
cache, and every measuring process prepares it (a hit) and runs random inputs.

--corpus (the manifest of benchmarks/build_corpus.py, --manifest to name another): each
model runs at its manifest's feeds with its dynamic dimensions left as exported, as a
user's processes have it. A first, seeding process prepares it in a temporary cache (a
miss), runs the feeds once and exits, which waits for what it started in the background
(the optimized stage of the general plan, the native plan of the feeds' shape); the
"seeding" columns say what it found and how long that wait took. Every measuring process
after it prepares it from the cache as a later process of the user's does (a hit, the
default background setting), and its first run is the first of a shape the cache has
seen: the "ran" column is the partitions of the plan that ran (native / all), the claim
being that the second process runs native code.

--onnxruntime (with --corpus) adds onnxruntime's row: a process of its own at its defaults
taking turns with nncc's measuring processes, which makes its session, reads the same feeds
and times its first run and its steady ones by the same steps.

--trees OLD NEW (with --corpus) measures the nncc of each checkout, a row each: each tree
seeds a cache of its own, and their measuring processes alternate, so that one run
compares them on the same machine load.

Every child writes and reuses byte code, as an installed nncc has it. Each measuring
process (--processes of them) times its prepare, pauses --pause seconds (default 0: the
first run right after the prepare; a process that reads its input first has the time
that pause stands for), then times its first run (with its minor page
faults, from getrusage) and the median of --runs further runs, in wall time and in the
process's CPU time (every thread's; on a loaded machine a run's wall time includes the
time slices other processes took, its CPU time does not). Prints one line per model with
the medians over the processes: "first / steady" near 1 means a process's first run pays
nothing the later ones do not; and each process's first run, in order (with --corpus, the
first measuring process may find in the cache only what the seeding process built, such
as the plan for one sample, and build the shape's own plan for the later ones).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "build" / "corpus" / "manifest.json"

# argv: model, runs, the feeds (.npz) or "" for random ones, whether to prepare as a later process of the
# user's does (background upgrades and shape lookups on) or only to load the optimized entry `nncc compile` stored,
# the seconds to pause between the prepare and the first run
_CHILD = r"""
import json, resource, sys, time
import numpy as np
import nncc
from nncc.model import prepare
path, runs, feeds_path, as_user = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "user"
pause = float(sys.argv[5])
start = time.perf_counter()
model, outcome = prepare(path, background="thread" if as_user else None)
prepared = time.perf_counter() - start
if not as_user:
    assert outcome.outcome == "hit" and outcome.stage == "optimized", (outcome.outcome, outcome.stage)
if feeds_path:
    with np.load(feeds_path) as saved:
        feeds = {k: saved[k] for k in saved.files}
else:
    from nncc.runtime.random_inputs import random_feeds
    feeds = random_feeds(model.input_infos, seed=0)
if pause:  # what a process does between its prepare and its first run (reading its input); 0: nothing, not even a
    time.sleep(pause)  # sleep(0), which yields the CPU: on this VM the vCPU idles and a 25 us run then takes 80-100
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
cpu, start = time.process_time(), time.perf_counter()
model.run(feeds)
first, first_cpu = time.perf_counter() - start, time.process_time() - cpu
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
steady, steady_cpu = [], []
for _ in range(runs):
    cpu, start = time.process_time(), time.perf_counter()
    model.run(feeds)
    steady.append(time.perf_counter() - start)
    steady_cpu.append(time.process_time() - cpu)
steady.sort()
steady_cpu.sort()
print(json.dumps({"first": first, "faults": faults, "steady": steady[len(steady) // 2], "first_cpu": first_cpu,
                  "steady_cpu": steady_cpu[len(steady_cpu) // 2], "prepare": prepared,
                  "native": model.last_run_native_partitions, "partitions": model.last_run_partitions,
                  "outcome": outcome.outcome, "stage": outcome.stage, "nncc": nncc.__file__}))
"""

# argv: model, runs, the feeds (.npz), the pause: onnxruntime at its defaults through the same steps as _CHILD (a
# session made, the feeds read, the first run, then the steady ones), the peer's row for the same protocol
_PEER = r"""
import json, resource, sys, time
import numpy as np
import onnxruntime
path, runs, feeds_path, pause = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
start = time.perf_counter()
session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
prepared = time.perf_counter() - start
with np.load(feeds_path) as saved:
    feeds = {k: saved[k] for k in saved.files}
if pause:
    time.sleep(pause)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
cpu, start = time.process_time(), time.perf_counter()
session.run(None, feeds)
first, first_cpu = time.perf_counter() - start, time.process_time() - cpu
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
steady, steady_cpu = [], []
for _ in range(runs):
    cpu, start = time.process_time(), time.perf_counter()
    session.run(None, feeds)
    steady.append(time.perf_counter() - start)
    steady_cpu.append(time.process_time() - cpu)
steady.sort()
steady_cpu.sort()
print(json.dumps({"first": first, "faults": faults, "steady": steady[len(steady) // 2], "first_cpu": first_cpu,
                  "steady_cpu": steady_cpu[len(steady_cpu) // 2], "prepare": prepared}))
"""

# argv: model, feeds (.npz). A user's first process: prepares (a miss), runs once and exits, and exiting waits for
# the background builds it started; "ended" is the wall clock when its script ended, for the parent to time the wait
_SEED = r"""
import json, sys, time
import numpy as np
from nncc.model import prepare
path, feeds_path = sys.argv[1], sys.argv[2]
with np.load(feeds_path) as saved:
    feeds = {k: saved[k] for k in saved.files}
start = time.perf_counter()
model, outcome = prepare(path)
model.run(feeds)
print(json.dumps({"outcome": outcome.outcome, "stage": outcome.stage, "ran": time.perf_counter() - start,
                  "native": model.last_run_native_partitions, "partitions": model.last_run_partitions,
                  "ended": time.time()}))
"""


def child(code: str, args: list[str], env: dict, name: str) -> dict:
    # -P: the working directory is not put first on sys.path, where a checkout's nncc would win over PYTHONPATH's
    done = subprocess.run([sys.executable, "-P", "-c", code, *args], env=env, capture_output=True, text=True)
    exited = time.time()
    if done.returncode:
        raise SystemExit(f"{name}: the measuring process failed:\n{done.stderr}")
    found = json.loads(done.stdout.splitlines()[-1])
    if "ended" in found:  # the seeding process: how long its exit waited for its background builds
        found["wait"] = exited - found.pop("ended")
    if done.stderr.strip():  # a background build that failed says so there
        print(f"{name}: {done.stderr.strip().splitlines()[-1][:300]}", file=sys.stderr)
    return found


def medians(seen: list[dict]) -> dict:
    """Each figure's median over the processes; the words (outcome, stage) of the last; and
    every process's first run in order ("firsts": the first process after the seeding one
    may run another plan than the later ones, which the median alone hides)."""
    return {key: statistics.median(s[key] for s in seen) if isinstance(value, (int, float)) else value
            for key, value in seen[-1].items()} | {"firsts": [s["first"] for s in seen]}


def measure(model: pathlib.Path, processes: int, runs: int, pause: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="nncc-first-run-") as cache:
        env = child_env(NNCC_CACHE_DIR=cache, NNCC_UPGRADE_AFTER="off")
        subprocess.run([sys.executable, "-P", "-m", "nncc", "compile", str(model), "-q", "-o",
                        os.path.join(cache, "artifact.nncc")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return medians([child(_CHILD, [str(model), str(runs), "", "compiled", str(pause)], env, model.name)
                        for _ in range(processes)])


def child_env(tree: str | None = None, **values) -> dict:
    """The children's environment: byte code written and reused, as an installed nncc has
    it; nncc imported from ``tree`` when given, else from this checkout."""
    env = dict(os.environ, **values)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree or str(ROOT), env.get("PYTHONPATH")]))
    return env


def measure_corpus(entry: dict, corpus: pathlib.Path, processes: int, runs: int, trees: list,
                   pause: float, peer: bool = False) -> tuple[list[dict], dict | None]:
    """One result per tree (None: the nncc this script finds), each tree with a cache of
    its own (the token covers nncc's code), the measuring processes alternating between them;
    and with ``peer``, onnxruntime's on the same feeds, its processes taking turns with them."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from corpus import write_feeds  # lazy: the corpus's own feeds, only in this mode

    path = str(corpus / entry["file"])
    with tempfile.TemporaryDirectory(prefix="nncc-first-run-") as folder:
        feeds = os.path.join(folder, "feeds.npz")
        write_feeds(entry, feeds)
        envs, seeds, seen = [], [], [[] for _ in trees]
        for i, tree in enumerate(trees):
            env = child_env(tree, NNCC_CACHE_DIR=os.path.join(folder, f"cache{i}"))  # a folder of nncc's own
            env.pop("NNCC_UPGRADE_AFTER", None)  # the default: the miss starts the upgrade
            envs.append(env)
            seeds.append(child(_SEED, [path, feeds], env, entry["name"]))
        peers = []
        for n in range(processes):
            if peer and n % 2:  # onnxruntime first in every other turn
                peers.append(child(_PEER, [path, str(runs), feeds, str(pause)], child_env(), entry["name"]))
            order = range(len(trees)) if n % 2 == 0 else reversed(range(len(trees)))
            for i in order:
                found = child(_CHILD, [path, str(runs), feeds, "user", str(pause)], envs[i], entry["name"])
                if trees[i] is not None and not found["nncc"].startswith(os.path.abspath(trees[i])):
                    raise SystemExit(f"{entry['name']}: {trees[i]} was to be measured, {found['nncc']} was imported")
                seen[i].append(found)
            if peer and n % 2 == 0:
                peers.append(child(_PEER, [path, str(runs), feeds, str(pause)], child_env(), entry["name"]))
    return [medians(s) | {"seed": seed} for s, seed in zip(seen, seeds)], (medians(peers) if peer else None)


def row(name: str, m: dict) -> str:
    return (f"| {name} | {m['native']:.0f}/{m['partitions']:.0f} | {m['prepare'] * 1000:.1f} ms "
            f"| {m['first'] * 1000:.2f} ms | {m['faults']:.0f} "
            f"| {m['steady'] * 1000:.2f} ms | {m['first'] / m['steady']:.2f} | {m['first_cpu'] * 1000:.2f} ms "
            f"| {m['steady_cpu'] * 1000:.2f} ms | {m['first_cpu'] / max(m['steady_cpu'], 1e-6):.2f} "
            f"| {' '.join(f'{f * 1000:.2f}' for f in m['firsts'])} |")


def peer_row(name: str, m: dict) -> str:
    """onnxruntime's figures in the table's columns (it has no partitions: "onnxruntime" there)."""
    return row(name, m | {"native": 0, "partitions": 0}).replace("| 0/0 |", "| onnxruntime |", 1)


HEADER = ("| model | ran (native/all) | prepare | first run | minor faults | steady run | first / steady "
          "| first run CPU | steady CPU | CPU first / steady | each process's first run, ms |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=pathlib.Path)
    parser.add_argument("--corpus", action="store_true", help="the corpus manifest's models at its feeds")
    parser.add_argument("--manifest", type=pathlib.Path, default=MANIFEST, help=f"default {MANIFEST}")
    parser.add_argument("--model", action="append", metavar="NAME", help="with --corpus: only these (repeatable)")
    parser.add_argument("--trees", nargs="+", metavar="TREE",
                        help="with --corpus: measure the nncc of each of these checkouts (their PYTHONPATH), "
                             "alternating, one row each")
    parser.add_argument("--onnxruntime", action="store_true",
                        help="with --corpus: onnxruntime at its defaults too, on the same feeds by the same steps "
                             "(a session, the feeds read, the first run, the steady ones), a row of its own")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--pause", type=float, default=0.0, metavar="SECONDS",
                        help="between the prepare and the first run, as a process reading its input has (default 0)")
    args = parser.parse_args()
    if args.corpus == bool(args.models):
        parser.error("give model files, or --corpus")
    if not args.corpus:
        print(HEADER + "\n" + "|---" * 11 + "|")
        for model in args.models:
            print(row(model.name, measure(model, args.processes, args.runs, args.pause)), flush=True)
        return 0
    try:
        entries = json.loads(args.manifest.read_text())["models"]
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"cannot read the manifest {args.manifest} ({exc}); build it with benchmarks/build_corpus.py")
    if args.model:
        unknown = sorted(set(args.model) - {e["name"] for e in entries})
        if unknown:
            parser.error(f"no model {', '.join(unknown)} in {args.manifest}")
        entries = [e for e in entries if e["name"] in args.model]
    trees = args.trees or [None]
    print(HEADER + (" tree |" if args.trees else "") + " seeding process: outcome, ran, wait for its background "
          "builds | later process: cache outcome, stage |\n" + "|---" * (13 + bool(args.trees)) + "|")
    for entry in entries:
        found, peer = measure_corpus(entry, args.manifest.parent, args.processes, args.runs, trees, args.pause,
                                     args.onnxruntime)
        for tree, m in zip(trees, found):
            seed = m["seed"]
            print(row(entry["name"], m) + (f" {tree} |" if args.trees else "")
                  + f" {seed['outcome']} ({seed['stage']}), {seed['native']}/{seed['partitions']}, "
                  f"{seed['wait']:.1f} s | {m['outcome']}, {m['stage']} |", flush=True)
        if peer:
            print(peer_row(entry["name"], peer) + (" |" if args.trees else "") + " - | - |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
