"""Signals: SIGINT and SIGTERM end nncc in order (temp files and half-written cache entries
removed, exit 130 / 143, the terminal restored); a SIGKILLed process leaves debris that
`cache verify` reports without failing and `cache gc` removes.

The signal arrives at a chosen step of the real program: a small driver runs `nncc` in a
child process and sends the signal to itself from inside os.replace, right after the entry's
plan file was renamed into place (the moment an interrupted compile used to leave an
orphan .plan), or just before the artifact's rename.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nncc.cache.store import Cache
from tests.conftest import ROOT
from tests.test_cache import MLP, RESNET

# A process started in the background of a non-interactive shell inherits SIGINT ignored,
# and Python keeps it so: the driver takes Ctrl-C's handler back, as a process a terminal
# starts in the foreground has it, whatever started the test run.
DRIVER = textwrap.dedent("""
    import os, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signame, when, *argv = sys.argv[1:]
    real_replace = os.replace
    def replace(src, dst, *a, **k):
        dst_name = os.fspath(dst)
        if when == "before-artifact-rename" and dst_name.endswith(".nncc"):
            os.kill(os.getpid(), getattr(signal, signame))
        real_replace(src, dst, *a, **k)
        if when == "after-plan-rename" and dst_name.endswith(".plan"):
            os.kill(os.getpid(), getattr(signal, signame))
    os.replace = replace
    import nncc.cache.index as index_mod
    real_insert = index_mod.Index.insert
    def insert(self, *a, **k):
        real_insert(self, *a, **k)
        if when == "after-commit":
            os.kill(os.getpid(), getattr(signal, signame))
    index_mod.Index.insert = insert
    sys.argv = ["nncc", *argv]
    from nncc.cli.main import program
    program()
""")


def env_for(cache_dir) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(cache_dir))
    env.pop("NNCC_DEBUG", None)
    return env


def drive(signame, when, *args, cache_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DRIVER, signame, when, *map(str, args)], env=env_for(cache_dir),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def nncc(*args, cache_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], env=env_for(cache_dir), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def entry_names(cache_dir) -> list[str]:
    return sorted(p.name for p in (cache_dir / "entries").rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("signame, code", [("SIGINT", 130), ("SIGTERM", 143)])
@pytest.mark.parametrize("command", ["compile", "run"])
def test_an_interrupted_compile_leaves_no_half_entry(tmp_path, signame, code, command):
    cache_dir = tmp_path / "cache"
    args = (["compile", RESNET, "-o", tmp_path / "r.nncc"] if command == "compile"
            else ["run", RESNET, "--random-inputs"])
    result = drive(signame, "after-plan-rename", *args, cache_dir=cache_dir)
    assert result.returncode == code, result.stderr
    assert result.stderr.splitlines()[-1] == ("nncc: interrupted" if code == 130 else "nncc: terminated")
    assert "Traceback" not in result.stderr
    assert entry_names(cache_dir) == []  # neither the renamed .plan nor a temp file
    verify = nncc("cache", "verify", "--json", cache_dir=cache_dir)
    assert verify.returncode == 0 and json.loads(verify.stdout)["counts"] == {}, verify.stdout
    assert not (tmp_path / "r.nncc").exists()


# each signal takes the same path out: the quick tier sends one of them, the full run both
@pytest.mark.slow
@pytest.mark.parametrize("signame, code", [("SIGINT", 130), pytest.param("SIGTERM", 143, marks=pytest.mark.slow)])
def test_an_interrupt_just_after_the_commit_keeps_the_complete_entry(tmp_path, signame, code):
    """The row is committed: the files it names must stay (not a MISSING entry)."""
    cache_dir = tmp_path / "cache"
    result = drive(signame, "after-commit", "run", MLP, "--random-inputs", cache_dir=cache_dir)
    assert result.returncode == code, result.stderr
    verify = nncc("cache", "verify", "--json", cache_dir=cache_dir)
    assert verify.returncode == 0 and json.loads(verify.stdout)["counts"] == {"OK": 1}, verify.stdout
    hit = nncc("run", MLP, "--random-inputs", "--json", cache_dir=cache_dir)
    assert json.loads(hit.stdout)["cache"]["outcome"] == "hit" and "warning" not in hit.stderr


@pytest.mark.slow
@pytest.mark.parametrize("signame, code", [pytest.param("SIGINT", 130, marks=pytest.mark.slow), ("SIGTERM", 143)])
def test_an_interrupted_artifact_write_leaves_the_old_artifact_and_no_temp(tmp_path, signame, code):
    cache_dir = tmp_path / "cache"
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.nncc").write_bytes(b"the previous artifact")
    result = drive(signame, "before-artifact-rename", "compile", MLP, "-o", out / "m.nncc", "--force",
                   cache_dir=cache_dir)
    assert result.returncode == code, result.stderr
    assert sorted(os.listdir(out)) == ["m.nncc"]  # no .nncc-*.tmp left behind
    assert (out / "m.nncc").read_bytes() == b"the previous artifact"


@pytest.mark.slow  # killed processes, then verify and gc in processes of their own
def test_sigkill_debris_is_reported_by_verify_and_removed_by_gc(tmp_path):
    cache_dir = tmp_path / "cache"
    assert nncc("run", MLP, "--random-inputs", cache_dir=cache_dir).returncode == 0
    result = drive("SIGKILL", "after-plan-rename", "run", RESNET, "--random-inputs", cache_dir=cache_dir)
    assert result.returncode == -signal.SIGKILL
    with Cache.open(cache_dir) as c:
        tokens = {e.token for e in c.index.entries()}
    debris = [name for name in entry_names(cache_dir) if name[:64] not in tokens]
    assert len(debris) == 1 and debris[0].endswith(".plan")
    verify = nncc("cache", "verify", cache_dir=cache_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "ORPHAN" in verify.stdout and "debris" in verify.stdout and "`nncc cache gc` removes it" in verify.stdout
    report = json.loads(nncc("cache", "verify", "--json", cache_dir=cache_dir).stdout)
    assert report["ok"] and report["counts"] == {"OK": 1, "ORPHAN": 1}
    gc = nncc("cache", "gc", "--json", cache_dir=cache_dir)
    assert gc.returncode == 0 and [r["reason"] for r in json.loads(gc.stdout)["removed"]] == ["orphan"]
    assert [name[:64] for name in entry_names(cache_dir)] == sorted(tokens) * 2
    assert json.loads(nncc("cache", "verify", "--json", cache_dir=cache_dir).stdout)["counts"] == {"OK": 1}


SHOW_CURSOR = b"\x1b[?25h"
HIDE_CURSOR = b"\x1b[?25l"


def read_until(fd: int, want: bytes, seen: bytearray) -> bool:
    """Read the pty into ``seen`` until ``want`` appears (True) or the child closes it."""
    while want not in seen:
        ready, _, _ = select.select([fd], [], [], 120)
        if not ready:
            return False  # a hang guard only: the assertion that follows says what is missing
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        if not chunk:
            return False
        seen += chunk
    return True


@pytest.mark.slow
def test_sigterm_during_bench_gives_the_cursor_back(tmp_path):
    """At a terminal, `nncc bench` shows a rich progress bar, which hides the cursor.
    SIGTERM in the middle of it must still show the cursor again before nncc exits."""
    env = env_for(tmp_path / "cache") | {"NNCC_PROGRESS_DELAY": "0", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    pid, fd = pty.fork()
    if pid == 0:  # the child: nncc at a terminal
        try:
            os.chdir(ROOT)
            os.execve(sys.executable, [sys.executable, "-m", "nncc", "bench", str(MLP), "--iterations",
                                       "100000000"], env)
        finally:
            os._exit(127)
    seen = bytearray()
    try:
        assert read_until(fd, HIDE_CURSOR, seen), bytes(seen)[-2000:]
        os.kill(pid, signal.SIGTERM)
        read_until(fd, b"\0never\0", seen)  # everything until the child closes the terminal
    finally:
        for _ in range(600):  # the child is exiting; a hang guard, not a speed check
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:  # still running long after the terminal went quiet: do not hang the suite
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        os.close(fd)
    tail = bytes(seen[seen.rindex(HIDE_CURSOR):])
    assert SHOW_CURSOR in tail, tail[-500:]
    assert os.waitstatus_to_exitcode(status) == 143
    assert b"nncc: terminated" in tail
