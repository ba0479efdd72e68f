"""Load a native partition library from bytes that were verified in memory.

The caller has hashed ``code`` (against the cache index, or the artifact's section table
and a trusted signer). Those same bytes are written to an anonymous memory file
(memfd_create) and dlopen'ed through /proc/self/fd: no path that could be swapped between
the check and the load is ever opened. The memfd is sealed against writes first, so not
even this process can change the code afterwards.

The memfd stays open for the life of the process. dlopen recognises an already-loaded
object by its name, so a /proc/self/fd/N whose number was closed and reused would hand back
the *previous* library's code; ctypes never unloads a library anyway, so keeping the
descriptor costs nothing that the mapping does not already hold.
"""

from __future__ import annotations

import ctypes
import fcntl
import os

from nncc.errors import NnccError


class NativeLoadError(NnccError):
    """The native code cannot be loaded here; the portable plan is used instead."""


class Library:
    """A loaded partition library; keeps the memfd and the handle alive together."""

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
            try:
                self.handle = ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError as exc:
                raise NativeLoadError(f"cannot load the native code: {exc}") from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd  # never closed: see the module's docstring
        self.threads = 1  # the size of the code's own thread pool, once set
        self.sanitized = False  # built in the sanitize mode: calls get exactly-sized buffers
        self.blas = True  # the code calls BLAS (held at one thread during a call, then)
        self.calls: dict = {}  # partition -> its checked nncc.backends.native.NativeCall
        _OPEN.append(fd)

    def function(self, name: str):
        try:
            fn = getattr(self.handle, name)
        except AttributeError:
            raise NativeLoadError(f"the native code has no entry point {name!r}") from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        return fn


_OPEN: list[int] = []  # every memfd a library was loaded from, kept open (never reused)
