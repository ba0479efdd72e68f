"""Remote tier benchmark: a remote hit over loopback Redis against a local hit, and the
wall time of a fleet of 8 cold machines sharing one Redis.

    python benchmarks/bench_remote.py [--runs 5] [--model build/real-models/resnet18.onnx]

Needs redis-server on PATH (started here on 127.0.0.1 at a free port, stopped at the end)
and the redis client. The default model is real_models.py's ResNet-18 (11.7M random
weights, 45 MB), built on first use.

(a) In process, nncc imported: median of --runs of
    local hit    prepare() on a warm local cache (the remote is configured but not asked)
    remote hit   prepare() on a fresh, empty local cache: fetch manifest and parts from
                 Redis, verify, store locally (atomic writes, fsync, index), prepare from there
    transfer     a bare redis-py GET of the same parts: the bytes at loopback bandwidth
    The claim checked: remote hit <= 2 x local hit + transfer.
(b) Whole processes: `python -m nncc run MODEL --random-inputs`, 8 of them at once, each
    with its own cold local cache, one Redis; against one cold compile plus 7 remote hits
    run one after another. The claim checked: fleet <= 1.5 x (compile + 7 remote hits).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KEY = "benchmark key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(folder: str):
    import redis

    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", folder], stdout=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc, client, f"redis://127.0.0.1:{port}/0"
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def model_path(arg: str | None) -> str:
    if arg:
        return arg
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import onnx
    from real_models import resnet18

    path = ROOT / "build" / "real-models" / "resnet18.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(resnet18(), str(path))
    return str(path)


def in_process(model: str, runs: int, work: str, client) -> dict:
    from nncc.preparing import remote as flow
    from nncc.model import prepare

    warm = os.path.join(work, "warm")
    _, outcome = prepare(model, cache_dir=warm)
    assert outcome.outcome in ("miss", "remote hit"), outcome
    local, remote, transfer = [], [], []
    manifest = client.get(f"nncc:manifests/{outcome.token}")
    import json

    parts = [p["hash"] for p in json.loads(manifest.split(b"\n", 1)[1])["parts"]]
    for i in range(runs):
        start = time.perf_counter()
        _, o = prepare(model, cache_dir=warm)
        local.append(time.perf_counter() - start)
        assert o.outcome == "hit", o
        flow._tiers.clear()  # a new process would open its own connection
        start = time.perf_counter()
        _, o = prepare(model, cache_dir=os.path.join(work, f"cold{i}"))
        remote.append(time.perf_counter() - start)
        assert o.outcome == "remote hit", o
        start = time.perf_counter()
        size = sum(len(client.get(f"nncc:parts/{h}")) for h in parts)
        transfer.append(time.perf_counter() - start)
        shutil.rmtree(os.path.join(work, f"cold{i}"))
    return {"local": statistics.median(local), "remote": statistics.median(remote),
            "transfer": statistics.median(transfer), "bytes": size}


def nncc_run(model: str, cache: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nncc", "run", model, "--random-inputs", "--json"],
                            env=dict(env, NNCC_CACHE_DIR=cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def outcome_of(proc) -> str:
    import json

    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(err)
    return json.loads(out)["cache"]["outcome"]


def fleet(model: str, work: str, client, env: dict) -> dict:
    client.flushdb()
    start = time.perf_counter()
    assert outcome_of(nncc_run(model, os.path.join(work, "serial0"), env)) == "miss"
    compile_s = time.perf_counter() - start
    hits = []
    for i in range(7):
        start = time.perf_counter()
        assert outcome_of(nncc_run(model, os.path.join(work, f"serial{i + 1}"), env)) == "remote hit"
        hits.append(time.perf_counter() - start)
    client.flushdb()
    start = time.perf_counter()
    procs = [nncc_run(model, os.path.join(work, f"fleet{i}"), env) for i in range(8)]
    outcomes = sorted(outcome_of(p) for p in procs)
    wall = time.perf_counter() - start
    assert outcomes == ["miss"] + ["remote hit"] * 7, outcomes
    return {"compile": compile_s, "remote_hits": sum(hits), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    model = model_path(args.model)
    with tempfile.TemporaryDirectory() as work:
        proc, client, url = start_redis(work)
        try:
            env = dict(os.environ, NNCC_REMOTE=url, NNCC_REMOTE_KEY=KEY, PYTHONPATH=str(ROOT))
            os.environ.update(NNCC_REMOTE=url, NNCC_REMOTE_KEY=KEY)
            a = in_process(model, max(args.runs, 1), work, client)
            b = fleet(model, work, client, env)
        finally:
            proc.terminate()
            proc.wait()
    mb = a["bytes"] / 1e6
    bound = 2 * a["local"] + a["transfer"]
    print(f"model {os.path.basename(model)}: {mb:.1f} MB in the remote entry; median of {args.runs} runs")
    print("| | ms |\n|---|---|")
    print(f"| local hit | {a['local'] * 1e3:.1f} |")
    print(f"| remote hit (loopback Redis) | {a['remote'] * 1e3:.1f} |")
    print(f"| bare transfer of the parts ({mb / a['transfer']:.0f} MB/s) | {a['transfer'] * 1e3:.1f} |")
    print(f"| bound: 2 x local hit + transfer | {bound * 1e3:.1f} ({'met' if a['remote'] <= bound else 'NOT met'}) |")
    limit = 1.5 * (b["compile"] + b["remote_hits"])
    print("\n| whole processes | s |\n|---|---|")
    print(f"| one cold compile | {b['compile']:.2f} |")
    print(f"| 7 remote hits, one after another | {b['remote_hits']:.2f} |")
    print(f"| fleet: 8 cold processes at once | {b['wall']:.2f} |")
    print(f"| bound: 1.5 x (compile + 7 remote hits) | {limit:.2f} ({'met' if b['wall'] <= limit else 'NOT met'}) |")


if __name__ == "__main__":
    main()
