"""The remote cache tier against real stores on loopback: a shared folder, a real
redis-server and moto's S3 server reached over HTTP by nncc's own client. Outputs are
checked against onnxruntime; remote objects are planted and inspected through clients
independent of nncc (files, redis-py, boto3)."""

from __future__ import annotations

import json

import pytest

from nncc.preparing import remote as flow
from nncc.model import artifact_bytes, prepare
from nncc.cache.store import Cache
from nncc.cache.verify import verify
from nncc.native.toolchain import find_toolchain
from tests.remote_servers import KEY, fresh_remote_state, remote  # noqa: F401
from tests.test_cache import MLP, RESNET, assert_correct, warnings_in


def counters(cache_dir) -> dict[str, int]:
    with Cache.open(cache_dir) as c:
        return c.index.counters()


@pytest.mark.slow
def test_a_cold_machine_gets_a_remote_hit(remote, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("NNCC_REMOTE_TRUST_NATIVE", "yes")  # the fleet runs the team key's native code
    compiled, first = prepare(RESNET, cache_dir=tmp_path / "a", stage="optimized")  # with native code
    assert first.outcome == "miss"
    assert remote.keys("manifests/") == [f"manifests/{first.token}"]
    assert len(remote.keys("parts/")) == 2  # model cache and data cache, content-addressed
    model, second = prepare(RESNET, cache_dir=tmp_path / "b")
    assert (second.outcome, second.token, second.stage) == ("remote hit", first.token, "optimized")
    assert_correct(model, RESNET)
    if find_toolchain() is not None:  # the native code came from the remote and verified: it runs
        assert compiled.native_partitions >= 1 and model.native_partitions == compiled.native_partitions
    # stored through the local atomic path: the next run is a plain local hit
    again, third = prepare(RESNET, cache_dir=tmp_path / "b")
    assert third.outcome == "hit"
    assert_correct(again, RESNET)
    stats = counters(tmp_path / "b")
    assert (stats["remote_hits"], stats["remote_misses"], stats["hits"]) == (1, 0, 1)
    assert counters(tmp_path / "a")["remote_misses"] == 1
    with Cache.open(tmp_path / "b") as c:
        assert verify(c).ok
    assert warnings_in(capfd.readouterr().err) == []
    assert remote.keys("leases/") == []  # released after the upload


def shared_names(remote) -> set[str]:
    return {key.split("/", 1)[1] for key in remote.keys("manifests/")}


@pytest.mark.slow
def test_manifest_is_uploaded_last_and_names_its_parts(remote, tmp_path):
    _, outcome = prepare(MLP, cache_dir=tmp_path / "a")
    (name,) = shared_names(remote)  # the quick stage: under its portable name
    raw = remote.get(f"manifests/{name}")
    mac, body = raw.split(b"\n", 1)
    doc = json.loads(body)
    assert doc["token"] == name and len(mac) == 64 and not doc["native"]
    from blake3 import blake3

    for part in doc["parts"]:  # each part is stored under the blake3 of its own bytes
        data = remote.get(f"parts/{part['hash']}")
        assert blake3(data).hexdigest() == part["hash"] and len(data) == part["size"]


# -- poisoned entries: never used, reported, counted -------------------------------------


def _publish(tmp_path, model, remote):
    """Machine A compiles ``model`` and uploads it; returns the name it is shared under."""
    before = shared_names(remote)
    _, outcome = prepare(model, cache_dir=tmp_path / f"a-{model.stem}")
    assert outcome.outcome == "miss"
    (name,) = shared_names(remote) - before
    return name


def _manifest(remote, token):
    mac, body = remote.get(f"manifests/{token}").split(b"\n", 1)
    return mac, json.loads(body)


def _parts(remote, token):
    return {p["role"]: p for p in _manifest(remote, token)[1]["parts"]}


def poison_wrong_mac(remote, token, tmp_path):
    # an entry made by someone with write access to the store but not the team key
    from nncc.cache.remote import manifest as mf

    mac, doc = _manifest(remote, token)
    forged = mf.Manifest(token, tuple(mf.Part(p["role"], p["hash"], p["size"]) for p in doc["parts"]),
                         doc["native"], doc["nncc_version"], doc["format_version"], doc["created"], None)
    remote.put(f"manifests/{token}", mf.encode(forged, mf.mac_key(b"not the team key")))
    return "MAC"


def poison_swapped_parts(remote, token, tmp_path):
    parts = _parts(remote, token)
    plan, data = (remote.get(f"parts/{parts[r]['hash']}") for r in ("plan", "data"))
    remote.put(f"parts/{parts['plan']['hash']}", data)
    remote.put(f"parts/{parts['data']['hash']}", plan)
    return "part"


def poison_truncated_data(remote, token, tmp_path):
    data = _parts(remote, token)["data"]
    remote.put(f"parts/{data['hash']}", remote.get(f"parts/{data['hash']}")[: data["size"] // 2])
    return "data part has"


def poison_replaced_plan(remote, token, tmp_path):
    # a plan (with native code) of another model under this entry's plan hash
    other = _publish(tmp_path, MLP, remote)
    plan = _parts(remote, token)["plan"]
    remote.put(f"parts/{plan['hash']}", remote.get(f"parts/{_parts(remote, other)['plan']['hash']}"))
    return "plan part"


def poison_other_token(remote, token, tmp_path):
    # a genuine, correctly signed entry, but for another model, copied under this token
    other = _publish(tmp_path, MLP, remote)
    remote.put(f"manifests/{token}", remote.get(f"manifests/{other}"))
    return "another token"


@pytest.mark.slow
@pytest.mark.parametrize("poison", [poison_wrong_mac, poison_swapped_parts, poison_truncated_data,
                                    poison_replaced_plan, poison_other_token])
def test_poisoned_entries_are_never_used(remote, tmp_path, capfd, poison):
    token = _publish(tmp_path, RESNET, remote)
    why = poison(remote, token, tmp_path)
    capfd.readouterr()
    model, outcome = prepare(RESNET, cache_dir=tmp_path / "b")
    assert outcome.outcome == "miss"  # compiled here, not taken from the remote
    assert_correct(model, RESNET)
    warned = warnings_in(capfd.readouterr().err)
    assert len(warned) == 1 and "rejected" in warned[0] and why in warned[0], warned
    stats = counters(tmp_path / "b")
    assert (stats["remote_rejected"], stats["remote_hits"]) == (1, 0)
    if poison in (poison_wrong_mac, poison_other_token):
        # a manifest this machine cannot verify is never replaced (it may be the team's, and
        # this machine's key the wrong one): gc --remote, run with the team key, removes it
        planted = remote.get(f"manifests/{token}")
        _, outcome = prepare(RESNET, cache_dir=tmp_path / "c")
        assert outcome.outcome == "miss" and remote.get(f"manifests/{token}") == planted
        from nncc.cache.remote.gc import collect_remote
        from nncc.settings import remote_settings
        from nncc.cache.remote.tier import RemoteTier

        if poison is poison_wrong_mac:  # a genuine entry too (the other poison made one): gc --remote
            _publish(tmp_path, MLP, remote)  # then knows the key is the team's
        tier = RemoteTier.open(remote_settings())
        try:
            collect_remote(tier)
        finally:
            tier.close()
        _, outcome = prepare(RESNET, cache_dir=tmp_path / "d")
        assert outcome.outcome == "miss"  # compiled, and this time shared
    # a damaged part was written again by the honest compile (same bytes under the same hash)
    healed, outcome = prepare(RESNET, cache_dir=tmp_path / "e")
    assert outcome.outcome == "remote hit"
    assert_correct(healed, RESNET)


@pytest.mark.slow
def test_a_machine_with_the_wrong_key_leaves_the_good_entry_intact(remote, tmp_path, monkeypatch, capfd):
    token = _publish(tmp_path, RESNET, remote)
    good = remote.get(f"manifests/{token}")
    monkeypatch.setenv("NNCC_REMOTE_KEY", "another team's secret, 32 bytes or more")
    flow._tiers.clear()  # a new run
    capfd.readouterr()
    model, outcome = prepare(RESNET, cache_dir=tmp_path / "wrong")
    assert outcome.outcome == "miss"  # compiled for itself
    assert_correct(model, RESNET)
    warned = warnings_in(capfd.readouterr().err)
    assert len(warned) == 1 and "does not verify" in warned[0] and "key" in warned[0], warned
    assert remote.get(f"manifests/{token}") == good  # not uploaded over
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    flow._tiers.clear()
    model, outcome = prepare(RESNET, cache_dir=tmp_path / "right")
    assert outcome.outcome == "remote hit"
    assert_correct(model, RESNET)


@pytest.mark.slow
def test_entries_are_created_once_and_never_replaced(remote):
    from nncc.settings import remote_settings
    from nncc.cache.remote.tier import open_store

    store = open_store(remote_settings())
    try:
        assert store.create("manifests/x", b"first") and not store.create("manifests/x", b"second")
        assert remote.get("manifests/x") == b"first" and store.exists("manifests/x")
        assert not store.exists("manifests/y")
    finally:
        store.close()


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.slow
def test_without_a_key_the_tier_is_off_with_one_warning(remote, tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("NNCC_REMOTE_KEY")
    for folder in ("a", "b"):
        _, outcome = prepare(MLP, cache_dir=tmp_path / folder)
        assert outcome.outcome == "miss"
    warned = warnings_in(capfd.readouterr().err)
    assert len(warned) == 1 and "no key" in warned[0] and "off" in warned[0]
    assert remote.keys("manifests/") == []  # nothing was uploaded without the key


@pytest.mark.slow
def test_key_file(remote, tmp_path, monkeypatch, cli):
    key_file = tmp_path / "team.key"
    code, out, _ = cli("cache", "remote", "keygen", key_file)
    assert code == 0 and out.strip() == str(key_file)
    assert key_file.stat().st_mode & 0o777 == 0o600 and len(key_file.read_text().strip()) == 64
    code, _, err = cli("cache", "remote", "keygen", key_file)  # a key is never replaced
    assert code == 2 and "exists" in err
    monkeypatch.delenv("NNCC_REMOTE_KEY")
    monkeypatch.setenv("NNCC_REMOTE_KEY_FILE", str(key_file))
    _publish(tmp_path, MLP, remote)
    _, outcome = prepare(MLP, cache_dir=tmp_path / "b")
    assert outcome.outcome == "remote hit"
    other = tmp_path / "other.key"  # entries signed by one team are not another's
    cli("cache", "remote", "keygen", other)
    monkeypatch.setenv("NNCC_REMOTE_KEY_FILE", str(other))
    flow._tiers.clear()
    _, outcome = prepare(MLP, cache_dir=tmp_path / "c")
    assert outcome.outcome == "miss"


@pytest.mark.parametrize("how", ["short key", "short key file", "readable key file"])
def test_weak_keys_and_readable_key_files_are_refused(tmp_path, monkeypatch, cli, how):
    monkeypatch.setenv("NNCC_REMOTE", f"file://{tmp_path}")
    key_file = tmp_path / "team.key"
    if how == "short key":
        monkeypatch.setenv("NNCC_REMOTE_KEY", "a")
    else:
        key_file.write_text("a" * 31 + "\n" if how == "short key file" else KEY + "\n")
        key_file.chmod(0o600 if how == "short key file" else 0o644)
        monkeypatch.setenv("NNCC_REMOTE_KEY_FILE", str(key_file))
    code, _, err = cli("run", MLP, "--random-inputs", "--cache-dir", tmp_path / "a")
    assert code == 2 and err.count("\n") == 1 and err.startswith("nncc: error:"), err
    assert ("chmod 600" in err) if how == "readable key file" else ("at least 32" in err and "keygen" in err)
    assert not (tmp_path / "manifests").exists()  # nothing was shared under a key others may know


def test_unknown_scheme_and_missing_client_are_one_clear_error(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    code, _, err = cli("run", MLP, "--random-inputs", "--remote", "ftp://somewhere/cache",
                       "--cache-dir", tmp_path / "a")
    assert code == 2 and err.count("\n") == 1 and "unknown scheme 'ftp'" in err
    monkeypatch.setitem(__import__("sys").modules, "redis", None)  # as if nncc[redis] were not installed
    flow._tiers.clear()
    code, _, err = cli("run", MLP, "--random-inputs", "--remote", "redis://127.0.0.1:1/0",
                       "--cache-dir", tmp_path / "b")
    assert code == 2 and "Redis client" in err and "nncc[redis]" in err


@pytest.mark.slow
def test_a_local_hit_imports_no_remote_code(remote, tmp_path):
    """The remote is asked only on a local miss: a hit loads neither a store nor its client."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    _, outcome = prepare(MLP, cache_dir=tmp_path / "a")
    script = ("import sys; from nncc.model import prepare; "
              f"_, o = prepare({str(MLP)!r}, cache_dir={str(tmp_path / 'a')!r}); "
              "print(o.outcome, sorted(m for m in sys.modules if m.startswith(('redis', 'nncc.cache.remote', "
              "'http.client', 'xml'))))")
    import os

    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, check=True)
    assert done.stdout.split(" ", 1) == ["hit", "[]\n"], done.stdout


def test_messages_never_show_a_redis_password(tmp_path, monkeypatch, capfd):
    from tests.remote_servers import free_port

    monkeypatch.setenv("NNCC_REMOTE", f"redis://:hunter2@127.0.0.1:{free_port()}/0")  # nothing listens there
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    _, outcome = prepare(MLP, cache_dir=tmp_path / "a")
    err = capfd.readouterr().err
    assert outcome.outcome == "miss" and "failed" in err and "hunter2" not in err


@pytest.mark.slow
def test_leases_are_exclusive_expire_and_are_released_only_by_their_owner(remote):
    import time

    from nncc.settings import remote_settings
    from nncc.cache.remote.tier import open_store

    store = open_store(remote_settings())
    key = "leases/" + "ef" * 32
    try:
        assert store.acquire_lease(key, "machine-a", 30)
        assert not store.acquire_lease(key, "machine-b", 30)  # held: one compile at a time
        store.release_lease(key, "machine-b")  # not b's to release
        assert not store.acquire_lease(key, "machine-b", 30)
        assert store.renew_lease(key, "machine-a", 0.5) and not store.renew_lease(key, "machine-b", 30)
        time.sleep(1.0)  # machine-a died: its lease expires and b takes over
        assert store.acquire_lease(key, "machine-b", 30)
        assert not store.renew_lease(key, "machine-a", 30)
        store.release_lease(key, "machine-b")
        assert store.acquire_lease(key, "machine-c", 30)
    finally:
        store.close()


@pytest.mark.slow
def test_remote_native_code_runs_only_when_trusted(remote, tmp_path, monkeypatch, capsys, cli):
    if find_toolchain() is None:
        pytest.skip("no C compiler: no native code to trust or not")
    from nncc.model import load, read_artifact

    _, first = prepare(RESNET, cache_dir=tmp_path / "a", stage="optimized")  # the team's native entry
    capsys.readouterr()
    # without remote.trust_native (the default) it is not even looked up: built here
    model, outcome = prepare(RESNET, cache_dir=tmp_path / "b", stage="optimized")
    assert outcome.outcome == "miss" and model.native_partitions >= 1
    with Cache.open(tmp_path / "b") as c:
        assert c.index.get(first.token).origin == "local"
    # and taken by hand, it is refused with one line saying why
    code, _, err = cli("cache", "pull", first.token, "--cache-dir", tmp_path / "c")
    assert code == 1 and "remote.trust_native is off" in err
    with Cache.open(tmp_path / "c") as c:
        assert c.index.entries() == []
    # trusted: it runs, is recorded as the remote's, and is never signed as the user's
    monkeypatch.setenv("NNCC_REMOTE_TRUST_NATIVE", "yes")
    model, outcome = prepare(RESNET, cache_dir=tmp_path / "d", stage="optimized")
    assert outcome.outcome == "remote hit" and model.native_partitions >= 1
    assert_correct(model, RESNET)
    capsys.readouterr()
    artifact = artifact_bytes(model)
    assert "not signed" in capsys.readouterr().err
    assert read_artifact(artifact, "out.nncc").seal is None
    assert load(artifact).native_partitions == 0  # the user's nncc does not run it unasked
    code, out, _ = cli("cache", "ls", "--wide", "--cache-dir", tmp_path / "d")
    assert code == 0 and "origin" in out and "remote" in out
    code, out, _ = cli("cache", "ls", "--json", "--cache-dir", tmp_path / "d")
    assert json.loads(out)["entries"][0]["origin"] == f"remote {remote.url}"
    # trust withdrawn: the adopted entry's portable plan runs, with one line saying why
    monkeypatch.setenv("NNCC_REMOTE_TRUST_NATIVE", "no")
    model, outcome = prepare(RESNET, cache_dir=tmp_path / "d", stage="optimized")
    assert outcome.outcome == "hit" and model.native_partitions == 0
    assert_correct(model, RESNET)
    warned = warnings_in(capsys.readouterr().err)
    assert len(warned) == 1 and "remote.trust_native is off" in warned[0]


@pytest.mark.slow
def test_gc_with_the_wrong_key_removes_nothing(remote, tmp_path, monkeypatch, cli):
    token = _publish(tmp_path, MLP, remote)
    good = remote.get(f"manifests/{token}")
    monkeypatch.setenv("NNCC_REMOTE_KEY", "another team's secret, 32 bytes or more")
    code, _, err = cli("cache", "gc", "--remote", "--max-age", "0s")
    assert code == 2 and "none of the 1 remote entries verifies" in err, err
    assert remote.get(f"manifests/{token}") == good
