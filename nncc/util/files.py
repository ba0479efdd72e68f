"""Reading a user's model files with one-line errors, and telling artifacts from ONNX models
by their first bytes (no parsing: the cache hashes these bytes)."""

from __future__ import annotations

import os

from nncc.errors import FileAccessError


def read_model_file(path: str | os.PathLike) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except IsADirectoryError:
        raise FileAccessError(f"{path} is a directory, not a model file") from None
    except OSError as exc:
        raise FileAccessError(f"cannot read {path}: {exc.strerror or exc}") from None


ARTIFACT_MAGIC = b"NNCCPLAN"  # the first bytes of every nncc artifact (nncc/plan/format.py)


def is_artifact(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(ARTIFACT_MAGIC)) == ARTIFACT_MAGIC
    except IsADirectoryError:
        raise FileAccessError(f"{path} is a directory, not a model file") from None
    except FileNotFoundError:
        raise FileAccessError(f"cannot read {path}: no such file",
                              hint=f"check the path; relative paths start at {os.getcwd()}") from None
    except OSError as exc:
        raise FileAccessError(f"cannot read {path}: {exc.strerror or exc}") from None
