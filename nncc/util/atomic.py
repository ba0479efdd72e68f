"""Atomic file writes: temp file in the same directory, fsync, rename.

A reader sees the old file or the new one, never a partial write; a failure leaves
nothing behind but the untouched original.
"""

from __future__ import annotations

import os
import tempfile

from nncc.errors import FileAccessError


def write_atomic(path: str | os.PathLike, data: bytes | memoryview) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".nncc-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise FileAccessError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise FileAccessError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
