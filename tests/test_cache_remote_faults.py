"""A remote that is down, black-holed or full never fails a run: the local path goes on
and one warning line says so, once per run however many models it prepares. And the
commands that move entries by hand: cache info, push, pull, gc --remote."""

from __future__ import annotations

import json

import pytest

from nncc.model import prepare
from nncc.cache.store import Cache
from tests.remote_servers import (ACCESS, KEY, MotoServer, RedisServer, black_hole, fresh_remote_state,  # noqa: F401
                                  remote)
from tests.test_cache import MLP, RESNET, assert_correct, warnings_in


def counters(cache_dir) -> dict[str, int]:
    with Cache.open(cache_dir) as c:
        return c.index.counters()


def _two_models_in_one_run(tmp_path, capfd):
    """Prepare two models in this process, each on a cold cache; both must compile and be
    right. Returns the warning lines."""
    capfd.readouterr()
    for model, folder in ((RESNET, "a"), (MLP, "b")):
        compiled, outcome = prepare(model, cache_dir=tmp_path / folder)
        assert outcome.outcome == "miss"
        assert_correct(compiled, model)
    return warnings_in(capfd.readouterr().err)


def test_stopped_redis_never_fails_a_run(tmp_path, monkeypatch, capfd):
    server = RedisServer(tmp_path)
    server.stop()  # its port now refuses connections
    monkeypatch.setenv("NNCC_REMOTE", server.url)
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    warned = _two_models_in_one_run(tmp_path, capfd)
    assert len(warned) == 1 and "failed" in warned[0] and "local cache only" in warned[0], warned
    assert counters(tmp_path / "a")["remote_errors"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_black_holed_port_never_fails_a_run(tmp_path, monkeypatch, capfd, kind):
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    monkeypatch.setenv("NNCC_REMOTE_TIMEOUT", "0.5")
    with black_hole() as port:
        if kind == "redis":
            monkeypatch.setenv("NNCC_REMOTE", f"redis://127.0.0.1:{port}/0")
        else:
            for name, value in ACCESS.items():
                monkeypatch.setenv(name, value)
            monkeypatch.setenv("NNCC_REMOTE", "s3://team-cache/nncc")
            monkeypatch.setenv("NNCC_S3_ENDPOINT", f"http://127.0.0.1:{port}")
        warned = _two_models_in_one_run(tmp_path, capfd)
    text = warned[0].lower() if warned else ""
    assert len(warned) == 1 and "failed" in text and ("timed out" in text or "timeout" in text), warned


@pytest.mark.slow
def test_stopped_s3_server_never_fails_a_run(tmp_path, monkeypatch, capfd):
    server = MotoServer()
    server.stop()
    for name, value in ACCESS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NNCC_REMOTE", server.url)
    monkeypatch.setenv("NNCC_S3_ENDPOINT", server.endpoint)
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    warned = _two_models_in_one_run(tmp_path, capfd)
    assert len(warned) == 1 and "failed" in warned[0], warned


def test_unmounted_shared_folder_never_fails_a_run(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("NNCC_REMOTE", f"file://{tmp_path}/not-mounted")
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    warned = _two_models_in_one_run(tmp_path, capfd)
    assert len(warned) == 1 and "not a folder" in warned[0], warned


def test_full_redis_never_fails_a_run_and_shows_no_partial_entry(tmp_path, monkeypatch, capfd):
    import redis

    server = RedisServer(tmp_path, maxmemory="4mb")
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(10_000):  # fill it up to maxmemory: writes are refused from then on
                server.client.set(f"ballast:{i}", b"x" * 65536)
        monkeypatch.setenv("NNCC_REMOTE", server.url)
        monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
        warned = _two_models_in_one_run(tmp_path, capfd)
        assert len(warned) == 1 and "maxmemory" in warned[0], warned
        assert list(server.client.scan_iter(match="nncc:manifests/*")) == []
        server.client.delete(*[f"ballast:{i}" for i in range(200)])  # room again: a new run uploads
        from nncc.preparing import remote as flow

        flow._tiers.clear()
        _, outcome = prepare(RESNET, cache_dir=tmp_path / "c")
        assert outcome.outcome == "miss"
        _, outcome = prepare(RESNET, cache_dir=tmp_path / "d")
        assert outcome.outcome == "remote hit"
    finally:
        server.stop()


# -- commands ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_push_pull_info(remote, tmp_path, monkeypatch, cli):
    monkeypatch.delenv("NNCC_REMOTE")  # given by --remote below
    code, _, err = cli("run", MLP, "--random-inputs", "--stage", "optimized", "--cache-dir", tmp_path / "a")
    assert code == 0 and "cache miss" in err
    code, out, _ = cli("cache", "ls", "--json", "--cache-dir", tmp_path / "a")
    token = json.loads(out)["entries"][0]["token"]
    code, out, err = cli("cache", "push", token[:10], "--remote", remote.url, "--cache-dir", tmp_path / "a")
    assert code == 0 and out.strip() == f"pushed {token}"
    assert remote.keys("manifests/") == [f"manifests/{token}"]
    code, out, err = cli("cache", "pull", token, "--remote", remote.url, "--cache-dir", tmp_path / "b")
    assert code == 0 and out.strip() == f"pulled {token}", err
    code, out, err = cli("run", MLP, "--random-inputs", "--stage", "optimized", "--cache-dir", tmp_path / "b")
    assert code == 0 and "cache hit" in err  # pulled entries serve local hits
    code, out, _ = cli("cache", "info", "--json", "--remote", remote.url, "--cache-dir", tmp_path / "b")
    info = json.loads(out)
    assert info["counters"]["remote_hits"] == 1 and info["counters"]["hits"] == 1
    assert info["remote"]["state"] == "on" and info["remote"]["entries"] == 1
    code, out, _ = cli("cache", "info", "--remote", remote.url, "--cache-dir", tmp_path / "b")
    assert "Remote hits      1" in out and "Remote entries   1" in out
    code, _, err = cli("cache", "pull", "ab" * 32, "--remote", remote.url, "--cache-dir", tmp_path / "b")
    assert code == 1 and "not in the remote cache" in err


def test_push_and_pull_need_a_keyed_remote(tmp_path, monkeypatch, cli):
    monkeypatch.delenv("NNCC_REMOTE", raising=False)
    cli("run", MLP, "--random-inputs", "--cache-dir", tmp_path / "a")
    code, _, err = cli("cache", "push", "--cache-dir", tmp_path / "a")
    assert code == 2 and "no remote cache" in err
    code, _, err = cli("cache", "push", "--remote", f"file://{tmp_path}", "--cache-dir", tmp_path / "a")
    assert code == 2 and "no key" in err


@pytest.mark.slow
def test_gc_remote_applies_size_and_age(remote, tmp_path, monkeypatch, cli):
    tokens = {}
    for model in (MLP, RESNET):
        _, outcome = prepare(model, cache_dir=tmp_path / "a", backends=["numpy"])  # portable: shared by token
        tokens[model.name] = outcome.token
    planted = "cd" * 32
    remote.put(f"manifests/{planted}", b"0" * 64 + b"\n{}")  # an entry nobody with the key wrote
    code, out, _ = cli("cache", "gc", "--remote", "--dry-run", "--max-size", "0", "--json")
    report = json.loads(out)
    assert code == 0 and report["dry_run"] and len(report["removed_entries"]) == 3
    assert len(remote.keys("manifests/")) == 3  # a dry run removes nothing
    # the older entry (MLP, uploaded first) goes to make the newer one fit
    resnet_bytes = sum(p.size for p in _manifest_parts(remote, tokens["resnet_block.onnx"]))
    code, out, _ = cli("cache", "gc", "--remote", "--max-size", str(resnet_bytes), "--json")
    report = json.loads(out)
    gone = {(r["token"], r["reason"]) for r in report["removed_entries"]}
    assert gone == {(tokens["mlp.onnx"], "size"), (planted, "rejected")}
    assert remote.keys("manifests/") == [f"manifests/{tokens['resnet_block.onnx']}"]
    assert len(remote.keys("parts/")) == 2 and report["kept_bytes"] == resnet_bytes
    _, outcome = prepare(RESNET, cache_dir=tmp_path / "b", backends=["numpy"])
    assert outcome.outcome == "remote hit"
    code, out, _ = cli("cache", "gc", "--remote", "--max-age", "0s", "--json")
    assert code == 0 and remote.keys("manifests/") == [] and remote.keys("parts/") == []


def _manifest_parts(remote, token):
    from nncc.cache.remote.manifest import decode, mac_key

    return decode(remote.get(f"manifests/{token}"), mac_key(KEY.encode()), token).parts


@pytest.mark.slow
def test_pull_rejects_a_poisoned_entry(remote, tmp_path, cli):
    _, outcome = prepare(MLP, cache_dir=tmp_path / "a", backends=["numpy"])
    mac, body = remote.get(f"manifests/{outcome.token}").split(b"\n", 1)
    doc = json.loads(body)
    plan = next(p for p in doc["parts"] if p["role"] == "plan")
    original = remote.get(f"parts/{plan['hash']}")
    remote.put(f"parts/{plan['hash']}", original[:-1] + bytes([original[-1] ^ 1]))  # one bit flipped
    code, _, err = cli("cache", "pull", outcome.token, "--cache-dir", tmp_path / "b")
    assert code == 1 and "rejected" in err and "hash" in err
    with Cache.open(tmp_path / "b") as c:
        assert c.index.entries() == [] and c.index.counters()["remote_rejected"] == 1
        assert c.scan()[0] == {}  # no file of the rejected entry stayed behind
