"""Telling artifacts from ONNX models by their first bytes, not by their file names."""

from __future__ import annotations

import os

from nncc.errors import FileAccessError, InputError

ARTIFACT_MAGIC = b"NNCCPLAN"


def is_artifact(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(ARTIFACT_MAGIC)) == ARTIFACT_MAGIC
    except IsADirectoryError:
        raise FileAccessError(f"{path} is a directory, not a model file") from None
    except FileNotFoundError:
        raise FileAccessError(f"cannot read {path}: No such file or directory",
                              hint=f"check the path; relative paths start at {os.getcwd()}") from None
    except OSError as exc:
        raise FileAccessError(f"cannot read {path}: {exc.strerror or exc}") from None


def refuse_artifact(path: str) -> None:
    """`nncc compile` takes ONNX models: a compiled artifact is already compiled."""
    if is_artifact(path):
        raise InputError(f"{path} is already a compiled nncc artifact, not an ONNX model",
                         hint="compile the .onnx model it came from; run or inspect the artifact as it is")
