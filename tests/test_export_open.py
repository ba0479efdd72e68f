"""What an exported library's open does for the first run: the model's workspace is mapped and
faulted in at open, so the first run takes no more page faults than a later one (it used to
fault the workspace in a 4 KiB page at a time)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from tests.export_build import compiler, export
from tests.conftest import ROOT
from tests.models import GraphBuilder

pytestmark = [pytest.mark.skipif(compiler() is None, reason="no C compiler: nothing can be exported or linked"),
              pytest.mark.slow]  # every test builds, links or runs a C library

PROGRAM = ROOT / "tests" / "export_first_run_faults.c"
PAGE = 4096


def wide_convnet(path):
    """Convolutions over a 96x96 image with 32 channels: intermediate tensors of 1.2 MB each,
    which the native code keeps in its workspace."""
    b = GraphBuilder(name="wide", seed=3)
    x = b.input([1, 3, 96, 96])
    y = b.node("Relu", [b.node("Conv", [x, b.weight([32, 3, 3, 3])], pads=[1, 1, 1, 1])])
    z = b.node("Relu", [b.node("Conv", [y, b.weight([32, 32, 3, 3])], pads=[1, 1, 1, 1])])
    y = b.node("Add", [b.node("Conv", [z, b.weight([32, 32, 1, 1])]), y])
    b.output(b.node("Flatten", [b.node("GlobalAveragePool", [y])]))
    return b.save(path)


def test_the_first_run_faults_no_more_pages_than_a_later_one(tmp_path):
    wide_convnet(tmp_path / "wide.onnx")
    export(tmp_path / "wide.onnx", tmp_path / "wide", cache=tmp_path / "cache")
    exe = tmp_path / "faults"
    done = subprocess.run([compiler(), "-O1", "-std=c11", "-DPFX=wide", "-include", str(tmp_path / "wide" / "wide.h"),
                           str(PROGRAM), str(tmp_path / "wide" / "libwide.a"), "-lm", "-lpthread", "-o", str(exe)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([str(exe), str(tmp_path / "wide" / "wide.weights")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = map(int, done.stdout.split())
    intermediate_pages = 32 * 96 * 96 * 4 // PAGE  # one of the model's 1.2 MB tensors
    # a workspace faulted a page at a time would cost the first run hundreds more
    assert first <= second + intermediate_pages // 10, (first, second, intermediate_pages)
