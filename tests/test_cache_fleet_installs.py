"""A fleet of separate installs: two virtual environments, each with its own `pip install`
of this checkout's wheel, made one after the other in different folders (so every file has
another path and another modification time). They must compute the same cache token for
the same model and options, and so share the remote tier's entries."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

from tests.conftest import ROOT
from tests.test_cache import MLP

pytestmark = pytest.mark.slow  # builds a wheel and two virtual environments


def _checkout_copy(dest):
    """What a source checkout holds for a build: the package, pyproject.toml, README.md
    (copied, so that pip's build files never land in the working tree)."""
    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "nncc", dest / "nncc", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    return dest


def _build_wheel(checkout, dest):
    """This checkout's wheel, built once, offline, by this interpreter (whose setuptools the
    test extra pins to one that builds wheels by itself)."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--wheel-dir", str(dest), str(checkout)], env=venv_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = dest.glob("nncc-*.whl")
    return wheel


def _make_venv(folder, wheel):
    """A venv with its own nncc, installed from ``wheel`` without the network, that sees
    this interpreter's packages (numpy, onnx, ...) for the rest. "--system-site-packages"
    would not do: run from a venv, it shows the base interpreter's packages, not the venv's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         check=True, capture_output=True, text=True).stdout.strip()
    # a bare path line: this interpreter's folders come after the venv's own, and their .pth
    # files (an editable nncc among them) are not run
    folders = dict.fromkeys(sysconfig.get_path(name) for name in ("purelib", "platlib"))
    pathlib.Path(own, "outer-packages.pth").write_text("".join(f"{f}\n" for f in folders))
    # --ignore-installed: the nncc this interpreter may have is neither looked at nor removed
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                           "--ignore-installed", "--no-index", str(wheel)], env=venv_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def venv_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NNCC_REMOTE", "NNCC_REMOTE_KEY")}
    return env | {k: str(v) for k, v in extra.items()}


@pytest.fixture(scope="module")
def two_installs(tmp_path_factory):
    base = tmp_path_factory.mktemp("installs")
    wheel = _build_wheel(_checkout_copy(base / "checkout"), base / "wheel")
    first = _make_venv(base / "machine-a" / "venv", wheel)
    second = _make_venv(base / "elsewhere" / "machine-b" / "env", wheel)  # later, in another folder
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


# -- a fleet on one remote: the quick stage shared, native code built once per target --------


def _counting_compiler(folder):
    """A C compiler that logs every compile or link to $CC_LOG, then runs the real one.
    Both machines use this one file, so they are of one target (same compiler identity)."""
    real = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if real is None:
        pytest.skip("no C compiler: the native stage cannot be built")
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "cc"
    script.write_text(f'#!/bin/sh\ncase " $* " in *" -o "*) echo "$*" >> "$CC_LOG";; esac\nexec {real} "$@"\n')
    script.chmod(0o755)
    return script


def _compiles(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _entry(python, cache) -> dict:
    listing, _ = nncc_json(python, "cache", "ls", "--cache-dir", cache)
    (entry,) = listing["entries"]
    return entry


def _wait_until(check, what: str, limit: float = 300.0):
    """Poll for a background build's result; the limit only turns a hang into a failure."""
    import time

    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.2)


def test_a_second_install_takes_both_stages_from_the_remote(two_installs, tmp_path):
    import numpy as np

    from tests.remote_servers import KEY
    from tests.test_cache import RESNET, check_outputs, feeds_for

    first, second = two_installs
    shared = tmp_path / "shared"
    shared.mkdir()
    cc = _counting_compiler(tmp_path / "bin")
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **feeds_for(RESNET))
    fleet = dict(NNCC_REMOTE=f"file://{shared}", NNCC_REMOTE_KEY=KEY, NNCC_UPGRADE_AFTER=2, CC=cc,
                 NNCC_REMOTE_TRUST_NATIVE="yes")
    logs = {first: tmp_path / "a.log", second: tmp_path / "b.log"}
    caches = {first: tmp_path / "a-cache", second: tmp_path / "b-cache"}

    def run(python, out):
        report, err = nncc_json(python, "run", RESNET, "--inputs", feeds, "-o", tmp_path / out,
                                "--cache-dir", caches[python], CC_LOG=logs[python], **fleet)
        check_outputs(tmp_path / out, RESNET)  # against onnxruntime
        return report["cache"], report["native_partitions"], err

    outcome, _, _ = run(first, "a1.npz")
    assert (outcome["outcome"], outcome["stage"]) == ("miss", "quick")
    assert len(os.listdir(shared / "manifests")) == 1  # the portable stage, shared

    outcome, native, err = run(second, "b1.npz")
    assert (outcome["outcome"], outcome["stage"]) == ("remote hit", "quick"), err
    assert native == 0 and _compiles(logs[second]) == 0

    for i in (2, 3):  # the first machine's second hit builds the native stage, and shares it
        outcome, _, _ = run(first, f"a{i}.npz")
    assert outcome["upgrade"] == "process"
    _wait_until(lambda: len(os.listdir(shared / "manifests")) == 2, "the optimized entry's upload")
    assert _compiles(logs[first]) > 0
    outcome, native, _ = run(first, "a4.npz")
    assert outcome["stage"] == "optimized" and native >= 1

    for i in (2, 3):  # the second machine's upgrade takes it from the remote
        outcome, _, _ = run(second, f"b{i}.npz")
    assert outcome["upgrade"] == "process"
    _wait_until(lambda: _entry(second, caches[second])["stage"] == "optimized", "the second machine's upgrade")
    outcome, native, _ = run(second, "b4.npz")
    assert (outcome["outcome"], outcome["stage"]) == ("hit", "optimized") and native >= 1
    assert _compiles(logs[second]) == 0  # the C compiler never ran on the second machine
    a, b = (dict(np.load(tmp_path / name)) for name in ("a4.npz", "b4.npz"))
    assert all(np.array_equal(a[k], b[k]) for k in a)  # the very same native code
