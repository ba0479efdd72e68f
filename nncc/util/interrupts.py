"""Holding off SIGINT and SIGTERM for a few statements that must not be cut in two.

nncc turns both signals into an exception (nncc/cli/main.py), which can surface between any
two statements. Inside ``held_signals()`` they stay pending; they are delivered, and raise,
once the block is left, so the block either runs to its end or not at all.
"""

from __future__ import annotations

import contextlib
import signal

_HELD = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def held_signals():
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - POSIX has it
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
