"""Settings: flag > environment > config file > default, each checked with one message
whatever its source; the `nncc config` commands; `--cache-dir` before the command name;
and the cache's limits (an entry that cannot fit is not stored, eviction takes only what
it must and says so)."""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import stat
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import FIXTURES, ROOT
from tests.oracle import ort_session

MLP = FIXTURES / "mlp.onnx"
RESNET = FIXTURES / "resnet_block.onnx"
SIZE_WHY = "use a number with an optional K, M, G or T suffix (e.g. 500M, 2G)"


@pytest.fixture
def config_file(tmp_path, monkeypatch) -> pathlib.Path:
    path = tmp_path / "conf" / "config.toml"
    monkeypatch.setenv("NNCC_CONFIG_FILE", str(path))
    return path


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> pathlib.Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("NNCC_CACHE_DIR", str(path))
    return path


def entry_sizes(cache: pathlib.Path) -> dict[str, int]:
    """token -> bytes of its two files, as found on disk (not as the index records them)."""
    sizes: dict[str, int] = {}
    for path in (cache / "entries").glob("*/*"):
        if path.suffix in (".plan", ".data"):
            sizes[path.stem] = sizes.get(path.stem, 0) + path.stat().st_size
    return sizes


def index_rows(cache: pathlib.Path) -> dict[str, tuple]:
    conn = sqlite3.connect(str(cache / "index.sqlite3"))
    try:
        return {r[0]: r[1:] for r in conn.execute("SELECT token, preference, last_used FROM entries")}
    finally:
        conn.close()


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# -- resolution order and checking ---------------------------------------------------------


def test_flag_beats_environment_beats_file_beats_default(config_file, monkeypatch):
    from nncc import settings

    monkeypatch.delenv("NNCC_CACHE_MAX_SIZE", raising=False)
    first = settings.resolve("cache.max_size")
    assert (first.value, first.source) == (2 << 30, "default")
    config_file.parent.mkdir()
    config_file.write_text('[cache]\nmax_size = "100M"\n')
    from_file = settings.resolve("cache.max_size")
    assert (from_file.value, from_file.source) == (100 << 20, "file")
    assert from_file.where == f"cache.max_size in {config_file}"
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", "200M")
    assert settings.resolve("cache.max_size").value == 200 << 20
    assert settings.resolve("cache.max_size").where == "NNCC_CACHE_MAX_SIZE"
    flagged = settings.resolve("cache.max_size", "300M", "--max-size")
    assert (flagged.value, flagged.source, flagged.where) == (300 << 20, "flag", "--max-size")
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", "off")
    assert settings.resolve("cache.max_size").value is None


@pytest.mark.parametrize("where", ["env", "file", "gc flag"])
def test_a_bad_size_gets_one_message_whatever_its_source(where, cli, config_file, cache_dir, monkeypatch):
    if where == "env":
        monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", "banana")
        args, source = ("run", MLP, "--random-inputs"), "NNCC_CACHE_MAX_SIZE"
    elif where == "file":
        config_file.parent.mkdir()
        config_file.write_text('[cache]\nmax_size = "banana"\n')
        args, source = ("run", MLP, "--random-inputs"), f"cache.max_size in {config_file}"
    else:
        args, source = ("cache", "gc", "--max-size", "banana"), "--max-size"
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    line = error_line(err)
    assert line.startswith(f"nncc: error: bad size 'banana' in {source}: {SIZE_WHY}"), line
    assert not (cache_dir / "entries").exists()  # refused before anything was compiled or stored


@pytest.mark.parametrize("where", ["env", "file", "flag", "flag before the command"])
def test_a_cache_dir_that_is_a_file_is_refused_the_same_way(where, cli, config_file, tmp_path, monkeypatch):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("mine")
    monkeypatch.delenv("NNCC_CACHE_DIR")
    args = ["run", MLP, "--random-inputs"]
    if where == "env":
        monkeypatch.setenv("NNCC_CACHE_DIR", str(a_file))
        source = "NNCC_CACHE_DIR"
    elif where == "file":
        config_file.parent.mkdir()
        config_file.write_text(f'[cache]\ndir = "{a_file}"\n')
        source = f"cache.dir in {config_file}"
    elif where == "flag":
        args += ["--cache-dir", a_file]
        source = "--cache-dir"
    else:
        args = ["--cache-dir", a_file] + args
        source = "--cache-dir"
    code, out, err = cli(*args)
    assert code == 2
    assert error_line(err).startswith(
        f"nncc: error: bad cache directory '{a_file}' in {source}: it exists and is not a directory")
    assert a_file.read_text() == "mine"


def test_a_config_file_that_is_not_toml_is_one_line_exit_2(cli, config_file, cache_dir):
    config_file.parent.mkdir()
    config_file.write_text("[cache\nmax_size = 1\n")
    for args in (("run", MLP, "--random-inputs"), ("config", "show"), ("config", "set", "cache.max_size", "1G")):
        code, out, err = cli(*args)
        assert code == 2, args
        assert error_line(err).startswith(f"nncc: error: the config file {config_file} is not valid TOML")
    assert config_file.read_text() == "[cache\nmax_size = 1\n"  # never rewritten
    code, out, err = cli("config", "path")
    assert code == 0 and out.strip() == str(config_file)


def test_the_default_config_file_is_in_the_user_config_directory(cli, monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.delenv("NNCC_CONFIG_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    code, out, err = cli("config", "path")
    expected = os.path.join(platformdirs.user_config_dir("nncc", appauthor=False), "config.toml")
    assert code == 0 and out.strip() == expected and expected.startswith(str(tmp_path / "xdg"))


# -- the config file drives the commands ---------------------------------------------------


def test_config_set_show_unset(cli, config_file, monkeypatch):
    monkeypatch.delenv("NNCC_CACHE_MAX_SIZE", raising=False)
    code, out, err = cli("config", "set", "cache.max_size", "500M")
    assert code == 0 and "cache.max_size = 500M" in err
    assert tomllib.loads(config_file.read_text()) == {"cache": {"max_size": "500M"}}
    assert cli("config", "set", "run.preference", "low-power")[0] == 0
    assert cli("config", "set", "run.threads", "1")[0] == 0
    assert tomllib.loads(config_file.read_text()) == {
        "cache": {"max_size": "500M"}, "run": {"preference": "low-power", "threads": 1}}

    code, out, err = cli("config", "show", "--json")
    shown = json.loads(out)["settings"]
    assert shown["cache.max_size"] == {"value": 500 << 20, "raw": "500M", "source": "file",
                                       "where": f"cache.max_size in {config_file}", "env": "NNCC_CACHE_MAX_SIZE"}
    assert shown["run.threads"]["value"] == 1 and shown["cache.hash_mode"]["value"] == "direct"
    assert shown["cache.hash_mode"]["source"] == "default"
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", "1G")
    code, out, err = cli("config", "show")
    line = next(line for line in out.splitlines() if line.startswith("cache.max_size"))
    assert line.split() == ["cache.max_size", "1G", "(NNCC_CACHE_MAX_SIZE)"]
    line = next(line for line in out.splitlines() if line.startswith("run.preference"))
    assert line.split() == ["run.preference", "low-power", "(config", "file)"]

    before = config_file.read_bytes()
    code, out, err = cli("config", "set", "cache.max_size", "lots")
    assert code == 2 and error_line(err).startswith(f"nncc: error: bad size 'lots' in cache.max_size: {SIZE_WHY}")
    code, out, err = cli("config", "set", "cache.colour", "blue")
    assert code == 2 and "unknown setting 'cache.colour'" in error_line(err)
    assert config_file.read_bytes() == before  # a refused value changes nothing

    assert cli("config", "unset", "run.threads")[0] == 0
    assert cli("config", "unset", "run.preference")[0] == 0
    assert tomllib.loads(config_file.read_text()) == {"cache": {"max_size": "500M"}}  # the empty table goes
    code, out, err = cli("config", "unset", "run.threads")
    assert code == 0 and "not set" in err
    assert sorted(os.listdir(config_file.parent)) == ["config.toml"]  # written atomically: no temp files left


def test_config_set_keeps_other_keys_and_the_file_mode_and_escapes_strings(cli, config_file, tmp_path):
    config_file.parent.mkdir()
    config_file.write_text('top = 1\n[cache]\nmax_age = "7d"\nfuture_key = [1, 2]\n[newer]\nflag = true\n')
    config_file.chmod(0o600)
    odd = tmp_path / 'a "quoted" \\ folder é\tx'
    code, out, err = cli("config", "set", "cache.dir", str(odd))
    assert code == 0, err
    assert tomllib.loads(config_file.read_text()) == {
        "top": 1, "cache": {"max_age": "7d", "future_key": [1, 2], "dir": str(odd)}, "newer": {"flag": True}}
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    code, out, err = cli("config", "show")
    assert code == 0 and "newer.flag" in err and "top" in err  # unknown keys: kept, and warned about


def test_config_set_stores_a_relative_cache_dir_as_absolute(cli, config_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli("config", "set", "cache.dir", "here/cache")[0] == 0
    assert tomllib.loads(config_file.read_text())["cache"]["dir"] == str(tmp_path / "here" / "cache")


def test_run_uses_the_cache_dir_and_preference_of_the_config_file(cli, config_file, tmp_path, monkeypatch):
    monkeypatch.delenv("NNCC_CACHE_DIR")
    folder = tmp_path / "configured-cache"
    assert cli("config", "set", "cache.dir", str(folder))[0] == 0
    assert cli("config", "set", "run.preference", "low-power")[0] == 0
    code, out, err = cli("run", MLP, "--random-inputs", "--json")
    assert code == 0, err
    assert json.loads(out)["cache"]["directory"] == str(folder)
    assert [row[0] for row in index_rows(folder).values()] == ["low-power"]
    code, out, err = cli("run", MLP, "--random-inputs", "--json", "--preference", "sustained-speed")
    assert sorted(row[0] for row in index_rows(folder).values()) == ["low-power", "sustained-speed"]


def test_cache_dir_before_the_command_name(cli, tmp_path, cache_dir):
    first, second = tmp_path / "first", tmp_path / "second"
    code, out, err = cli("--cache-dir", first, "run", MLP, "--random-inputs")
    assert code == 0 and "cache miss" in err
    assert len(entry_sizes(first)) == 1 and not cache_dir.exists()
    code, out, err = cli("--cache-dir", first, "cache", "info", "--json")
    assert json.loads(out)["directory"] == str(first) and json.loads(out)["entries"] == 1
    code, out, err = cli("-q", "--cache-dir", first, "run", MLP, "--random-inputs")
    assert code == 0 and err == ""  # a hit, and -q before the command as well
    # the command's own --cache-dir wins over the one before the command name
    code, out, err = cli("--cache-dir", first, "run", MLP, "--random-inputs", "--cache-dir", second)
    assert code == 0 and len(entry_sizes(second)) == 1


# -- limits ---------------------------------------------------------------------------------


def sizes_of(cli, tmp_path, *runs) -> list[int]:
    """Bytes each run's entry takes, measured by storing it in a scratch cache."""
    scratch = tmp_path / "scratch"
    result = []
    for args in runs:
        before = set(entry_sizes(scratch)) if scratch.exists() else set()
        code, out, err = cli("run", *args, "--random-inputs", "--cache-dir", scratch)
        assert code == 0, err
        [token] = set(entry_sizes(scratch)) - before
        result.append(entry_sizes(scratch)[token])
    return result


def test_an_entry_larger_than_the_limit_is_not_stored(cli, cache_dir, tmp_path, monkeypatch):
    import numpy as np
    import onnxruntime as ort

    mlp_size, resnet_size = sizes_of(cli, tmp_path, (MLP,), (RESNET,))
    assert mlp_size < resnet_size
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", str(resnet_size - 1))
    assert cli("run", MLP, "--random-inputs")[0] == 0
    kept = entry_sizes(cache_dir)

    session = ort_session(RESNET)
    [inp] = session.get_inputs()
    x = np.random.default_rng(3).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]) \
        .astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = cli("run", RESNET, "--input", f"{inp.name}={tmp_path / 'x.npy'}",
                         "-o", tmp_path / "out.npz", "--json")
    assert code == 0, err  # the run succeeds
    warnings = [line for line in err.splitlines() if line.startswith("nncc: warning:")]
    assert len(warnings) == 1 and "larger than the cache size limit" in warnings[0] and "not stored" in warnings[0]
    assert "NNCC_CACHE_MAX_SIZE" in warnings[0]
    assert json.loads(out)["cache"]["outcome"] == "not-stored"
    assert entry_sizes(cache_dir) == kept  # nothing evicted, nothing added
    got = np.load(tmp_path / "out.npz")
    for meta, want in zip(session.get_outputs(), session.run(None, {inp.name: x})):
        np.testing.assert_allclose(got[meta.name], want, rtol=1e-4, atol=1e-4)
    code, out, err = cli("cache", "info", "--json")
    assert json.loads(out)["counters"]["evictions"] == 0


def test_eviction_removes_only_what_it_must_and_says_so(cli, cache_dir, tmp_path, monkeypatch):
    from nncc.util.units import format_bytes

    runs = [(MLP, "-O", "2"), (MLP, "-O", "1"), (MLP, "-O", "0"), (MLP, "--preference", "low-power")]
    sizes = sizes_of(cli, tmp_path, *runs)
    tokens = []
    for args in runs[:3]:
        code, out, err = cli("run", *args, "--random-inputs", "--json")
        tokens.append(json.loads(out)["cache"]["token"])
    # room for the last three: storing the fourth must evict the least recently used one only
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", str(sum(sizes[1:])))
    code, out, err = cli("run", *runs[3], "--random-inputs")
    assert code == 0
    assert f"evicted 1 entry ({format_bytes(sizes[0])})" in err
    remaining = entry_sizes(cache_dir)
    assert tokens[0] not in remaining and set(tokens[1:]) <= set(remaining) and len(remaining) == 3
    assert sum(remaining.values()) == sum(sizes[1:])


def test_eviction_json_reports_entries_and_bytes(cli, cache_dir, tmp_path, monkeypatch):
    runs = [(MLP, "-O", "2"), (MLP, "-O", "1"), (MLP, "-O", "0")]
    sizes = sizes_of(cli, tmp_path, *runs)
    for args in runs[:2]:
        assert cli("run", *args, "--random-inputs")[0] == 0
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", str(sizes[2]))  # only the new one fits
    code, out, err = cli("run", *runs[2], "--random-inputs", "--json")
    assert json.loads(out)["cache"]["evicted"] == {"entries": 2, "bytes": sizes[0] + sizes[1]}
    assert "evicted 2 entries" in err
    assert sum(entry_sizes(cache_dir).values()) == sizes[2]


def test_the_age_limit_applies_after_a_store(cli, cache_dir, config_file, monkeypatch):
    code, out, err = cli("run", MLP, "--random-inputs", "--json")
    old = json.loads(out)["cache"]["token"]
    code, out, err = cli("run", MLP, "-O", "1", "--random-inputs", "--json")
    recent = json.loads(out)["cache"]["token"]
    conn = sqlite3.connect(str(cache_dir / "index.sqlite3"))
    conn.execute("UPDATE entries SET last_used = last_used - 3 * 86400 WHERE token = ?", (old,))
    conn.commit()
    conn.close()
    assert cli("config", "set", "cache.max_age", "2d")[0] == 0
    code, out, err = cli("run", MLP, "-O", "0", "--random-inputs", "--json")
    assert code == 0 and json.loads(out)["cache"]["evicted"]["entries"] == 1 and "evicted 1 entry" in err
    assert old not in entry_sizes(cache_dir) and recent in entry_sizes(cache_dir)


# -- low-power and threads at run time ------------------------------------------------------


@pytest.fixture
def probe_model(tmp_path) -> pathlib.Path:
    """MatMul, then the probe op (tests/plugins/blas_probe.py), which records the BLAS
    thread count while the model runs."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]),
         helper.make_node("BlasThreads", ["y"], ["z"], domain="test.probe")],
        "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor("w", TensorProto.FLOAT, [8, 8], [0.5] * 64)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("test.probe", 1)])
    path = tmp_path / "probe.onnx"
    onnx.save(model, str(path))
    return path


def observed_threads(probe_model, tmp_path, *args, env=None) -> list[int]:
    """Run `nncc run` on the probe model in a fresh process; the counts the probe saw."""
    record = tmp_path / f"threads-{len(list(tmp_path.glob('threads-*')))}.txt"
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NNCC_THREADS")}
    environment.update(PYTHONPATH=str(ROOT), NNCC_TEST_BLAS_PROBE=str(record), OPENBLAS_NUM_THREADS="2",
                       **(env or {}))
    result = subprocess.run([sys.executable, "-m", "nncc", "run", str(probe_model), "--random-inputs",
                             "--plugin", "tests.plugins.blas_probe", "--steps", "2", "--bind", "z=x", *args],
                            cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return [int(line) for line in record.read_text().split()]


@pytest.mark.slow
def test_low_power_runs_blas_on_one_thread(probe_model, tmp_path):
    from nncc.util.threads import blas_threads

    if blas_threads() is None:
        pytest.skip("numpy's BLAS here has no known thread-count entry point; nothing to observe")
    baseline = observed_threads(probe_model, tmp_path)
    if baseline[0] < 2:
        pytest.skip("BLAS runs one thread on this machine anyway: low-power could not be told apart")
    assert baseline == [2, 2]
    assert observed_threads(probe_model, tmp_path, "--preference", "low-power") == [1, 1]
    assert observed_threads(probe_model, tmp_path, "--preference", "low-power", "--threads", "2") == [1, 1]
    assert observed_threads(probe_model, tmp_path, "--threads", "1") == [1, 1]
    assert observed_threads(probe_model, tmp_path, env={"NNCC_THREADS": "1"}) == [1, 1]
    config = tmp_path / "config.toml"
    config.write_text('[run]\nthreads = 1\n')
    assert observed_threads(probe_model, tmp_path, env={"NNCC_CONFIG_FILE": str(config)}) == [1, 1]
    assert observed_threads(probe_model, tmp_path, "--threads", "2",
                            env={"NNCC_CONFIG_FILE": str(config)}) == [2, 2]


def test_low_power_restores_the_thread_count_after_each_run(probe_model, tmp_path, monkeypatch):
    import numpy as np

    import nncc
    from nncc.util.threads import blas_threads, limit_blas_threads

    if blas_threads() is None:
        pytest.skip("numpy's BLAS here has no known thread-count entry point; nothing to observe")
    record = tmp_path / "seen.txt"
    monkeypatch.setenv("NNCC_TEST_BLAS_PROBE", str(record))
    model, _ = nncc.prepare(probe_model, preference="low-power", plugins=("tests.plugins.blas_probe",))
    x = np.ones((8, 8), np.float32)
    with limit_blas_threads(2):
        before = blas_threads()
        out = model.run({"x": x})["z"]
        assert blas_threads() == before
    np.testing.assert_allclose(out, x @ np.full((8, 8), 0.5, np.float32))
    assert record.read_text().split() == ["1"]


def test_a_bad_thread_count_is_refused_like_any_setting(cli, probe_model, monkeypatch):
    monkeypatch.setenv("NNCC_THREADS", "many")
    code, out, err = cli("run", MLP, "--random-inputs")
    assert code == 2 and error_line(err).startswith("nncc: error: bad thread count 'many' in NNCC_THREADS:")
    monkeypatch.delenv("NNCC_THREADS")
    code, out, err = cli("run", MLP, "--random-inputs", "--threads", "1.5")
    assert code == 2 and error_line(err).startswith("nncc: error: bad thread count '1.5' in --threads:")


# -- cheap to read -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_config_file_costs_a_cache_hit_only_tomllib(tmp_path):
    """A hit imports the same modules with or without a config file, but tomllib and the
    standard-library modules it uses (and never click or rich: the settings live in the core)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(tmp_path / "c"),
               NNCC_CONFIG_FILE=str(tmp_path / "none.toml"))
    hit = f"import sys, nncc\nnncc.prepare({str(MLP)!r})\nprint(' '.join(sorted(sys.modules)))\n"

    def modules(**extra) -> set[str]:
        result = subprocess.run([sys.executable, "-c", hit], env=dict(env, **extra), capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return set(result.stdout.split())

    modules()  # the miss that fills the cache
    plain = modules()
    config = tmp_path / "config.toml"
    config.write_text('[cache]\nmax_size = "1G"\n')
    configured = modules(NNCC_CONFIG_FILE=str(config))
    extra = {m.split(".")[0] for m in configured - plain}
    assert "tomllib" in extra and extra <= set(sys.stdlib_module_names) and not plain - configured
    assert not {"click", "rich"} & configured


def test_the_native_pool_follows_low_power_and_the_thread_setting(tmp_path):
    """The native code's own thread pool: one thread for low-power, else as many as BLAS
    runs (so `run --threads N`, which sets BLAS's count first, sizes it too)."""
    import nncc
    from nncc.native.toolchain import find_toolchain
    from nncc.util.threads import blas_threads, limit_blas_threads

    if find_toolchain() is None:
        pytest.skip("no C compiler on this machine: no native code, no native pool")
    if blas_threads() is None:
        pytest.skip("numpy's BLAS here has no known thread-count entry point")
    with limit_blas_threads(2):
        fast, _ = nncc.prepare(RESNET, cache_dir=tmp_path / "c")
        low, _ = nncc.prepare(RESNET, cache_dir=tmp_path / "c", preference="low-power")
    with limit_blas_threads(1):
        one, _ = nncc.prepare(RESNET, cache_dir=tmp_path / "c")  # a cache hit, activated anew
    if fast.native_partitions == 0:
        pytest.skip("the native backend took no partition of this model here")
    threads = [m._executor.loaded["native"].threads for m in (fast, low, one)]  # the native pool each loaded
    assert threads == [2, 1, 1]


def test_trusting_a_shared_cache_is_a_setting_and_a_vague_value_is_refused(cli, cache_dir, config_file,
                                                                            monkeypatch):
    monkeypatch.delenv("NNCC_CACHE_TRUST_SHARED", raising=False)
    assert cli("run", MLP, "--random-inputs")[0] == 0
    cache_dir.chmod(0o777)  # others can write: not used unless trusted
    code, out, err = cli("run", MLP, "--random-inputs", "--json")
    assert code == 0 and json.loads(out)["cache"]["outcome"] == "unavailable"
    assert cli("config", "set", "cache.trust_shared", "yes")[0] == 0
    code, out, err = cli("run", MLP, "--random-inputs", "--json")
    assert code == 0 and json.loads(out)["cache"]["outcome"] == "hit", err
    monkeypatch.setenv("NNCC_CACHE_TRUST_SHARED", "0")  # the environment wins over the file
    code, out, err = cli("run", MLP, "--random-inputs", "--json")
    assert json.loads(out)["cache"]["outcome"] == "unavailable"
    monkeypatch.setenv("NNCC_CACHE_TRUST_SHARED", "maybe")  # once read as "trust"
    code, out, err = cli("run", MLP, "--random-inputs", "--json")
    assert code == 2 and error_line(err).startswith(
        "nncc: error: bad switch 'maybe' in NNCC_CACHE_TRUST_SHARED: use 1, yes, on or true, or 0, no, off or false")
    cache_dir.chmod(0o700)


def test_config_set_where_the_file_cannot_be_written_is_one_line(cli, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("NNCC_CONFIG_FILE", str(blocker / "config.toml"))  # its folder is a file
    code, out, err = cli("config", "set", "cache.max_size", "1G")
    assert code == 2 and error_line(err).startswith("nncc: error: cannot create the folder of the config file")
    assert blocker.read_text() == "x"


def test_a_bad_memory_bound_is_worded_like_every_bad_setting(cli, monkeypatch):
    monkeypatch.setenv("NNCC_MAX_MEMORY", "plenty")
    code, out, err = cli("run", MLP, "--random-inputs", "--no-cache")
    assert code == 2
    assert error_line(err).startswith(f"nncc: error: bad size 'plenty' in NNCC_MAX_MEMORY: {SIZE_WHY}")


def test_a_bad_compiler_timeout_is_refused_like_any_setting(tmp_path):
    from nncc.native.toolchain import find_toolchain

    if find_toolchain() is None:
        pytest.skip("no C compiler on this machine: no native build reads the timeout")
    # a fresh process: this one may hold the native code built already, and build nothing
    env = dict(os.environ, PYTHONPATH=str(ROOT), NNCC_CC_TIMEOUT="soon")  # once a float() at import
    result = subprocess.run([sys.executable, "-m", "nncc", "run", str(RESNET), "--random-inputs", "--no-cache"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and error_line(result.stderr).startswith(
        "nncc: error: bad timeout 'soon' in NNCC_CC_TIMEOUT: use a number of seconds greater than 0")


@pytest.mark.parametrize("source", ["env", "file"])
def test_upgrade_after_is_a_checked_setting(config_file, cache_dir, monkeypatch, source):
    """The hits before a native stage is built: a bad value is refused before anything is
    compiled, with the settings' wording, wherever it comes from."""
    from nncc import settings

    monkeypatch.delenv("NNCC_UPGRADE_AFTER", raising=False)
    assert settings.resolve("cache.upgrade_after").value == 0  # the default: the miss starts the build
    env = dict(os.environ)
    if source == "env":
        env["NNCC_UPGRADE_AFTER"] = "soon"
    else:
        config_file.parent.mkdir()
        config_file.write_text('[cache]\nupgrade_after = "soon"\n')
    result = subprocess.run([sys.executable, "-m", "nncc", "run", str(RESNET), "--random-inputs"],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 2
    line = error_line(result.stderr)
    assert line.startswith("nncc: error: bad hit count 'soon' in ") and ("NNCC_UPGRADE_AFTER" in line
                                                                        or "cache.upgrade_after" in line)
    assert not cache_dir.exists()  # refused before the cache was touched
    monkeypatch.setenv("NNCC_UPGRADE_AFTER", "off")
    assert settings.resolve("cache.upgrade_after").value is None  # only on request
    monkeypatch.setenv("NNCC_UPGRADE_AFTER", "0")
    assert settings.resolve("cache.upgrade_after").value == 0  # 0 is at the miss, not off
    monkeypatch.setenv("NNCC_UPGRADE_AFTER", "-1")
    with pytest.raises(settings.SettingError, match="use a whole number of hits"):
        settings.resolve("cache.upgrade_after")
