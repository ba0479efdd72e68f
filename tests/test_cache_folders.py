"""nncc manages only folders that are its own, deletes only names it writes, never through
a symlink, heals what it can and says what it could not, and creates no cache from a
command that only reads. Real `nncc` processes on real folders.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from nncc.cache.store import Cache
from tests.conftest import ROOT
from tests.test_cache import MLP

CACHE_COMMANDS = [("clear",), ("gc",), ("verify", "--fix"), ("verify",), ("ls",), ("info",), ("rm", "ab")]


def nncc(*args, cache_dir=None, env=None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    full_env.pop("NNCC_DEBUG", None)
    full_env.pop("NNCC_CACHE_TRUST_SHARED", None)
    if cache_dir is not None:
        full_env["NNCC_CACHE_DIR"] = str(cache_dir)
    result = subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], env=full_env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def tree(folder: pathlib.Path) -> dict[str, bytes | None]:
    """Every path below ``folder``: file contents, None for folders and links."""
    out = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def filled(cache_dir: pathlib.Path) -> str:
    """A real cache with one entry; returns its token."""
    result = nncc("run", MLP, "--random-inputs", cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr
    with Cache.open(cache_dir) as c:
        [entry] = c.index.entries()
    return entry.token


# -- a folder that is not nncc's -------------------------------------------------------------


@pytest.fixture
def users_folder(tmp_path) -> pathlib.Path:
    v = tmp_path / "v"
    (v / "entries" / "ab").mkdir(parents=True)
    (v / "locks").mkdir()
    (v / "entries" / "ab" / "thesis.tex").write_text("chapter 1")
    (v / "entries" / "notes.txt").write_text("notes")
    (v / "locks" / "x.lock").write_text("mine")
    return v


@pytest.mark.slow
@pytest.mark.parametrize("command", CACHE_COMMANDS, ids=" ".join)
def test_a_foreign_folder_is_refused_and_left_alone(users_folder, command):
    before = tree(users_folder)
    result = nncc("cache", *command, "--cache-dir", users_folder)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("nncc: error: ") and "not an nncc cache" in line and str(users_folder) in line
    assert tree(users_folder) == before  # nothing removed, no CACHEDIR.TAG, no index


def test_run_with_a_foreign_folder_compiles_in_memory(users_folder):
    before = tree(users_folder)
    result = nncc("run", MLP, "--random-inputs", "--cache-dir", users_folder)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "not an nncc cache" in warnings[0]
    assert tree(users_folder) == before


@pytest.mark.slow
def test_an_empty_folder_becomes_a_cache(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    filled(empty)
    assert (empty / "CACHEDIR.TAG").read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55")
    assert nncc("cache", "verify", "--cache-dir", empty).returncode == 0


# -- read-only commands create nothing --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("command", [("ls",), ("info",), ("ls", "--json"), ("info", "--json"), ("verify",),
                                     ("gc",), ("clear",)], ids=" ".join)
def test_no_cache_command_creates_a_cache(tmp_path, command):
    typo = tmp_path / "typo"
    result = nncc("cache", *command, "--cache-dir", typo)
    assert result.returncode == 0, result.stderr
    assert not typo.exists()
    if command == ("ls", "--json"):
        assert json.loads(result.stdout) == {"directory": str(typo), "entries": []}
    if command == ("info", "--json"):
        info = json.loads(result.stdout)
        assert info["exists"] is False and info["entries"] == 0
    if command in (("ls",), ("info",)):
        assert "no cache" in (result.stdout + result.stderr).lower() or "exists           no" in result.stdout.lower()


# -- inside a real cache: only nncc's names, never through a symlink --------------------------


@pytest.mark.slow
def test_clear_gc_and_fix_remove_only_nncc_names(tmp_path):
    cache_dir = tmp_path / "cache"
    filled(cache_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / ("a" * 64 + ".plan")  # a name nncc would write, in someone's folder
    precious.write_text("precious")
    (outside / ("." + "a" * 64 + ".data.1-0123abcd.tmp")).write_text("also precious")
    (cache_dir / "entries" / "aa").symlink_to(outside, target_is_directory=True)  # a shard made a link
    (cache_dir / "entries" / "notes.txt").write_text("notes")
    (cache_dir / "entries" / "zz").mkdir()
    (cache_dir / "entries" / "zz" / "thesis.tex").write_text("chapter 1")
    (cache_dir / "locks" / "x.lock").write_text("mine")
    (cache_dir / "README").write_text("about my cache")
    kept = {p: p.read_bytes() for p in [precious, *outside.iterdir(), cache_dir / "entries" / "notes.txt",
                                        cache_dir / "entries" / "zz" / "thesis.tex", cache_dir / "locks" / "x.lock",
                                        cache_dir / "README"]}

    verify = nncc("cache", "verify", "--json", cache_dir=cache_dir)
    report = json.loads(verify.stdout)
    assert verify.returncode == 0 and report["counts"] == {"OK": 1, "FOREIGN": 3}, report
    for command in (("verify", "--fix"), ("gc",), ("clear",)):
        result = nncc("cache", *command, cache_dir=cache_dir)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        assert "[removed]" not in result.stdout
    assert {p: p.read_bytes() for p in kept} == kept
    assert (cache_dir / "entries" / "aa").is_symlink()
    with Cache.open(cache_dir) as c:
        assert c.index.entries() == []


@pytest.mark.slow
def test_a_symlinked_entries_folder_is_refused(tmp_path):
    cache_dir = tmp_path / "cache"
    filled(cache_dir)
    outside = tmp_path / "outside"
    (cache_dir / "entries").rename(outside)  # the entry files now live outside, reached by a link
    (cache_dir / "entries").symlink_to(outside, target_is_directory=True)
    before = tree(outside)
    for command in (("clear",), ("gc", "--max-size", "0"), ("verify", "--fix")):
        result = nncc("cache", *command, cache_dir=cache_dir)
        assert result.returncode == 2 and "symbolic link" in result.stderr, result.stderr
    run = nncc("run", MLP, "--random-inputs", cache_dir=cache_dir)
    assert run.returncode == 0 and "symbolic link" in run.stderr
    assert tree(outside) == before


# -- an entry file replaced by a directory ----------------------------------------------------


@pytest.mark.slow
def test_an_entry_replaced_by_an_empty_directory_is_healed(tmp_path):
    cache_dir = tmp_path / "cache"
    token = filled(cache_dir)
    plan = cache_dir / "entries" / token[:2] / f"{token}.plan"
    plan.unlink()
    plan.mkdir()
    first = nncc("run", MLP, "--random-inputs", "--json", cache_dir=cache_dir)
    assert first.returncode == 0 and "rejected" in first.stderr
    assert json.loads(first.stdout)["cache"]["outcome"] == "recompiled"
    second = nncc("run", MLP, "--random-inputs", "--json", cache_dir=cache_dir)
    assert second.returncode == 0 and "warning" not in second.stderr  # healed: no warning again
    assert json.loads(second.stdout)["cache"]["outcome"] == "hit"
    assert plan.is_file()


@pytest.mark.slow
@pytest.mark.parametrize("command", [("verify", "--fix"), ("gc", "--max-size", "0"), ("clear",)], ids=" ".join)
def test_fix_gc_and_clear_remove_an_empty_directory_entry(tmp_path, command):
    cache_dir = tmp_path / "cache"
    token = filled(cache_dir)
    data = cache_dir / "entries" / token[:2] / f"{token}.data"
    data.unlink()
    data.mkdir()
    result = nncc("cache", *command, cache_dir=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not data.exists()
    assert nncc("cache", "verify", cache_dir=cache_dir).returncode == 0


@pytest.mark.slow
def test_a_directory_that_cannot_go_is_reported_not_claimed(tmp_path):
    cache_dir = tmp_path / "cache"
    token = filled(cache_dir)
    plan = cache_dir / "entries" / token[:2] / f"{token}.plan"
    plan.unlink()
    plan.mkdir()
    (plan / "work.txt").write_text("someone's")  # not nncc's to delete
    fix = nncc("cache", "verify", "--fix", cache_dir=cache_dir)
    assert fix.returncode == 1, fix.stdout + fix.stderr
    assert "[removed]" not in fix.stdout.split(str(plan))[0].splitlines()[-1]
    assert "not removed" in fix.stdout and "not empty" in fix.stdout
    gc = nncc("cache", "gc", "--json", cache_dir=cache_dir)
    report = json.loads(gc.stdout)
    assert gc.returncode == 1 and report["removed"] == [] and "not empty" in report["failed"][0]["reason"]
    clear = nncc("cache", "clear", cache_dir=cache_dir)
    assert clear.returncode == 1 and "removed 0 items" in clear.stdout and "not empty" in clear.stderr
    assert (plan / "work.txt").read_text() == "someone's"


@pytest.mark.slow
def test_a_malformed_row_never_names_files_to_delete(tmp_path):
    """An index row whose token is not 64 hex digits (a hand-edited or damaged index) is
    dropped by clear without touching the paths it would name outside the cache."""
    cache_dir = tmp_path / "a" / "cache"
    filled(cache_dir)
    token = "../../thesis"
    c = Cache(str(cache_dir))
    victims = [pathlib.Path(os.path.normpath(p)) for p in (*c.paths(token), c.lock_path(token))]
    assert all(not str(v).startswith(str(cache_dir)) for v in victims)
    for victim in victims:
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("precious")
    import sqlite3

    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    row = list(conn.execute("SELECT * FROM entries").fetchone())
    row[0] = token
    conn.execute(f"INSERT INTO entries VALUES ({', '.join('?' * len(row))})", row)
    conn.commit()
    conn.close()
    result = nncc("cache", "clear", cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr
    assert [v.read_text() for v in victims] == ["precious"] * 3
    with Cache.open(cache_dir) as c:
        assert c.index.entries() == []


@pytest.mark.slow
def test_verify_neither_locks_nor_reads_what_a_malformed_row_names(tmp_path):
    cache_dir = tmp_path / "a" / "cache"
    filled(cache_dir)
    token = "../../thesis"
    lock = pathlib.Path(os.path.normpath(Cache(str(cache_dir)).lock_path(token)))
    import sqlite3

    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    row = list(conn.execute("SELECT * FROM entries").fetchone())
    row[0] = token
    conn.execute(f"INSERT INTO entries VALUES ({', '.join('?' * len(row))})", row)
    conn.commit()
    conn.close()
    report = json.loads(nncc("cache", "verify", "--json", cache_dir=cache_dir).stdout)
    assert report["counts"] == {"OK": 1, "CORRUPT": 1} and not lock.exists()
    fix = nncc("cache", "verify", "--fix", "--json", cache_dir=cache_dir)
    assert fix.returncode == 0 and not lock.exists()
    assert json.loads(nncc("cache", "verify", "--json", cache_dir=cache_dir).stdout)["counts"] == {"OK": 1}
