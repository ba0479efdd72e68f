"""What the commands read: a model or an artifact, told apart by its first bytes, not by
its file name (``nncc.util.files.read_source`` reads it once, so a pipe works too)."""

from __future__ import annotations

from nncc.errors import InputError
from nncc.util.files import read_source


def read_onnx_source(path: str) -> bytes:
    """`nncc compile` takes ONNX models: a compiled artifact is already compiled. Returns
    the model's bytes, read once."""
    data, artifact = read_source(path, map_artifact=False)
    if artifact:
        raise InputError(f"{path} is already a compiled nncc artifact, not an ONNX model",
                         hint="compile the .onnx model it came from; run or inspect the artifact as it is")
    return data
