"""The BLAS thread count at run time, through the BLAS library numpy has loaded.

numpy's wheels bundle OpenBLAS (``libscipy_openblas64_*.so`` in ``numpy.libs`` for numpy 2,
``libopenblas64_p*.so`` before); its ``*_set_num_threads*`` entry point changes the
number of threads for every later BLAS call in the process, without restarting it. This
module finds the library already mapped into the process, resolves whichever of the known
symbol spellings it exports, and otherwise does nothing (another BLAS, another platform):

    from nncc.util.threads import blas_threads, set_blas_threads, limit_blas_threads

    set_blas_threads(2)            # True if applied, False if there is no known BLAS
    with limit_blas_threads(1):    # restores the previous count afterwards
        ...

``blas_info()`` tells what was found: the library path, its thread count, the kernel it
dispatched to (OpenBLAS's core name, e.g. "Haswell" or "SkylakeX") and its build config.
The core never imports click or rich; importing this module does not import numpy either.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy  # the library to limit is numpy's own: loaded before its symbols are looked up

# Symbol spellings, most specific first: scipy-openblas (numpy >= 2), OpenBLAS built with
# a 64_ suffix (numpy 1.2x wheels), plain OpenBLAS (distribution packages).
_SET = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
        "openblas_set_num_threads")
_GET = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
        "openblas_get_num_threads")
_CORENAME = ("scipy_openblas_get_corename64_", "openblas_get_corename64_", "scipy_openblas_get_corename",
             "openblas_get_corename")
_CONFIG = ("scipy_openblas_get_config64_", "openblas_get_config64_", "scipy_openblas_get_config",
           "openblas_get_config")


@dataclass(frozen=True)
class _Blas:
    path: str
    set_threads: Callable[[int], None] | None
    get_threads: Callable[[], int] | None
    corename: Callable[[], bytes] | None
    config: Callable[[], bytes] | None


def _symbol(lib: ctypes.CDLL, names: tuple[str, ...], restype=None, argtypes=None):
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            if argtypes is not None:
                fn.argtypes = argtypes
            return fn
    return None


def _candidates() -> list[str]:
    """OpenBLAS libraries mapped into this process, then the ones numpy ships."""
    try:
        root = os.path.dirname(os.path.dirname(numpy.__file__))
    except ImportError:
        root = None
    found: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) == 6 else ""
                name = os.path.basename(path).lower()
                if "openblas" in name and ".so" in name and path not in found:
                    found.append(path)
    except OSError:  # not Linux
        pass
    if root is not None:
        patterns = ("numpy.libs/*openblas*", "numpy/.dylibs/*openblas*", "scipy_openblas64/lib/*openblas*.so*",
                    "scipy_openblas32/lib/*openblas*.so*")
        for pattern in patterns:
            for path in sorted(glob.glob(os.path.join(root, pattern))):
                if path not in found:
                    found.append(path)
    return found


def blas_library_paths() -> list[str]:
    """The OpenBLAS libraries numpy has mapped or ships, most likely first."""
    return _candidates()


@functools.lru_cache(maxsize=1)
def _blas() -> _Blas | None:
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        set_threads = _symbol(lib, _SET, None, [ctypes.c_int])
        if set_threads is None:
            continue
        return _Blas(
            path=path,
            set_threads=set_threads,
            get_threads=_symbol(lib, _GET, ctypes.c_int, []),
            corename=_symbol(lib, _CORENAME, ctypes.c_char_p, []),
            config=_symbol(lib, _CONFIG, ctypes.c_char_p, []),
        )
    return None


def blas_threads() -> int | None:
    """The BLAS library's current thread count, or None when no known BLAS is loaded."""
    blas = _blas()
    if blas is None or blas.get_threads is None:
        return None
    return int(blas.get_threads())


def set_blas_threads(n: int) -> bool:
    """Use ``n`` threads (at least 1) for later BLAS calls. False when it could not be applied."""
    if n < 1:
        raise ValueError(f"thread count must be at least 1, not {n}")
    blas = _blas()
    if blas is None or blas.set_threads is None:
        return False
    blas.set_threads(int(n))
    return True


@contextmanager
def limit_blas_threads(n: int | None) -> Iterator[bool]:
    """``set_blas_threads(n)`` for the duration of the block (None or 0: leave it alone)."""
    if not n:
        yield False
        return
    previous = blas_threads()
    applied = set_blas_threads(n)
    try:
        yield applied
    finally:
        if applied and previous:
            set_blas_threads(previous)


class one_blas_thread:
    """BLAS at one thread for a block, then as it was (``active=False``: nothing). Blocks on
    several threads at once (one model run from two threads, or two models) nest: BLAS's
    count is process-wide, so it is set to one when the first block enters and restored
    only when the last one leaves, never in the middle of another thread's block."""

    __slots__ = ("active",)
    _previous: int | None = None
    _inside = 0  # blocks entered and not yet left, over every thread
    _lock = threading.Lock()

    def __init__(self, active: bool):
        self.active = active

    def __enter__(self):
        if self.active:
            with one_blas_thread._lock:
                one_blas_thread._inside += 1
                if one_blas_thread._inside == 1:
                    one_blas_thread._previous = blas_threads()
                    set_blas_threads(1)

    def __exit__(self, *exc):
        if self.active:
            with one_blas_thread._lock:
                one_blas_thread._inside -= 1
                if one_blas_thread._inside == 0 and one_blas_thread._previous:
                    set_blas_threads(one_blas_thread._previous)
        return False


def _text(fn) -> str | None:
    if fn is None:
        return None
    value = fn()
    return value.decode("utf-8", "replace").strip() if value else None


def blas_info() -> dict:
    """What BLAS numpy runs on: {"library", "threads", "corename", "config"} (None if unknown)."""
    blas = _blas()
    if blas is None:
        return {"library": None, "threads": None, "corename": None, "config": None}
    return {"library": blas.path, "threads": blas_threads(), "corename": _text(blas.corename),
            "config": _text(blas.config)}
