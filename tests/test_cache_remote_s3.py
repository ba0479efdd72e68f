"""The S3 store through botocore, against moto's S3 server on loopback: the AWS credential
chain (a shared credentials file and a profile, no variables), multipart uploads of large
objects, and conditional creates."""

from __future__ import annotations

import pytest

from nncc.model import prepare
from tests.remote_servers import ACCESS, KEY, MotoServer, fresh_remote_state  # noqa: F401
from tests.test_cache import MLP, assert_correct


@pytest.fixture
def moto(tmp_path):
    server = MotoServer()
    yield server
    server.stop()


@pytest.mark.slow
def test_credentials_come_from_a_shared_file_and_profile(moto, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "credentials").write_text("[team]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    (tmp_path / "config").write_text("[profile team]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "team")
    monkeypatch.setenv("NNCC_REMOTE", moto.url)
    monkeypatch.setenv("NNCC_S3_ENDPOINT", moto.endpoint)
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    _, first = prepare(MLP, cache_dir=tmp_path / "a")
    assert first.outcome == "miss" and first.remote_note is None  # shared, no fault
    model, second = prepare(MLP, cache_dir=tmp_path / "b")
    assert second.outcome == "remote hit"
    assert_correct(model, MLP)


@pytest.mark.slow
def test_large_objects_go_up_in_parts_and_creates_never_replace(moto, monkeypatch):
    from nncc.cache.remote import s3_store

    for name, value in ACCESS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(s3_store, "MULTIPART_THRESHOLD", 5 << 20)
    monkeypatch.setattr(s3_store, "PART_SIZE", 5 << 20)  # S3's smallest part
    store = s3_store.S3Store(moto.url, "team-cache", "/nncc", moto.endpoint, 10.0)
    try:
        import os

        data = os.urandom((11 << 20) + 123)  # three parts
        store.put("parts/big", data)
        head = moto.client.head_object(Bucket="team-cache", Key="nncc/parts/big")
        assert head["ETag"].strip('"').endswith("-3")  # S3 names a multipart object's ETag by its part count
        assert moto.client.get_object(Bucket="team-cache", Key="nncc/parts/big")["Body"].read() == data
        assert store.get("parts/big") == data and store.exists("parts/big") and not store.exists("parts/none")
        assert store.create("manifests/m", b"first") and not store.create("manifests/m", b"second")
        assert store.get("manifests/m") == b"first"
        assert [item.key for item in store.list("parts/")] == ["parts/big"]
    finally:
        store.close()
