"""Model builders the tests share (one-node models: tests/one_node_graphs.py).

``benchmark_model``: a model benchmarks/real_models.py builds, made as the benchmarks make
it, in a process of its own with benchmarks/ on its path (the benchmarks are scripts, not
a package the tests import)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import onnx

from tests.conftest import ROOT


def benchmark_model(call: str, folder: pathlib.Path) -> onnx.ModelProto:
    """The model ``call`` returns, a Python expression over benchmarks/real_models.py's
    names (e.g. ``"lstm(seq=9, inp=6, hidden=21, layers=3)"``)."""
    path = folder / "benchmark-model.onnx"
    code = f"import onnx\nfrom real_models import *\nfrom real_models import _transformer\nonnx.save({call}, {str(path)!r})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return onnx.load(path)
