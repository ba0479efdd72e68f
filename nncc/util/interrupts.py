"""Holding off SIGINT and SIGTERM for a few statements that must not be cut in two.

nncc turns both signals into an exception (nncc/cli/main.py), which can surface between any
two statements. Inside ``held_signals()`` a signal is only recorded; once the block is
left, the handler that was in place runs for it (and raises), so the block either runs to
its end or not at all. Blocking the signal with a thread mask would not do: the process
has other threads (numpy's BLAS pool, for one), the kernel hands the signal to one of them,
and Python runs its handler in the main thread at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held_signals():
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only: nothing lands here
        return
    pending: list[int] = []

    def hold(signum, frame):
        pending.append(signum)

    previous = {signum: signal.signal(signum, hold) for signum in _HELD}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            signum = pending[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)  # KeyboardInterrupt, or nncc's SIGTERM exception
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)  # the default action, now
