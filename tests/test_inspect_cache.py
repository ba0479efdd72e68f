"""`nncc inspect MODEL.onnx` says whether the compilation cache holds the model with these
options: the token a run stores under, and the entry's stage and origin (local compile or
the remote tier), checked against what `nncc run` reported and `nncc cache ls` lists."""

from __future__ import annotations

import json
import os

import pytest

from tests.remote_servers import KEY, fresh_remote_state  # noqa: F401
from tests.test_cache import MLP
from tests.test_shell import SCHEMAS, check_schema


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # the text report's lines whole, however long the tmp paths


def json_of(cli, *args) -> dict:
    code, out, err = cli(*args)
    assert code == 0, err
    return json.loads(out)


def inspected(cli, *args) -> dict:
    report = json_of(cli, "inspect", MLP, "--json", *args)
    check_schema(report, SCHEMAS[("inspect",)], "nncc inspect")
    return report["cache"]


def listed(cli, cache_dir) -> list[dict]:
    return json_of(cli, "cache", "ls", "--json", "--cache-dir", cache_dir)["entries"]


def test_inspect_finds_the_entry_a_run_stored(cli, tmp_path):
    cache_dir = tmp_path / "cache"
    before = inspected(cli, "--cache-dir", cache_dir)
    assert before["cached"] is False and before["detail"] == "no cache there yet"
    assert before["directory"] == str(cache_dir)
    assert not cache_dir.exists()  # inspect looks; it never creates a cache

    run = json_of(cli, "run", MLP, "--random-inputs", "--json", "--cache-dir", cache_dir)["cache"]
    assert run["outcome"] == "miss" and run["token"] == before["token"]

    found = inspected(cli, "--cache-dir", cache_dir)
    [entry] = listed(cli, cache_dir)
    assert found["cached"] is True and found["token"] == entry["token"] == run["token"]
    assert (found["stage"], found["origin"], found["hits"]) == (run["stage"], "local", 0)
    assert (found["stage"], found["origin"], found["size"]) == (entry["stage"], entry["origin"], entry["size"])

    json_of(cli, "run", MLP, "--random-inputs", "--json", "--cache-dir", cache_dir)  # a hit
    assert inspected(cli, "--cache-dir", cache_dir)["hits"] == 1

    code, text, _ = cli("inspect", MLP, "--cache-dir", cache_dir)
    assert code == 0
    assert f"cache: cached ({run['stage']} stage, origin local, 1 hit," in text
    assert f"token {run['token']}" in text


def test_options_name_the_entry_and_the_stage_does_not(cli, tmp_path):
    cache_dir = tmp_path / "cache"
    run = json_of(cli, "run", MLP, "--random-inputs", "--json", "--cache-dir", cache_dir)["cache"]
    other = inspected(cli, "--cache-dir", cache_dir, "--preference", "low-power")
    assert other["cached"] is False and other["detail"] is None and other["token"] != run["token"]
    # one entry per model and options whatever stage it holds: --stage quick finds it too
    quick = inspected(cli, "--cache-dir", cache_dir, "--stage", "quick")
    assert quick["cached"] is True and quick["token"] == run["token"]
    # the same root option every command takes
    assert json_of(cli, "--cache-dir", cache_dir, "inspect", MLP, "--json")["cache"]["token"] == run["token"]
    # nncc compile builds the optimized stage in place of the quick one: inspect sees it
    code, _, err = cli("compile", MLP, "-o", tmp_path / "mlp.nncc", "--cache-dir", cache_dir)
    assert code == 0, err
    [entry] = listed(cli, cache_dir)
    assert entry["stage"] == "optimized"
    assert inspected(cli, "--cache-dir", cache_dir)["stage"] == "optimized"


def test_an_entry_from_the_remote_tier_names_it(cli, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("NNCC_REMOTE", f"file://{shared}")
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    outcomes = [json_of(cli, "run", MLP, "--random-inputs", "--json", "--cache-dir", tmp_path / machine)["cache"]
                for machine in ("a", "b")]
    assert [o["outcome"] for o in outcomes] == ["miss", "remote hit"]
    a, b = (inspected(cli, "--cache-dir", tmp_path / machine) for machine in ("a", "b"))
    assert a["token"] == b["token"] == outcomes[0]["token"]
    assert a["origin"] == "local" and b["origin"] == f"remote file://{shared}"
    assert [e["origin"] for e in listed(cli, tmp_path / "b")] == [b["origin"]]
    code, text, _ = cli("inspect", MLP, "--cache-dir", tmp_path / "b")
    assert code == 0 and f"origin remote file://{shared}," in text


def test_a_cache_that_cannot_be_read_is_reported_not_an_error(cli, tmp_path):
    foreign = tmp_path / "photos"  # not nncc's: refused, and left as it is
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"not a cache")
    found = inspected(cli, "--cache-dir", foreign)
    assert found["cached"] is None and "not" in found["detail"] and len(found["token"]) == 64
    assert os.listdir(foreign) == ["holiday.jpg"]
    code, text, err = cli("inspect", MLP, "--cache-dir", foreign)
    assert code == 0 and "cache: not checked (" in text and "Traceback" not in err


def test_an_artifact_does_not_involve_the_cache(cli, tmp_path):
    artifact = tmp_path / "mlp.nncc"
    code, _, err = cli("compile", MLP, "-o", artifact, "--cache-dir", tmp_path / "cache")
    assert code == 0, err
    report = json_of(cli, "inspect", artifact, "--json", "--cache-dir", tmp_path / "cache")
    check_schema(report, SCHEMAS[("inspect",)], "nncc inspect")
    assert report["cache"] is None
    code, text, _ = cli("inspect", artifact, "--cache-dir", tmp_path / "cache")
    assert code == 0 and "cache:" not in text


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes, SQLite's own reader files aside: the
    shared-memory file, where a reader of a WAL database keeps its read marks, and the
    empty write-ahead log a reader opens."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith("-shm") and not (p.name.endswith("-wal") and not p.stat().st_size)}


def test_a_look_writes_nothing_in_the_cache(cli, tmp_path):
    import sqlite3

    cache_dir = tmp_path / "cache"
    json_of(cli, "run", MLP, "--random-inputs", "--json", "--cache-dir", cache_dir)
    before = snapshot(cache_dir)
    assert inspected(cli, "--cache-dir", cache_dir)["cached"] is True
    assert snapshot(cache_dir) == before  # no hit counted, no statistics, no code hashes learned
    # an index another nncc version wrote: a run would retire its rows; a look leaves them
    with sqlite3.connect(cache_dir / "index.sqlite3") as db:
        db.execute("UPDATE meta SET value = '0.0.1' WHERE key = 'nncc_version'")
    db.close()
    before = snapshot(cache_dir)
    found = inspected(cli, "--cache-dir", cache_dir)
    assert found["cached"] is None and "another nncc version" in found["detail"]
    assert snapshot(cache_dir) == before


def test_a_shared_cache_is_read_only_when_trusted(cli, tmp_path):
    cache_dir = tmp_path / "cache"
    run = json_of(cli, "run", MLP, "--random-inputs", "--json", "--cache-dir", cache_dir)["cache"]
    cache_dir.chmod(0o770)  # writable by the group: whoever is in it could plant entries
    found = inspected(cli, "--cache-dir", cache_dir)
    assert found["cached"] is None and "writable by group" in found["detail"] and found["token"] == run["token"]
    trusted = inspected(cli, "--cache-dir", cache_dir, "--trust-shared-cache")
    assert trusted["cached"] is True and trusted["token"] == run["token"]
