"""A filled cache on storage nncc cannot write (a read-only mount, a shared cache owned by
someone else) still serves verified hits, writes nothing, and degrades to an in-memory
compile for what it does not hold or what fails verification.

The read-only view is real: directories made 0555 for an ordinary user, or, for root (for
whom permission bits do not apply), a read-only bind mount of the cache.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pathlib
import subprocess

import pytest

from nncc.model import prepare
from nncc.cache.store import Cache
from tests.test_cache import MLP, RESNET, assert_correct, warnings_in


@contextlib.contextmanager
def read_only_view(source: pathlib.Path, scratch: pathlib.Path):
    """``source`` as a directory tree this process cannot write into."""
    if os.geteuid() != 0:
        folders = [source, *(p for p in source.rglob("*") if p.is_dir())]
        for folder in folders:
            folder.chmod(0o555)
        try:
            yield source
        finally:
            for folder in folders:
                folder.chmod(0o755)
        return
    view = scratch / "read-only-view"
    view.mkdir()
    bind = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True, text=True)
    if bind.returncode:
        pytest.skip(f"root, and bind mounts are not permitted here: {bind.stderr.strip()}")
    try:
        remount = subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True, text=True)
        if remount.returncode:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
        assert not os.access(view, os.W_OK)
        yield view
    finally:
        if subprocess.run(["umount", str(view)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(view)], check=True)  # a mapping still open


def snapshot(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def filled(tmp_path, capsys) -> pathlib.Path:
    cache = tmp_path / "cache"
    _, outcome = prepare(MLP, cache_dir=cache)
    assert outcome.outcome == "miss"
    capsys.readouterr()
    return cache


def test_read_only_cache_serves_verified_hits_and_writes_nothing(filled, tmp_path, capsys):
    before = snapshot(filled)
    with read_only_view(filled, tmp_path) as view:
        for _ in range(2):
            model, outcome = prepare(MLP, cache_dir=view)
            assert outcome.outcome == "hit"
            assert_correct(model, MLP)
        assert warnings_in(capsys.readouterr().err) == []
        del model  # its constants are mapped from the view
        gc.collect()
    assert snapshot(filled) == before  # no hit counts, no locks, no gc, no probe files


def test_read_only_cache_without_the_entry_compiles_in_memory(filled, tmp_path, capsys):
    before = snapshot(filled)
    with read_only_view(filled, tmp_path) as view:
        model, outcome = prepare(RESNET, cache_dir=view)
        assert outcome.outcome == "unavailable" and "read-only" in outcome.detail
        assert_correct(model, RESNET)
        assert len(warnings_in(capsys.readouterr().err)) == 1
    assert snapshot(filled) == before


def test_read_only_cache_never_executes_a_tampered_entry(filled, tmp_path, capsys):
    plan_file = next(p for p in filled.rglob("*") if p.is_file() and p.suffix == ".plan")
    data = bytearray(plan_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    plan_file.write_bytes(bytes(data))  # through the writable original
    with read_only_view(filled, tmp_path) as view:
        model, outcome = prepare(MLP, cache_dir=view)
        assert outcome.outcome == "unavailable" and "rejected" in outcome.detail
        assert_correct(model, MLP)
        assert len(warnings_in(capsys.readouterr().err)) == 1


def test_read_only_cache_of_another_version_does_not_serve(filled, tmp_path, monkeypatch, capsys):
    import nncc._version

    monkeypatch.setattr(nncc._version, "__version__", "0.0.0-other")
    with read_only_view(filled, tmp_path) as view:
        model, outcome = prepare(MLP, cache_dir=view)
        assert outcome.outcome == "unavailable" and "another nncc version" in outcome.detail
        assert_correct(model, MLP)


def test_cache_commands_still_refuse_a_read_only_cache(filled, tmp_path):
    """Only prepare reads a read-only cache: the management commands need to write."""
    from nncc.cache.store import CacheUnavailable

    with read_only_view(filled, tmp_path) as view:
        with pytest.raises(CacheUnavailable, match="not writable"):
            Cache.open(view)


@pytest.mark.slow
def test_cache_ls_and_info_read_a_read_only_cache(filled, tmp_path):
    import json
    import sys

    from tests.conftest import ROOT

    def nncc(*args):
        done = subprocess.run([sys.executable, "-m", "nncc", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        return done

    with read_only_view(filled, tmp_path) as view:
        ls = nncc("cache", "ls", "--cache-dir", str(view), "--json")
        assert ls.returncode == 0, ls.stderr
        assert [e["source_path"].endswith("mlp.onnx") for e in json.loads(ls.stdout)["entries"]] == [True]
        info = nncc("cache", "info", "--cache-dir", str(view), "--json")
        assert info.returncode == 0, info.stderr
        report = json.loads(info.stdout)
        assert report["read_only"] is True and report["entries"] == 1
        text = nncc("cache", "info", "--cache-dir", str(view))
        assert "Read-only" in text.stdout
        gc = nncc("cache", "gc", "--cache-dir", str(view))  # must write: a clear one-line error
        assert gc.returncode != 0 and gc.stderr.startswith("nncc: error: cannot open the cache")
