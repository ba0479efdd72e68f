"""The cache under real processes: make -j, SIGKILL at any point, gc beside runs."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from nncc.cache.store import Cache
from nncc.cache.verify import verify
from tests.conftest import ROOT
from tests.test_cache import MLP, RESNET, check_outputs, feeds_for, reference

pytestmark = pytest.mark.slow  # many processes, killed and raced, each compiling


# Imports everything first, says it is ready, then waits for the common "go" file, so that
# the processes really reach the cache at the same moment.
BARRIER_DRIVER = textwrap.dedent("""
    import os, sys, time
    ready, go = sys.argv[1:3]
    import nncc.cli.main, nncc.cli.run, nncc.model, nncc.cache.store, nncc.compiler, nncc.kernels
    import nncc.frontend.onnx, nncc.runtime.executor, numpy
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.0005)
    nncc.cli.main.main(sys.argv[3:])
""")


def env_for(cache_dir) -> dict:
    return dict(os.environ, NNCC_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT))


def nncc_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "nncc", *map(str, args)]




def counters(cache_dir):
    with Cache.open(cache_dir) as c:
        return c.index.counters(), c.index.entries()


def test_eight_processes_compile_once(tmp_path):
    cache_dir = tmp_path / "cache"
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **feeds_for(RESNET))
    go = tmp_path / "go"
    procs = []
    for i in range(8):
        cmd = [sys.executable, "-c", BARRIER_DRIVER, str(tmp_path / f"ready{i}"), str(go), "run", str(RESNET),
               "--inputs", str(feeds), "-o", str(tmp_path / f"out{i}.npz"), "--json"]
        procs.append(subprocess.Popen(cmd, env=env_for(cache_dir), cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 240
    while not all((tmp_path / f"ready{i}").exists() for i in range(8)):
        assert time.time() < deadline, "the processes did not get ready"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.01)
    go.write_text("go")
    results = [p.communicate(timeout=300) for p in procs]
    outcomes = []
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
        assert "warning" not in err, err
        outcomes.append(json.loads(out)["cache"]["outcome"])
    assert sorted(outcomes) == ["hit"] * 7 + ["miss"]
    for i in range(8):
        check_outputs(tmp_path / f"out{i}.npz", RESNET)
    stats, entries = counters(cache_dir)
    assert stats["misses"] == 1 and stats["hits"] == 7 and stats["corruptions"] == 0
    assert len(entries) == 1 and entries[0].hits == 7
    with Cache.open(cache_dir) as c:
        assert verify(c).ok


def test_sigkill_at_random_points_leaves_a_usable_cache(tmp_path):
    cache_dir = tmp_path / "cache"
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **feeds_for(RESNET))
    cmd = nncc_cmd("run", RESNET, "--inputs", feeds, "--json")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env_for(cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=300)
    measured = time.perf_counter() - t0
    assert done.returncode == 0 and json.loads(done.stdout)["cache"]["outcome"] == "miss"
    rng = random.Random(20240601)
    killed = completed = 0
    for _ in range(20):
        with Cache.open(cache_dir) as c:  # make each attempt a miss that writes an entry
            for entry in c.index.entries():
                assert c.remove(entry.token, blocking=True)
        proc = subprocess.Popen(cmd, env=env_for(cache_dir), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, measured))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        killed += proc.returncode == -signal.SIGKILL
        completed += proc.returncode == 0
        with Cache.open(cache_dir) as c:
            # never anything that would be used and is wrong: only unreferenced debris
            bad = [f for f in verify(c).findings if f.status in ("CORRUPT", "MISSING", "STALE")]
            assert bad == [], [f.as_dict() for f in bad]
    assert killed + completed == 20 and killed >= 1
    fix = subprocess.run(nncc_cmd("cache", "verify", "--fix"), env=env_for(cache_dir), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    clean = subprocess.run(nncc_cmd("cache", "verify", "--json"), env=env_for(cache_dir), cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0 and set(json.loads(clean.stdout)["counts"]) <= {"OK"}
    out = tmp_path / "after.npz"
    final = subprocess.run(cmd + ["-o", str(out)], env=env_for(cache_dir), cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert final.returncode == 0 and "warning" not in final.stderr
    assert json.loads(final.stdout)["cache"]["outcome"] in ("hit", "miss")
    check_outputs(out, RESNET)


# Dies by SIGKILL at one precise step of the write protocol.
STEP_DRIVER = textwrap.dedent("""
    import os, signal, sys
    step, model, cache_dir = sys.argv[1:4]
    import nncc.cache.index as index_mod
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace, real_fsync, real_insert = os.replace, os.fsync, index_mod.Index.insert
    renames = []
    def entry_file(path):  # kernel objects are written first, into objects/: not these steps
        return os.sep + "entries" + os.sep in str(path)
    def replace(src, dst):
        if not entry_file(dst):
            return real_replace(src, dst)
        if step == "before-plan-rename":
            die()
        real_replace(src, dst)
        renames.append(dst)
        if step == "after-plan-rename" and len(renames) == 1:
            die()
        if step == "after-data-rename" and len(renames) == 2:
            die()
    def fsync(fd):
        if step == "mid-temp-write" and entry_file(os.readlink(f"/proc/self/fd/{fd}")):
            die()
        real_fsync(fd)
    def insert(self, *a, **k):
        if step == "before-commit":
            die()
        real_insert(self, *a, **k)
        if step == "after-commit":
            die()
    os.replace, os.fsync, index_mod.Index.insert = replace, fsync, insert
    from nncc.model import prepare
    prepare(model, cache_dir=cache_dir)
""")

STEPS = ["mid-temp-write", "before-plan-rename", "after-plan-rename", "after-data-rename", "before-commit",
         "after-commit"]


@pytest.mark.parametrize("step", STEPS)
def test_sigkill_at_each_write_step(step, tmp_path):
    cache_dir = tmp_path / "cache"
    # another, complete entry must survive whatever happens
    subprocess.run(nncc_cmd("run", MLP, "--random-inputs"), env=env_for(cache_dir), cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    proc = subprocess.run([sys.executable, "-c", STEP_DRIVER, step, str(RESNET), str(cache_dir)],
                          env=env_for(cache_dir), cwd=ROOT, capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with Cache.open(cache_dir) as c:
        findings = verify(c).findings
    statuses = {f.status for f in findings}
    assert statuses <= {"OK", "ORPHAN", "LEFTOVER"}, [f.as_dict() for f in findings]
    ok = [f for f in findings if f.status == "OK"]
    assert len(ok) == (2 if step == "after-commit" else 1)
    if step in ("mid-temp-write", "before-plan-rename"):
        assert "LEFTOVER" in statuses
    if step in ("after-plan-rename", "after-data-rename", "before-commit"):
        assert "ORPHAN" in statuses
    # the next run: correct outputs, the debris is overwritten or left for gc
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **feeds_for(RESNET))
    out = tmp_path / "out.npz"
    run = subprocess.run(nncc_cmd("run", RESNET, "--inputs", feeds, "-o", out, "--json"), env=env_for(cache_dir),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "warning" not in run.stderr
    assert json.loads(run.stdout)["cache"]["outcome"] == ("hit" if step == "after-commit" else "miss")
    check_outputs(out, RESNET)
    fix = subprocess.run(nncc_cmd("cache", "verify", "--fix"), env=env_for(cache_dir), cwd=ROOT,
                         capture_output=True, timeout=120)
    assert fix.returncode == 0
    with Cache.open(cache_dir) as c:
        assert {f.status for f in verify(c).findings} == {"OK"}
        assert len(c.index.entries()) == 2


GC_LOOP = textwrap.dedent("""
    import os, sys, time
    cache_dir, stop = sys.argv[1:3]
    from nncc.cache.store import Cache
    from nncc.cache.gc import collect
    from nncc.cache.verify import verify
    rounds = removed = 0
    while not os.path.exists(stop):
        with Cache.open(cache_dir) as c:
            removed += len(collect(c, max_size=0).removed)
            if rounds % 5 == 0:
                verify(c, fix=True)
        rounds += 1
    print(rounds, removed)
""")


def test_gc_beside_runs_never_breaks_them(tmp_path):
    cache_dir = tmp_path / "cache"
    stop = tmp_path / "stop"
    with Cache.open(cache_dir):
        pass
    gc = subprocess.Popen([sys.executable, "-c", GC_LOOP, str(cache_dir), str(stop)], env=env_for(cache_dir),
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        outcomes = []
        for i in range(8):
            model = RESNET if i % 2 else MLP
            feeds = tmp_path / f"feeds-{model.stem}.npz"
            np.savez(feeds, **feeds_for(model))
            out = tmp_path / f"out{i}.npz"
            run = subprocess.run(nncc_cmd("run", model, "--inputs", feeds, "-o", out, "--json"),
                                 env=env_for(cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, run.stderr
            assert "warning" not in run.stderr, run.stderr
            outcomes.append(json.loads(run.stdout)["cache"]["outcome"])
            check_outputs(out, model)
    finally:
        stop.write_text("stop")
        gc_out, gc_err = gc.communicate(timeout=120)
    assert gc.returncode == 0, gc_err
    rounds, removed = map(int, gc_out.split())
    assert rounds > 8 and removed >= 1  # gc really ran, and really removed entries
    assert set(outcomes) <= {"hit", "miss"}


IN_PROCESS_RUNNER = textwrap.dedent("""
    import sys, numpy as np
    from nncc.model import prepare
    model_path, cache_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    feeds = dict(np.load(sys.argv[4]))
    want = dict(np.load(sys.argv[5]))
    seen = set()
    for _ in range(n):
        model, outcome = prepare(model_path, cache_dir=cache_dir)
        seen.add(outcome.outcome)
        got = model.run(feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-4)
    print(" ".join(sorted(seen)))
""")


def test_many_prepares_beside_gc(tmp_path):
    """Tighter interleaving than whole processes: 60 prepares in a loop against a gc loop."""
    cache_dir = tmp_path / "cache"
    stop = tmp_path / "stop"
    feeds, want = tmp_path / "feeds.npz", tmp_path / "want.npz"
    np.savez(feeds, **feeds_for(MLP))
    np.savez(want, **reference(MLP))
    with Cache.open(cache_dir):
        pass
    gc = subprocess.Popen([sys.executable, "-c", GC_LOOP, str(cache_dir), str(stop)], env=env_for(cache_dir),
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run = subprocess.run([sys.executable, "-c", IN_PROCESS_RUNNER, str(MLP), str(cache_dir), "60", str(feeds),
                              str(want)], env=env_for(cache_dir), cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    finally:
        stop.write_text("stop")
        gc.communicate(timeout=120)
    assert run.returncode == 0, run.stderr
    assert "warning" not in run.stderr, run.stderr
    assert set(run.stdout.split()) <= {"hit", "miss"}
