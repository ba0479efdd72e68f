"""Cache statistics that answer "is it worth it": time saved, average hit and compile time,
why each miss happened, `nncc cache zero-stats`, and an index of the older schema that
keeps working."""

from __future__ import annotations

import json
import pathlib
import sqlite3

import pytest

import nncc
from nncc.cache.index import ALL_COUNTERS, Index
from nncc.model import prepare
from nncc.cache.store import Cache
from nncc.plan.format import FORMAT_VERSION
from tests.conftest import FIXTURES

MLP = FIXTURES / "mlp.onnx"
RESNET = FIXTURES / "resnet_block.onnx"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> pathlib.Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("NNCC_CACHE_DIR", str(path))
    return path


def info(cli) -> dict:
    code, out, err = cli("cache", "info", "--json")
    assert code == 0, err
    return json.loads(out)


def reasons(cli) -> dict:
    return info(cli)["stats"]["miss_reasons"]


def test_each_miss_reason_is_counted_where_it_happens(cli, cache_dir):
    expected = dict.fromkeys(("new_model", "changed_options", "version_change", "tamper", "evicted"), 0)

    assert prepare(MLP)[1].outcome == "miss"
    expected["new_model"] += 1
    assert reasons(cli) == expected

    assert prepare(MLP, preference="low-power")[1].outcome == "miss"
    expected["changed_options"] += 1
    assert reasons(cli) == expected

    assert prepare(MLP)[1].outcome == "hit"  # a hit is no miss
    assert reasons(cli) == expected

    # tamper: the stored plan no longer matches its hash
    _, outcome = prepare(RESNET)
    expected["new_model"] += 1
    plan = pathlib.Path(Cache(str(cache_dir)).paths(outcome.token)[0])
    data = bytearray(plan.read_bytes())
    data[-1] ^= 0xFF
    plan.write_bytes(bytes(data))
    assert prepare(RESNET)[1].outcome == "recompiled"
    expected["tamper"] += 1
    assert reasons(cli) == expected

    # evicted: the entry was there and was removed
    code, _, err = cli("cache", "rm", outcome.token[:12])
    assert code == 0, err
    assert prepare(RESNET)[1].outcome == "miss"
    expected["evicted"] += 1
    assert reasons(cli) == expected

    # version change: another nncc version opened the index and retired every row
    Index(str(cache_dir), "0.0.0-another", FORMAT_VERSION).open().close()
    assert prepare(RESNET)[1].outcome == "miss"
    expected["version_change"] += 1
    assert reasons(cli) == expected

    report = info(cli)
    counters = report["counters"]
    assert sum(expected.values()) == counters["misses"] + counters["recompiles"]


def test_time_saved_is_compile_time_times_hits_less_the_hits(cli, cache_dir):
    prepare(MLP)
    prepare(RESNET)
    for _ in range(3):
        assert prepare(MLP)[1].outcome == "hit"
    assert prepare(RESNET)[1].outcome == "hit"
    code, out, _ = cli("cache", "ls", "--json")
    rows = json.loads(out)["entries"]
    avoided = sum(r["compile_seconds"] * r["hits"] for r in rows)  # what the index recorded per entry
    compiled = sum(r["compile_seconds"] for r in rows)
    stats = info(cli)["stats"]
    assert stats["compile_seconds_avoided"] == pytest.approx(avoided, abs=1e-5)
    assert stats["average_compile_seconds"] == pytest.approx(compiled / 2, abs=1e-5)
    assert stats["hit_seconds"] > 0
    assert stats["average_hit_seconds"] == pytest.approx(stats["hit_seconds"] / 4)
    assert stats["time_saved_seconds"] == pytest.approx(avoided - stats["hit_seconds"], abs=1e-5)

    code, out, _ = cli("cache", "info")
    lines = dict(line.split(None, 1) if not line.startswith(("Miss ", "Time ", "Hit ")) else
                 (line[:14].strip(), line[14:].strip()) for line in out.splitlines())
    assert code == 0
    assert lines["Hits"].startswith("4, ") and "to load on average" in lines["Hits"]
    assert lines["Misses"].startswith("2, ") and "to compile on average" in lines["Misses"]
    assert lines["Miss reasons"] == "new model 2"
    assert "compiles avoided" in lines["Time saved"]


def test_zero_stats_resets_the_counters_not_the_entries(cli, cache_dir):
    prepare(MLP)
    prepare(MLP)
    code, out, err = cli("cache", "zero-stats")
    assert code == 0 and out.startswith("zeroed the statistics of ")
    report = info(cli)
    assert report["counters"] == dict.fromkeys(report["counters"], 0)
    assert set(report["stats"]["miss_reasons"].values()) == {0}
    assert report["stats"]["time_saved_seconds"] == 0 and report["stats"]["average_hit_seconds"] is None
    assert report["entries"] == 1
    with Cache.open(cache_dir) as c:
        assert [e.hits for e in c.index.entries()] == [1]  # `ls` still shows each entry's own hits
    assert prepare(MLP)[1].outcome == "hit"
    assert info(cli)["counters"]["hits"] == 1
    # no cache: nothing to zero, nothing created
    code, out, _ = cli("cache", "zero-stats", "--cache-dir", cache_dir.parent / "none", "--json")
    assert code == 0 and json.loads(out)["zeroed"] is False and not (cache_dir.parent / "none").exists()


def _make_schema_1(cache_dir) -> None:
    """Turn the index into what the previous schema wrote: no history table, only the
    five lookup counters, user_version 1."""
    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    conn.execute("DROP TABLE history")
    conn.execute("DELETE FROM counters WHERE name NOT IN ('hits', 'misses', 'corruptions', 'recompiles', 'evictions')")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def test_an_index_of_the_previous_schema_keeps_its_entries(cli, cache_dir):
    _, first = prepare(MLP)
    prepare(MLP)
    _make_schema_1(cache_dir)
    # read-only (as on read-only storage): the old index serves and `info` reads it
    with Cache(str(cache_dir))._open_read_only() as c:
        assert [e.token for e in c.index.entries()] == [first.token]
        assert c.index.counters(ALL_COUNTERS)["miss_new_model"] == 0
    # writable: migrated in place, the entry is still a hit
    assert prepare(MLP)[1].outcome == "hit"
    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    from nncc.cache.index import SCHEMA_VERSION

    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    [(hits, compile_seconds)] = conn.execute("SELECT hits, compile_seconds FROM entries").fetchall()
    conn.close()
    assert hits == 2
    stats = info(cli)["stats"]
    # the hit before the migration counts its avoided compile (taken from the entry), the one after too
    assert stats["compile_seconds_avoided"] == pytest.approx(2 * compile_seconds, abs=1e-5)
    assert info(cli)["nncc_version"] == nncc.__version__
