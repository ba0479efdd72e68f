"""Two stages per cache entry, with real processes and the real C compiler.

A miss stores the quick portable plan without running the compiler and, by default,
starts a detached worker that builds the native stage and swaps it in, so the model's
second process runs native code (with cache.upgrade_after N, the Nth hit starts it); readers stay
correct throughout (checked against onnxruntime), one build happens per token however
many processes hit it, a killed worker leaves stage 1 serving, and a failed build is
recorded and not retried. The compiler is a wrapper script that logs every call, so
"the compiler did (not) run" is read from its log, not inferred.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest

from nncc.native.toolchain import find_toolchain
from tests.models import mlp
from tests.oracle import ort_run

REAL_CC = find_toolchain()
pytestmark = pytest.mark.skipif(REAL_CC is None, reason="no C compiler on this machine: there is no native "
                                "stage to build (a miss then stays quick, which test_no_compiler covers)")

ROOT = pathlib.Path(__file__).resolve().parent.parent
WAIT = 120.0  # a bound on waiting for a background build, not a timing assertion


class Setup:
    """A model, its feeds and onnxruntime's outputs, a cache, and a logging compiler."""

    def __init__(self, tmp_path: pathlib.Path, compiler_body: str | None = None, upgrade_after: str = "0"):
        self.tmp = tmp_path
        self.model = tmp_path / "mlp.onnx"
        onnx.save(mlp([4, 64], 32, 10, seed=5, softmax=True), self.model)
        self.feeds = tmp_path / "feeds.npz"
        x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
        np.savez(self.feeds, x=x)
        self.want = ort_run(self.model, {"x": x})[0]
        np.save(tmp_path / "want.npy", self.want)
        self.cache = tmp_path / "cache"
        self.log = tmp_path / "cc.log"
        self.cc = tmp_path / "cc"
        body = compiler_body if compiler_body is not None else f'exec {REAL_CC.path} "$@"'
        # every call is logged with its arguments; a build is a call naming unit.c
        self.cc.write_text(f'#!/bin/sh\necho "$PPID $*" >> {self.log}\n{body}\n')
        self.cc.chmod(0o755)
        self.env = dict(os.environ, CC=str(self.cc), NNCC_CACHE_DIR=str(self.cache), NNCC_UPGRADE_AFTER=upgrade_after,
                        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def run(self, *extra, out="out.npz"):
        """`nncc run` in its own process: (the cache report, native partitions, outputs)."""
        done = subprocess.run([sys.executable, "-m", "nncc", "run", str(self.model), "--inputs", str(self.feeds),
                               "-o", str(self.tmp / out), "--json", *extra], env=self.env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        with np.load(self.tmp / out) as got:
            probs = got["probs"]
        np.testing.assert_allclose(probs, self.want, rtol=1e-4, atol=1e-5)
        return report["cache"], report["native_partitions"]

    def builds(self) -> int:
        """How many native builds ran: each ends in one link of the shared object (its
        translation units may come from the kernel object cache)."""
        if not self.log.exists():
            return 0
        return sum("-shared" in line.split() for line in self.log.read_text().splitlines())

    def calls(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def row(self, query: str):
        conn = sqlite3.connect(f"file:{self.cache / 'index.sqlite3'}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(query).fetchall()
        finally:
            conn.close()

    def stage(self) -> str | None:
        rows = self.row("SELECT stage FROM entries")
        return rows[0][0] if rows else None

    def failures(self) -> list:
        return self.row("SELECT token, reason FROM native_failures")

    def wait_for(self, condition, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            assert time.monotonic() < deadline, f"gave up waiting {WAIT:g} s for {what}"
            time.sleep(0.2)

    def cli(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "nncc", *args], env=self.env, capture_output=True, text=True)


@pytest.mark.slow
def test_the_miss_starts_the_worker_and_the_second_process_runs_native_code(tmp_path):
    """The default: process 1 misses, runs the quick stage and leaves a detached worker
    building the native stage; once the worker has committed it (read from the index, and
    its upgrade lock released), process 2 is a hit whose plan runs native code."""
    s = Setup(tmp_path)
    first, native = s.run()
    assert (first["outcome"], first["stage"], first["upgrade"], native) == ("miss", "quick", "process", 0)
    lock = s.cache / "locks" / f"{first['token']}.upgrade"
    s.wait_for(lambda: s.stage() == "optimized" and not lock.exists(), "the worker started by the miss")
    assert s.builds() == 1
    second, native = s.run()
    assert (second["outcome"], second["stage"], second["upgrade"], native) == ("hit", "optimized", None, 1)
    assert second["token"] == first["token"] and s.builds() == 1
    info = json.loads(s.cli("cache", "info", "--json").stdout)
    assert info["counters"]["upgrades"] == 1 and info["counters"]["misses"] == 1


@pytest.mark.slow
def test_miss_is_quick_and_a_worker_upgrades_after_n_hits(tmp_path):
    s = Setup(tmp_path, upgrade_after="2")
    first, native = s.run()
    assert (first["outcome"], first["stage"], native) == ("miss", "quick", 0)
    assert s.calls() == 0, "a quick miss must not run the C compiler at all"
    second, _ = s.run()
    assert (second["outcome"], second["stage"], second["upgrade"]) == ("hit", "quick", None)
    third, _ = s.run()  # the second hit: NNCC_UPGRADE_AFTER=2
    assert (third["stage"], third["upgrade"]) == ("quick", "process")
    s.wait_for(lambda: s.stage() == "optimized", "the worker's upgrade")
    assert s.builds() == 1
    after, native = s.run()
    assert (after["outcome"], after["stage"], native) == ("hit", "optimized", 1)
    # the token is the stage's own: one entry, upgraded in place
    assert after["token"] == first["token"] and len(s.row("SELECT token FROM entries")) == 1
    listing = json.loads(s.cli("cache", "ls", "--json").stdout)
    assert [e["stage"] for e in listing["entries"]] == ["optimized"]
    info = json.loads(s.cli("cache", "info", "--json").stdout)
    assert info["counters"]["upgrades"] == 1 and info["native_failures"] == {}
    assert info["stages"] == {"quick": 0, "optimized": 1}
    assert s.builds() == 1  # hits on the optimized entry build nothing


_READER = r"""
import sys, numpy as np
from nncc.model import prepare
model_path, feeds_path, want_path, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
x = np.load(feeds_path)["x"]
want = np.load(want_path)
seen = []
for _ in range(rounds):
    model, outcome = prepare(model_path, background="process")
    got = model.run({"x": x})["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    seen.append((outcome.stage, model.native_partitions))
    if outcome.stage == "optimized":
        break
    import time; time.sleep(0.1)
print(" ".join(f"{stage}:{native}" for stage, native in seen))
"""


@pytest.mark.slow  # each waits on a background worker's native build
def test_four_processes_hitting_one_token_build_it_once(tmp_path):
    """Four long-running readers start together on an empty cache: one miss, hits from all
    four, upgrade attempts from several, exactly one native build, and every output along
    the way right. Each reader picks the optimized stage up at a later prepare()."""
    s = Setup(tmp_path)
    reader = tmp_path / "reader.py"
    reader.write_text(_READER)
    rounds = 2000  # an upper bound: each reader stops once it has seen the optimized stage
    procs = [subprocess.Popen([sys.executable, str(reader), str(s.model), str(s.feeds), str(tmp_path / "want.npy"),
                               str(rounds)], env=s.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = [p.communicate(timeout=600) + (p.returncode,) for p in procs]
    for out, err, code in results:
        assert code == 0, err
        seen = out.split()
        assert seen[-1] == "optimized:1", seen[-5:]  # picked up by the running process
        assert all(entry in ("quick:0", "optimized:1") for entry in seen)
    assert s.builds() == 1, s.log.read_text()
    counters = dict(s.row("SELECT name, value FROM counters"))
    assert counters["misses"] == 1 and counters["upgrades"] == 1


@pytest.mark.slow  # each waits on a background worker's native build
def test_sigkill_of_the_worker_mid_build_keeps_stage_one(tmp_path):
    slow_flag = tmp_path / "slow"
    started = tmp_path / "started"
    slow_flag.touch()
    # while the flag exists the compiler announces itself and sleeps before building
    s = Setup(tmp_path, f'if [ -f {slow_flag} ]; then touch {started}; sleep 60; fi\nexec {REAL_CC.path} "$@"')
    third, _ = s.run()
    assert third["upgrade"] == "process"  # started by the miss
    s.wait_for(started.exists, "the worker to start the compiler")
    worker = int(s.log.read_text().split()[0])  # the compiler's parent: the worker
    os.killpg(worker, signal.SIGKILL)  # the worker leads its own session: it and the compiler
    slow_flag.unlink()
    s.wait_for(lambda: not _alive(worker), "the killed worker to go")
    assert s.stage() == "quick" and s.failures() == []  # stage 1 intact, nothing recorded
    left = s.cache / "locks" / f"{third['token']}.upgrade"
    assert left.exists()  # the killed worker's lock file: gc removes it, as nobody holds it
    gc = s.cli("cache", "gc")
    assert gc.returncode == 0 and not left.exists(), gc.stderr
    verify = s.cli("cache", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    served, native = s.run()
    assert (served["outcome"], served["stage"], native) == ("hit", "quick", 0)
    assert served["upgrade"] == "process"  # the killed build is tried again
    s.wait_for(lambda: s.stage() == "optimized", "the second worker's upgrade")
    after, native = s.run()
    assert (after["stage"], native) == ("optimized", 1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by init) is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow  # each waits on a background worker's native build
def test_a_hanging_compiler_is_recorded_and_not_retried(tmp_path):
    s = Setup(tmp_path, 'case " $* " in *" -c "*) exec sleep 60 ;; esac\nexit 1')  # every compile hangs
    s.env["NNCC_CC_TIMEOUT"] = "1"
    third, _ = s.run()
    assert third["upgrade"] == "process"  # started by the miss
    s.wait_for(lambda: s.failures() != [], "the failure to be recorded")
    (token, reason), = s.failures()
    assert token == third["token"] and "timed out" in reason
    assert s.stage() == "quick"
    info = s.cli("cache", "info")
    assert "Native build failed" in info.stdout and "timed out" in info.stdout
    assert "1 quick, 0 optimized" in info.stdout
    assert json.loads(s.cli("cache", "info", "--json").stdout)["native_failures"][token]["reason"] == reason
    attempted = s.calls()
    assert attempted >= 1 and s.builds() == 0  # it never got as far as a link
    for _ in range(2):
        served, native = s.run()
        assert (served["stage"], served["upgrade"], native) == ("quick", None, 0)
    assert s.calls() == attempted  # not retried


@pytest.mark.slow  # each waits on a background worker's native build
def test_low_power_never_spawns_a_worker(tmp_path):
    s = Setup(tmp_path)
    for _ in range(4):
        report, native = s.run("--preference", "low-power")
        assert (report["stage"], report["upgrade"], native) == ("quick", None, 0)
    assert s.calls() == 0


@pytest.mark.slow
def test_no_compiler_no_worker(tmp_path):
    s = Setup(tmp_path)
    s.env["CC"] = str(tmp_path / "no-such-cc")
    for _ in range(3):
        report, native = s.run()
        assert (report["stage"], report["upgrade"], native) == ("quick", None, 0)


@pytest.mark.slow  # each waits on a background worker's native build
def test_forced_stages_and_compile(tmp_path):
    s = Setup(tmp_path)
    quick, native = s.run("--stage", "quick")
    assert (quick["outcome"], quick["stage"], native) == ("miss", "quick", 0) and s.calls() == 0
    # `nncc compile` builds the optimized stage of the quick entry now
    done = s.cli("compile", str(s.model), "-o", str(tmp_path / "mlp.nncc"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cache"]["stage"] == "optimized" and s.builds() == 1
    assert s.stage() == "optimized"
    optimized, native = s.run()
    assert (optimized["stage"], native) == ("optimized", 1)
    portable, native = s.run("--stage", "quick")  # the optimized entry's portable plan
    assert (portable["stage"], native) == ("optimized", 0)
    inspect = json.loads(s.cli("inspect", str(tmp_path / "mlp.nncc"), "--json").stdout)
    assert inspect["stage"] == "optimized"
    assert json.loads(s.cli("inspect", str(s.model), "--stage", "quick", "--json").stdout)["stage"] == "quick"
    (tmp_path / "fresh").mkdir()
    s2 = Setup(tmp_path / "fresh")
    forced, native = s2.run("--stage", "optimized")  # on a miss: native now, as `nncc compile` does
    assert (forced["outcome"], forced["stage"], native) == ("miss", "optimized", 1) and s2.builds() == 1


@pytest.mark.slow  # each waits on a background worker's native build
def test_api_upgrades_in_a_background_thread(tmp_path, monkeypatch):
    import threading

    from nncc.model import prepare

    s = Setup(tmp_path)
    monkeypatch.setenv("CC", str(s.cc))
    monkeypatch.delenv("NNCC_UPGRADE_AFTER")  # the default: the miss starts it
    x = np.load(s.feeds)["x"]
    model, outcome = prepare(s.model, cache_dir=s.cache)
    np.testing.assert_allclose(model.run({"x": x})["probs"], s.want, rtol=1e-4, atol=1e-5)
    assert (outcome.outcome, outcome.stage, outcome.upgrade, model.native_partitions) == ("miss", "quick", "thread", 0)
    for thread in threading.enumerate():
        if thread.name.startswith("nncc-upgrade-"):
            thread.join(WAIT)
    model, outcome = prepare(s.model, cache_dir=s.cache)  # the same process picks stage 2 up
    assert (outcome.stage, model.native_partitions) == ("optimized", 1)
    np.testing.assert_allclose(model.run({"x": x})["probs"], s.want, rtol=1e-4, atol=1e-5)
    assert s.builds() == 1


@pytest.mark.slow  # each waits on a background worker's native build
def test_worker_aborts_when_the_model_no_longer_hashes_to_the_token(tmp_path):
    s = Setup(tmp_path)
    first, _ = s.run("--stage", "quick")
    options = {"preference": "fast-single-answer", "opt_level": 2, "backends": ["native", "numpy"],
               "plugins": [], "target": "native"}
    original = s.model.read_bytes()
    edited = onnx.load(str(s.model))
    edited.doc_string = "edited after the entry was made"
    onnx.save(edited, str(s.model))

    def worker():
        return subprocess.run([sys.executable, "-m", "nncc.preparing.upgrade", "--cache-dir", str(s.cache),
                               "--token", first["token"], "--model", str(s.model), "--options",
                               json.dumps(options)], env=s.env, capture_output=True, text=True)

    aborted = worker()
    assert aborted.returncode == 1, aborted.stderr
    assert s.stage() == "quick" and s.calls() == 0 and s.failures() == []  # nothing built, nothing recorded
    s.model.write_bytes(original)  # the same worker on the model the entry was made from upgrades it
    done = worker()
    assert done.returncode == 0, done.stderr
    assert s.stage() == "optimized" and s.builds() == 1


@pytest.mark.slow
def test_gc_leaves_the_upgrade_lock_of_a_running_builder(tmp_path):
    from nncc.cache.locking import FileLock

    s = Setup(tmp_path)
    first, _ = s.run("--stage", "quick")
    path = s.cache / "locks" / f"{first['token']}.upgrade"
    with FileLock(str(path)):  # a builder at work
        gc = s.cli("cache", "gc")
        assert gc.returncode == 0 and path.exists(), gc.stderr


@pytest.mark.slow  # each waits on a background worker's native build
def test_worker_whose_entry_cannot_be_written_warns_and_fails(tmp_path):
    """A cache that cannot take the entry once its native stage is built (here its shard
    folder becomes a symbolic link, which the store never writes through; nncc bench removes
    its temporary cache when it is done): the builder says so in one warning and fails, it
    does not die with a traceback."""
    swap, elsewhere = tmp_path / "swap", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the compiler swaps the shard that `swap` names (its script is in the token: it is written once)
    s = Setup(tmp_path, f'if [ -f {swap} ]; then rm -rf "$(cat {swap})"; ln -sfn {elsewhere} "$(cat {swap})"; fi\n'
                        f'exec {REAL_CC.path} "$@"')
    first, _ = s.run("--stage", "quick")
    shard = s.cache / "entries" / first["token"][:2]
    swap.write_text(str(shard))
    options = {"preference": "fast-single-answer", "opt_level": 2, "backends": ["native", "numpy"],
               "plugins": [], "target": "native"}
    done = subprocess.run([sys.executable, "-m", "nncc.preparing.upgrade", "--cache-dir", str(s.cache),
                           "--token", first["token"], "--model", str(s.model), "--options", json.dumps(options)],
                          env=s.env, capture_output=True, text=True)
    assert s.builds() == 1 and shard.is_symlink()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"nncc: warning: cannot build the optimized stage of cache entry {first['token'][:12]}")
    assert "symbolic link" in done.stderr and len(done.stderr.splitlines()) == 1
    assert s.stage() == "quick" and list(elsewhere.iterdir()) == []  # nothing written through the link
