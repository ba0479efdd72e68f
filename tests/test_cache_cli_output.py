"""The cache commands read well: `ls` fits 80 columns without cutting a token prefix or a
model name, `ls`/`rm` take model-name patterns, `--help` cuts nothing and lists exit code
130, reports go to stdout and every line on stderr speaks with the `nncc:` prefix."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, ROOT

MLP = FIXTURES / "mlp.onnx"
RESNET = FIXTURES / "resnet_block.onnx"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> pathlib.Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("NNCC_CACHE_DIR", str(path))
    return path


def nncc(*args, cwd=None, **env) -> subprocess.CompletedProcess:
    """A real `nncc` process with stdout piped (not a terminal)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NNCC_DEBUG")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    environ.update({k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], capture_output=True, text=True,
                          env=environ, timeout=300, cwd=cwd)


def listed(cli) -> list[dict]:
    code, out, err = cli("cache", "ls", "--json")
    assert code == 0, err
    return json.loads(out)["entries"]


def populate(cli, tmp_path) -> pathlib.Path:
    """mlp, resnet_block twice (two preferences) and a model with a long name."""
    long_name = tmp_path / "models" / "a_rather_long_model_name_for_testing_columns_v2.onnx"
    long_name.parent.mkdir()
    shutil.copy(FIXTURES / "gru_cell.onnx", long_name)  # other bytes: its own entry
    for args in ((MLP,), (RESNET,), (RESNET, "--preference", "low-power"), (long_name,)):
        code, _, err = cli("run", *args, "--random-inputs")
        assert code == 0, err
    return long_name


# -- ls at 80 columns ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 60, 40])
def test_ls_fits_the_width_without_cutting_tokens_or_names(cli, cache_dir, tmp_path, columns):
    populate(cli, tmp_path)
    entries = listed(cli)
    result = nncc("cache", "ls", NNCC_CACHE_DIR=cache_dir, COLUMNS=columns)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"nncc cache at {cache_dir}"
    table = lines[1:]
    assert table[0].split()[:2] == ["token", "model"] and len(table) == 1 + len(entries)
    widest_kept = 12 + 2 + max(len(os.path.basename(e["source_path"])) for e in entries)
    for line in table:
        assert len(line) <= max(columns, widest_kept), line
        assert "…" not in line and "..." not in line
    for entry, line in zip(entries, table[1:]):  # ls --json and ls list in the same order
        assert line.split()[:2] == [entry["token"][:12], os.path.basename(entry["source_path"])]
    if columns == 80:  # beside the 52-character name, only the most useful column fits
        assert table[0].split() == ["token", "model", "size"]


@pytest.mark.slow
def test_ls_wide_shows_every_column_and_wide_terminals_more(cli, cache_dir, tmp_path):
    for args in ((MLP,), (RESNET,), (RESNET, "--preference", "low-power")):
        assert cli("run", *args, "--random-inputs")[0] == 0
    at80 = nncc("cache", "ls", NNCC_CACHE_DIR=cache_dir, COLUMNS=80).stdout.splitlines()
    assert at80[1].split() == ["token", "model", "size", "preference", "hits", "last", "used"]
    assert max(map(len, at80[1:])) <= 80  # (the title line holds the whole folder path)
    wide = nncc("cache", "ls", "--wide", NNCC_CACHE_DIR=cache_dir, COLUMNS=40)
    header = wide.stdout.splitlines()[1]
    for title in ("token", "model", "model cache", "data cache", "size", "preference", "hits", "last used",
                  "version", "created"):
        assert title in header, title
    roomy = nncc("cache", "ls", NNCC_CACHE_DIR=cache_dir, COLUMNS=200).stdout.splitlines()[1]
    assert roomy.split() == ["token", "model", "size", "preference", "hits", "last", "used", "version", "created"]


def test_ls_and_rm_take_a_model_name_pattern(cli, cache_dir, tmp_path):
    long_name = populate(cli, tmp_path)
    entries = listed(cli)

    def tokens_of(*names):
        return sorted(e["token"] for e in entries if os.path.basename(e["source_path"]) in names)

    def ls(*patterns):
        code, out, err = cli("cache", "ls", *patterns, "--json")
        assert code == 0, err
        return sorted(e["token"] for e in json.loads(out)["entries"])

    assert ls("resnet*") == tokens_of("resnet_block.onnx") and len(ls("resnet*")) == 2
    assert ls("mlp") == ls("mlp.onnx") == tokens_of("mlp.onnx")  # the name without .onnx too
    assert ls("*.onnx") == sorted(e["token"] for e in entries)
    assert ls(str(long_name.parent) + "/*") == tokens_of(long_name.name)  # a pattern with / matches the path
    one = entries[0]["token"]
    assert ls(one[:6]) == [one]
    assert ls("mlp", "resnet*") == tokens_of("mlp.onnx", "resnet_block.onnx")
    code, out, err = cli("cache", "ls", "nothing*")
    assert code == 0 and err == "nncc: no entries match 'nothing*'\n"

    code, out, err = cli("cache", "rm", "resnet*", "--json")
    assert code == 0, err
    assert sorted(json.loads(out)["removed"]) == tokens_of("resnet_block.onnx")
    assert sorted(e["token"] for e in listed(cli)) == tokens_of("mlp.onnx", long_name.name)
    code, out, err = cli("cache", "rm", "mlp")
    assert code == 0 and [line.split()[:3] for line in out.splitlines()] == \
        [["removed", t[:12], "mlp.onnx"] for t in tokens_of("mlp.onnx")]
    code, out, err = cli("cache", "rm", "nothing*")
    assert code == 2 and err.startswith("nncc: error: no cache entry matches 'nothing*'")
    assert [e["token"] for e in listed(cli)] == tokens_of(long_name.name)


def test_rm_refuses_an_argument_that_is_both_a_token_prefix_and_a_name(cli, cache_dir, tmp_path):
    code, out, _ = cli("run", MLP, "--random-inputs", "--json")
    token = json.loads(out)["cache"]["token"]
    hexname = tmp_path / f"{token[0]}.onnx"  # a model named like the first digit of a token
    shutil.copy(RESNET, hexname)
    assert cli("run", hexname, "--random-inputs")[0] == 0
    code, out, err = cli("cache", "rm", token[0])
    assert code == 2 and "both a token prefix and a model name" in err
    assert len(listed(cli)) == 2  # nothing removed
    assert cli("cache", "rm", f"{token[0]}.onnx")[0] == 0
    assert [e["token"] for e in listed(cli)] == [token]


# -- help ----------------------------------------------------------------------------------------


def test_cache_help_shows_whole_summaries():
    from nncc.cli.cache import cache

    result = nncc("cache", "--help", COLUMNS=80)
    assert result.returncode == 0
    commands = result.stdout.split("Commands:")[1]
    assert "..." not in commands
    text = " ".join(commands.split())  # the summaries may wrap, never end cut
    for name, command in cache.commands.items():
        first_sentence = re.match(r"(.+?\.)(\s|$)", " ".join(command.help.split())).group(1)
        assert f"{name} {first_sentence}" in text, name


@pytest.mark.parametrize("command", [("run",), ("compile",), ("inspect",), ("bench",), ("cache",),
                                     ("cache", "ls"), ("cache", "rm"), ("cache", "gc"), ("cache", "zero-stats")])
def test_every_help_lists_the_interrupt_exit_codes(cli, command):
    code, out, _ = cli(*command, "--help")
    text = " ".join(out.split())
    assert code == 0 and "130 interrupted (Ctrl-C)" in text and "143 terminated (SIGTERM)" in text


# -- one voice -----------------------------------------------------------------------------------


def test_reports_on_stdout_and_nncc_on_every_stderr_line(cli, cache_dir, tmp_path):
    stderr = []

    def run(*args, expect=0):
        code, out, err = cli(*args)
        assert code == expect, err
        stderr.extend(err.splitlines())
        return out

    run("run", MLP, "--random-inputs")
    run("run", MLP, "--random-inputs")
    run("compile", MLP, "-o", tmp_path / "m.nncc")
    run("compile", MLP, "-o", tmp_path / "m.nncc")  # up to date
    run("cache", "ls", "zzz*")
    assert run("cache", "verify").splitlines() == ["1 entry verified: all OK"]
    assert run("cache", "gc", "--max-size", "0", "--dry-run").splitlines()[-1].startswith("dry run: 1 item would go")
    assert run("cache", "gc").splitlines() == ["removed 0 items, freed 0 B"]
    assert run("cache", "clear").splitlines()[-1].startswith(f"cleared {cache_dir}: removed 1 item, freed ")
    assert run("cache", "zero-stats").splitlines() == [f"zeroed the statistics of {cache_dir}"]
    run("cache", "rm", "zzz", expect=2)
    assert stderr and all(line.startswith("nncc: ") for line in stderr), stderr
    compiled = [line for line in stderr if " -> " in line or "up to date" in line]
    assert len(compiled) == 2 and all("KiB" in line and "bytes" not in line for line in compiled)
    # reports are what was asked for: --quiet hides status lines, not reports
    code, out, err = cli("-q", "cache", "gc")
    assert code == 0 and out == "removed 0 items, freed 0 B\n" and err == ""


def test_verify_wording_says_what_was_found_and_done(cli, cache_dir):
    from nncc.cache.store import Cache

    code, out, _ = cli("run", MLP, "--random-inputs", "--json")
    token = json.loads(out)["cache"]["token"]
    assert cli("run", RESNET, "--random-inputs")[0] == 0
    plan = pathlib.Path(Cache(str(cache_dir)).paths(token)[0])
    plan.write_bytes(b"junk")
    code, out, _ = cli("cache", "verify")
    assert code == 1 and out.splitlines()[-1] == "problems found: 1 CORRUPT, 1 OK"
    code, out, _ = cli("cache", "verify", "--fix")
    assert code == 0 and out.splitlines()[-1] == "problems fixed: 1 CORRUPT removed, 1 OK"
    code, out, _ = cli("cache", "verify")
    assert code == 0 and out == "1 entry verified: all OK\n"
    assert "ok:" not in out


# -- docs/cache.md -------------------------------------------------------------------------------


@pytest.mark.slow
def test_docs_cache_examples_run_as_shown(tmp_path):
    """Every `$ nncc ...` line of docs/cache.md's console blocks runs, in order, in a folder
    with model.onnx and a fresh cache, and exits 0; every output line shown there starts
    like a line nncc printed, up to its first number or path (timings, tokens and folders
    differ from run to run)."""
    import shlex

    text = (ROOT / "docs" / "cache.md").read_text()
    blocks = re.findall(r"^```console\n(.*?)^```$", text, flags=re.M | re.S)
    assert len(blocks) >= 3
    shutil.copy(MLP, tmp_path / "model.onnx")
    ran = 0
    for block in blocks:
        command, shown, actual = None, [], []
        for line in block.splitlines() + ["$ end"]:
            if not line.startswith("$ "):
                shown.append(line)
                continue
            if command is not None:
                stable = [" ".join(re.split(r"[0-9/]", s, maxsplit=1)[0].split()) for s in shown]
                for want, full in zip(stable, shown):
                    assert any(" ".join(a.split()).startswith(want) for a in actual), (command, full, actual)
            if line == "$ end":
                break
            command = shlex.split(line[2:])
            assert command[0] == "nncc", line
            result = nncc(*command[1:], NNCC_CACHE_DIR=tmp_path / "cache", COLUMNS=80, cwd=tmp_path)
            assert result.returncode == 0, (line, result.stderr)
            shown, actual = [], (result.stdout + result.stderr).splitlines()
            ran += 1
    assert ran >= 8
