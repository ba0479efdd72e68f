"""The remote tier's settings: passwords masked in every output, the config file private,
and every remote setting checked when a command starts, not on its first local miss."""

from __future__ import annotations

import json
import stat

import pytest

from tests.test_cache import MLP

SECRET_URL = "redis://:hunter2@127.0.0.1:6379/0"


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "config" / "config.toml"
    monkeypatch.setenv("NNCC_CONFIG_FILE", str(path))
    return path


def test_passwords_are_masked_everywhere_and_the_config_file_is_private(cli, config_file):
    code, out, err = cli("config", "set", "remote.url", SECRET_URL)
    assert code == 0 and "hunter2" not in out + err and "redis://:***@127.0.0.1:6379/0" in err
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600  # it holds the password
    assert "hunter2" in config_file.read_text()  # stored as given: it is the setting
    code, out, err = cli("config", "set", "remote.url", SECRET_URL, "--json")
    assert code == 0 and "hunter2" not in out + err and json.loads(out)["value"] == "redis://:***@127.0.0.1:6379/0"
    for args in (("config", "show"), ("config", "show", "--json")):
        code, out, err = cli(*args)
        assert code == 0 and "hunter2" not in out + err and "***" in out + err
    config_file.chmod(0o644)  # made readable by hand: the next write makes it private again
    assert cli("config", "set", "remote.timeout", "5")[0] == 0
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    code, _, err = cli("config", "set", "remote.url", "redis://:hunter2@127.0.0.1:6379/db0")
    assert code == 2 and "hunter2" not in err and "not a number" in err


@pytest.mark.parametrize("key, value, why", [
    ("remote.url", "redsi://x", "unknown scheme"),
    ("remote.url", "redis:///0", "name the host"),
    ("remote.url", "redis://host/zero", "not a number"),
    ("remote.url", "s3:///prefix", "name the bucket"),
    ("remote.url", "file://relative/path", "absolute"),
    ("remote.lease", "0.0001", "from 1 to 86400"),
    ("remote.timeout", "0", "from 0.1 to 600"),
    ("remote.wait", "1e9", "from 0.1 to 86400"),
    ("remote.trust_native", "maybe", "use 1, yes"),
])
def test_bad_remote_settings_are_refused_by_config_set(cli, config_file, key, value, why):
    code, _, err = cli("config", "set", key, value)
    assert code == 2 and why in err and err.startswith("nncc: error:"), err
    assert not config_file.exists()  # nothing was written


def test_remote_settings_are_checked_when_a_run_starts(cli, tmp_path, monkeypatch):
    """Checked before anything runs, even when the model is a local hit and the remote
    would never be asked."""
    cache = tmp_path / "cache"
    assert cli("run", MLP, "--random-inputs", "--cache-dir", cache)[0] == 0
    monkeypatch.setenv("NNCC_REMOTE", "file:///shared")
    monkeypatch.setenv("NNCC_REMOTE_LEASE", "0.0001")
    code, _, err = cli("run", MLP, "--random-inputs", "--cache-dir", cache)
    assert code == 2 and err.count("\n") <= 2 and "NNCC_REMOTE_LEASE" in err, err
    monkeypatch.delenv("NNCC_REMOTE_LEASE")
    monkeypatch.setenv("NNCC_REMOTE", "redis://:hunter2@host/zero")
    code, _, err = cli("run", MLP, "--random-inputs", "--cache-dir", cache)
    assert code == 2 and "NNCC_REMOTE" in err and "hunter2" not in err, err
    monkeypatch.delenv("NNCC_REMOTE")
    code, _, err = cli("run", MLP, "--random-inputs", "--cache-dir", cache, "--remote", "redsi://x")
    assert code == 2 and "--remote" in err and "unknown scheme" in err, err
