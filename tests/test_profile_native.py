"""benchmarks/profile_native.py on a model with a symbolic input dimension (the convnet's
batch ``n``): the size comes from ``--dim n=SIZE`` or from the shapes of ``--feeds
FILE.npz``, the native code is built for it and profiled; a dimension left unbound, or
bound to two sizes, or a feed the model does not take, is one line on stderr and exit 2,
before anything is compiled."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

from nncc.native.toolchain import find_toolchain
from tests.conftest import ROOT
from tests.models import convnet

SCRIPT = ROOT / "benchmarks" / "profile_native.py"


def _profile(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "--runs", "2"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "convnet.onnx"
    onnx.save(convnet(seed=2), str(path))
    return path


@pytest.mark.slow
@pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: there is no native code to profile")
def test_the_batch_comes_from_dim_or_from_the_feeds(tmp_path, model):
    by_dim = _profile(model, "--dim", "n=2")
    assert by_dim.returncode == 0, by_dim.stderr
    assert "(1 BLAS thread(s), n=2; 1 native partition(s))" in by_dim.stdout.splitlines()[0]
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32))
    by_feeds = _profile(model, "--feeds", feeds)
    assert by_feeds.returncode == 0, by_feeds.stderr
    assert "(1 BLAS thread(s), n=3; 1 native partition(s))" in by_feeds.stdout.splitlines()[0]
    assert "FusedConv" in by_feeds.stdout  # the convolutions' steps were timed


def test_an_unbound_or_contradicted_dimension_is_one_line_and_exit_2(tmp_path, model):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=np.zeros((3, 3, 16, 16), np.float32))
    stray = tmp_path / "stray.npz"
    np.savez(stray, image=np.zeros((3, 3, 16, 16), np.float32))
    for args, says in [((), "input 'x' has the symbolic dimension n (axis 0) and no size for it: give --dim n=SIZE"),
                       (("--feeds", feeds, "--dim", "n=2"), "dimension n is 3 in --feeds's 'x' (axis 0) but 2"),
                       (("--feeds", stray), "--feeds has an array 'image', which is no input of the model"),
                       (("--dim", "n"), "--dim takes NAME=SIZE")]:
        done = _profile(model, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == ""
        assert len(done.stderr.splitlines()) == 1 and says in done.stderr, (args, done.stderr)
