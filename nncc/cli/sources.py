"""Telling artifacts from ONNX models by their first bytes, not by their file names.

``is_artifact`` lives in the core (nncc.util.files) so that `nncc bench` shares it."""

from __future__ import annotations

from nncc.errors import InputError
from nncc.util.files import is_artifact  # noqa: F401  (the CLI's import point)


def refuse_artifact(path: str) -> None:
    """`nncc compile` takes ONNX models: a compiled artifact is already compiled."""
    if is_artifact(path):
        raise InputError(f"{path} is already a compiled nncc artifact, not an ONNX model",
                         hint="compile the .onnx model it came from; run or inspect the artifact as it is")
