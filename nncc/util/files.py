"""Reading a user's model file with one-line errors (no parsing: the cache hashes these bytes)."""

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
