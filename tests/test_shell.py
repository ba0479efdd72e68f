"""nncc in the shell: --help and --version, --json schemas, -q/-v, progress only on a
terminal, NO_COLOR, one-line errors with hints, NNCC_DEBUG, shell completion, and the
Make-friendly `nncc compile` (write only when changed, --force, --depfile).

The real `make` runs are in tests/test_make.py; the README's examples in tests/test_docs.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import select
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from tests.conftest import FIXTURES, ROOT

MLP = FIXTURES / "mlp.onnx"
HAS_BENCH = (ROOT / "nncc" / "cli" / "bench.py").exists()
NO_BENCH = "nncc/cli/bench.py does not exist yet (another change adds `nncc bench`)"


def env(**extra) -> dict[str, str]:
    out = dict(os.environ)
    for key in ("NNCC_DEBUG", "NO_COLOR", "FORCE_COLOR", "COLUMNS", "NNCC_PROGRESS_DELAY", "TTY_COMPATIBLE"):
        out.pop(key, None)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    out.update(extra)
    return out


def nncc_process(*args, cwd=ROOT, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], cwd=cwd, env=env(**extra),
                          capture_output=True, text=True, timeout=120)


# -- the command tree -------------------------------------------------------------------------


def command_paths() -> list[tuple[str, ...]]:
    """Every command: the top-level ones from main.COMMANDS and the subcommands of groups."""
    import click

    from nncc.cli.main import COMMANDS, cli as root

    paths = []
    ctx = click.Context(root)

    def walk(path, command):
        paths.append(path)
        if isinstance(command, click.Group):
            GROUPS.add(path)
            for sub in command.list_commands(ctx):
                walk(path + (sub,), command.get_command(ctx, sub))

    for name in sorted(COMMANDS):
        if name == "bench" and not HAS_BENCH:
            paths.append((name,))
            continue
        walk((name,), root.get_command(ctx, name))
    return paths


GROUPS: set[tuple[str, ...]] = set()  # filled by command_paths: commands that hold others
LEAVES = [p for p in command_paths() if p not in GROUPS]
REPORTING = [p for p in LEAVES if p != ("bench",)] + [("bench",)]  # every leaf reports


def test_every_command_is_listed():
    assert set(command_paths()) >= {("run",), ("compile",), ("inspect",), ("bench",), ("cache",),
                                    ("cache", "ls"), ("cache", "info"), ("cache", "verify"),
                                    ("cache", "gc"), ("cache", "rm"), ("cache", "clear")}


@pytest.mark.parametrize("path", [()] + command_paths(), ids=lambda p: " ".join(p) or "nncc")
def test_help(cli, path):
    if path[:1] == ("bench",) and not HAS_BENCH:
        pytest.skip(NO_BENCH)
    code, out, err = cli(*path, "--help")
    assert code == 0, err
    assert out.startswith(f"Usage: {' '.join(('nncc',) + path)} "), out
    assert err == ""
    if path in LEAVES:
        assert "--json" in out
        assert "-q, --quiet" in out or "--quiet, -q" in out
        if path != ("bench",):  # bench has its own -q (no progress bar); see the report
            assert "-v, --verbose" in out
    if path == ("compile",):
        assert "--depfile" in out and "--force" in out
    code, short, _ = cli(*path, "-h")
    assert code == 0 and short == out


def test_root_help_lists_every_command_and_the_global_options(cli):
    from nncc.cli.main import COMMANDS

    code, out, _ = cli("--help")
    assert code == 0
    for name, (_, _, summary) in COMMANDS.items():
        assert name in out and summary[:30] in out
    assert "-q, --quiet" in out and "-v, --verbose" in out and "--version" in out
    assert "Exit codes" in out


def test_version(cli):
    code, out, err = cli("--version")
    assert code == 0 and out == f"nncc, version {nncc.__version__}\n" and err == ""
    # one source for the version: the package metadata reads nncc/_version.py
    from importlib.metadata import version

    assert version("nncc") == nncc.__version__
    assert 'version = { attr = "nncc._version.__version__" }' in (ROOT / "pyproject.toml").read_text()
    result = nncc_process("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"nncc, version {nncc.__version__}"


def test_bare_group_shows_help(cli):
    for args in ((), ("cache",)):
        code, out, err = cli(*args)
        assert "Usage: nncc" in out + err
        assert code in (0, 2)  # click < 8.2: 0; click >= 8.2: 2 (no command given)


# -- JSON schemas -----------------------------------------------------------------------------

number = (int, float)
null = type(None)
CACHE_OUTCOME = {"outcome": str, "token": (str, null), "seconds": number, "directory": (str, null),
                 "detail": (str, null)}
CONSTANTS = {"count": int, "bytes": int}

# Required keys and their types, per command (docs/json.md). A dict: an object with these
# keys (more are allowed); [schema]: a list whose items match; {"*": schema}: any keys.
SCHEMAS = {
    ("run",): {
        "model": str,
        "outputs": [{"name": str, "shape": [int], "dtype": str, "min": (number, null), "max": (number, null),
                     "mean": (number, null), "std": (number, null), "nonfinite": int}],
        "timing": {"prepare_seconds": number, "run_seconds": number},
        "cache": (CACHE_OUTCOME, null),
    },
    ("compile",): {
        "model": str, "output": str, "bytes": int, "written": bool, "depfile": (str, null),
        "compile_seconds": number, "cache": CACHE_OUTCOME,
    },
    ("export",): {
        "model": str, "output": str, "name": str, "files": {"*": int}, "written": [str], "depfile": (str, null),
        "export_seconds": number, "cache": CACHE_OUTCOME,
    },
    ("inspect",): {
        "path": str, "format_version": int, "producer": str,
        "options": {"preference": str, "opt_level": int, "backends": [str], "plugins": [str], "threads": int,
                    "opsets": {"*": int}},
        "inputs": [{"name": str, "dtype": str, "shape": [(int, str, null)]}],
        "outputs": [{"name": str, "dtype": str, "shape": [(int, str, null)]}],
        "instructions": int,
        "partitions": [{"index": int, "backend": str, "backend_version": str, "entry": str, "nodes": int,
                        "ops": {"*": int}}],
        "fallbacks": [{"node": str, "op": str, "reason": str}],
        "fallback_groups": [{"reason": str, "nodes": int, "ops": {"*": int}}],
        "peak_activation_bytes": int,
        "dynamic_values": int,
        "constants": {"inline": CONSTANTS, "referenced": CONSTANTS,
                      "splat": {"count": int, "bytes": int, "expanded_bytes": int}},
        "artifact_bytes": int,
        "cache": ({"directory": str, "token": str, "cached": (bool, null), "stage": (str, null),
                   "origin": (str, null), "detail": (str, null)}, null),
    },
    ("cache", "ls"): {
        "directory": str,
        "entries": [{"token": str, "plan_hash": str, "data_hash": str, "plan_size": int, "data_size": int,
                     "size": int, "nncc_version": str, "format_version": int, "source_path": (str, null),
                     "model_hash": (str, null), "preference": (str, null), "options": (str, null),
                     "created": number, "last_used": number, "hits": int, "compile_seconds": (number, null),
                     "objects": [str]}],
        "objects": [{"key": str, "hash": str, "size": int, "created": number, "last_used": number, "users": int}],
    },
    ("cache", "info"): {
        "directory": str, "index": str, "nncc_version": (str, null), "entries": int, "total_bytes": int,
        "max_bytes": (int, null), "stale_entries": int, "objects": int, "object_bytes": int, "unused_objects": int,
        "counters": {"hits": int, "misses": int, "corruptions": int, "recompiles": int, "evictions": int,
                     "remote_hits": int, "remote_misses": int, "remote_rejected": int, "remote_errors": int,
                     "upgrades": int},
        "hit_rate": (number, null), "read_only": bool, "disk_full": bool,
        "stats": {"time_saved_seconds": number, "compile_seconds_avoided": number, "hit_seconds": number,
                  "average_hit_seconds": (number, null), "compile_seconds": number,
                  "average_compile_seconds": (number, null),
                  "miss_reasons": {"new_model": int, "changed_options": int, "version_change": int,
                                   "tamper": int, "evicted": int}},
        "stats_since": (number, null),
        "remote": ({"url": str, "state": str}, null),
    },
    ("cache", "verify"): {
        "directory": str, "ok": bool, "fix": bool, "counts": {"*": int},
        "findings": [{"status": str, "token": (str, null), "detail": str, "paths": [str], "bytes": int,
                      "source": (str, null), "fixed": bool}],
    },
    ("cache", "gc"): {
        "directory": str, "dry_run": bool,
        "removed": [{"token": (str, null), "reason": str, "bytes": int, "source": (str, null),
                     "paths": [str]}],
        "freed_bytes": int, "skipped_busy": [str],
    },
    ("cache", "rm"): {"removed": [str], "busy": [str]},
    ("cache", "push"): {"remote": str, "pushed": [str], "failed": [{"token": str, "reason": str}]},
    ("cache", "pull"): {"remote": str, "pulled": [str], "failed": [{"token": str, "reason": str}]},
    ("cache", "remote", "keygen"): {"key_file": str},
    ("cache", "clear"): {"directory": str, "removed": int, "freed_bytes": int, "busy": [str]},
    ("cache", "zero-stats"): {"directory": str, "zeroed": bool},
    ("config", "show"): {
        "config_file": str, "exists": bool,
        "settings": {"*": {"value": (str, int, float, bool, null), "raw": (str, int, float, bool, null),
                           "source": str,
                           "where": str, "env": (str, null)}},
        "unknown_keys": [str],
    },
    ("config", "set"): {"config_file": str, "key": str, "value": (str, int, float, bool, null),
                        "raw": (str, int, float, bool), "effective_source": str},
    ("config", "unset"): {"config_file": str, "key": str, "removed": bool},
    ("config", "path"): {"config_file": str, "exists": bool},
    # the bench schema is the bench command's own (docs/bench.md); these keys are its core
    ("bench",): {
        "schema": str, "model": str, "model_kind": str, "nncc_version": str, "settings": dict,
        "compile": dict, "first_inference_seconds": (number, null), "iterations": int,
        "latency_seconds": {"min": number, "p50": number, "p90": number, "p99": number, "mean": number,
                            "stddev": number},
        "throughput_per_second": (number, null), "memory": dict,
    },
}


def check_schema(value, schema, where: str = "$") -> None:
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: expected an object, got {value!r:.80}"
        if set(schema) == {"*"}:
            for key, item in value.items():
                check_schema(item, schema["*"], f"{where}.{key}")
            return
        missing = sorted(set(schema) - set(value))
        assert not missing, f"{where}: missing keys {missing}"
        for key, sub in schema.items():
            check_schema(value[key], sub, f"{where}.{key}")
    elif isinstance(schema, list):
        assert isinstance(value, list), f"{where}: expected a list, got {value!r:.80}"
        for i, item in enumerate(value):
            check_schema(item, schema[0], f"{where}[{i}]")
    elif isinstance(schema, tuple):
        errors = []
        for option in schema:
            try:
                check_schema(value, option, where)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(f"{where}: {value!r:.80} matches none of {schema}: {errors}")
    else:
        assert isinstance(value, schema) and (schema is bool or not isinstance(value, bool)), \
            f"{where}: expected {schema.__name__}, got {type(value).__name__} {value!r:.80}"


def test_schema_checker_catches_mistakes():
    check_schema({"a": [1, 2], "b": None}, {"a": [int], "b": (str, null)})
    for bad in ({"a": [1, "x"], "b": None}, {"a": [1]}, {"a": [True], "b": None}, {"a": 1, "b": None}):
        with pytest.raises(AssertionError):
            check_schema(bad, {"a": [int], "b": (str, null)})


def test_schemas_cover_every_reporting_command():
    assert set(SCHEMAS) == set(REPORTING)


def test_docs_json_documents_every_key():
    text = (ROOT / "docs" / "json.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    for path, schema in SCHEMAS.items():
        title = f"`nncc {' '.join(path)} --json`"
        [section] = [s for s in sections if s.startswith(title)]
        if path == ("bench",):
            assert "docs/bench.md" in section or "bench.md" in section
            continue
        for key in schema:
            assert re.search(rf"\b{re.escape(key)}\b", section), (path, key)


@pytest.fixture
def populated(cli, tmp_path):
    """A cache with one entry, a compiled artifact, and the feeds of mlp."""
    artifact = tmp_path / "mlp.nncc"
    code, _, err = cli("compile", MLP, "-o", artifact)
    assert code == 0, err
    return artifact


def json_of(cli, *args) -> dict:
    code, out, err = cli(*args)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_json_schemas(cli, populated, tmp_path, monkeypatch):
    shared = tmp_path / "shared"  # a remote tier on a shared folder, for push and pull
    shared.mkdir()
    monkeypatch.setenv("NNCC_REMOTE_KEY", "a team secret of 32 bytes or more")
    outputs = {
        ("run",): json_of(cli, "run", MLP, "--random-inputs", "--json"),
        ("compile",): json_of(cli, "compile", MLP, "-o", tmp_path / "again.nncc", "--json",
                              "--depfile", tmp_path / "again.d"),
        ("inspect",): json_of(cli, "inspect", populated, "--json"),
        ("cache", "ls"): json_of(cli, "cache", "ls", "--json"),
        ("cache", "info"): json_of(cli, "cache", "info", "--json"),
        ("cache", "verify"): json_of(cli, "cache", "verify", "--json"),
        ("cache", "gc"): json_of(cli, "cache", "gc", "--max-size", "0", "--dry-run", "--json"),
    }
    token = outputs[("cache", "ls")]["entries"][0]["token"]
    outputs[("cache", "push")] = json_of(cli, "cache", "push", "--remote", f"file://{shared}", "--json")
    outputs[("cache", "pull")] = json_of(cli, "cache", "pull", token, "--remote", f"file://{shared}", "--json")
    outputs[("cache", "rm")] = json_of(cli, "cache", "rm", token[:10], "--json")
    outputs[("cache", "remote", "keygen")] = json_of(cli, "cache", "remote", "keygen", tmp_path / "team.key", "--json")
    cli("run", MLP, "--random-inputs")  # an entry for clear to remove
    outputs[("cache", "zero-stats")] = json_of(cli, "cache", "zero-stats", "--json")
    outputs[("cache", "clear")] = json_of(cli, "cache", "clear", "--json")
    if find_toolchain() is not None:  # an export links C: without a compiler it is refused
        outputs[("export",)] = json_of(cli, "export", MLP, "-o", tmp_path / "mlp-c", "--dim", "N=1", "--json")
    outputs[("config", "path")] = json_of(cli, "config", "path", "--json")
    outputs[("config", "set")] = json_of(cli, "config", "set", "cache.max_age", "30d", "--json")
    outputs[("config", "show")] = json_of(cli, "config", "show", "--json")
    outputs[("config", "unset")] = json_of(cli, "config", "unset", "cache.max_age", "--json")
    for path, payload in outputs.items():
        check_schema(payload, SCHEMAS[path], "nncc " + " ".join(path))
    # and the values behind a few keys
    assert outputs[("run",)]["cache"]["outcome"] == "hit"
    assert outputs[("compile",)]["written"] is True
    assert outputs[("inspect",)]["inputs"][0]["shape"] == ["N", 64]
    assert outputs[("cache", "rm")]["removed"] == [token]
    assert outputs[("cache", "push")]["pushed"] == outputs[("cache", "pull")]["pulled"] == [token]
    assert outputs[("cache", "clear")]["removed"] >= 1
    artifact_run = json_of(cli, "run", populated, "--random-inputs", "--json")
    check_schema(artifact_run, SCHEMAS[("run",)])
    assert artifact_run["cache"] is None


@pytest.mark.slow  # a bench run; test_bench checks its JSON keys quickly
@pytest.mark.skipif(not HAS_BENCH, reason=NO_BENCH)
def test_bench_json_schema(tmp_path):
    result = nncc_process("bench", MLP, "--iterations", "3", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr
    check_schema(json.loads(result.stdout), SCHEMAS[("bench",)], "nncc bench")


# -- stdout carries only what was asked for; -q and -v --------------------------------------


def test_compile_prints_nothing_on_stdout(cli, tmp_path):
    code, out, err = cli("compile", MLP, "-o", tmp_path / "m.nncc")
    assert code == 0 and out == ""
    assert "compiled" in err and "cache miss" in err


@pytest.mark.parametrize("args", [
    ("-q", "run", MLP, "--random-inputs"),
    ("run", MLP, "--random-inputs", "-q"),
    ("run", "--quiet", MLP, "--random-inputs"),
    ("--quiet", "compile", MLP, "-o", "{tmp}/m.nncc"),
    ("compile", MLP, "-o", "{tmp}/m.nncc", "--quiet"),
    ("cache", "-q", "verify"),
    ("-q", "cache", "gc", "--dry-run"),
    ("cache", "clear", "-q"),
], ids=lambda a: " ".join(map(str, a)).replace(str(FIXTURES) + "/", ""))
def test_quiet_hides_status_lines(cli, tmp_path, args):
    code, out, err = cli(*(str(a).replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 0 and err == "", err
    if "run" in args:
        assert "probs" in out  # requested output stays


def test_verbose_adds_detail_and_the_last_flag_wins(cli, tmp_path):
    code, out, err = cli("run", MLP, "--random-inputs", "--verbose")
    assert code == 0
    assert "cache miss" in err and "cache token " in err and "input x: float32[1, 64]" in err
    code, _, err = cli("-v", "compile", MLP, "-o", tmp_path / "m.nncc")
    assert "options: preference=fast-single-answer -O2 backends=native,numpy target=native" in err
    code, _, err = cli("-q", "run", MLP, "--random-inputs", "-v")  # the command's flag comes last
    assert "cache hit" in err and "input x" in err
    code, _, err = cli("-v", "run", MLP, "--random-inputs", "-q")
    assert err == ""
    code, out, err = cli("cache", "verify", "-v")
    assert code == 0 and out.startswith("OK ")  # -v lists the entries that are fine too
    code, out, err = cli("cache", "verify")
    assert code == 0 and out == "1 entry verified: all OK\n" and err == ""  # the report is on stdout


def test_warnings_and_errors_survive_quiet(cli, tmp_path):
    code, out, err = cli("-q", "run", tmp_path / "missing.onnx")
    assert code == 2 and err.startswith("nncc: error: ")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, out, err = cli("-q", "run", MLP, "--random-inputs", "--cache-dir", blocker / "cache")
    assert code == 0 and "nncc: warning:" in err


# -- write only when changed, --force, --depfile ------------------------------------------------


def test_unchanged_compile_leaves_the_file_and_its_mtime(cli, tmp_path):
    out = tmp_path / "m.nncc"
    first = json_of(cli, "compile", MLP, "-o", out, "--json")
    assert first["written"] is True
    old = time.time() - 1000
    os.utime(out, (old, old))
    inode = out.stat().st_ino
    again = json_of(cli, "compile", MLP, "-o", out, "--json")
    assert again["written"] is False and again["bytes"] == out.stat().st_size
    assert out.stat().st_mtime == old and out.stat().st_ino == inode
    code, _, err = cli("compile", MLP, "-o", out)
    assert code == 0 and "up to date" in err and out.stat().st_mtime == old
    forced = json_of(cli, "compile", MLP, "-o", out, "--json", "--force")
    assert forced["written"] is True and out.stat().st_mtime > old
    # different content (another preference) is written, and a damaged file is replaced
    os.utime(out, (old, old))
    assert json_of(cli, "compile", MLP, "-o", out, "--json", "-O", "0")["written"] is True
    assert out.stat().st_mtime > old
    out.write_bytes(out.read_bytes()[:-1] + b"\0")
    assert json_of(cli, "compile", MLP, "-o", out, "--json", "-O", "0")["written"] is True
    assert out.read_bytes() == nncc.compile_model(MLP, opt_level=0).to_bytes()


def test_same_content_compares_every_byte(tmp_path):
    from nncc.util.buildfiles import same_content, write_if_changed

    data = os.urandom(3 << 20)
    path = tmp_path / "f"
    assert write_if_changed(path, data) is True
    assert same_content(path, data) and write_if_changed(path, data) is False
    changed = bytearray(data)
    changed[-1] ^= 1
    assert not same_content(path, bytes(changed)) and not same_content(path, data + b"x")
    assert not same_content(tmp_path / "absent", b"") and not same_content(tmp_path, b"")
    assert write_if_changed(path, bytes(changed)) is True and path.read_bytes() == bytes(changed)


def test_depfile_format():
    from nncc.util.buildfiles import depfile

    assert depfile("out/m.nncc", ["models/m.onnx"]) == "out/m.nncc: \\\n  models/m.onnx\n"
    text = depfile("out dir/m.nncc", ["m$.onnx", "w#1.bin", "w#1.bin"])
    assert text == "out\\ dir/m.nncc: \\\n  m$$.onnx \\\n  w\\#1.bin\n\nw\\#1.bin:\n"


def external_data_model(folder: pathlib.Path) -> pathlib.Path:
    """models/ext.onnx: y = x + w, with w stored in weights.bin next to it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(folder / "ext.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    (folder / "notes.txt").write_text("not referenced")
    return folder / "ext.onnx"


@pytest.mark.slow  # a compile and three CLI processes
def test_depfile_lists_the_model_and_its_external_data(cli, tmp_path, monkeypatch):
    external_data_model(tmp_path / "models")
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("compile", "models/ext.onnx", "-o", "ext.nncc", "--depfile", "ext.d")
    assert code == 0, err
    assert (tmp_path / "ext.d").read_text() == (
        "ext.nncc: \\\n  models/ext.onnx \\\n  models/weights.bin\n\nmodels/weights.bin:\n")
    code, out, err = cli("compile", MLP, "-o", "mlp.nncc", "--depfile", "mlp.d", "--no-cache")
    assert code == 0, err
    assert (tmp_path / "mlp.d").read_text() == f"mlp.nncc: \\\n  {MLP}\n"


# -- progress only on a terminal; NO_COLOR ------------------------------------------------------


class Recorder:
    def __init__(self):
        self.events = []

    def start(self, description, total):
        self.events.append(("start", description, total))
        return len(self.events)

    def update(self, handle, description=None, advance=0):
        self.events.append(("update", description, advance))

    def finish(self, handle):
        self.events.append(("finish",))


def test_core_reports_progress_only_to_an_installed_reporter(tmp_path):
    from nncc.cache.store import Cache
    from nncc.cache.verify import verify
    from nncc.util import progress

    nncc.compile_model(MLP)  # no reporter: nothing to see, nothing fails
    recorder = Recorder()
    with progress.reporting(recorder), progress.task("compiling mlp"):
        nncc.compile_model(MLP)
    descriptions = [e[1] for e in recorder.events if e[0] == "update"]
    assert {"inferring shapes", "partitioning", "lowering"} <= set(descriptions)
    assert recorder.events[-1] == ("finish",)

    nncc.prepare(MLP, cache_dir=tmp_path / "c")
    recorder = Recorder()
    with progress.reporting(recorder), Cache.open(tmp_path / "c") as c:
        assert verify(c).ok
    assert recorder.events[0] == ("start", "verifying cache entries", 1)
    assert ("update", None, 1) in recorder.events

    class Broken(Recorder):
        def update(self, *a, **k):
            raise RuntimeError("display is broken")

    with progress.reporting(Broken()), progress.task("x", total=2) as t:
        t.advance()  # a broken display never breaks the work
        progress.describe("y")


def read_pty(master: int, proc: subprocess.Popen, timeout: float = 60) -> bytes:
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    return b"".join(chunks)


def run_on_tty(*args, stream: str, **extra) -> tuple[subprocess.CompletedProcess, bytes]:
    """Run nncc with `stream` ("stdout" or "stderr") on a pseudo-terminal, the other piped."""
    import pty

    master, slave = pty.openpty()
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, stream: slave}
    proc = subprocess.Popen([sys.executable, "-m", "nncc", *map(str, args)], cwd=ROOT,
                            env=env(**{"TERM": "xterm-256color", **extra}), stdin=subprocess.DEVNULL, **kwargs)
    os.close(slave)
    try:
        tty = read_pty(master, proc)
        other = getattr(proc, "stderr" if stream == "stdout" else "stdout").read()
        proc.wait(timeout=60)
    finally:
        os.close(master)
    piped = other.decode()
    result = subprocess.CompletedProcess(proc.args, proc.returncode,
                                         piped if stream == "stderr" else "", piped if stream == "stdout" else "")
    return result, tty


COLOR_SGR = re.compile(rb"\x1b\[([0-9;]*)m")


def colors(data: bytes) -> list[bytes]:
    """The SGR sequences in ``data`` that set a colour (bold, dim, reset are not colours)."""
    found = []
    for m in COLOR_SGR.finditer(data):
        codes = [int(c) for c in m.group(1).split(b";") if c]
        if any(30 <= c <= 38 or 40 <= c <= 48 or 90 <= c <= 97 or 100 <= c <= 107 for c in codes):
            found.append(m.group(0))
    return found


@pytest.mark.slow  # CLI processes on a pseudo-terminal and a pipe
def test_progress_is_drawn_on_a_terminal_only(tmp_path):
    cache = tmp_path / "c"
    assert nncc_process("compile", MLP, "-o", tmp_path / "m.nncc", NNCC_CACHE_DIR=str(cache)).returncode == 0
    result, tty = run_on_tty("cache", "verify", stream="stderr", NNCC_CACHE_DIR=str(cache),
                             NNCC_PROGRESS_DELAY="0")
    assert result.returncode == 0
    assert b"verifying cache entries" in tty and b"\x1b[" in tty  # drawn, then erased
    assert result.stdout == "1 entry verified: all OK\n"  # the report, on stdout
    # the same with -q, and with stderr piped: no progress, no escape codes
    result, tty = run_on_tty("cache", "verify", "-q", stream="stderr", NNCC_CACHE_DIR=str(cache),
                             NNCC_PROGRESS_DELAY="0")
    assert result.returncode == 0 and tty == b""
    piped = nncc_process("cache", "verify", NNCC_CACHE_DIR=str(cache), NNCC_PROGRESS_DELAY="0")
    assert piped.returncode == 0 and "\x1b" not in piped.stderr and "verifying" not in piped.stderr
    # TERM=dumb: a terminal, but nothing animated
    result, tty = run_on_tty("cache", "verify", stream="stderr", NNCC_CACHE_DIR=str(cache),
                             NNCC_PROGRESS_DELAY="0", TERM="dumb")
    assert b"verifying" not in tty


def test_run_on_a_terminal_keeps_stdout_for_the_outputs(tmp_path):
    """A progress display on stderr never captures what goes to stdout."""
    result, tty = run_on_tty("run", MLP, "--random-inputs", "--json", stream="stderr",
                             NNCC_CACHE_DIR=str(tmp_path / "c"), NNCC_PROGRESS_DELAY="0")
    assert result.returncode == 0
    assert json.loads(result.stdout)["outputs"][0]["name"] == "probs"
    assert b"preparing mlp.onnx" in tty


@pytest.mark.slow  # CLI processes on a pseudo-terminal and a pipe
def test_run_table_is_rich_on_a_terminal_and_plain_columns_when_piped(tmp_path):
    cache = str(tmp_path / "c")
    result, tty = run_on_tty("run", MLP, "--random-inputs", stream="stdout", NNCC_CACHE_DIR=cache)
    assert result.returncode == 0
    assert "┃" in tty.decode() or "│" in tty.decode()  # rich's box drawing
    piped = nncc_process("run", MLP, "--random-inputs", NNCC_CACHE_DIR=cache)
    lines = piped.stdout.splitlines()
    assert lines[0] == f"outputs of {MLP}"
    assert lines[1].split() == ["name", "shape", "dtype", "min", "max", "mean", "std"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert set(rows) == {"probs", "logits"} and "[1, 10]  float32" in rows["probs"]
    # columns line up: every row is as wide as the widest, numbers right-aligned
    assert len({len(line) for line in lines[1:]}) == 1
    assert not any(ch in piped.stdout for ch in "┃│─━")


@pytest.mark.slow
def test_scripted_cache_hit_imports_neither_rich_nor_importlib_metadata(tmp_path):
    """A piped `nncc run` on a cache hit is a start-up path: rich (about 30 ms) and
    importlib.metadata (20 ms or more) stay unimported when no plugin is installed."""
    cache = str(tmp_path / "c")
    assert nncc_process("run", MLP, "--random-inputs", NNCC_CACHE_DIR=cache).returncode == 0
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "nncc", "run", MLP, "--random-inputs"],
                            cwd=ROOT, env=env(NNCC_CACHE_DIR=cache), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "cache hit" in result.stderr
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "numpy" in imported  # the import log is there
    assert not {name for name in imported if name.split(".")[0] == "rich"}
    assert "importlib.metadata" not in imported


@pytest.mark.slow
def test_program_flushes_everything_before_its_fast_exit(tmp_path):
    """`nncc` ends with os._exit (no interpreter teardown): what it printed must still be
    complete in a file, and exit codes must survive."""
    out, err = tmp_path / "out.json", tmp_path / "err.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        done = subprocess.run([sys.executable, "-m", "nncc", "run", MLP, "--random-inputs", "--json"],
                              cwd=ROOT, env=env(NNCC_CACHE_DIR=str(tmp_path / "c")), stdout=stdout,
                              stderr=stderr, timeout=120)
    assert done.returncode == 0
    assert json.loads(out.read_text())["outputs"][0]["name"] == "probs"
    assert "cache miss" in err.read_text()
    with open(out, "w") as stdout, open(err, "w") as stderr:
        done = subprocess.run([sys.executable, "-m", "nncc", "run", tmp_path / "missing.onnx"], cwd=ROOT,
                              env=env(), stdout=stdout, stderr=stderr, timeout=120)
    assert done.returncode == 2 and out.read_text() == ""
    assert err.read_text().startswith("nncc: error: cannot read")


@pytest.mark.slow
def test_no_color_and_non_tty_output_have_no_escapes(tmp_path):
    cache = str(tmp_path / "c")
    # on a terminal, inspect colours backends and fallbacks ...
    result, colored = run_on_tty("inspect", MLP, stream="stdout", NNCC_CACHE_DIR=cache)
    assert result.returncode == 0 and colors(colored), colored[:300]
    # ... NO_COLOR=1 turns every colour off, even on a terminal
    result, plain = run_on_tty("inspect", MLP, stream="stdout", NNCC_CACHE_DIR=cache, NO_COLOR="1")
    assert result.returncode == 0 and b"fallback" in plain and colors(plain) == []
    # and output that is not a terminal has no escape sequences at all, NO_COLOR or not
    commands = [("inspect", MLP), ("run", MLP, "--random-inputs"), ("compile", MLP, "-o", tmp_path / "m.nncc"),
                ("cache", "ls"), ("cache", "info"), ("cache", "verify"), ("cache", "gc", "--dry-run")]
    for extra in ({}, {"NO_COLOR": "1"}):
        for args in commands:
            result = nncc_process(*args, NNCC_CACHE_DIR=cache, **extra)
            assert result.returncode == 0, (args, result.stderr)
            assert "\x1b" not in result.stdout + result.stderr, (args, extra)


# -- errors: one line, a hint where it helps, NNCC_DEBUG --------------------------------------


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if not line.startswith("nncc: cache ")]
    assert len(lines) == 1 and lines[0].startswith("nncc: error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.mark.parametrize("command", [("run",), ("compile", "-o", "out.nncc"), ("inspect",)])
def test_missing_model_suggests_checking_the_path(tmp_path, command):
    result = nncc_process(command[0], "nope/model.onnx", *command[1:], cwd=tmp_path)
    line = error_line(result)
    assert result.returncode == 2
    assert "nope/model.onnx" in line and "(hint: check the path" in line and str(tmp_path) in line


def test_unknown_input_lists_the_model_inputs(tmp_path):
    np.save(tmp_path / "v.npy", np.zeros((1, 64), np.float32))
    line = error_line(nncc_process("run", MLP, "-i", f"bogus={tmp_path / 'v.npy'}"))
    assert "unknown input 'bogus'" in line and "the model's inputs are: x" in line


@pytest.mark.slow  # a plugin compile and CLI processes
def test_artifact_needing_a_plugin_names_it(tmp_path):
    out = tmp_path / "m.nncc"
    extra = {"PYTHONPATH": os.pathsep.join([str(ROOT / "examples"), str(ROOT)])}
    result = nncc_process("compile", FIXTURES / "mobilenet.onnx", "-o", out, "--plugin", "plugin_example",
                          "--backend", "example", "--backend", "numpy", "--no-cache", **extra)
    assert result.returncode == 0, result.stderr
    line = error_line(nncc_process("run", out, "--random-inputs", **extra))
    assert "not registered" in line and "--plugin plugin_example" in line
    assert nncc_process("run", out, "--random-inputs", "--plugin", "plugin_example", **extra).returncode == 0


@pytest.mark.slow  # CLI processes; test_partition names plugins quickly
def test_unknown_custom_op_suggests_a_plugin(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"], domain="example")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example", 1)])
    (tmp_path / "swish.onnx").write_bytes(model.SerializeToString())
    line = error_line(nncc_process("run", tmp_path / "swish.onnx", "--random-inputs", "--no-cache"))
    assert "unsupported op 'Swish'" in line and "hint: a plugin may register example ops" in line
    # ... and with the example plugin it runs: example::Swish is its custom op
    result = nncc_process("run", tmp_path / "swish.onnx", "--random-inputs", "--no-cache", "--json",
                          "--plugin", "plugin_example",
                          PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), str(ROOT)]))
    assert result.returncode == 0, result.stderr


def test_compiling_an_artifact_is_refused(populated):
    line = error_line(nncc_process("compile", populated, "-o", populated.with_name("again.nncc")))
    assert "already a compiled nncc artifact" in line


@pytest.mark.parametrize("args, fragment", [
    (("run", MLP, "--bogus"), "no such option '--bogus'"),
    (("frobnicate",), "no such command 'frobnicate'"),
    (("run",), "missing argument 'MODEL'"),
    (("compile", MLP), "missing option '-o'"),
    (("cache", "gc", "--max-size"), "option '--max-size' requires an argument"),
    (("-q", "cache", "gc", "--max-size"), "(hint: see 'nncc cache gc --help')"),
])
def test_usage_errors_are_one_line_with_a_help_hint(args, fragment):
    result = nncc_process(*args)
    line = error_line(result)
    assert result.returncode == 2
    assert fragment.lower() in line.lower() and "--help'" in line


def test_nncc_debug_shows_the_traceback(tmp_path):
    result = nncc_process("run", tmp_path / "missing.onnx")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    debug = nncc_process("run", tmp_path / "missing.onnx", NNCC_DEBUG="1")
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr and "FileAccessError" in debug.stderr
    usage = nncc_process("run", "--bogus", NNCC_DEBUG="1")
    assert usage.returncode != 0 and "Traceback (most recent call last)" in usage.stderr


# -- shell completion -----------------------------------------------------------------------------


def test_completion_scripts_hand_over_to_the_installed_click():
    """completions/ holds no copy of click's completion script, whose protocol changes
    between click versions (the fish one did from 8.4 to 8.5): each script asks the
    installed nncc for it (`_NNCC_COMPLETE=<shell>_source nncc`) on first use."""
    for shell, name in (("bash", "nncc.bash"), ("zsh", "_nncc"), ("fish", "nncc.fish")):
        script = (ROOT / "completions" / name).read_text()
        assert f"_NNCC_COMPLETE={shell}_source nncc" in script
        assert f"{shell}_complete" not in script  # click's side of the protocol stays in click
    assert (ROOT / "completions" / "_nncc").read_text().startswith("#compdef nncc\n")


def _nncc_on_path(tmp_path) -> pathlib.Path:
    """A folder with an `nncc` that runs this checkout, for the shells to find on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nncc").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nncc "$@"\n')
    (bin_dir / "nncc").chmod(0o755)
    return bin_dir


def complete(args: list[str], incomplete: str) -> list[tuple[str, str | None]]:
    from click.shell_completion import ShellComplete

    from nncc.cli.main import cli as root

    items = ShellComplete(root, {}, "nncc", "_NNCC_COMPLETE").get_completions(args, incomplete)
    return [(item.value, item.help) for item in items]


def test_completion_of_commands_and_options():
    assert [v for v, _ in complete([], "c")] == ["cache", "compile", "config"]
    assert [v for v, _ in complete(["config", "set"], "cache.max_")] == ["cache.max_size", "cache.max_age"]
    assert {"ls", "info", "verify", "gc", "rm", "clear"} <= {v for v, _ in complete(["cache"], "")}
    assert "--depfile" in {v for v, _ in complete(["compile"], "--d")}
    assert [v for v, _ in complete(["run", "--preference"], "s")] == ["sustained-speed"]


def test_completing_command_names_imports_no_command():
    code = ("import os, sys, json\n"
            "os.environ.update(COMP_WORDS='nncc ', COMP_CWORD='1', _NNCC_COMPLETE='bash_complete')\n"
            "from nncc.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('nncc.cli.') or m in "
            "('numpy', 'rich'))), file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=60)
    assert "plain,run" in result.stdout and "plain,cache" in result.stdout
    assert json.loads(result.stderr.strip().splitlines()[-1]) == ["nncc.cli.main", "nncc.cli.options"]


def test_cache_rm_completes_tokens_from_the_index(tmp_path, monkeypatch):
    cache = tmp_path / "c"
    monkeypatch.setenv("NNCC_CACHE_DIR", str(cache))
    assert complete(["cache", "rm"], "") == []  # no cache yet: nothing, and nothing created
    assert not cache.exists()
    _, first = nncc.prepare(MLP)
    _, second = nncc.prepare(FIXTURES / "resnet_block.onnx")
    items = dict(complete(["cache", "rm"], ""))
    # tokens with the model name beside them, and the model names themselves (rm takes both)
    assert set(items) == {first.token[:12], second.token[:12], "mlp.onnx", "resnet_block.onnx"}
    assert re.fullmatch(r"mlp\.onnx, [0-9.]+ KiB", items[first.token[:12]])
    assert re.fullmatch(r"resnet_block\.onnx, [0-9.]+ KiB", items[second.token[:12]])
    assert re.fullmatch(r"1 entry, [0-9.]+ KiB", items["mlp.onnx"])
    assert first.token[:12] in dict(complete(["cache", "rm"], first.token[:3]))
    assert complete(["cache", "rm"], first.token[:20]) == [(first.token, items[first.token[:12]])]
    assert complete(["cache", "rm"], "res") == [("resnet_block.onnx", items["resnet_block.onnx"])]
    assert complete(["cache", "ls"], "ml") == [("mlp.onnx", items["mlp.onnx"])]
    assert complete(["cache", "rm"], "xyz") == []
    # --cache-dir given before the tokens is honoured
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert complete(["cache", "rm", "--cache-dir", str(cache)], "")
    assert complete(["cache", "rm"], "") == []


def test_token_completion_never_fails(tmp_path, monkeypatch):
    from nncc.cli.complete import cached_tokens

    cache = tmp_path / "c"
    cache.mkdir()
    (cache / "index.sqlite3").write_bytes(b"this is not a database" * 100)
    assert cached_tokens(str(cache), "") == []
    assert (cache / "index.sqlite3").read_bytes() == b"this is not a database" * 100  # untouched
    (cache / "index.sqlite3").unlink()
    (cache / "index.sqlite3").mkdir()
    assert cached_tokens(str(cache), "") == []
    result = subprocess.run([sys.executable, "-m", "nncc"], capture_output=True, text=True, timeout=60,
                            env=env(_NNCC_COMPLETE="bash_complete", COMP_WORDS="nncc cache rm ", COMP_CWORD="3",
                                    NNCC_CACHE_DIR=str(cache)))
    assert result.returncode == 0 and result.stdout.strip() == "" and result.stderr == ""


def test_completion_constants_match_the_cache():
    import nncc.settings
    from nncc.cache import index, store
    from nncc.cli import complete as comp

    assert comp.INDEX_NAME == index.INDEX_NAME and comp.ENV_DIR == store.ENV_DIR
    assert comp.cache_directory(None) == nncc.settings.cache_dir(None)
    assert comp.cache_directory("x") == nncc.settings.cache_dir("x")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_end_to_end(tmp_path):
    """Source completions/nncc.bash in a real bash and press TAB twice (call the function
    `complete` registered): the first loads click's script, the second uses it."""
    bin_dir = _nncc_on_path(tmp_path)
    nncc.prepare(MLP, cache_dir=tmp_path / "c")
    tab = 'fn=$(complete -p nncc | sed -E "s/.* -F ([^ ]+) .*/\\1/"); COMPREPLY=(); $fn nncc'
    script = (
        f"source {ROOT / 'completions' / 'nncc.bash'}\n"
        "complete -p nncc\n"
        f"COMP_WORDS=(nncc ca); COMP_CWORD=1; {tab}; echo \"words: ${{COMPREPLY[*]}}\"\n"
        "complete -p nncc\n"
        f"COMP_WORDS=(nncc cache rm ''); COMP_CWORD=3; {tab}; echo \"tokens: ${{COMPREPLY[*]}}\"\n"
    )
    result = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True,
                            timeout=60, env=env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                                NNCC_CACHE_DIR=str(tmp_path / "c")))
    assert result.returncode == 0, result.stderr
    registered = [line for line in result.stdout.splitlines() if line.startswith("complete ")]
    assert registered == ["complete -o nosort -F _nncc_completion_load nncc",
                          "complete -o nosort -F _nncc_completion nncc"]
    assert "words: cache" in result.stdout
    [tokens] = [line for line in result.stdout.splitlines() if line.startswith("tokens: ")]
    assert re.fullmatch(r"tokens: [0-9a-f]{12} mlp\.onnx", tokens), tokens  # the model's name beside its token


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed (apt-get install zsh)")
def test_zsh_completion_end_to_end(tmp_path):
    """Autoload completions/_nncc in a real zsh and run it as the completion system would,
    with compdef, compadd and _describe recording what they are given."""
    bin_dir = _nncc_on_path(tmp_path)
    script = (
        f"fpath=({ROOT / 'completions'} $fpath)\n"
        "compdef() { print -r -- \"compdef $*\" }\n"
        "compadd() { print -r -- \"compadd ${(P)${@[-1]}}\" }\n"
        "_describe() { print -r -- \"describe ${(P)3}\" }\n"
        "autoload -Uz _nncc\n"
        "words=(nncc ca); CURRENT=2; _nncc\n"
        "words=(nncc cache g); CURRENT=3; _nncc_completion\n"
    )
    result = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True, timeout=60,
                            env=env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "compdef _nncc_completion nncc" in lines  # registered for the next completions
    assert any(line.startswith("describe cache:") for line in lines), lines
    assert any(line.startswith("describe gc:") for line in lines), lines


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed (apt-get install fish)")
def test_fish_completion_end_to_end(tmp_path):
    """Load completions/nncc.fish in a real fish and ask it to complete command lines."""
    bin_dir = _nncc_on_path(tmp_path)
    nncc.prepare(MLP, cache_dir=tmp_path / "c")
    script = (f"source {ROOT / 'completions' / 'nncc.fish'}\n"
              "complete -C 'nncc ca'\n"
              "echo ---\n"
              "complete -C 'nncc cache rm '\n")
    result = subprocess.run(["fish", "--no-config", "-c", script], capture_output=True, text=True, timeout=60,
                            env=env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                    NNCC_CACHE_DIR=str(tmp_path / "c")))
    assert result.returncode == 0, result.stderr
    commands, tokens = result.stdout.split("---\n")
    assert [line.split("\t")[0] for line in commands.splitlines()] == ["cache"]
    token, name = [line.split("\t") for line in tokens.splitlines()]
    assert re.fullmatch(r"[0-9a-f]{12}", token[0]) and token[1].startswith("mlp.onnx, "), token
    assert name[0] == "mlp.onnx", name


@pytest.mark.slow
def test_fast_exit_still_runs_what_plugins_left_to_finish(tmp_path):
    """nncc skips the interpreter's finalization, not a normal exit's duties: a plugin's
    atexit handler runs and its non-daemon thread is waited for."""
    (tmp_path / "finishing_plugin.py").write_text(
        "import atexit, os, threading, time\n"
        "def _late():\n"
        "    time.sleep(0.3)\n"
        "    open(os.environ['THREAD_FILE'], 'w').write('thread done')\n"
        "threading.Thread(target=_late).start()\n"
        "atexit.register(lambda: open(os.environ['ATEXIT_FILE'], 'w').write('atexit ran'))\n")
    done = nncc_process("run", FIXTURES / "mlp.onnx", "--random-inputs", "-q", "--plugin", "finishing_plugin",
                        "--cache-dir", tmp_path / "cache", PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
                        THREAD_FILE=str(tmp_path / "thread.txt"), ATEXIT_FILE=str(tmp_path / "atexit.txt"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "thread.txt").read_text() == "thread done"
    assert (tmp_path / "atexit.txt").read_text() == "atexit ran"
