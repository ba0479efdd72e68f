"""Output paths never destroy the user's files: an output that is the same file as an input
(the model, its external data, a feed) or as another output is refused with one error
line and exit code 2, before anything is written. Real processes, real files."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.models import relu_model
from tests.test_cli_errors import assert_error, nncc


@pytest.fixture
def work(tmp_path: pathlib.Path) -> pathlib.Path:
    relu_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.array([[-1, 0, 1], [2, -3, 4]], np.float32))
    return tmp_path


def snapshot(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def refused(result, work, before, *names):
    """One error line naming both files, exit 2, every file as it was."""
    assert_error(result, "same file", *names)
    assert snapshot(work) == before


@pytest.mark.parametrize("args, names", [
    (["compile", "m.onnx", "-o", "m.onnx"], ["m.onnx"]),
    (["compile", "m.onnx", "-o", "m.nncc", "--depfile", "m.onnx"], ["depfile", "m.onnx"]),
    (["compile", "m.onnx", "-o", "m.nncc", "--depfile", "m.nncc"], ["depfile", "m.nncc", "output"]),
    (["compile", "m.onnx", "-o", "./sub/../m.onnx"], ["./sub/../m.onnx", "m.onnx"]),
    (["run", "m.onnx", "--random-inputs", "--output", "m.onnx"], ["m.onnx"]),
    (["run", "m.onnx", "--input", "x=x.npy", "--output", "x.npy"], ["x.npy", "input x"]),
])
def test_output_is_an_input(work, args, names):
    (work / "sub").mkdir()
    before = snapshot(work)
    refused(nncc(*args, cwd=work), work, before, *names)


@pytest.mark.slow
def test_hard_link_and_symlink_to_the_model(work):
    os.link(work / "m.onnx", work / "hard.nncc")
    os.symlink(work / "m.onnx", work / "soft.nncc")
    os.symlink(work / "gone", work / "dangling.nncc")  # resolves to the same missing file
    before = snapshot(work)
    refused(nncc("compile", "m.onnx", "-o", "hard.nncc", cwd=work), work, before, "hard.nncc", "m.onnx")
    refused(nncc("compile", "m.onnx", "-o", "soft.nncc", cwd=work), work, before, "soft.nncc", "m.onnx")
    refused(nncc("run", "m.onnx", "--random-inputs", "-o", "hard.nncc", cwd=work), work, before, "hard.nncc")
    refused(nncc("compile", "m.onnx", "-o", "dangling.nncc", "--depfile", "gone", cwd=work), work, before,
            "gone", "dangling.nncc")
    # distinct files are fine, and the model is still a model
    ok = nncc("compile", "m.onnx", "-o", "m.nncc", "--depfile", "m.d", cwd=work)
    assert ok.returncode == 0, ok.stderr
    assert (work / "m.onnx").read_bytes() == before["m.onnx"]


@pytest.mark.slow
def test_external_data_files_are_inputs(tmp_path):
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    before = snapshot(tmp_path)
    refused(nncc("compile", "m.onnx", "-o", "weights.bin", cwd=tmp_path), tmp_path, before,
            "weights.bin", "external data")
    refused(nncc("compile", "m.onnx", "-o", "m.nncc", "--depfile", "weights.bin", cwd=tmp_path), tmp_path, before,
            "weights.bin")
    refused(nncc("run", "m.onnx", "--random-inputs", "--output", "weights.bin", cwd=tmp_path), tmp_path, before,
            "weights.bin")


@pytest.mark.slow
def test_output_dir_file_is_an_input(work):
    """--output-dir DIR writes DIR/y.npy: an input read from that very file is refused."""
    out = work / "out"
    out.mkdir()
    np.save(out / "y.npy", np.ones((2, 3), np.float32))
    before = out.joinpath("y.npy").read_bytes()
    result = nncc("run", "m.onnx", "--input", f"x={out / 'y.npy'}", "--output-dir", out, cwd=work)
    assert_error(result, "same file", "y.npy", "input x")
    assert out.joinpath("y.npy").read_bytes() == before
    assert sorted(os.listdir(out)) == ["y.npy"]
    ok = nncc("run", "m.onnx", "--input", "x=x.npy", "--output-dir", out, cwd=work)
    assert ok.returncode == 0, ok.stderr
    np.testing.assert_array_equal(np.load(out / "y.npy"), np.maximum(np.load(work / "x.npy"), 0))
