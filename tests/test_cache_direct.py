"""A cache hit whose cost does not grow with the model: direct-mode tokens (the model file is
found by its identity and not read) and the data cache checked by chunks.

Reads are observed with a Python audit hook on "open" events: the real file system calls,
not a stand-in. Outputs are checked against onnxruntime.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

from nncc.cache import direct
from nncc.cache.files import CHUNK_BYTES
from nncc.model import prepare
from nncc.cache.store import Cache
from nncc.cache.verify import verify
from tests.models import matmul_model
from tests.oracle import ort_run


_OPENED: list[str] = []
_WATCH: set[str] = set()


def _audit(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0]) if not isinstance(args[0], int) else ""
        if path in _WATCH:
            _OPENED.append(path)


sys.addaudithook(_audit)


def opened_during(fn, *paths):
    """(fn's result, the watched paths it opened)."""
    _WATCH.clear()
    _WATCH.update(str(p) for p in paths)
    _OPENED.clear()
    try:
        result = fn()
    finally:
        _WATCH.clear()
    return result, list(_OPENED)


def aged(path: pathlib.Path) -> pathlib.Path:
    """Wait until ``path``'s change time is older than direct mode's guard. (A user's
    model was written long before it is run; ctime cannot be set back.)"""
    wait = os.stat(path).st_ctime + direct.TOO_NEW + 0.05 - time.time()
    if wait > 0:
        time.sleep(wait)
    return path


def reference(model, feeds):
    return ort_run(model, feeds)


def x_for(rows: int) -> dict:
    return {"x": np.random.default_rng(3).standard_normal((2, rows)).astype(np.float32)}


def check(model, path, rows):
    got = model.run(x_for(rows))["y"]
    np.testing.assert_allclose(got, reference(path, x_for(rows))[0], rtol=1e-4, atol=1e-4)


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


# -- direct mode ---------------------------------------------------------------------------


@pytest.mark.slow
def test_direct_hit_reads_neither_the_model_nor_its_external_data(tmp_path, cache_dir):
    path = matmul_model(tmp_path / "m", 64, 16, external=True)
    weights = tmp_path / "m" / "weights.bin"
    aged(weights), aged(path)
    (model, first), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path, weights)
    assert first.outcome == "miss" and str(path) in opened and str(weights) in opened
    (model, hit), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path, weights)
    assert hit.outcome == "hit" and hit.token == first.token
    assert opened == []  # found by identity: nothing of the model was read
    check(model, path, 64)


@pytest.mark.slow
def test_content_mode_always_reads_the_model(tmp_path, cache_dir, monkeypatch):
    path = aged(matmul_model(tmp_path, 64, 16))
    prepare(path, cache_dir=cache_dir)
    (_, hit), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir, hash_mode="content"), path)
    assert hit.outcome == "hit" and opened == [str(path)]
    monkeypatch.setenv("NNCC_CACHE_HASH_MODE", "content")
    (_, hit), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path)
    assert hit.outcome == "hit" and opened == [str(path)]
    monkeypatch.delenv("NNCC_CACHE_HASH_MODE")
    config = tmp_path / "config.toml"
    config.write_text('[cache]\nhash_mode = "content"\n')
    monkeypatch.setenv("NNCC_CONFIG_FILE", str(config))
    (_, hit), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path)
    assert hit.outcome == "hit" and opened == [str(path)]


@pytest.mark.slow
def test_a_model_changed_in_place_is_hashed_again(tmp_path, cache_dir):
    path = aged(matmul_model(tmp_path, 64, 16, seed=0))
    _, first = prepare(path, cache_dir=cache_dir)
    size = path.stat().st_size
    # new weights, same size, same inode: the identity (times) differs, so it is hashed
    other = matmul_model(tmp_path / "other", 64, 16, seed=1)
    with open(path, "r+b") as f:
        f.write(other.read_bytes())
    assert path.stat().st_size == size
    (model, changed), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path)
    assert changed.outcome == "miss" and changed.token != first.token and opened
    check(model, path, 64)


@pytest.mark.slow
def test_touched_but_unchanged_model_keeps_its_entry(tmp_path, cache_dir):
    path = aged(matmul_model(tmp_path, 64, 16))
    _, first = prepare(path, cache_dir=cache_dir)
    os.utime(path)  # new times, same bytes: hashed again, same token, still a hit
    (model, again), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path)
    assert again.outcome == "hit" and again.token == first.token and opened
    check(model, path, 64)


@pytest.mark.slow
def test_changed_external_data_is_hashed_again(tmp_path, cache_dir):
    path = aged(matmul_model(tmp_path / "m", 64, 16, seed=0, external=True))
    weights = tmp_path / "m" / "weights.bin"
    _, first = prepare(path, cache_dir=cache_dir)
    raw = np.frombuffer(weights.read_bytes(), np.float32) * 2
    weights.write_bytes(raw.tobytes())  # the model file itself is untouched
    (model, changed), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path, weights)
    assert changed.outcome == "miss" and changed.token != first.token and str(weights) in opened
    check(model, path, 64)


@pytest.mark.slow
def test_a_new_file_in_the_models_folder_is_looked_at(tmp_path, cache_dir):
    """External data is searched for in the model's folder: a file that appears there
    (it could be the one a location names) makes direct mode hash again."""
    path = aged(matmul_model(tmp_path / "m", 64, 16, external=True))
    aged(tmp_path / "m" / "weights.bin")
    prepare(path, cache_dir=cache_dir)
    (tmp_path / "m" / "notes.txt").write_text("x")
    (_, again), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path)
    assert again.outcome == "hit" and opened == [str(path)]


def test_a_just_written_model_is_not_remembered(tmp_path, cache_dir):
    """ccache's guard: an identity that changed moments before it was hashed may change
    again within one time-stamp tick, so it is not recorded."""
    path = matmul_model(tmp_path, 64, 16)  # written now
    prepare(path, cache_dir=cache_dir)
    with Cache.open(cache_dir) as c:
        assert c.index.conn.execute("SELECT count(*) FROM manifest").fetchone()[0] == 0
    (_, hit), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path)
    assert hit.outcome == "hit" and opened == [str(path)]


@pytest.mark.slow
def test_the_same_file_under_other_options_is_another_lookup(tmp_path, cache_dir):
    path = aged(matmul_model(tmp_path, 64, 16))
    _, a = prepare(path, cache_dir=cache_dir)
    prepare(path, cache_dir=cache_dir)
    (_, b), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir, opt_level=0), path)
    assert b.outcome == "miss" and b.token != a.token and opened == [str(path)]


@pytest.mark.slow
def test_the_manifest_row_goes_with_its_entry(tmp_path, cache_dir):
    path = aged(matmul_model(tmp_path, 64, 16))
    _, first = prepare(path, cache_dir=cache_dir)
    with Cache.open(cache_dir) as c:
        assert c.index.conn.execute("SELECT token FROM manifest").fetchall() == [(first.token,)]
        c.remove(first.token)
        assert c.index.conn.execute("SELECT count(*) FROM manifest").fetchone()[0] == 0
    (model, again), opened = opened_during(lambda: prepare(path, cache_dir=cache_dir), path)
    assert again.outcome == "miss" and opened
    check(model, path, 64)


@pytest.mark.slow
def test_cli_run_hit_does_not_read_the_model(tmp_path, cache_dir):
    path = aged(matmul_model(tmp_path, 64, 16))
    env = dict(os.environ, NNCC_CACHE_DIR=str(cache_dir))
    # the hook reports each open at once: nncc may leave with os._exit
    script = ("import os, sys, runpy\n"
              "model = sys.argv[1]\n"
              "sys.addaudithook(lambda e, a: os.write(2, b'OPENED-MODEL\\n') "
              "if e == 'open' and a and a[0] == model else None)\n"
              "sys.argv = ['nncc', 'run', model, '--random-inputs', '--json']\n"
              "runpy.run_module('nncc', run_name='__main__')\n")
    outcomes = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        outcomes.append((json.loads(done.stdout)["cache"]["outcome"], done.stderr.count("OPENED-MODEL")))
    # one open to look at the first bytes (is it an artifact?), one to read the model;
    # the hit only looks
    assert outcomes == [("miss", 2), ("hit", 1)]


def test_bad_hash_mode_is_a_usage_error(tmp_path):
    path = matmul_model(tmp_path, 8, 4)
    done = subprocess.run([sys.executable, "-m", "nncc", "run", str(path), "--random-inputs"],
                          env=dict(os.environ, NNCC_CACHE_HASH_MODE="sometimes", NNCC_CACHE_DIR=str(tmp_path / "c")),
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("nncc: error: bad hash mode 'sometimes' in NNCC_CACHE_HASH_MODE")


# -- the data cache: checked by chunks on a hit, whole by `cache verify` ---------------------


def _data_file(cache_dir, token) -> pathlib.Path:
    return pathlib.Path(Cache(str(cache_dir)).paths(token)[1])


def _flip(path: pathlib.Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.slow
def test_a_flipped_data_bit_is_found_by_the_spot_checks_then_recompiled(tmp_path, cache_dir):
    """A data cache of several chunks: each hit hashes one chosen at random. A changed
    byte gives (at worst) wrong values until the check lands on its chunk; the entry is
    then rejected and recompiled, and `cache verify` finds it at once."""
    rows, cols = 1024, 768  # 3 MiB of weights: three chunks
    path = matmul_model(tmp_path, rows, cols)
    _, first = prepare(path, cache_dir=cache_dir)
    data = _data_file(cache_dir, first.token)
    assert data.stat().st_size > 2 * CHUNK_BYTES
    _flip(data, CHUNK_BYTES + 12345)
    with Cache.open(cache_dir) as c:
        report = verify(c)
        assert not report.ok and any(f.token == first.token for f in report.problems)
    served = 0
    for _ in range(200):  # a miss 200 times in a row has odds of (2/3)**200
        model, outcome = prepare(path, cache_dir=cache_dir)
        if outcome.outcome == "recompiled":
            assert "chunk 1" in outcome.detail
            break
        assert outcome.outcome == "hit"
        served += 1
        model.run(x_for(rows))  # wrong values at worst; it runs
    else:
        pytest.fail("200 hits never checked the changed chunk")
    check(model, path, rows)
    with Cache.open(cache_dir) as c:
        assert verify(c).ok


def test_small_data_cache_is_checked_whole_on_every_hit(tmp_path, cache_dir):
    path = matmul_model(tmp_path, 64, 16)
    _, first = prepare(path, cache_dir=cache_dir)
    _flip(_data_file(cache_dir, first.token), 100)
    model, outcome = prepare(path, cache_dir=cache_dir)
    assert outcome.outcome == "recompiled" and "data cache chunk 0" in outcome.detail
    check(model, path, 64)


@pytest.mark.parametrize("change", ["truncate", "extend"])
def test_a_data_cache_of_another_size_is_rejected(tmp_path, cache_dir, change):
    path = matmul_model(tmp_path, 64, 16)
    _, first = prepare(path, cache_dir=cache_dir)
    data = _data_file(cache_dir, first.token)
    raw = data.read_bytes()
    data.write_bytes(raw[:-64] if change == "truncate" else raw + b"\0" * 64)
    model, outcome = prepare(path, cache_dir=cache_dir)
    assert outcome.outcome == "recompiled" and "bytes, the index recorded" in outcome.detail
    check(model, path, 64)


def test_the_indexed_full_data_hash_is_what_verify_checks(tmp_path, cache_dir):
    """A hit checks chunks; the whole-file hash in the index is `cache verify`'s."""
    path = matmul_model(tmp_path, 64, 16)
    _, first = prepare(path, cache_dir=cache_dir)
    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    conn.execute("UPDATE entries SET data_hash = ? WHERE token = ?", ("f" * 64, first.token))
    conn.commit()
    conn.close()
    model, outcome = prepare(path, cache_dir=cache_dir)
    assert outcome.outcome == "hit"
    check(model, path, 64)  # the data itself is intact
    with Cache.open(cache_dir) as c:
        report = verify(c)
        assert [f.token for f in report.problems] == [first.token]


@pytest.mark.slow
def test_flipped_data_bits_never_crash_a_run(tmp_path, cache_dir):
    """Whatever byte of the data cache changes, a run gives values or a recompile, in a
    process that exits normally: the data cache steers no address and no branch."""
    rows, cols = 1024, 768
    path = matmul_model(tmp_path, rows, cols)
    _, first = prepare(path, cache_dir=cache_dir)
    data = _data_file(cache_dir, first.token)
    size = data.stat().st_size
    pristine = data.read_bytes()
    rng = np.random.default_rng(11)
    env = dict(os.environ, NNCC_CACHE_DIR=str(cache_dir))
    for offset in sorted(rng.integers(0, size, 6)):
        data.write_bytes(pristine)
        _flip(data, int(offset))
        done = subprocess.run([sys.executable, "-m", "nncc", "run", str(path), "--random-inputs", "-q"],
                              env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
    shutil.rmtree(cache_dir)
