"""A cache on a full disk: runs still work (hits served read-only, misses compiled in memory),
ls/info read it, and the commands that remove things free the space.

The disk is real: a small tmpfs filled to the last block. Mounting one needs root (this
suite runs as root in its VM); elsewhere these tests skip, saying why.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from nncc.cache.index import Index, IndexUnavailable
from nncc.model import prepare
from nncc.cache.store import Cache, no_space_left
from tests.conftest import ROOT
from tests.test_cache import MLP, RESNET, assert_correct, check_outputs, feeds_for, warnings_in

DISK_BYTES = 8 << 20


@contextlib.contextmanager
def small_disk(folder: pathlib.Path):
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(folder)], check=True)  # a mapping still open


def fill(disk: pathlib.Path) -> pathlib.Path:
    """Take every free block of ``disk``; returns the file that holds them."""
    junk = disk / "junk"
    with open(junk, "ab", buffering=0) as f:  # unbuffered: close() has nothing left to flush
        chunk = b"\0" * 4096
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    assert no_space_left(str(disk))
    return junk


@pytest.fixture
def full_cache(tmp_path, capsys):
    """A cache holding mlp and resnet_block, on a disk with no free block left."""
    with small_disk(tmp_path / "disk") as disk:
        cache = disk / "cache"
        for model in (MLP, RESNET):
            assert prepare(model, cache_dir=cache)[1].outcome == "miss"
        capsys.readouterr()
        junk = fill(disk)
        yield cache, junk


def nncc(*args, cache: pathlib.Path, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NNCC_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd)


def save_feeds(model: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    path = folder / f"{model.stem}-feeds.npz"
    np.savez(path, **feeds_for(model))
    return path


def tokens(cache: pathlib.Path) -> set[str]:
    with Cache.open(cache, read_only_ok=True) as c:
        return {e.token for e in c.index.entries()}


@pytest.mark.slow
def test_run_on_a_full_disk_serves_hits_and_compiles_misses_in_memory(full_cache, tmp_path):
    cache, _ = full_cache
    out = tmp_path / "out.npz"
    hit = nncc("run", MLP, "--inputs", save_feeds(MLP, tmp_path), "-o", out, "--json", cache=cache, cwd=tmp_path)
    assert hit.returncode == 0, hit.stderr
    assert json.loads(hit.stdout)["cache"]["outcome"] == "hit" and not warnings_in(hit.stderr)
    check_outputs(out, MLP)

    # another optimization level: another token, so nothing in the cache serves it
    miss = nncc("run", MLP, "-O", "1", "--inputs", save_feeds(MLP, tmp_path), "-o", out, "--json", cache=cache,
                cwd=tmp_path)
    assert miss.returncode == 0, miss.stderr
    report = json.loads(miss.stdout)["cache"]
    assert report["outcome"] == "unavailable" and "disk full" in report["detail"]
    assert len(warnings_in(miss.stderr)) == 1
    check_outputs(out, MLP)
    assert len(tokens(cache)) == 2  # nothing was stored


@pytest.mark.slow
def test_ls_and_info_read_a_cache_on_a_full_disk(full_cache, tmp_path):
    cache, _ = full_cache
    listed = nncc("cache", "ls", "--json", cache=cache, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["entries"]) == 2
    info = nncc("cache", "info", "--json", cache=cache, cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    report = json.loads(info.stdout)
    assert report["disk_full"] is True and report["read_only"] is True and report["entries"] == 2
    text = nncc("cache", "info", cache=cache, cwd=tmp_path)
    assert "Disk full" in text.stdout


@pytest.mark.slow
def test_gc_frees_space_on_a_full_disk_and_the_cache_works_again(full_cache, tmp_path):
    cache, junk = full_cache
    before = tokens(cache)
    with Cache.open(cache, read_only_ok=True) as c:  # the newest entry and the kernel objects it needs fit
        newest = max(c.index.entries(), key=lambda e: e.last_used)
        needed = set(c.index.entry_objects(newest.token))
        bound = newest.size + sum(o["size"] for o in c.index.objects() if o["key"] in needed)
    gc = nncc("cache", "gc", "--max-size", bound, "--json", cache=cache, cwd=tmp_path)  # one of the two fits
    assert gc.returncode == 0, gc.stderr
    report = json.loads(gc.stdout)
    evicted = {r["token"] for r in report["removed"] if r["reason"] == "size"}
    assert len(evicted) == 1 and report["freed_bytes"] > 0
    assert not no_space_left(str(cache))
    for path in (p for r in report["removed"] for p in r["paths"]):
        assert not os.path.exists(path)
    assert tokens(cache) == before - evicted  # rows and files went together

    [gone] = [pathlib.Path(r["source"]) for r in report["removed"] if r["reason"] == "size"]
    assert gone == MLP  # the least recently used

    junk.unlink()
    verified = nncc("cache", "verify", "--json", cache=cache, cwd=tmp_path)
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout
    for expected in ("miss", "hit"):  # the index is writable again: store, then serve
        model, outcome = prepare(MLP, cache_dir=cache)
        assert outcome.outcome == expected
        assert_correct(model, MLP)


@pytest.mark.slow
def test_rm_and_clear_work_on_a_full_disk(full_cache, tmp_path):
    cache, _ = full_cache
    first, second = sorted(tokens(cache))
    rm = nncc("cache", "rm", first[:10], cache=cache, cwd=tmp_path)
    assert rm.returncode == 0, rm.stderr
    assert tokens(cache) == {second}
    fill(cache.parent)  # full again
    objects = len(list((cache / "objects").rglob("*.o")))
    clear = nncc("cache", "clear", "--json", cache=cache, cwd=tmp_path)
    assert clear.returncode == 0, clear.stderr
    # the entry, and every kernel object (none is needed any more)
    assert json.loads(clear.stdout)["removed"] == 1 + objects
    assert not any((cache / "objects").rglob("*.o"))
    assert tokens(cache) == set()
    assert not any((cache / "entries").rglob("*.plan")) and not any((cache / "entries").rglob("*.data"))


@pytest.mark.slow
def test_reclaiming_holds_the_index_exclusively(full_cache):
    """While files go before their rows, no other process may look an entry up."""
    cache, _ = full_cache
    with Cache.open(cache, reclaim=True) as c:
        assert c.reclaiming and c.disk_full
        c.index.entries()  # the exclusive lock is taken by the first access
        other = Index(str(cache), c.index.version, c.index.format_version, timeout=0.1)
        with pytest.raises(IndexUnavailable, match="locked"):
            other.open().get("0" * 64)
        other.close()


def test_rows_left_behind_on_a_still_full_disk_are_reported(full_cache, monkeypatch, capsys):
    cache, _ = full_cache
    with Cache.open(cache, reclaim=True) as c:
        token = sorted(e.token for e in c.index.entries())[0]

        def still_full(*args, **kwargs):
            raise IndexUnavailable("database or disk is full")

        monkeypatch.setattr(c.index, "delete", still_full)
        assert c.remove(token)
        assert not any(os.path.exists(p) for p in c.paths(token))  # the files went first
    err = capsys.readouterr().err
    assert "still full" in err and "verify --fix" in err
    assert token in tokens(cache)
    fixed = subprocess.run([sys.executable, "-m", "nncc", "cache", "verify", "--fix", "--json"], capture_output=True,
                           text=True, env=dict(os.environ, NNCC_CACHE_DIR=str(cache)), cwd=ROOT)
    assert json.loads(fixed.stdout)["counts"].get("MISSING") == 1
    assert token not in tokens(cache)


def test_a_removal_that_cannot_write_the_index_still_frees_the_files(tmp_path, monkeypatch, capsys):
    """An index opened before the disk filled up (no reclaim mode): deleting the row fails
    for want of room, so the files go first and the row is retried, and reported at close."""
    cache = tmp_path / "cache"
    assert prepare(MLP, cache_dir=cache)[1].outcome == "miss"
    with Cache.open(cache) as c:
        assert not c.reclaiming
        [token] = [e.token for e in c.index.entries()]

        def full(*args, **kwargs):
            raise IndexUnavailable("database or disk is full")

        monkeypatch.setattr(c.index, "delete", full)
        assert c.remove(token)
        assert not any(os.path.exists(p) for p in c.paths(token))
    assert "still full" in capsys.readouterr().err
    assert tokens(cache) == {token}  # the row waits for `verify --fix`
    with Cache.open(cache) as c:  # room again: the entry is MISSING, and --fix drops it
        from nncc.cache.verify import verify

        report = verify(c, fix=True)
        assert report.counts() == {"MISSING": 1}
    assert tokens(cache) == set()
