"""The compilation cache through the Python API: token, flows, tampering, degradation, gc.

Real files, a real sqlite index, real fixture models. Outputs are checked against
onnxruntime on the same inputs.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

import nncc
import nncc._version
import nncc.cache
from nncc.cache import files as files_mod
import nncc.model as model_mod
from nncc.cache import store as store_mod
from nncc.cache.gc import collect
from nncc.cache.limits import after_store
from nncc.settings import cache_settings, parse_age, parse_size
from nncc.cache.index import SCHEMA_VERSION, Index
from nncc.cache.locking import FileLock, LockBusy, try_lock
from nncc.model import prepare
from nncc.cache.store import Cache
from nncc.preparing.token import compute_token, external_files
from nncc.cache.verify import verify
from nncc.compiler import CompileOptions
from tests.conftest import FIXTURES, ROOT
from tests.oracle import ort_outputs, ort_run


MLP = FIXTURES / "mlp.onnx"
RESNET = FIXTURES / "resnet_block.onnx"
RTOL, ATOL = 1e-3, 1e-4


def feeds_for(model: pathlib.Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    if model.name == "mlp.onnx":
        return {"x": rng.standard_normal((3, 64)).astype(np.float32)}
    if model.name.endswith("resnet_block.onnx"):
        return {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    raise KeyError(model.name)


_REFERENCE: dict[str, dict[str, np.ndarray]] = {}


def reference(model: pathlib.Path) -> dict[str, np.ndarray]:
    if str(model) not in _REFERENCE:
        _REFERENCE[str(model)] = ort_outputs(model, feeds_for(model))
    return _REFERENCE[str(model)]


def assert_matches_reference(got: dict, model: pathlib.Path) -> None:
    want = reference(model)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


def assert_correct(compiled, model: pathlib.Path) -> None:
    assert_matches_reference(compiled.run(feeds_for(model)), model)


def check_outputs(npz: pathlib.Path, model: pathlib.Path) -> None:
    """The outputs a CLI run saved to ``npz`` agree with the reference."""
    assert_matches_reference(dict(np.load(npz)), model)


@pytest.fixture
def cache_dir(tmp_path) -> pathlib.Path:
    return tmp_path / "cache"


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if "warning" in line]


def open_cache(cache_dir) -> Cache:
    return Cache.open(cache_dir)


def only_entry(cache_dir):
    with open_cache(cache_dir) as c:
        entries = c.index.entries()
    assert len(entries) == 1
    return entries[0]


def counters(cache_dir) -> dict[str, int]:
    with open_cache(cache_dir) as c:
        return c.index.counters()


# -- the three flows -----------------------------------------------------------------


def test_miss_then_hit(cache_dir, capsys):
    model, outcome = prepare(MLP, cache_dir=cache_dir)
    assert outcome.outcome == "miss" and len(outcome.token) == 64 and outcome.seconds > 0
    assert_correct(model, MLP)
    model, outcome2 = prepare(MLP, cache_dir=cache_dir)
    assert outcome2.outcome == "hit" and outcome2.token == outcome.token
    assert_correct(model, MLP)
    entry = only_entry(cache_dir)
    assert entry.token == outcome.token and entry.hits == 1
    assert entry.source_path == str(MLP) and entry.preference == "fast-single-answer"
    assert entry.nncc_version == nncc.__version__ and entry.compile_seconds > 0
    plan, data = Cache(str(cache_dir)).paths(entry.token)
    assert os.path.getsize(plan) == entry.plan_size and os.path.getsize(data) == entry.data_size
    assert pathlib.Path(plan).parent.name == entry.token[:2]
    assert counters(cache_dir) == {"hits": 1, "misses": 1, "corruptions": 0, "recompiles": 0, "evictions": 0, "remote_hits": 0, "remote_misses": 0, "remote_rejected": 0, "remote_errors": 0,
                                   "upgrades": 0}
    assert warnings_in(capsys.readouterr().err) == []


def test_hit_shares_data_cache_by_mmap(cache_dir):
    prepare(RESNET, cache_dir=cache_dir)
    model, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "hit"
    model_bytes, data = model.cache_parts
    assert isinstance(model_bytes, bytes)
    import mmap

    assert isinstance(data, mmap.mmap)
    big = [a for a in model.plan.constants.values() if a.nbytes > 1024]
    assert big and all(not a.flags.owndata for a in big)  # views into the mapping
    assert_correct(model, RESNET)


def test_no_cache_reads_and_writes_nothing(cache_dir):
    model, outcome = prepare(MLP, cache_dir=cache_dir, use_cache=False)
    assert outcome.outcome == "disabled" and outcome.token is None
    assert_correct(model, MLP)
    assert not cache_dir.exists()
    prepare(MLP, cache_dir=cache_dir)
    model, outcome = prepare(MLP, cache_dir=cache_dir, use_cache=False)
    assert outcome.outcome == "disabled"
    assert counters(cache_dir)["hits"] == 0


def test_env_var_and_default_location(tmp_path, monkeypatch):
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path / "from-env"))
    _, outcome = prepare(MLP)
    assert outcome.directory == str(tmp_path / "from-env")
    assert (tmp_path / "from-env" / "index.sqlite3").exists()
    assert (tmp_path / "from-env" / "CACHEDIR.TAG").read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55")
    monkeypatch.delenv("NNCC_CACHE_DIR")
    import platformdirs

    import nncc.settings

    assert nncc.settings.cache_dir() == platformdirs.user_cache_dir("nncc", appauthor=False)
    assert nncc.settings.cache_dir(tmp_path / "x") == str(tmp_path / "x")


def test_nncc_model_prepare_and_options_in_key(cache_dir):
    from nncc.model import prepare as model_prepare

    _, a = model_prepare(MLP, cache_dir=cache_dir)
    _, b = model_prepare(MLP, cache_dir=cache_dir, preference="low-power")
    _, c = model_prepare(MLP, cache_dir=cache_dir, opt_level=0)
    assert len({a.token, b.token, c.token}) == 3
    assert [a.outcome, b.outcome, c.outcome] == ["miss"] * 3
    model, d = model_prepare(MLP, cache_dir=cache_dir, preference="low-power")
    assert d.outcome == "hit" and d.token == b.token
    assert model.plan.options["preference"] == "low-power"


@pytest.mark.slow
def test_artifact_from_cache_is_byte_identical(cache_dir):
    fresh = nncc.compile_model(RESNET).to_bytes()
    m1, o1 = prepare(RESNET, cache_dir=cache_dir, stage="optimized")  # what `nncc compile` stores
    m2, o2 = prepare(RESNET, cache_dir=cache_dir, stage="optimized")
    assert (o1.outcome, o2.outcome) == ("miss", "hit")
    assert model_mod.artifact_bytes(m1) == fresh
    assert model_mod.artifact_bytes(m2) == fresh


@pytest.mark.slow
def test_cached_entry_is_what_compile_produces(cache_dir):
    from nncc.plan.format import serialize_parts

    prepare(RESNET, cache_dir=cache_dir, stage="optimized")
    entry = only_entry(cache_dir)
    plan, data = Cache(str(cache_dir)).paths(entry.token)
    want_plan, want_data = serialize_parts(nncc.compile_model(RESNET).plan)
    assert pathlib.Path(plan).read_bytes() == want_plan
    assert pathlib.Path(data).read_bytes() == want_data


# -- the token -----------------------------------------------------------------------


def test_token_ingredients(tmp_path, monkeypatch):
    data = MLP.read_bytes()
    opts = CompileOptions()
    base = compute_token(MLP, data, opts)
    assert isinstance(base, bytes) and len(base) == 32
    assert compute_token(MLP, data, opts) == base
    # the model's place does not matter, its bytes do
    copy = tmp_path / "elsewhere.onnx"
    shutil.copy(MLP, copy)
    assert compute_token(copy, copy.read_bytes(), opts) == base
    assert compute_token(MLP, data + b"\0", opts) != base
    # every compile option
    for changed in (CompileOptions(preference="sustained-speed"), CompileOptions(preference="low-power"),
                    CompileOptions(opt_level=1), CompileOptions(backends=("numpy", "cpu"))):
        assert compute_token(MLP, data, changed) != base
    # nncc version, format version, backend versions, numpy
    monkeypatch.setattr(nncc._version, "__version__", "9.9.9")
    assert compute_token(MLP, data, opts) != base
    monkeypatch.undo()
    import nncc.plan.format as fmt

    monkeypatch.setattr(fmt, "FORMAT_VERSION", fmt.FORMAT_VERSION + 1)
    assert compute_token(MLP, data, opts) != base
    monkeypatch.undo()
    from nncc.backends.portable import PortableBackend as NumpyBackend

    monkeypatch.setattr(NumpyBackend, "version", "2")
    assert compute_token(MLP, data, opts) != base
    monkeypatch.undo()
    monkeypatch.setattr(np, "__version__", "0.0.1")
    assert compute_token(MLP, data, opts) != base
    monkeypatch.undo()
    assert compute_token(MLP, data, opts) == base


def test_token_covers_loaded_plugins(tmp_path, monkeypatch):
    from nncc.backends import registry

    monkeypatch.setattr(registry, "_PLUGINS", dict(registry._PLUGINS))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "nncc_cache_test_plugin.py").write_text("__version__ = '1.0'\n")
    data = MLP.read_bytes()
    base = compute_token(MLP, data, CompileOptions())
    with_plugin = compute_token(MLP, data, CompileOptions(plugins=("nncc_cache_test_plugin",)))
    assert with_plugin != base
    assert "nncc_cache_test_plugin" in registry.loaded_plugins()
    # a plugin loaded in-process changes the result even if these options do not name it
    assert compute_token(MLP, data, CompileOptions()) != base
    registry._PLUGINS["nncc_cache_test_plugin"] = "2.0"
    assert compute_token(MLP, data, CompileOptions()) not in (base, with_plugin)


def test_code_fingerprint_follows_the_source_contents(tmp_path):
    from nncc.preparing.token import code_fingerprint, forget_fingerprints

    package = tmp_path / "pkg"
    (package / "sub" / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("A = 1\n")
    (package / "sub" / "b.py").write_text("B = 2\n")
    (package / "sub" / "kernel.c").write_text("int f(void) { return 1; }\n")
    (package / "sub" / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"compiled")

    def fingerprint(folder=package):
        forget_fingerprints()  # once per process in nncc; here after each edit
        return code_fingerprint(str(folder))

    base = fingerprint()
    assert fingerprint() == base
    (package / "sub" / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"recompiled")
    (package / "notes.txt").write_text("not code")
    assert fingerprint() == base  # byte code and data files are not the source
    stat = (package / "sub" / "b.py").stat()
    os.utime(package / "sub" / "b.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    assert fingerprint() == base  # touched, not changed: the contents decide
    copy = tmp_path / "elsewhere" / "pkg"
    shutil.copytree(package, copy)  # a byte-identical copy in another folder, with new times
    assert fingerprint(copy) == base
    (package / "a.py").write_text("A = 2\n")  # same size, one byte changed
    edited = fingerprint()
    assert edited != base
    (package / "sub" / "kernel.c").write_text("int f(void) { return 2; }\n")  # the C the native backend builds
    assert fingerprint() not in (base, edited)
    (package / "c.py").write_text("")
    assert fingerprint() not in (base, edited)


def test_code_hashes_are_remembered_by_path_size_and_mtime(tmp_path):
    """An editable checkout is hashed once; later processes read the hashes from the index
    and only re-read a file whose size or mtime changed."""
    from nncc.cache.index import Index
    from nncc.preparing.token import code_fingerprint, forget_fingerprints

    package = tmp_path / "pkg"
    package.mkdir()
    old = 1_600_000_000_000_000_000  # long ago: the hashes may be remembered
    for name, text in (("a.py", "A = 1\n"), ("b.py", "B = 2\n")):
        (package / name).write_text(text)
        os.utime(package / name, ns=(old, old))
    index = Index(str(tmp_path), "test", 1).open()
    try:
        forget_fingerprints()
        base = code_fingerprint(str(package), index)
        remembered = index.code_hashes()
        assert sorted(remembered) == [str(package / "a.py"), str(package / "b.py")]
        import hashlib

        assert remembered[str(package / "a.py")][2] == hashlib.sha256(b"A = 1\n").hexdigest()
        (package / "a.py").write_text("A = 3\n")  # same size, new mtime: read again
        os.utime(package / "a.py", ns=(old + 1, old + 1))
        forget_fingerprints()
        changed = code_fingerprint(str(package), index)
        assert changed != base
        forget_fingerprints()
        assert code_fingerprint(str(package)) == changed  # the memo agrees with hashing afresh
    finally:
        index.close()
        forget_fingerprints()


def test_changed_nncc_code_misses_instead_of_serving_old_plans(cache_dir, monkeypatch, capsys):
    """An editable install changes nncc's code without changing __version__: the entry
    compiled by the old code must not be served."""
    from nncc.preparing import token

    _, first = prepare(MLP, cache_dir=cache_dir)
    _, again = prepare(MLP, cache_dir=cache_dir)
    assert (first.outcome, again.outcome) == ("miss", "hit")
    monkeypatch.setattr(token, "code_fingerprint", lambda package_dir, memo=None: b"other code")
    model, changed = prepare(MLP, cache_dir=cache_dir)
    assert changed.outcome == "miss" and changed.token != first.token
    assert_correct(model, MLP)


def make_external_model(folder: pathlib.Path, scale: float) -> pathlib.Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    w = (np.arange(64 * 16, dtype=np.float32).reshape(64, 16) / 1000.0) * scale
    init = numpy_helper.from_array(w, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return path


def test_external_data_is_in_the_token(tmp_path, cache_dir):
    path = make_external_model(tmp_path / "m", 1.0)
    data = path.read_bytes()
    assert b"location" in data
    files = external_files(path, data)
    assert [rel for rel, _ in files] == ["weights.bin"]
    assert external_files(MLP, MLP.read_bytes()) == []
    x = np.ones((2, 64), np.float32)
    model, first = prepare(path, cache_dir=cache_dir)
    y1 = model.run({"x": x})["y"]
    _, again = prepare(path, cache_dir=cache_dir)
    assert (first.outcome, again.outcome) == ("miss", "hit")
    # new weights, same model file: a new token and the new values
    weights = tmp_path / "m" / "weights.bin"
    weights.write_bytes((np.frombuffer(weights.read_bytes(), np.float32) * 2).tobytes())
    assert path.read_bytes() == data
    model, changed = prepare(path, cache_dir=cache_dir)
    assert changed.outcome == "miss" and changed.token != first.token
    np.testing.assert_allclose(model.run({"x": x})["y"], 2 * y1, rtol=1e-5)
    np.testing.assert_allclose(model.run({"x": x})["y"], ort_run(path, {"x": x})[0], rtol=1e-4)


# -- tampering: detected, never prepared, recompiled, correct --------------------------


def _flip(path: str, offset_fraction: float = 0.5) -> None:
    raw = bytearray(pathlib.Path(path).read_bytes())
    raw[int(len(raw) * offset_fraction)] ^= 0x10
    pathlib.Path(path).write_bytes(bytes(raw))


def _truncate(path: str) -> None:
    raw = pathlib.Path(path).read_bytes()
    pathlib.Path(path).write_bytes(raw[: len(raw) // 2])


def _swap(a: str, b: str) -> None:
    tmp = a + ".swap"
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def _entries(cache_dir) -> dict[str, tuple[str, str]]:
    c = Cache(str(cache_dir))
    with open_cache(cache_dir) as opened:
        return {e.source_path: c.paths(e.token) for e in opened.index.entries()}


def _sql(cache_dir, statement, *args) -> None:
    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    conn.execute(statement, args)
    conn.commit()
    conn.close()


def tamper_plan_bit(cache_dir):
    _flip(_entries(cache_dir)[str(RESNET)][0])


def tamper_plan_header_bit(cache_dir):
    _flip(_entries(cache_dir)[str(RESNET)][0], 0.01)


def tamper_data_bit(cache_dir):
    _flip(_entries(cache_dir)[str(RESNET)][1])


def tamper_truncate_plan(cache_dir):
    _truncate(_entries(cache_dir)[str(RESNET)][0])


def tamper_truncate_data(cache_dir):
    _truncate(_entries(cache_dir)[str(RESNET)][1])


def tamper_swap_entries(cache_dir):
    files = _entries(cache_dir)
    for i in (0, 1):
        _swap(files[str(RESNET)][i], files[str(MLP)][i])


def tamper_swap_plans_only(cache_dir):
    files = _entries(cache_dir)
    _swap(files[str(RESNET)][0], files[str(MLP)][0])


def tamper_replace_plan_with_other_valid_plan(cache_dir):
    files = _entries(cache_dir)
    shutil.copy(files[str(MLP)][0], files[str(RESNET)][0])


def tamper_index_plan_hash(cache_dir):
    _sql(cache_dir, "UPDATE entries SET plan_hash = ? WHERE source_path = ?", "0" * 64, str(RESNET))


def tamper_index_data_hash(cache_dir):
    _sql(cache_dir, "UPDATE entries SET data_hash = ? WHERE source_path = ?", "f" * 64, str(RESNET))


def tamper_index_chunk_hashes(cache_dir):
    with open_cache(cache_dir) as c:
        token = next(e.token for e in c.index.entries() if e.source_path == str(RESNET))
    _sql(cache_dir, "UPDATE chunks SET hashes = zeroblob(length(hashes)) WHERE token = ?", token)


def tamper_index_size(cache_dir):
    _sql(cache_dir, "UPDATE entries SET plan_size = plan_size + 1 WHERE source_path = ?", str(RESNET))


def tamper_delete_data(cache_dir):
    os.unlink(_entries(cache_dir)[str(RESNET)][1])


def tamper_row_version(cache_dir):
    _sql(cache_dir, "UPDATE entries SET nncc_version = '0.0.0-old' WHERE source_path = ?", str(RESNET))


TAMPERINGS = [tamper_plan_bit, tamper_plan_header_bit, tamper_data_bit, tamper_truncate_plan,
              tamper_truncate_data, tamper_swap_entries, tamper_swap_plans_only,
              tamper_replace_plan_with_other_valid_plan, tamper_index_plan_hash, tamper_index_chunk_hashes,
              tamper_index_size, tamper_delete_data, tamper_row_version]


@pytest.mark.slow
@pytest.mark.parametrize("tamper", TAMPERINGS, ids=lambda f: f.__name__.removeprefix("tamper_"))
def test_tampering_is_detected_and_recompiled(tamper, cache_dir, monkeypatch, capsys):
    import nncc.plan.format as fmt

    for model in (RESNET, MLP):
        assert prepare(model, cache_dir=cache_dir)[1].outcome == "miss"
    capsys.readouterr()
    tamper(cache_dir)

    parsed = []
    real = fmt.deserialize
    monkeypatch.setattr(fmt, "deserialize", lambda buf, data=None: parsed.append(bytes(buf)) or real(buf, data=data))
    model, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "recompiled", outcome
    assert parsed == []  # nothing tampered was even parsed, let alone executed
    assert_correct(model, RESNET)
    err = capsys.readouterr().err
    assert len(warnings_in(err)) == 1 and outcome.token[:12] in err
    assert counters(cache_dir)["corruptions"] == 1 and counters(cache_dir)["recompiles"] == 1

    # the fresh entry is good: a verified hit, parsed from the bytes that were hashed
    model, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "hit"
    assert_correct(model, RESNET)
    plan_path = Cache(str(cache_dir)).paths(outcome.token)[0]
    assert parsed == [pathlib.Path(plan_path).read_bytes()]
    # the other model: recompiled if its files were touched, else still a hit; always correct
    model, other = prepare(MLP, cache_dir=cache_dir)
    assert other.outcome == ("recompiled" if tamper in (tamper_swap_entries, tamper_swap_plans_only) else "hit")
    assert_correct(model, MLP)
    with open_cache(cache_dir) as c:
        assert verify(c).ok


def _rescaled_copy(model: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    """The same graph with every float initializer doubled: a plan of identical layout."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(model))
    for i, init in enumerate(proto.graph.initializer):
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32:
            proto.graph.initializer[i].CopyFrom(numpy_helper.from_array(array * 2, init.name))
    path = folder / f"rescaled_{model.name}"
    onnx.save(proto, str(path))
    return path


def test_same_size_plans_swapped_are_caught_by_the_hash(cache_dir, tmp_path, capsys):
    """Two models of identical structure give plans of equal size: only the hash tells them
    apart, and preparing the other one would silently compute the other model."""
    twin = _rescaled_copy(RESNET, tmp_path)
    _, first = prepare(RESNET, cache_dir=cache_dir)
    _, second = prepare(twin, cache_dir=cache_dir)
    c = Cache(str(cache_dir))
    first_plan, second_plan = c.paths(first.token)[0], c.paths(second.token)[0]
    assert os.path.getsize(first_plan) == os.path.getsize(second_plan)
    assert pathlib.Path(first_plan).read_bytes() != pathlib.Path(second_plan).read_bytes()
    _swap(first_plan, second_plan)
    capsys.readouterr()
    model, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "recompiled" and "hash" in outcome.detail
    assert_correct(model, RESNET)
    model, outcome = prepare(twin, cache_dir=cache_dir)
    assert outcome.outcome == "recompiled"
    assert_correct(model, twin)
    assert len(warnings_in(capsys.readouterr().err)) == 2


def test_plan_format_error_after_matching_hash_is_rejected(cache_dir, capsys):
    """Defence in depth: even a plan whose hash matches the index (e.g. an index written by
    a buggy nncc) goes through the bounds-checked parser and is rejected if malformed."""
    from blake3 import blake3

    prepare(RESNET, cache_dir=cache_dir)
    capsys.readouterr()
    plan_path = _entries(cache_dir)[str(RESNET)][0]
    bogus = b"NNCCPLAN" + b"\xff" * 200
    pathlib.Path(plan_path).write_bytes(bogus)
    _sql(cache_dir, "UPDATE entries SET plan_hash = ?, plan_size = ?", blake3(bogus).hexdigest(), len(bogus))
    model, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "recompiled" and "malformed" in outcome.detail
    assert_correct(model, RESNET)
    assert len(warnings_in(capsys.readouterr().err)) == 1


def test_toctou_hash_is_taken_of_the_parsed_bytes(cache_dir, monkeypatch):
    """The file is changed right after it was read: what is parsed is what was hashed."""
    prepare(RESNET, cache_dir=cache_dir)
    plan_path = _entries(cache_dir)[str(RESNET)][0]
    real_read = store_mod.read_entry_file

    def read_then_tamper(path, what, *size):
        data = real_read(path, what, *size)
        _flip(path)  # the attacker wins the race against the file, not against the buffer
        return data

    monkeypatch.setattr(store_mod, "read_entry_file", read_then_tamper)
    model, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "hit"
    assert_correct(model, RESNET)
    monkeypatch.undo()
    _, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "recompiled"  # the next run sees the changed file and refuses it
    del plan_path


# -- versions ------------------------------------------------------------------------


def test_other_nncc_version_reinitializes_the_index(cache_dir, capsys):
    prepare(RESNET, cache_dir=cache_dir)
    prepare(MLP, cache_dir=cache_dir)
    _sql(cache_dir, "UPDATE meta SET value = '0.0.1' WHERE key = 'nncc_version'")
    model, outcome = prepare(MLP, cache_dir=cache_dir)
    assert outcome.outcome == "miss"  # the old row is retired, never prepared
    assert_correct(model, MLP)
    with open_cache(cache_dir) as c:
        assert c.index.meta()["nncc_version"] == nncc.__version__
        report = verify(c)
        stale = [f for f in report.findings if f.status == "STALE"]
        assert [f.source for f in stale] == [str(RESNET)] and not report.ok
        mlp_objects = set(c.index.entry_objects(only_token_of(c, MLP)))
        gc_report = collect(c)
        assert [r.reason for r in gc_report.removed if r.reason != "object"] == ["stale"]
        # the retired entry's kernel objects go with it, except those the live entry needs
        assert not mlp_objects & {r.token for r in gc_report.removed if r.reason == "object"}
        assert all(o["users"] for o in c.index.objects())
        assert verify(c).ok and c.index.stale() == {}
    assert warnings_in(capsys.readouterr().err) == []


def only_token_of(cache, model) -> str:
    (token,) = [e.token for e in cache.index.entries() if e.source_path == str(model)]
    return token


@pytest.mark.slow
def test_file_of_other_version_without_row_is_stale(cache_dir):
    prepare(RESNET, cache_dir=cache_dir, stage="optimized")
    entry = only_entry(cache_dir)
    plan_path = _entries(cache_dir)[str(RESNET)][0]
    raw = bytearray(pathlib.Path(plan_path).read_bytes())
    raw[16:32] = b"0.0.1".ljust(16, b"\0")
    pathlib.Path(plan_path).write_bytes(bytes(raw))
    _sql(cache_dir, "DELETE FROM entries")
    with open_cache(cache_dir) as c:
        statuses = {f.status for f in verify(c).findings if f.token == entry.token}
        assert statuses == {"STALE"}
        assert verify(c, fix=True).ok and verify(c).ok


# -- degradation: the run never fails --------------------------------------------------


def test_unwritable_location_compiles_in_memory(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    model, outcome = prepare(MLP, cache_dir=blocker / "cache")
    assert outcome.outcome == "unavailable"
    assert_correct(model, MLP)
    assert len(warnings_in(capsys.readouterr().err)) == 1
    # the cache directory itself is a file: a bad setting, refused as from any source
    from nncc.settings import SettingError

    with pytest.raises(SettingError, match=f"bad cache directory '{blocker}' in --cache-dir: "
                                           "it exists and is not a directory"):
        prepare(MLP, cache_dir=blocker)


def chmod_is_effective(tmp_path) -> bool:
    """False as root (CAP_DAC_OVERRIDE ignores modes): the tests below then skip, and
    test_unwritable_location_compiles_in_memory covers the case with a path under a file."""
    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0o555)
    try:
        return not os.access(probe, os.W_OK)
    finally:
        probe.chmod(0o755)


def test_read_only_directory_compiles_in_memory(tmp_path, capsys):
    if not chmod_is_effective(tmp_path):
        pytest.skip("chmod has no effect for this user (root)")
    cache_dir = tmp_path / "ro"
    cache_dir.mkdir()
    cache_dir.chmod(0o555)
    try:
        model, outcome = prepare(MLP, cache_dir=cache_dir)
        assert outcome.outcome == "unavailable"
        assert_correct(model, MLP)
        assert len(warnings_in(capsys.readouterr().err)) == 1
    finally:
        cache_dir.chmod(0o755)


def test_read_only_populated_cache_still_runs(tmp_path, capsys):
    if not chmod_is_effective(tmp_path):
        pytest.skip("chmod has no effect for this user (root)")
    cache_dir = tmp_path / "ro"
    prepare(MLP, cache_dir=cache_dir)
    capsys.readouterr()
    modes = {}
    for folder in [cache_dir, *cache_dir.rglob("*")]:
        if folder.is_dir():
            modes[folder] = folder.stat().st_mode
            folder.chmod(0o555)
    try:
        model, outcome = prepare(RESNET, cache_dir=cache_dir)
        assert outcome.outcome in ("unavailable", "miss")
        assert_correct(model, RESNET)
        assert len(warnings_in(capsys.readouterr().err)) <= 1
    finally:
        for folder, mode in modes.items():
            folder.chmod(mode)


def test_full_disk_compiles_in_memory(cache_dir, monkeypatch, capsys):
    def no_space(path, data, prefix):
        raise files_mod.CacheWriteError(f"cannot write {path}: No space left on device")

    prepare(RESNET, cache_dir=cache_dir)  # the cache works; then the disk fills up
    capsys.readouterr()
    monkeypatch.setattr(store_mod, "write_file_atomic", no_space)
    model, outcome = prepare(MLP, cache_dir=cache_dir)
    assert outcome.outcome == "unavailable" and "No space" in outcome.detail
    assert_correct(model, MLP)
    assert len(warnings_in(capsys.readouterr().err)) == 1
    monkeypatch.undo()
    with open_cache(cache_dir) as c:
        assert len(c.index.entries()) == 1
        assert verify(c).ok


def test_disk_full_between_the_two_files_leaves_nothing(cache_dir, monkeypatch, capsys):
    real = store_mod.write_file_atomic

    def fail_on_data(path, data, prefix):
        if path.endswith(".data"):
            raise files_mod.CacheWriteError("No space left on device")
        return real(path, data, prefix)

    monkeypatch.setattr(store_mod, "write_file_atomic", fail_on_data)
    model, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "unavailable"
    assert_correct(model, RESNET)
    monkeypatch.undo()
    with open_cache(cache_dir) as c:
        assert c.index.entries() == [] and c.scan() == ({}, [])


def test_index_that_cannot_be_opened(cache_dir, capsys):
    cache_dir.mkdir()
    (cache_dir / "index.sqlite3").mkdir()  # a directory where the database should be
    model, outcome = prepare(MLP, cache_dir=cache_dir)
    assert outcome.outcome == "unavailable"
    assert_correct(model, MLP)
    assert len(warnings_in(capsys.readouterr().err)) == 1


def test_corrupt_index_is_rebuilt(cache_dir, capsys):
    prepare(RESNET, cache_dir=cache_dir)
    prepare(MLP, cache_dir=cache_dir)
    for suffix in ("-wal", "-shm"):
        p = cache_dir / ("index.sqlite3" + suffix)
        if p.exists():
            p.unlink()
    (cache_dir / "index.sqlite3").write_bytes(os.urandom(8192))
    capsys.readouterr()
    model, outcome = prepare(MLP, cache_dir=cache_dir)
    assert outcome.outcome == "miss"  # files without their recorded hashes are never trusted
    assert_correct(model, MLP)
    err = capsys.readouterr().err
    assert len(warnings_in(err)) == 1 and "rebuilt" in err
    with open_cache(cache_dir) as c:
        assert [e.source_path for e in c.index.entries()] == [str(MLP)]
        report = verify(c)
        # the old entry files are debris: reported, never used, not a verification failure
        assert {f.status for f in report.findings} == {"OK", "ORPHAN"} and report.ok
        assert verify(c, fix=True).ok
        assert {f.status for f in verify(c).findings} == {"OK"}
    _, outcome = prepare(MLP, cache_dir=cache_dir)
    assert outcome.outcome == "hit"


def test_index_with_corrupt_pages_is_rebuilt(cache_dir, capsys):
    """The file still opens (header, schema and meta pages intact) but the entries table's
    pages are garbage: the corruption surfaces mid-operation and is handled the same way."""
    prepare(MLP, cache_dir=cache_dir)
    prepare(RESNET, cache_dir=cache_dir)
    capsys.readouterr()
    path = cache_dir / "index.sqlite3"
    assert not (cache_dir / "index.sqlite3-wal").exists()  # checkpointed at close
    conn = sqlite3.connect(str(path))
    pages = dict(conn.execute("SELECT name, rootpage FROM sqlite_master").fetchall())
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(path.read_bytes())
    for name in ("entries", "sqlite_autoindex_entries_1"):
        start = (pages[name] - 1) * page_size
        raw[start:start + page_size] = bytes([0xA5]) * page_size
    path.write_bytes(bytes(raw))
    Index(str(cache_dir), nncc.__version__, 1).open().close()  # still opens

    model, outcome = prepare(MLP, cache_dir=cache_dir)
    assert outcome.outcome == "miss"
    assert_correct(model, MLP)
    err = capsys.readouterr().err
    assert len(warnings_in(err)) == 1 and "rebuilt" in err
    assert prepare(MLP, cache_dir=cache_dir)[1].outcome == "hit"
    with open_cache(cache_dir) as c:
        assert c.index.healthy()
        assert verify(c, fix=True).ok and verify(c).ok


def test_index_with_other_schema_is_recreated(cache_dir):
    prepare(MLP, cache_dir=cache_dir)
    _sql(cache_dir, "PRAGMA user_version = 99")
    _, outcome = prepare(MLP, cache_dir=cache_dir)
    assert outcome.outcome == "miss"
    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # the current one, not 99
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


# -- gc --------------------------------------------------------------------------------


def test_parse_size_and_age():
    assert parse_size("500M") == 500 << 20 and parse_size("2G") == 2 << 30 and parse_size("10") == 10
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30)) and parse_size("4k") == 4096
    assert parse_age("7d") == 7 * 86400 and parse_age("12h") == 43200 and parse_age("30m") == 1800
    with pytest.raises(Exception):
        parse_size("lots")
    with pytest.raises(Exception):
        parse_age("7 days")


def test_gc_lru_size_and_age(cache_dir):
    for model, pref in ((MLP, "fast-single-answer"), (RESNET, "fast-single-answer"), (MLP, "low-power")):
        prepare(model, cache_dir=cache_dir, preference=pref)
    prepare(MLP, cache_dir=cache_dir)  # most recently used
    with open_cache(cache_dir) as c:
        entries = {(e.source_path, e.preference): e for e in c.index.entries()}
        newest = entries[(str(MLP), "fast-single-answer")]
        total = sum(e.size for e in entries.values())
        # the bound counts kernel objects too: resnet_block's (the MLP has no native code)
        objects = sum(o["size"] for o in c.index.objects())
        dry = collect(c, max_size=newest.size, dry_run=True)
        assert len([r for r in dry.removed if r.reason == "size"]) == 2 and len(c.index.entries()) == 3
        assert dry.freed == total - newest.size + objects
        report = collect(c, max_size=newest.size)
        assert {r.reason for r in report.removed} == {"size"} | ({"object"} if objects else set())
        assert report.freed == total - newest.size + objects and c.index.objects() == []
        assert [e.token for e in c.index.entries()] == [newest.token]
        assert all(not os.path.exists(p) for r in report.removed for p in r.paths)
        _sql(cache_dir, "UPDATE entries SET last_used = last_used - 8 * 86400")
        report = collect(c, max_age=parse_age("7d"))
        assert [r.reason for r in report.removed] == ["age"] and c.index.entries() == []
        assert c.index.counters()["evictions"] == 3


def test_auto_gc_bounds_the_cache(cache_dir, monkeypatch):
    prepare(RESNET, cache_dir=cache_dir)
    one = only_entry(cache_dir).size
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", str(one + 100))
    prepare(RESNET, cache_dir=cache_dir, preference="low-power")
    with open_cache(cache_dir) as c:
        entries = c.index.entries()
        assert [e.preference for e in entries] == ["low-power"]  # the LRU one went
        assert c.index.totals()[1] <= one + 100
        monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", "off")
        assert after_store(c, cache_settings(cache_dir)) is None


def test_gc_removes_orphans_and_leftovers_but_not_busy_ones(cache_dir):
    prepare(MLP, cache_dir=cache_dir)
    with open_cache(cache_dir) as c:
        orphan = "ab" * 32
        leftover = "cd" * 32
        busy = "ef" * 32
        for token in (orphan, leftover, busy):
            os.makedirs(c.shard(token), exist_ok=True)
        pathlib.Path(c.paths(orphan)[0]).write_bytes(b"x" * 10)
        pathlib.Path(c.shard(leftover), f".{leftover}.plan.123-0000abcd.tmp").write_bytes(b"y" * 20)
        pathlib.Path(c.shard(busy), f".{busy}.data.124-0000abcd.tmp").write_bytes(b"z" * 30)
        stray = pathlib.Path(c.entries_dir, "ab", "README")  # not a name nncc writes: never removed
        stray.write_text("?")
        statuses = {f.token: f.status for f in verify(c).findings}
        assert statuses[orphan] == "ORPHAN" and statuses[leftover] == "LEFTOVER" and statuses[None] == "FOREIGN"
        with c.lock(busy):  # a writer is in the middle of it
            assert {f.token: f.status for f in verify(c).findings}[busy] == "IN-PROGRESS"
            report = collect(c)
            removed = {(r.token, r.reason) for r in report.removed}
            assert (orphan, "orphan") in removed and (leftover, "leftover") in removed
            assert all(token is not None for token, _ in removed) and stray.read_text() == "?"
            assert any(p.name.startswith(f".{busy}") for p in pathlib.Path(c.shard(busy)).iterdir())
        assert len(c.index.entries()) == 1
        collect(c)
        assert verify(c).ok
        assert {f.status for f in verify(c).findings} == {"OK", "FOREIGN"} and stray.exists()
        assert sorted(os.listdir(c.locks_dir)) == [only_entry(cache_dir).token + ".lock"]


def test_gc_skips_an_entry_being_read(cache_dir):
    prepare(MLP, cache_dir=cache_dir)
    entry = only_entry(cache_dir)
    with open_cache(cache_dir) as c:
        with c.lock(entry.token, shared=True):  # a run is verifying this entry
            report = collect(c, max_size=0)
            assert report.removed == [] and report.skipped_busy == [entry.token]
        assert len(collect(c, max_size=0).removed) == 1


def test_deleting_files_under_a_prepared_model_is_harmless(cache_dir):
    prepare(RESNET, cache_dir=cache_dir)
    model, outcome = prepare(RESNET, cache_dir=cache_dir)
    assert outcome.outcome == "hit"
    with open_cache(cache_dir) as c:
        collect(c, max_size=0)
        assert c.scan() == ({}, [])
    assert_correct(model, RESNET)  # bytes in memory, data in a mapping of an unlinked file


# -- locks and the index -----------------------------------------------------------------


def test_file_lock_exclusion_and_safe_unlink(tmp_path):
    path = str(tmp_path / "t.lock")
    with FileLock(path) as held:
        with pytest.raises(LockBusy):
            FileLock(path, shared=True, blocking=False).acquire()
        assert try_lock(path) is None
        held.unlink()
        assert not os.path.exists(path)
        other = FileLock(path, blocking=False).acquire()  # a new file: a new lock
        other.release()
    with FileLock(path, shared=True), FileLock(path, shared=True, blocking=False):
        assert try_lock(path) is None


def test_index_counters_and_rows(tmp_path):
    index = Index(str(tmp_path), "1.2.3", 1).open()
    assert index.counters() == {"hits": 0, "misses": 0, "corruptions": 0, "recompiles": 0, "evictions": 0, "remote_hits": 0, "remote_misses": 0, "remote_rejected": 0, "remote_errors": 0,
                                   "upgrades": 0}
    assert index.meta()["nncc_version"] == "1.2.3"
    index.close()
    again = Index(str(tmp_path), "1.2.4", 1).open()
    assert again.reinitialized and again.meta()["nncc_version"] == "1.2.4"
    again.close()


@pytest.mark.slow
def test_hit_does_not_import_the_frontend(cache_dir):
    # the miss in a fresh process too: plugins other tests loaded here are in this one's token
    subprocess.run([sys.executable, "-c", f"import nncc; nncc.prepare({str(MLP)!r}, cache_dir={str(cache_dir)!r})"],
                   cwd=ROOT, check=True, timeout=120)
    code = (
        "import sys; from nncc.model import prepare\n"
        f"model, outcome = prepare({str(MLP)!r}, cache_dir={str(cache_dir)!r})\n"
        "assert outcome.outcome == 'hit', outcome\n"
        "assert 'nncc.frontend.onnx' not in sys.modules, 'frontend imported on a hit'\n"
        "assert 'nncc.frontend.protobuf' not in sys.modules\n"
        "assert 'onnx' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_cli_main_import_stays_light():
    code = ("import sys, nncc.cli.main\n"
            "heavy = [m for m in ('numpy', 'rich', 'sqlite3', 'blake3', 'nncc.cache') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_core_cache_modules_do_not_import_click_or_rich():
    code = ("import sys, nncc.cache, nncc.cache.gc, nncc.cache.verify\n"
            "from nncc.model import prepare\n"
            f"prepare({str(MLP)!r}, use_cache=False)\n"
            "assert 'click' not in sys.modules and 'rich' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
