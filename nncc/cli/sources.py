"""Telling artifacts from ONNX models by their first bytes, not by their file names."""

from __future__ import annotations

from nncc.errors import FileAccessError

ARTIFACT_MAGIC = b"NNCCPLAN"


def is_artifact(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(ARTIFACT_MAGIC)) == ARTIFACT_MAGIC
    except IsADirectoryError:
        raise FileAccessError(f"{path} is a directory, not a model file") from None
    except OSError as exc:
        raise FileAccessError(f"cannot read {path}: {exc.strerror or exc}") from None
