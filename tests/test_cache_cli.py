"""`nncc run`/`nncc compile` through the cache, and the `nncc cache` commands."""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from nncc.cache.store import Cache
from tests.conftest import ROOT
from tests.test_cache import MLP, RESNET, check_outputs, feeds_for


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> pathlib.Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("NNCC_CACHE_DIR", str(path))
    return path


def feeds_file(tmp_path, model) -> pathlib.Path:
    path = tmp_path / f"{model.stem}-feeds.npz"
    np.savez(path, **feeds_for(model))
    return path




def entries(cache_dir):
    with Cache.open(cache_dir) as c:
        return c.index.entries()


# -- run and compile -------------------------------------------------------------------


def test_run_miss_hit_and_no_cache(cli, cache_dir, tmp_path):
    feeds = feeds_file(tmp_path, RESNET)
    code, out, err = cli("run", RESNET, "--inputs", feeds, "-o", tmp_path / "a.npz", "--json")
    assert code == 0, err
    first = json.loads(out)["cache"]
    assert first["outcome"] == "miss" and len(first["token"]) == 64 and first["seconds"] > 0
    assert f"cache miss {first['token'][:12]}" in err and "ms" in err
    check_outputs(tmp_path / "a.npz", RESNET)

    code, out, err = cli("run", RESNET, "--inputs", feeds, "-o", tmp_path / "b.npz", "--json")
    second = json.loads(out)["cache"]
    assert code == 0 and second["outcome"] == "hit" and second["token"] == first["token"]
    assert "cache hit" in err
    check_outputs(tmp_path / "b.npz", RESNET)

    code, out, err = cli("run", RESNET, "--inputs", feeds, "--no-cache", "--json")
    assert code == 0 and json.loads(out)["cache"] == {"outcome": "disabled", "token": None,
                                                       "seconds": json.loads(out)["cache"]["seconds"],
                                                       "directory": None, "detail": None, "evicted": None,
                                                       "stage": None, "upgrade": None,
                                                       "remote_seconds": None, "remote_note": None}
    assert "cache disabled" in err
    assert [e.hits for e in entries(cache_dir)] == [1]

    code, out, err = cli("run", RESNET, "--inputs", feeds)  # human output
    assert code == 0 and "logits" in out and "cache hit" in err


def test_run_options_are_part_of_the_key(cli, cache_dir, tmp_path):
    feeds = feeds_file(tmp_path, MLP)
    outcomes = []
    for args in ((), ("--preference", "low-power"), ("-O", "0"), ("--preference", "low-power")):
        code, out, err = cli("run", MLP, "--inputs", feeds, "--json", *args)
        assert code == 0, err
        outcomes.append(json.loads(out)["cache"]["outcome"])
    assert outcomes == ["miss", "miss", "miss", "hit"]
    assert sorted(e.preference for e in entries(cache_dir)) == ["fast-single-answer", "fast-single-answer", "low-power"]


def test_no_cache_creates_nothing(cli, cache_dir, tmp_path):
    code, out, err = cli("run", MLP, "--random-inputs", "--no-cache", "--json")
    assert code == 0 and not cache_dir.exists()
    code, out, err = cli("compile", MLP, "-o", tmp_path / "m.nncc", "--no-cache")
    assert code == 0 and not cache_dir.exists() and (tmp_path / "m.nncc").exists()


def test_cache_dir_option_beats_the_environment(cli, cache_dir, tmp_path):
    other = tmp_path / "other"
    code, out, err = cli("run", MLP, "--random-inputs", "--cache-dir", other, "--json")
    assert code == 0 and json.loads(out)["cache"]["directory"] == str(other)
    assert (other / "index.sqlite3").exists() and not cache_dir.exists()
    code, out, err = cli("cache", "ls", "--cache-dir", other, "--json")
    assert len(json.loads(out)["entries"]) == 1


@pytest.mark.slow
def test_compile_uses_the_cache_and_writes_the_same_artifact(cli, cache_dir, tmp_path):
    outs = []
    for name, extra in (("a", ()), ("b", ()), ("c", ("--no-cache",))):
        code, out, err = cli("compile", RESNET, "-o", tmp_path / f"{name}.nncc", "--json", *extra)
        assert code == 0, err
        outs.append(json.loads(out)["cache"]["outcome"])
    assert outs == ["miss", "hit", "disabled"]
    a, b, c = ((tmp_path / f"{n}.nncc").read_bytes() for n in "abc")
    assert a == b == c
    feeds = feeds_file(tmp_path, RESNET)
    code, out, err = cli("run", tmp_path / "b.nncc", "--inputs", feeds, "-o", tmp_path / "b.npz", "--json")
    assert code == 0 and json.loads(out)["cache"] is None
    check_outputs(tmp_path / "b.npz", RESNET)


def test_run_with_an_unusable_cache_location_warns_once(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out, err = cli("run", MLP, "--random-inputs", "--cache-dir", blocker / "sub", "--json")
    assert code == 0
    assert json.loads(out)["cache"]["outcome"] == "unavailable"
    assert len([line for line in err.splitlines() if "warning" in line]) == 1


@pytest.mark.slow
def test_run_as_a_real_process_with_a_corrupt_index(cache_dir, tmp_path):
    env = dict(os.environ, NNCC_CACHE_DIR=str(cache_dir))
    cmd = [sys.executable, "-m", "nncc", "run", str(MLP), "--random-inputs", "--json"]
    assert subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, timeout=120).returncode == 0
    for suffix in ("-wal", "-shm"):
        (cache_dir / f"index.sqlite3{suffix}").unlink(missing_ok=True)
    (cache_dir / "index.sqlite3").write_bytes(b"\x00garbage" * 1000)
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cache"]["outcome"] == "miss"
    assert [line for line in done.stderr.splitlines() if "warning" in line] == [
        line for line in done.stderr.splitlines() if "rebuilt" in line]
    assert len([line for line in done.stderr.splitlines() if "warning" in line]) == 1
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout)["cache"]["outcome"] == "hit"


def test_tampered_entry_through_the_cli(cli, cache_dir, tmp_path):
    feeds = feeds_file(tmp_path, RESNET)
    cli("run", RESNET, "--inputs", feeds)
    token = entries(cache_dir)[0].token
    plan = pathlib.Path(Cache(str(cache_dir)).paths(token)[0])
    raw = bytearray(plan.read_bytes())
    raw[len(raw) // 2] ^= 1
    plan.write_bytes(bytes(raw))
    code, out, err = cli("cache", "verify")
    assert code == 1 and "CORRUPT" in out and token[:12] in out
    code, out, err = cli("run", RESNET, "--inputs", feeds, "-o", tmp_path / "o.npz", "--json")
    assert code == 0 and json.loads(out)["cache"]["outcome"] == "recompiled"
    assert len([line for line in err.splitlines() if "warning" in line]) == 1
    check_outputs(tmp_path / "o.npz", RESNET)
    assert cli("cache", "verify")[0] == 0


# -- nncc cache ...------------------------------------------------------------------------


def populate(cli, tmp_path):
    cli("run", MLP, "--random-inputs")
    cli("run", RESNET, "--random-inputs", "--stage", "optimized")  # native code: kernel objects
    cli("run", RESNET, "--random-inputs")
    cli("run", RESNET, "--random-inputs", "--preference", "low-power")


def test_help_lists_cache(cli):
    code, out, _ = cli("--help")
    assert code == 0 and "cache" in out
    code, out, _ = cli("cache", "--help")
    for sub in ("ls", "info", "verify", "gc", "rm", "clear"):
        assert sub in out


@pytest.mark.slow
def test_ls(cli, cache_dir, tmp_path):
    populate(cli, tmp_path)
    code, out, err = cli("cache", "ls", "--json")
    assert code == 0
    rows = json.loads(out)["entries"]
    assert len(rows) == 3
    for key in ("token", "source_path", "plan_size", "data_size", "preference", "created", "last_used", "hits",
                "nncc_version", "size", "compile_seconds"):
        assert key in rows[0]
    code, out, _ = cli("cache", "ls", "--json", "--sort", "hits")
    assert [r["hits"] for r in json.loads(out)["entries"]] == [1, 0, 0]
    code, out, _ = cli("cache", "ls", "--json", "--sort", "size")
    sizes = [r["size"] for r in json.loads(out)["entries"]]
    assert sizes == sorted(sizes, reverse=True)
    code, out, _ = cli("cache", "ls", "--json", "--sort", "last-used")
    used = [r["last_used"] for r in json.loads(out)["entries"]]
    assert used == sorted(used, reverse=True)
    code, out, _ = cli("cache", "ls")
    assert code == 0 and rows[0]["token"][:12] in out and "resnet_block.onnx" in out
    assert cli("cache", "ls", "--sort", "name")[0] == 2


@pytest.mark.slow
def test_info(cli, cache_dir, tmp_path):
    populate(cli, tmp_path)
    code, out, _ = cli("cache", "info", "--json")
    info = json.loads(out)
    assert code == 0 and info["directory"] == str(cache_dir) and info["entries"] == 3
    assert info["counters"]["hits"] == 1 and info["counters"]["misses"] == 3
    assert info["total_bytes"] == sum(e.size for e in entries(cache_dir))
    assert info["hit_rate"] == pytest.approx(0.25)
    assert info["max_bytes"] == 2 << 30
    code, out, _ = cli("cache", "info")
    assert code == 0 and "Hits" in out and "Misses" in out and "Corruptions" in out and str(cache_dir) in out


@pytest.mark.slow
def test_verify_and_fix(cli, cache_dir, tmp_path):
    populate(cli, tmp_path)
    code, out, err = cli("cache", "verify", "--json")
    assert code == 0 and json.loads(out)["counts"] == {"OK": 3}
    c = Cache(str(cache_dir))
    rows = entries(cache_dir)
    os.unlink(c.paths(rows[0].token)[1])  # MISSING
    pathlib.Path(c.paths(rows[1].token)[0]).write_bytes(b"junk")  # CORRUPT
    orphan = "7" * 64
    os.makedirs(c.shard(orphan), exist_ok=True)
    pathlib.Path(c.paths(orphan)[1]).write_bytes(b"o")  # ORPHAN
    pathlib.Path(c.shard(orphan), f".{orphan}.plan.1-0123abcd.tmp").write_bytes(b"t")  # LEFTOVER
    code, out, err = cli("cache", "verify", "--json")
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    assert report["counts"] == {"OK": 1, "MISSING": 1, "CORRUPT": 1, "ORPHAN": 1, "LEFTOVER": 1}
    code, out, err = cli("cache", "verify")
    assert code == 1 and "MISSING" in out and "problems found: 1 CORRUPT, 1 LEFTOVER, 1 MISSING, 1 ORPHAN, 1 OK" in out
    code, out, err = cli("cache", "verify", "--fix", "--json")
    assert code == 0 and all(f["fixed"] for f in json.loads(out)["findings"] if f["status"] != "OK")
    code, out, err = cli("cache", "verify", "--json")
    assert code == 0 and json.loads(out)["counts"] == {"OK": 1}


@pytest.mark.slow
def test_gc_commands(cli, cache_dir, tmp_path):
    populate(cli, tmp_path)
    total = sum(e.size for e in entries(cache_dir))
    objects = json.loads(cli("cache", "info", "--json")[1])["objects"]  # kernel objects count too
    object_bytes = json.loads(cli("cache", "info", "--json")[1])["object_bytes"]
    code, out, err = cli("cache", "gc", "--max-size", "0", "--dry-run", "--json")
    report = json.loads(out)
    assert code == 0 and report["dry_run"] and len(report["removed"]) == 3 + objects
    assert report["freed_bytes"] == total + object_bytes
    assert len(entries(cache_dir)) == 3
    code, out, err = cli("cache", "gc", "--max-size", "0", "--dry-run")
    assert code == 0 and out.count("would remove") == 3 + objects and "dry run: " in out
    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    conn.execute("UPDATE entries SET last_used = last_used - 3 * 86400 WHERE preference = 'low-power'")
    conn.commit()
    conn.close()
    code, out, err = cli("cache", "gc", "--max-age", "2d")
    assert code == 0 and "age" in out and "freed" in out
    assert len(entries(cache_dir)) == 2
    code, out, err = cli("cache", "gc", "--max-size", "1G", "--json")
    assert code == 0 and json.loads(out)["removed"] == []
    newest = max(entries(cache_dir), key=lambda e: e.last_used)  # resnet_block, run last
    with Cache.open(cache_dir) as c:  # the size bound counts the kernel objects an entry needs
        needed = set(c.index.entry_objects(newest.token))
        needed_bytes = sum(o["size"] for o in c.index.objects() if o["key"] in needed)
    code, out, err = cli("cache", "gc", "--max-size", str(newest.size + needed_bytes), "--json")
    removed = json.loads(out)["removed"]
    assert code == 0 and [(r["reason"], r["source"]) for r in removed if r["reason"] != "object"] == \
        [("size", str(MLP))]
    assert not needed & {r["token"] for r in removed if r["reason"] == "object"}
    assert [e.token for e in entries(cache_dir)] == [newest.token]
    assert cli("cache", "gc", "--max-size", "lots")[0] == 2
    assert cli("cache", "gc", "--max-age", "soon")[0] == 2


@pytest.mark.slow
def test_rm_with_prefixes(cli, cache_dir, tmp_path):
    populate(cli, tmp_path)
    rows = entries(cache_dir)
    token = rows[0].token
    code, out, err = cli("cache", "rm", token[:10], "--json")
    assert code == 0 and json.loads(out) == {"removed": [token], "busy": []}
    assert token not in {e.token for e in entries(cache_dir)}
    assert not any(os.path.exists(p) for p in Cache(str(cache_dir)).paths(token))
    c = Cache(str(cache_dir))
    for t in ("ab" + "1" * 62, "ab" + "2" * 62):
        os.makedirs(c.shard(t), exist_ok=True)
        pathlib.Path(c.paths(t)[0]).write_bytes(b"x")
    code, out, err = cli("cache", "rm", "ab")
    assert code == 2 and "ambiguous" in err
    code, out, err = cli("cache", "rm", "ab1")
    assert code == 0 and not os.path.exists(c.paths("ab" + "1" * 62)[0])
    assert cli("cache", "rm", "ffff" if not any(e.token.startswith("ffff") for e in entries(cache_dir)) else "fffff")[0] == 2
    assert cli("cache", "rm", "xyz")[0] == 2
    rest = [e.token for e in entries(cache_dir)]
    code, out, err = cli("cache", "rm", *[t[:8] for t in rest])
    assert code == 0 and entries(cache_dir) == []


@pytest.mark.slow
def test_clear(cli, cache_dir, tmp_path):
    populate(cli, tmp_path)
    objects = json.loads(cli("cache", "info", "--json")[1])["objects"]
    assert objects > 0  # the entries' native code was linked from kernel objects kept there
    code, out, err = cli("cache", "clear", "--json")
    report = json.loads(out)
    assert code == 0 and report["removed"] == 3 + objects and report["freed_bytes"] > 0
    assert entries(cache_dir) == []
    assert Cache.open(cache_dir).scan() == ({}, [])
    assert not list((cache_dir / "objects").rglob("*.o"))
    code, out, err = cli("cache", "clear")
    assert code == 0 and "removed 0 items" in out
    code, out, err = cli("cache", "info", "--json")
    assert json.loads(out)["entries"] == 0 and json.loads(out)["objects"] == 0


def test_cache_commands_take_cache_dir(cli, tmp_path):
    other = tmp_path / "x"
    cli("run", MLP, "--random-inputs", "--cache-dir", other)
    for sub in (("ls",), ("info",), ("verify",), ("gc",), ("clear",)):
        code, out, err = cli("cache", *sub, "--cache-dir", other, "--json")
        assert code == 0, (sub, err)
        json.loads(out)
