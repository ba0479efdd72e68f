"""Faulting memory in before a run needs it.

A model's constants are a read-only mapping of the data cache, and its arena is memory
nothing has written yet: left alone, the first run takes a page fault on every page of
both, which later runs never take. ``populate`` asks the kernel to map such a range now
(``MADV_POPULATE_READ``/``_WRITE``, Linux 5.14; on an older kernel, read-ahead for a
mapping's file); the call goes through ctypes, so it runs without the GIL, on a thread
beside the caller's own work. The memory's contents are never changed.
"""

from __future__ import annotations

import ctypes
import mmap
import threading

import numpy as np

MADV_WILLNEED = 3
MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23

_libc = None  # libc's madvise, found on the first call (None again where there is none)


def _madvise():
    global _libc
    if _libc is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):
            return None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_int
        _libc = fn
    return _libc


def populate(buffer, write: bool = False) -> bool:
    """Map every page of ``buffer`` (an mmap, or an array or other buffer over memory this
    process owns) now: read-only for a file mapping, writable (``write``) for scratch
    memory such as an arena. Whether the kernel did; never raises."""
    if buffer is None or isinstance(buffer, (bytes, bytearray)) or not _size(buffer):
        return False
    try:
        view = np.frombuffer(buffer, dtype=np.uint8) if not isinstance(buffer, np.ndarray) else buffer
        address, size = view.ctypes.data, view.nbytes
    except (TypeError, ValueError):
        return False
    fn = _madvise()
    if fn is None or size == 0:
        return False
    start = address - address % mmap.PAGESIZE
    length = address + size - start
    if fn(start, length, MADV_POPULATE_WRITE if write else MADV_POPULATE_READ) == 0:
        return True
    if not write:  # an older kernel: at least have the file read ahead
        fn(start, length, MADV_WILLNEED)
    return False


def populate_in_background(buffers: list[tuple[object, bool]]) -> threading.Thread | None:
    """``populate`` each (buffer, write) in a daemon thread, in order; the thread, or None
    when there is nothing to do. A run that starts meanwhile is not held up: it faults in
    what it touches first itself."""
    buffers = [(b, w) for b, w in buffers if b is not None and not isinstance(b, (bytes, bytearray)) and _size(b)]
    if not buffers:
        return None
    thread = threading.Thread(target=lambda: [populate(b, w) for b, w in buffers], name="nncc-prefault",
                              daemon=True)
    thread.start()
    return thread


def _size(buffer) -> int:
    """Its bytes: an array's (a 0-d one, a model's scalar output, has no len), else its length."""
    return buffer.nbytes if isinstance(buffer, np.ndarray) else len(buffer)
