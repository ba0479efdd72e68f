"""examples/Makefile under real GNU make, in a temporary copy of the tree: the first run
compiles both fixture models and runs one, the second does nothing, touching a model
recompiles only that one (and, since the artifact did not change, does not re-run what
depends on it), and `make -j4` works on a clean tree. Plus --depfile with external data.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import FIXTURES, ROOT

MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="GNU make is not installed")
MODELS = ("mlp", "resnet_block")


@pytest.fixture
def tree(tmp_path) -> pathlib.Path:
    """tmp/examples/Makefile and tmp/fixtures/{mlp,resnet_block}.onnx, as in the repository."""
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "Makefile", tmp_path / "examples" / "Makefile")
    (tmp_path / "fixtures").mkdir()
    for name in MODELS:
        shutil.copy(FIXTURES / f"{name}.onnx", tmp_path / "fixtures" / f"{name}.onnx")
    return tmp_path


def make(tree: pathlib.Path, *args: str, directory: str = "examples") -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["NNCC_CACHE_DIR"] = str(tree / "cache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for key in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "NNCC_DEBUG"):
        env.pop(key, None)
    result = subprocess.run(
        [MAKE, "--no-print-directory", "-C", str(tree / directory), f"NNCC={sys.executable} -m nncc", *args],
        env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def compiled(result: subprocess.CompletedProcess) -> list[str]:
    """The models whose compile recipe ran, from make's echo of the recipes."""
    return [name for name in MODELS if f"compile ../fixtures/{name}.onnx" in result.stdout]


def mtimes(folder: pathlib.Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(folder.iterdir())}


def bump_mtime(path: pathlib.Path) -> None:
    """`touch`, a little in the future: make compares timestamps, this never ties."""
    later = time.time() + 5
    os.utime(path, (later, later))


@pytest.mark.slow
def test_makefile_builds_then_does_nothing_then_rebuilds_only_what_was_touched(tree):
    build = tree / "examples" / "build"
    first = make(tree)
    assert compiled(first) == ["mlp", "resnet_block"]
    assert "run build/mlp.nncc" in first.stdout and "probs" in first.stdout
    assert sorted(p.name for p in build.iterdir()) == ["mlp-outputs.npz", "mlp.d", "mlp.nncc",
                                                        "resnet_block.d", "resnet_block.nncc"]
    assert (build / "mlp.d").read_text() == "build/mlp.nncc: \\\n  ../fixtures/mlp.onnx\n"

    second = make(tree)
    assert "Nothing to be done for 'all'" in second.stdout, second.stdout
    assert compiled(second) == [] and "run build/" not in second.stdout

    before = mtimes(build)
    bump_mtime(tree / "fixtures" / "resnet_block.onnx")
    third = make(tree)
    assert compiled(third) == ["resnet_block"], third.stdout
    assert "run build/" not in third.stdout
    assert "up to date" in third.stderr  # a cache hit giving the same bytes: not rewritten
    assert mtimes(build) == before

    # touching mlp re-runs its compile; the artifact is unchanged, so make (which re-checks
    # a target's timestamp after its recipe) does not re-run the model. resnet_block's
    # artifact is still older than its touched model, so its compile runs again too -- a
    # cache hit that writes nothing (README: "Using nncc from make").
    bump_mtime(tree / "fixtures" / "mlp.onnx")
    fourth = make(tree)
    assert compiled(fourth) == ["mlp", "resnet_block"] and "run build/" not in fourth.stdout
    assert fourth.stderr.count("up to date") == 2 and "cache hit" in fourth.stderr
    assert mtimes(build) == before


@pytest.mark.slow
def test_make_j4_on_a_clean_tree(tree):
    result = make(tree, "-j4")
    assert sorted(compiled(result)) == ["mlp", "resnet_block"]
    build = tree / "examples" / "build"
    assert {"mlp.nncc", "resnet_block.nncc", "mlp-outputs.npz", "mlp.d", "resnet_block.d"} <= \
        {p.name for p in build.iterdir()}
    import nncc

    for name in MODELS:
        assert (build / f"{name}.nncc").read_bytes() == nncc.compile_model(FIXTURES / f"{name}.onnx").to_bytes()
    assert "Nothing to be done" in make(tree, "-j4").stdout
    make(tree, "clean")
    assert not build.exists()


@pytest.mark.slow
def test_depfile_makes_external_data_a_prerequisite(tmp_path):
    """A model whose weights live in weights.bin: editing the weights recompiles it."""
    from tests.test_shell import external_data_model

    external_data_model(tmp_path / "models")
    (tmp_path / "Makefile").write_text(
        "out/ext.nncc: models/ext.onnx\n"
        "\tmkdir -p out\n"
        "\t$(NNCC) compile $< -o $@ --depfile out/ext.d\n"
        "-include out/ext.d\n")
    assert "compile models/ext.onnx" in make(tmp_path, directory=".").stdout
    assert (tmp_path / "out" / "ext.d").read_text() == (
        "out/ext.nncc: \\\n  models/ext.onnx \\\n  models/weights.bin\n\nmodels/weights.bin:\n")
    assert "'out/ext.nncc' is up to date" in make(tmp_path, directory=".").stdout
    before = (tmp_path / "out" / "ext.nncc").read_bytes()
    weights = tmp_path / "models" / "weights.bin"
    weights.write_bytes(bytes(reversed(weights.read_bytes())))
    bump_mtime(weights)
    result = make(tmp_path, directory=".")
    assert "compile models/ext.onnx" in result.stdout and "cache miss" in result.stderr
    assert (tmp_path / "out" / "ext.nncc").read_bytes() != before
