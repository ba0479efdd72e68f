"""Per-token file locks (``fcntl.flock``) that can be deleted safely.

Protocol (docs/cache.md, "Locks"):

* A writer takes the token's lock EXCLUSIVE, re-checks the index, and compiles and stores
  only if the entry is still missing; it holds the lock until the index row is committed.
* A reader takes the lock SHARED while it reads and verifies an entry's files, so gc and
  ``verify --fix`` (which need EXCLUSIVE, non-blocking, and skip busy tokens) never remove
  an entry under a reader that has not finished verifying it.
* Lock files may be unlinked, but only by a process holding the lock exclusively. To stay
  correct when that happens, ``acquire`` checks after locking that the path still names
  the inode it locked, and starts over if not (the classic flock + unlink race).

flock locks are released by the kernel when a process dies, so a SIGKILLed compile never
leaves a token locked.
"""

from __future__ import annotations

import errno
import fcntl
import os


class LockBusy(Exception):
    """A non-blocking acquire found the lock held by someone else."""


class FileLock:
    """``with FileLock(path, shared=False, blocking=True):`` ... One acquisition per object."""

    __slots__ = ("path", "shared", "blocking", "fd")

    def __init__(self, path: str, shared: bool = False, blocking: bool = True):
        self.path = path
        self.shared = shared
        self.blocking = blocking
        self.fd: int | None = None

    def acquire(self) -> "FileLock":
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        if not self.blocking:
            mode |= fcntl.LOCK_NB
        while True:
            # never through a symlink: a lock file is created in locks/ and nowhere else
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, mode)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise LockBusy(self.path) from None
                raise
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                os.close(fd)  # unlinked while we waited: lock the new file instead
                continue
            held = os.fstat(fd)
            if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                self.fd = fd
                return self
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def unlink(self) -> None:
        """Remove the lock file; only legal while holding the lock exclusively."""
        if self.fd is None or self.shared:
            raise RuntimeError("unlink needs the lock held exclusively")
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_problem(path: str, exc: OSError) -> str:
    """Why a lock file cannot be taken, in one line (a symlink planted in its place is
    never followed)."""
    if exc.errno == errno.ELOOP:
        return f"its lock file {path} is a symbolic link (never followed); left alone"
    return f"cannot lock {path}: {exc.strerror or exc}"


def try_lock(path: str) -> FileLock | None:
    """Take ``path`` exclusively without waiting; None if someone holds it, or if it is a
    symbolic link (never followed: its token is then left alone, as if busy)."""
    try:
        return FileLock(path, shared=False, blocking=False).acquire()
    except LockBusy:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
