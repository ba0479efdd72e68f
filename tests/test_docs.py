"""The README works as written: every ```sh block (except the installation) and the Python
API example run, top to bottom, in a copy of the repository's fixtures and examples, as a
newcomer would run them; the documents it links exist; CHANGELOG.md keeps its form.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import nncc
from tests.conftest import ROOT

README = ROOT / "README.md"
NOT_RUN = {"Set up": "installs the package (the tests run against this checkout)"}


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(section heading, fence language, code) for every fenced block, in order."""
    found, section, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = re.match(r"#{2,3} (.*)", line)
        if heading:
            section = heading.group(1).strip("` ")
        fence = re.match(r"```(\w*)\s*$", line)
        if fence:
            end = lines.index("```", i + 1)
            found.append((section, fence.group(1), "\n".join(lines[i + 1:end])))
            i = end
        i += 1
    return found


def runnable() -> list[tuple[str, str, str]]:
    return [(section, lang, code) for section, lang, code in blocks(README.read_text())
            if (lang == "sh" and section not in NOT_RUN) or (lang == "python" and section == "Python API")]


def test_every_command_has_a_readme_section_with_an_example():
    from nncc.cli.main import COMMANDS

    sections = {section for section, lang, _ in runnable()}
    for name in COMMANDS:
        assert f"nncc {name}" in sections, name
    for title in ("First steps", "Using nncc from make", "Plugins", "Output, exit codes and environment"):
        assert title in sections, title
    text = README.read_text()
    for title in ("## Shell completion", "## Artifact format", "## Benchmarks", "## Python API"):
        assert title in text
    assert "benchmarks/RESULTS.md" in text and "nncc/plan/format.py" in text


def test_readme_links_point_at_files():
    text = README.read_text()
    for target in re.findall(r"\]\(((?!https?:|#)[^)]+)\)", text):
        if target == "benchmarks/RESULTS.md":
            continue  # written with the benchmark results, by another change
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), target
        if anchor:  # a section of that document, by GitHub's heading anchor
            headings = re.findall(r"^#+ (.*)$", (ROOT / path).read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, target


@pytest.fixture
def newcomer(tmp_path) -> tuple[pathlib.Path, dict[str, str]]:
    """A working copy with the fixtures and examples, `nncc` and `python` on PATH
    (this checkout's nncc), and its own compilation cache."""
    work = tmp_path / "nncc"
    shutil.copytree(ROOT / "fixtures", work / "fixtures", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__", "build"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nncc").write_text(
        f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{ROOT}" exec "{sys.executable}" -m nncc "$@"\n')
    (bin_dir / "nncc").chmod(0o755)
    # a wrapper, not a symlink: Python 3.10 finds its virtual environment from the path it
    # was started by, so a symlink elsewhere would start it without the venv's packages
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = dict(os.environ)
    for key in ("NNCC_DEBUG", "MAKEFLAGS", "MAKELEVEL", "PYTHONPATH"):
        env.pop(key, None)
    for key in [k for k in env if k.startswith("NNCC_")]:
        env.pop(key)  # no setting of the test's own environment leaks into the examples
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", NNCC_CACHE_DIR=str(tmp_path / "cache"),
               NNCC_CONFIG_FILE=str(tmp_path / "config" / "config.toml"))
    return work, env


@pytest.mark.slow  # every README example, each a process
def test_readme_examples_run(newcomer):
    work, env = newcomer
    outputs = {}
    for section, lang, code in runnable():
        if lang == "sh":
            command = ["bash", "-e", "-o", "pipefail", "-c", code]
        else:
            command = [sys.executable, "-c", code]
            env = dict(env, PYTHONPATH=str(ROOT))
        result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"README section {section!r}:\n{code}\n{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, (section, result.stderr)
        outputs.setdefault(section, []).append(result)
    first = outputs["First steps"][0]
    assert "cache miss" in first.stderr and "up to date" in first.stderr  # compiled, then a verified hit
    assert "mlp.onnx" in first.stdout and "probs" in first.stdout and "latency" in first.stdout
    assert (work / "build" / "mlp.nncc").read_bytes() == nncc.compile_model(work / "fixtures" / "mlp.onnx").to_bytes()
    assert '"written"' in outputs["nncc compile"][0].stdout
    assert (work / "build" / "resnet_block.d").exists() and (work / "build" / "bench.json").exists()
    assert "example" in outputs["Plugins"][0].stdout  # inspect shows the example backend's partitions
    assert "Nothing to be done" in outputs["Using nncc from make"][0].stdout
    assert "{'probs': (3, 10), 'logits': (3, 10)}" in outputs["Python API"][0].stdout
    config = outputs["nncc config"][0]
    assert "run.preference" in config.stdout and "NNCC_CACHE_MAX_SIZE" in config.stdout
    assert config.stdout.rstrip().endswith(env["NNCC_CONFIG_FILE"])
    assert not pathlib.Path(env["NNCC_CONFIG_FILE"]).read_text().strip()  # everything unset again


CACHE_DOC = ROOT / "docs" / "cache.md"


@pytest.mark.slow  # every cache doc example, each a process
def test_cache_doc_examples_run(newcomer):
    """docs/cache.md's ```sh blocks run, in order, like the README's."""
    work, env = newcomer
    examples = [(section, code) for section, lang, code in blocks(CACHE_DOC.read_text()) if lang == "sh"]
    assert any(section == "Configuration" for section, _ in examples)
    for section, code in examples:
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=work, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"docs/cache.md section {section!r}:\n{code}\n{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, (section, result.stderr)


def test_readme_plugin_api_excerpt_names_real_things():
    [excerpt] = [code for section, lang, code in blocks(README.read_text())
                 if section == "Plugins" and lang == "python"]
    imports = "\n".join(line for line in excerpt.splitlines() if line.startswith("from "))
    exec(compile(imports, "README.md", "exec"), {})
    source = (ROOT / "examples" / "plugin_example.py").read_text()
    for name in ("class ExampleBackend(Backend)", "def register()", '@kernel("Swish"', "def partition",
                 "def compile"):
        assert name in source


def test_changelog_keeps_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "keepachangelog.com" in text
    releases = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert releases and releases[0] == "Unreleased"
    for kind in re.findall(r"^### (.+)$", text, re.M):
        assert kind in ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"), kind
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    for mention in ("--depfile", "completions/", "--quiet", "docs/json.md", "NO_COLOR"):
        assert mention in unreleased, mention


def test_readme_settings_table_lists_every_setting_with_its_variable_and_default():
    """The configuration table is the user's reference: each key nncc reads, with the
    environment variable and default that nncc.settings really uses."""
    from nncc.settings import SETTINGS

    rows = [line.split("|")[1:-1] for line in README.read_text().splitlines()
            if line.startswith("| `") and "`NNCC_" in line]
    listed = {}
    for cells in rows:
        keys = re.findall(r"`([a-z_]+\.[a-z_]+)`", cells[0])
        envs = re.findall(r"`(NNCC_[A-Z_]+)`", cells[1])
        assert len(keys) == len(envs), cells
        listed.update(zip(keys, envs))
    assert set(listed) == set(SETTINGS)
    for key, env in listed.items():
        assert SETTINGS[key].env == env, key
    for cells in rows:
        keys = re.findall(r"`([a-z_]+\.[a-z_]+)`", cells[0])
        defaults = re.findall(r"`([^`]+)`", cells[2])
        if len(keys) == 1 and defaults:  # one key: its default as the settings module has it
            assert defaults == [SETTINGS[keys[0]].default], keys
