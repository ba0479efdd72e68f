"""The executor's dispatch of compiled partitions and its treatment of kernel bugs.

A TypeError or IndexError raised inside a kernel is a bug, not bad input: it propagates
with its traceback (tests/plugins/buggy_plugin.py has such kernels). Values are checked
against onnxruntime.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import traceback

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import nncc
from nncc.backends.registry import load_plugin
from nncc.errors import KernelError
from tests.conftest import ROOT

BUGGY = "tests.plugins.buggy_plugin"
F = TensorProto.FLOAT


@pytest.fixture(scope="module", autouse=True)
def plugins():
    """Plugins are process-wide (and part of the cache key): unloaded afterwards."""
    load_plugin(BUGGY)
    yield
    from nncc.backends import registry as backends
    from nncc.kernels import registry as kernels

    backends._PLUGINS.pop(BUGGY, None)
    for key in [k for k in kernels._REGISTRY if k[0] == "test.buggy"]:
        del kernels._REGISTRY[key]
    sys.modules.pop(BUGGY, None)


def buggy_model(tmp_path: pathlib.Path, op: str) -> pathlib.Path:
    """x -> Relu -> test.buggy::op -> Neg -> y: the bug sits between two ordinary kernels."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node(op, ["r"], ["b"], name="the_buggy_node", domain="test.buggy"),
             helper.make_node("Neg", ["b"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("test.buggy", 1)])
    path = tmp_path / f"{op}.onnx"
    onnx.save(model, str(path))
    return path


def frames(exc: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(exc.__traceback__)]


@pytest.mark.parametrize("op, error, where", [("Broken", TypeError, "add_nothing"),
                                              ("OutOfRange", IndexError, "one_past_the_end")])
def test_a_kernel_bug_keeps_its_type_and_traceback(tmp_path, op, error, where):
    model = nncc.compile_model(buggy_model(tmp_path, op), backends=["numpy"], plugins=[BUGGY])
    x = np.ones((2, 3), np.float32)
    with pytest.raises(error) as caught:
        model.run({"x": x})
    assert not isinstance(caught.value, KernelError)
    # the traceback reaches down into the kernel's own helper, where the bug is
    assert frames(caught.value)[-1] == where
    assert caught.value.__cause__ is None  # raised as is, not re-raised from a wrapper


@pytest.mark.parametrize("op, error, where", [("Broken", TypeError, "add_nothing"),
                                              ("OutOfRange", IndexError, "one_past_the_end")])
def test_a_kernel_bug_keeps_its_type_in_the_interpreter(tmp_path, op, error, where):
    with pytest.raises(error) as caught:
        nncc.load_onnx(buggy_model(tmp_path, op)).run({"x": np.ones((2, 3), np.float32)})
    assert frames(caught.value)[-1] == where


def test_a_kernel_bug_is_an_internal_error_at_the_cli(tmp_path):
    """One line that says it is nncc's fault (exit 1), and the full traceback on request."""
    path = buggy_model(tmp_path, "Broken")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, "-m", "nncc", "run", str(path), "--plugin", BUGGY, "--backend", "numpy",
               "--random-inputs"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "internal error: TypeError" in done.stderr and "the_buggy_node failed" not in done.stderr
    env["NNCC_DEBUG"] = "1"
    debug = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr and "in add_nothing" in debug.stderr
