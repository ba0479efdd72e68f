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
    try:
        tmp = synced_temp(path, fill, mode=default_mode() if mode is None else mode)
    except OSError as exc:
        raise FileAccessError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        os.replace(tmp, path)
    except BaseException as exc:
        unlink_quietly(tmp)
        if isinstance(exc, OSError):
            raise FileAccessError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def synced_temp(path: str | os.PathLike, fill: Callable[[BinaryIO], object], temp_name: str | None = None,
                mode: int = 0o600) -> str:
    """A complete, fsynced temporary file beside ``path`` holding what ``fill`` writes:
    its name, for the caller to rename (or link) into place. ``temp_name``: its name in
    that folder (created exclusively), else a fresh ``.nncc-*.tmp``. Raises OSError; a
    failure leaves nothing behind."""
    directory = os.path.dirname(os.path.abspath(path))
    if temp_name is None:
        fd, tmp = tempfile.mkstemp(prefix=".nncc-", suffix=".tmp", dir=directory)
    else:
        tmp = os.path.join(directory, temp_name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # whatever the umask
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp


def unique_suffix() -> str:
    """``<pid>-<8 hex>``: a temp name no other writer picks."""
    return f"{os.getpid()}-{os.urandom(4).hex()}"


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def default_mode() -> int:
    """The mode an ordinary new file gets: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
