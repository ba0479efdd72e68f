"""The trust anchor is private: a cache folder (or its index, entries/, locks/) that group or
others can write, or that another user owns, is neither written nor served from unless
trusting it is asked for; `nncc run` then compiles in memory with one warning. The index
is created 0600 and never opened through a symlink. Real processes, real folders; "another
user" is uid 65534 (nobody), which only root can give a folder to.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

from nncc.cache.store import Cache
from tests.conftest import ROOT
from tests.test_cache import MLP, check_outputs, feeds_for

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user (chown) needs root")


def nncc(*args, cache_dir, env=None, umask=None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(cache_dir), **(env or {}))
    full_env.pop("NNCC_DEBUG", None)
    if not env or "NNCC_CACHE_TRUST_SHARED" not in env:
        full_env.pop("NNCC_CACHE_TRUST_SHARED", None)
    result = subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], env=full_env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def filled(cache_dir: pathlib.Path) -> None:
    result = nncc("run", MLP, "--random-inputs", cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr


def files(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith("index.sqlite3")}


def run_untrusted(cache_dir, tmp_path, *fragments, trust_hint=True):
    """`nncc run` on an untrusted cache: exit 0, correct outputs, compiled in memory with
    exactly one warning naming the path and how to fix or trust it; nothing written."""
    before = files(cache_dir)
    feeds = tmp_path / "feeds.npz"
    import numpy as np

    np.savez(feeds, **feeds_for(MLP))
    out = tmp_path / "out.npz"
    result = nncc("run", MLP, "--inputs", feeds, "-o", out, "--json", cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["cache"]["outcome"] == "unavailable"
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, result.stderr
    for fragment in (("NNCC_CACHE_TRUST_SHARED=1",) if trust_hint else ()) + fragments:
        assert fragment in warnings[0], (fragment, warnings[0])
    check_outputs(out, MLP)
    assert files(cache_dir) == before


@pytest.mark.slow
def test_a_cache_folder_others_can_write_is_not_used(tmp_path):
    cache_dir = tmp_path / "cache"
    filled(cache_dir)
    cache_dir.chmod(0o777)
    run_untrusted(cache_dir, tmp_path, str(cache_dir), "mode 0777", "chmod go-w")
    for command in (("ls",), ("info",), ("verify",), ("gc",), ("clear",)):
        result = nncc("cache", *command, cache_dir=cache_dir)
        assert result.returncode == 2 and "writable by group or others" in result.stderr, (command, result.stderr)
    # trusted explicitly: served as before
    trusted = nncc("run", MLP, "--random-inputs", "--json", cache_dir=cache_dir,
                   env={"NNCC_CACHE_TRUST_SHARED": "1"})
    assert trusted.returncode == 0 and json.loads(trusted.stdout)["cache"]["outcome"] == "hit", trusted.stderr
    flag = nncc("run", MLP, "--random-inputs", "--json", "--trust-shared-cache", cache_dir=cache_dir)
    assert json.loads(flag.stdout)["cache"]["outcome"] == "hit", flag.stderr
    listed = nncc("cache", "ls", "--json", "--trust-shared-cache", cache_dir=cache_dir)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["entries"]) == 1
    # made private again: used without any setting
    cache_dir.chmod(0o700)
    again = nncc("run", MLP, "--random-inputs", "--json", cache_dir=cache_dir)
    assert json.loads(again.stdout)["cache"]["outcome"] == "hit" and "warning" not in again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("part", ["index.sqlite3", "entries", "locks"])
def test_group_writable_parts_are_not_used(tmp_path, part):
    cache_dir = tmp_path / "cache"
    filled(cache_dir)
    (cache_dir / part).chmod(0o664 if part.endswith("sqlite3") else 0o770)
    run_untrusted(cache_dir, tmp_path, str(cache_dir / part), "writable by group or others")


@pytest.mark.slow
@needs_root
@pytest.mark.parametrize("part", ["", "index.sqlite3", "entries", "locks"])
def test_a_cache_owned_by_another_user_is_not_used(tmp_path, part):
    cache_dir = tmp_path / "cache"
    filled(cache_dir)
    os.chown(cache_dir / part if part else cache_dir, NOBODY, -1)
    run_untrusted(cache_dir, tmp_path, str(cache_dir / part if part else cache_dir), "owned by another user")
    result = nncc("cache", "clear", cache_dir=cache_dir)
    assert result.returncode == 2 and "owned by another user" in result.stderr
    trusted = nncc("run", MLP, "--random-inputs", "--json", cache_dir=cache_dir,
                   env={"NNCC_CACHE_TRUST_SHARED": "1"})
    assert json.loads(trusted.stdout)["cache"]["outcome"] == "hit", trusted.stderr


@needs_root
def test_nothing_is_written_into_another_users_empty_folder(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chown(folder, NOBODY, -1)
    run_untrusted(folder, tmp_path, str(folder), "owned by another user")
    assert list(folder.iterdir()) == []


@pytest.mark.slow
def test_an_empty_folder_of_ones_own_is_made_private(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    folder.chmod(0o777)
    filled(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for sub in ("entries", "locks"):
        assert stat.S_IMODE((folder / sub).stat().st_mode) == 0o700


def test_an_empty_folder_meant_to_be_shared_keeps_its_mode(tmp_path):
    folder = tmp_path / "team"
    folder.mkdir()
    folder.chmod(0o770)
    result = nncc("run", MLP, "--random-inputs", "--json", cache_dir=folder, env={"NNCC_CACHE_TRUST_SHARED": "1"})
    assert json.loads(result.stdout)["cache"]["outcome"] == "miss", result.stderr
    assert stat.S_IMODE(folder.stat().st_mode) == 0o770


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_the_index_is_created_private_whatever_the_umask(tmp_path, umask):
    cache_dir = tmp_path / "cache"
    result = nncc("run", MLP, "--random-inputs", cache_dir=cache_dir, umask=umask)
    assert result.returncode == 0, result.stderr
    for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm"):
        path = cache_dir / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700


@pytest.mark.slow
def test_a_symlinked_index_is_refused(tmp_path):
    cache_dir = tmp_path / "cache"
    filled(cache_dir)
    for suffix in ("", "-wal", "-shm"):
        p = cache_dir / ("index.sqlite3" + suffix)
        if p.exists():
            p.unlink()
    target = tmp_path / "elsewhere.db"
    (cache_dir / "index.sqlite3").symlink_to(target)
    run_untrusted(cache_dir, tmp_path, "symbolic link", trust_hint=False)
    assert not target.exists()  # SQLite never wrote through the link
    for command in (("ls",), ("verify", "--fix"), ("clear",)):
        result = nncc("cache", *command, cache_dir=cache_dir)
        assert result.returncode == 2 and "symbolic link" in result.stderr, (command, result.stderr)
    assert not target.exists()
    with pytest.raises(Exception, match="symbolic link"):
        Cache.open(cache_dir)
