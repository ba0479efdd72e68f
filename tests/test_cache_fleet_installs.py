"""A fleet of separate installs: two virtual environments, each with its own `pip install`
of this checkout, made one after the other in different folders (so every file has
another path and another modification time). They must compute the same cache token for
the same model and options, and so share the remote tier's entries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_cache import MLP


def _checkout_copy(dest):
    """What a source checkout holds for a build: the package, pyproject.toml, README.md
    (copied, so that pip's build files never land in the working tree)."""
    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "nncc", dest / "nncc", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    return dest


def _make_venv(folder, checkout):
    """A venv that sees the system's packages (numpy, onnx, ...) and holds its own nncc,
    installed from ``checkout`` without the network."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(folder)],
                   check=True)
    python = folder / "bin" / "python"
    # this interpreter's pip installs into the venv; the build runs in the venv (seeing the
    # system's setuptools and wheel, as --no-build-isolation asks)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-index", str(checkout)], env=venv_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def _can_build_wheels() -> bool:
    """setuptools builds a wheel by itself from 70.1 on; before, it needs the wheel package."""
    import importlib.util

    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def venv_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NNCC_REMOTE", "NNCC_REMOTE_KEY")}
    return env | {k: str(v) for k, v in extra.items()}


@pytest.fixture(scope="module")
def two_installs(tmp_path_factory):
    if not _can_build_wheels():
        pytest.skip("installing a checkout without the network needs setuptools>=70.1 or the wheel package "
                    "(both in the test extra)")
    base = tmp_path_factory.mktemp("installs")
    checkout = _checkout_copy(base / "checkout")
    first = _make_venv(base / "machine-a" / "venv", checkout)
    second = _make_venv(base / "elsewhere" / "machine-b" / "env", checkout)  # later, in another folder
    for python, folder in ((first, "machine-a"), (second, "machine-b")):
        where = subprocess.run([str(python), "-c", "import nncc; print(nncc.__file__)"], env=venv_env(),
                               check=True, capture_output=True, text=True, cwd=base).stdout
        assert folder in where and "site-packages" in where, where  # each runs its own installed copy
    return first, second


def nncc_json(python, *args, **env) -> tuple[dict, str]:
    """`nncc ARGS --json` with ``python``, from a folder without a checkout in it (the
    current folder comes first on sys.path)."""
    done = subprocess.run([str(python), "-m", "nncc", *map(str, args), "--json"], env=venv_env(**env),
                          capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(str(python))))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_two_installs_compute_the_same_token(two_installs, tmp_path):
    first, second = two_installs
    a, _ = nncc_json(first, "run", MLP, "--random-inputs", "--cache-dir", tmp_path / "a")
    b, _ = nncc_json(second, "run", MLP, "--random-inputs", "--cache-dir", tmp_path / "b")
    assert a["cache"]["outcome"] == b["cache"]["outcome"] == "miss"
    assert a["cache"]["token"] == b["cache"]["token"]
    # and the token is the one the checkout itself computes (its RECORD agrees with its files)
    c, _ = nncc_json(sys.executable, "run", MLP, "--random-inputs", "--cache-dir", tmp_path / "c",
                     PYTHONPATH=ROOT)
    assert c["cache"]["token"] == a["cache"]["token"]
