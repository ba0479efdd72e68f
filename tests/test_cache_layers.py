"""The cache's layering and its command-line edges: the store is a leaf (of nncc it uses
only util and errors, and reads no setting), every `nncc cache` command checks its settings once at start, `nncc cache
gc` applies the configured bounds, and damaged locks or indexes are reported, not crashed on."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import sqlite3

import pytest

from tests.conftest import ROOT
from tests.test_cache import MLP

# the store is a leaf: bytes by token. Of nncc it may use only these; everything else
# (backends, plugins, the ONNX frontend, plans, native code, the runtime, the settings) is
# above it, and the token that names an entry is computed up there (nncc.preparing.token)
THE_STORE_MAY_USE = ("nncc._version", "nncc.cache", "nncc.util", "nncc.errors")
NOT_THE_SETTINGS = ("nncc.settings", "nncc.settings_file")


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _above_the_store(name: str) -> bool:
    """A module of nncc that the store may not use (the package root itself only runs
    ``nncc/__init__.py``, which loads nothing)."""
    return name.startswith("nncc.") and not _within(name, THE_STORE_MAY_USE)


def _imports(path: pathlib.Path):
    """Every module a file imports, function-local ones included, except under
    ``if TYPE_CHECKING:``; with the line of each."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(sub) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno


def test_the_store_imports_nothing_of_nncc_but_util_and_errors():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for path in sorted((ROOT / "nncc/cache").rglob("*.py"))
             for name, line in _imports(path) if _above_the_store(name)]
    assert wrong == []


def test_the_rule_finds_an_import_from_above(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom nncc.util import files\n\ndef f():\n"
                      "    from nncc.backends.registry import get_backend  # lazy: x\n")
    assert [(n, line) for n, line in _imports(module) if _above_the_store(n)] == [("nncc.backends.registry", 5)]


@pytest.mark.parametrize("folder", ["nncc/util", "nncc/runtime"])
def test_the_floors_below_settings_import_no_settings(folder):
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for path in sorted((ROOT / folder).rglob("*.py"))
             for name, line in _imports(path) if _within(name, NOT_THE_SETTINGS)]
    assert wrong == []


def test_importing_the_store_loads_nothing_above_it():
    import subprocess
    import sys

    script = ("import sys, nncc.cache, nncc.cache.gc, nncc.cache.verify, nncc.cache.limits, nncc.cache.objects, "
              "nncc.cache.stats, nncc.cache.direct, nncc.cache.remote.tier, nncc.cache.remote.gc, "
              "nncc.cache.remote.file_store, nncc.cache.remote.record; "
              "print(sorted(m for m in sys.modules if m.startswith('nncc')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    loaded = eval(done.stdout)  # a list of module names printed by the child
    assert "nncc.cache.remote.tier" in loaded  # the script did import the store
    assert [m for m in loaded if _above_the_store(m)] == []


# -- settings: resolved once, at start ------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> pathlib.Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("NNCC_CACHE_DIR", str(path))
    return path


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.mark.parametrize("populated", [False, True], ids=["empty", "populated"])
def test_a_bad_cache_setting_is_exit_2_whatever_the_cache_holds(cli, cache_dir, monkeypatch, populated):
    if populated:
        assert cli("run", MLP, "--random-inputs")[0] == 0
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", "banana")
    for command in (["info"], ["info", "--json"], ["gc"], ["gc", "--dry-run"], ["ls"], ["verify"], ["clear"]):
        code, out, err = cli("cache", *command)
        assert code == 2, (command, out, err)
        assert _one_line(err).startswith("nncc: error: bad size 'banana' in NNCC_CACHE_MAX_SIZE"), command
    if populated:  # nothing was removed on the way
        with sqlite3.connect(cache_dir / "index.sqlite3") as db:
            assert db.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 1


def test_cache_gc_without_flags_applies_the_configured_bounds(cli, cache_dir, monkeypatch):
    for preference in ("low-power", "fast-single-answer"):  # two entries; low-power is used first
        assert cli("compile", MLP, "-o", cache_dir.parent / f"{preference}.nncc", "--preference", preference)[0] == 0
    with sqlite3.connect(cache_dir / "index.sqlite3") as db:
        rows = dict(db.execute("SELECT preference, plan_size + data_size FROM entries").fetchall())
    assert len(rows) == 2
    code, out, _ = cli("cache", "gc", "--json")  # under the default bound: only garbage goes
    assert code == 0 and json.loads(out)["removed"] == []
    # the bound fits the newer entry alone: the configured bound evicts the older one, as after a store
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", str(rows["fast-single-answer"] + 1))
    code, out, _ = cli("cache", "gc", "--json")
    assert code == 0
    assert [r["reason"] for r in json.loads(out)["removed"]] == ["size"]
    with sqlite3.connect(cache_dir / "index.sqlite3") as db:
        assert [r[0] for r in db.execute("SELECT preference FROM entries")] == ["fast-single-answer"]
    # a flag wins over the configured bound
    code, out, _ = cli("cache", "gc", "--max-size", "0", "--json")
    assert code == 0 and len(json.loads(out)["removed"]) == 1


def test_cache_info_shows_the_configured_size_bound(cli, cache_dir, monkeypatch):
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", "3M")
    for populated in (False, True):
        if populated:
            assert cli("run", MLP, "--random-inputs")[0] == 0
        code, out, _ = cli("cache", "info", "--json")
        assert code == 0 and json.loads(out)["max_bytes"] == 3 << 20 and json.loads(out)["exists"] is populated


# -- hostile cache folders -------------------------------------------------------------------------


def _only_token(cache_dir) -> str:
    with sqlite3.connect(cache_dir / "index.sqlite3") as db:
        (token,), = db.execute("SELECT token FROM entries").fetchall()
    return token


@pytest.mark.parametrize("command", [["verify", "--fix"], ["clear"], ["gc", "--max-size", "0"]])
def test_a_lock_file_replaced_by_a_symlink_loop_is_reported_not_crashed_on(cli, cache_dir, command):
    assert cli("run", MLP, "--random-inputs")[0] == 0
    lock = cache_dir / "locks" / f"{_only_token(cache_dir)}.lock"
    if lock.exists():
        lock.unlink()
    os.symlink(lock.name, lock)  # a link to itself: ELOOP on any open
    code, out, err = cli("cache", *command)
    assert "internal error" not in err and "Traceback" not in err, err
    assert code == 1, (out, err)  # the entry could not be removed: said, on one line
    assert f"{lock} is a symbolic link" in out + err
    assert os.path.islink(lock)  # never followed, never "fixed" by writing through it
    assert cli("cache", "ls")[0] == 0  # the rest of the cache still works


def test_verify_reports_an_index_it_had_to_rebuild(cli, cache_dir):
    assert cli("run", MLP, "--random-inputs")[0] == 0
    for suffix in ("-wal", "-shm"):
        pathlib.Path(f"{cache_dir / 'index.sqlite3'}{suffix}").unlink(missing_ok=True)
    (cache_dir / "index.sqlite3").write_bytes(b"not a database at all" * 10)
    code, out, err = cli("cache", "verify", "--json")
    assert code == 1, (out, err)
    report = json.loads(out)
    assert not report["ok"]
    damaged = [f for f in report["findings"] if f["token"] is None and f["status"] == "CORRUPT"]
    assert len(damaged) == 1 and "index was damaged" in damaged[0]["detail"]
    assert [f["status"] for f in report["findings"] if f["token"]] == ["ORPHAN"]  # the entry it listed
    code, out, err = cli("cache", "verify")  # rebuilt now: healthy, and says so
    assert code == 0 and "index was damaged" not in out


# -- the remote tier is asked outside every local lock ----------------------------------------------


@pytest.mark.slow
def test_a_local_miss_asks_the_remote_without_holding_the_token_lock(tmp_path):
    """While a run is inside its remote read-through (connected to the remote, waiting for
    an answer), the token's local lock is free: another process on this machine is not held
    up by a slow remote."""
    import socket
    import subprocess
    import sys

    from nncc.cache.locking import try_lock
    from tests.remote_servers import KEY

    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NNCC_REMOTE")}
    env.update(NNCC_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    run = [sys.executable, "-m", "nncc", "run", str(MLP), "--random-inputs", "--json"]
    first = subprocess.run(run, env=env, capture_output=True, text=True, check=True)  # learn the token
    token = json.loads(first.stdout)["cache"]["token"]
    subprocess.run([sys.executable, "-m", "nncc", "cache", "clear"], env=env, capture_output=True, check=True)

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    env.update(NNCC_REMOTE=f"redis://127.0.0.1:{server.getsockname()[1]}/0", NNCC_REMOTE_KEY=KEY,
               NNCC_REMOTE_TIMEOUT="600")  # it waits for our answer until we hang up
    proc = subprocess.Popen(run, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        conn = None
        while conn is None and proc.poll() is None:
            try:
                conn, _ = server.accept()
            except socket.timeout:
                pass
        assert conn is not None, proc.communicate()
        held = try_lock(str(cache / "locks" / f"{token}.lock"))  # the run is inside the remote call now
        assert held is not None, "the token's lock is held while the remote is asked"
        held.unlink()
        held.release()
        conn.close()  # the remote fails: the run goes on with the local cache
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    assert proc.returncode == 0, err
    report = json.loads(out)["cache"]
    assert report["outcome"] == "miss" and report["token"] == token and report["remote_note"] == "failed"
