"""Reading and writing the cache's files: regular files only, verified reads, atomic writes.

Nothing here knows what an entry holds; the store (store.py) and ``nncc cache verify``
build on these helpers.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import stat

from blake3 import blake3

from nncc.util.files import kind, open_file, read_at_most

# The data cache is checked on a hit by chunks, not whole (see spot_check): its cost then
# stays flat however large the weights are.
CHUNK_BYTES = 1 << 20
HASH_BYTES = 32


class CacheEntryError(Exception):
    """An entry failed verification; it must not be prepared."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind  # "corrupt" | "missing" | "unreadable" | "stale"
        self.detail = detail


class CacheWriteError(Exception):
    """Writing an entry failed (disk full, read-only...)."""


def content_hash(buffer) -> str:
    size = len(buffer)
    return blake3(buffer, max_threads=blake3.AUTO if size >= (8 << 20) else 1).hexdigest()


def chunk_hashes(buffer, chunk: int = CHUNK_BYTES) -> bytes:
    """The blake3 of every ``chunk`` bytes of ``buffer``, concatenated (32 bytes each)."""
    view = memoryview(buffer)
    return b"".join(blake3(view[i:i + chunk]).digest() for i in range(0, len(view), chunk))


def spot_check(buffer, hashes: bytes, chunk: int = CHUNK_BYTES, count: int = 1) -> int | None:
    """Hash ``count`` randomly chosen chunks of ``buffer`` (every chunk when there are no
    more than ``count``) against ``hashes``; the index of the first that differs, or None.
    Across hits every chunk is checked sooner or later, at a cost per hit that does not
    grow with the buffer."""
    view = memoryview(buffer)
    chunks = -(-len(view) // chunk)
    if len(hashes) != chunks * HASH_BYTES:
        return 0
    picks = range(chunks) if chunks <= count else random.sample(range(chunks), count)
    for i in picks:
        if blake3(view[i * chunk:(i + 1) * chunk]).digest() != hashes[i * HASH_BYTES:(i + 1) * HASH_BYTES]:
            return i
    return None


def open_entry_file(path: str, what: str) -> tuple[int, int]:
    """(descriptor, size) of a cache file, opened without blocking and checked to be a
    regular file: anything else in its place (a FIFO, a link to a device) is a corrupt
    entry, never a hang or an endless read. The caller closes the descriptor."""
    try:
        fd, st = open_file(path)
    except FileNotFoundError:
        raise CacheEntryError("missing", f"{what} file is missing") from None
    except OSError as exc:
        raise CacheEntryError("unreadable", f"cannot read the {what}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CacheEntryError("corrupt", f"{what} file is {kind(st.st_mode)}, not a regular file")
    return fd, st.st_size


def read_entry_file(path: str, what: str, expected_size: int | None = None) -> bytes:
    """A cache file's bytes, read once, at most the size fstat declared. With
    ``expected_size`` a file of another size is rejected without being read."""
    fd, size = open_entry_file(path, what)
    try:
        if expected_size is not None and size != expected_size:
            raise CacheEntryError("corrupt", f"{what} has {size} bytes, the index recorded {expected_size}")
        data = read_at_most(fd, size)
    except OSError as exc:
        raise CacheEntryError("unreadable", f"cannot read the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if expected_size is not None and len(data) != expected_size:
        raise CacheEntryError("corrupt", f"{what} has {len(data)} bytes, the index recorded {expected_size}")
    return data


def map_entry_file(path: str, what: str, expected_size: int):
    """A read-only mapping of a cache file of exactly ``expected_size`` bytes (b"" when
    empty). Its contents are not checked here."""
    fd, size = open_entry_file(path, what)
    try:
        if size != expected_size:
            raise CacheEntryError("corrupt", f"{what} has {size} bytes, the index recorded {expected_size}")
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise CacheEntryError("unreadable", f"cannot map the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def write_file_atomic(path: str, data, prefix: str) -> None:
    """Atomic write (nncc.util.atomic): a temp file named ``<prefix>.<pid>-<rand>.tmp`` in the
    same folder (the name gc and verify recognize), fsync, rename."""
    from nncc.util.atomic import synced_temp, unique_suffix  # lazy: start-up

    folder = os.path.dirname(path)
    try:
        tmp = synced_temp(path, lambda f: f.write(data), f"{prefix}.{unique_suffix()}.tmp", 0o600)
    except OSError as exc:
        raise CacheWriteError(f"cannot write in {folder}: {exc.strerror or exc}") from None
    try:
        os.replace(tmp, path)
    except BaseException as exc:
        unlink_quietly(tmp)
        if isinstance(exc, OSError):
            raise CacheWriteError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, IsADirectoryError):
        pass
