"""Load a native partition library from bytes that were verified in memory.

The caller has hashed ``code`` (against the cache index, or the artifact's section table
and a trusted signer). Those same bytes are written to an anonymous memory file
(memfd_create) and dlopen'ed through /proc/self/fd: no path that could be swapped between
the check and the load is ever opened. The memfd is sealed against writes first, so not
even this process can change the code afterwards.

The memfd is closed once the library is mapped, so a process that loads many models does
not run out of descriptors. dlopen recognises an already-loaded object by the name it was
opened with, so a /proc/self/fd/N whose number comes round again is spelled differently
each time (``fd/./N``, ``fd/../fd/N``, ...): the same string never names two libraries.
"""

from __future__ import annotations

import ctypes
import fcntl
import itertools
import os

from nncc.errors import NnccError


class NativeLoadError(NnccError):
    """The native code cannot be loaded here; the portable plan is used instead."""


class Library:
    """A loaded partition library (its handle; the code stays mapped for the process's life)."""

    def __init__(self, code: bytes | memoryview):
        if not hasattr(os, "memfd_create"):
            raise NativeLoadError("this platform cannot load native code from memory (no memfd_create)")
        fd = os.memfd_create("nncc-partitions", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 2))
        try:
            view = memoryview(code)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            seals = getattr(fcntl, "F_SEAL_WRITE", 8) | getattr(fcntl, "F_SEAL_GROW", 4) | \
                getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_SEAL", 1)
            try:
                fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", 1033), seals)
            except OSError:
                pass  # a kernel without sealing: the memfd is still private to this process
            path = _fresh_name(fd)
            try:
                self.handle = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError as exc:
                raise NativeLoadError(f"cannot load the native code: {exc}") from None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the mapping holds the code, and its name is never used again
        self.threads = 1  # the size of the code's own thread pool, once set
        self.sanitized = False  # built in the sanitize mode: calls get exactly-sized buffers
        self.blas = True  # the code calls BLAS (held at one thread during a call, then)
        self.calls: dict = {}  # partition -> its checked nncc.backends.native.NativeCall

    def function(self, name: str):
        try:
            fn = getattr(self.handle, name)
        except AttributeError:
            raise NativeLoadError(f"the native code has no entry point {name!r}") from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        return fn

    def scratch_failure(self) -> tuple[int, int]:
        """(bytes, step) of this library's last call that returned SCRATCH_STATUS: the
        scratch request that failed, and the index of the step that made it."""
        record = (ctypes.c_int64 * 2)()
        self.handle.nncc_scratch_failure(record)
        return record[0], record[1]


    def jobs_shared(self) -> int:
        """How many parallel jobs this library's thread pool has handed to its workers."""
        fn = self.handle.nncc_jobs_shared
        fn.restype = ctypes.c_int64
        return fn()


SCRATCH_STATUS = 2  # a call's status when a step's scratch could not be allocated (prelude.h)


_loads = itertools.count()


def _fresh_name(fd: int) -> str:
    """A /proc path to ``fd`` that no library of this process was opened with before: the
    load's number in binary, each bit a no-op step (``./`` or ``../fd/``), so the spellings
    stay short and never repeat."""
    steps = "".join("../fd/" if bit == "1" else "./" for bit in bin(next(_loads))[2:])
    return f"/proc/self/fd/{steps}{fd}"
