"""Atomic file writes: temp file in the same directory, fsync, rename.

A reader sees the old file or the new one, never a partial write; a failure leaves
nothing behind but the untouched original.
"""

from __future__ import annotations

import os
import tempfile
from typing import BinaryIO, Callable

from nncc.errors import FileAccessError


def write_atomic(path: str | os.PathLike, data: bytes | memoryview, mode: int | None = None) -> None:
    write_atomic_with(path, lambda f: f.write(data), mode)


def write_atomic_with(path: str | os.PathLike, fill: Callable[[BinaryIO], object],
                      mode: int | None = None) -> None:
    """Let ``fill`` write the file's contents, then put it in place atomically.

    ``mode`` defaults to what an ordinary new file gets (0666 less the umask); private
    files such as cache entries pass 0600.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".nncc-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise FileAccessError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _default_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise FileAccessError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
