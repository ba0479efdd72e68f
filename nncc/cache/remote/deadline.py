"""One deadline for a whole remote operation, whatever the client does inside it.

A client's time-out applies to each socket read: a server that sends a byte a second
never trips it. So every operation of the tier on a run's path runs in a daemon thread
and is waited for at most its deadline: ``remote.timeout``, plus a second per
``BYTES_PER_SECOND`` of payload it moves (parts can be large). An operation still running
then is abandoned (its thread dies with the process) and raised as RemoteTimeout; the
caller turns the tier off. Any exception a client raises, of whatever kind, comes out
as a RemoteFault: a warning and the local cache, never an internal error.
"""

from __future__ import annotations

import threading
import time

from nncc.cache.remote.errors import PoisonedEntry, RemoteConfigError, RemoteFault, RemoteTimeout

BYTES_PER_SECOND = 10 << 20  # the slowest transfer rate a part is given time for

_spent = threading.local()  # seconds this thread waited on remote operations


def allowance(timeout: float, size: int = 0) -> float:
    return timeout + size / BYTES_PER_SECOND


def bounded(what: str, seconds: float, fn):
    """``fn()``'s result, if it finishes within ``seconds``; RemoteTimeout otherwise."""
    box: dict = {}
    done = threading.Event()

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    started = time.monotonic()
    worker = threading.Thread(target=run, name="nncc-remote", daemon=True)
    worker.start()
    finished = done.wait(seconds)
    _spent.seconds = getattr(_spent, "seconds", 0.0) + (time.monotonic() - started)
    if not finished:
        raise RemoteTimeout(f"{what} timed out after {seconds:g} s")
    error = box.get("error")
    if error is None:
        return box.get("value")
    if isinstance(error, (RemoteFault, PoisonedEntry, RemoteConfigError)):
        raise error
    if isinstance(error, Exception):
        raise RemoteFault(f"{what} failed: {type(error).__name__}: {error}") from None
    raise error  # KeyboardInterrupt and the like are not the remote's


def spent() -> float:
    """Seconds this thread has waited on remote operations so far."""
    return getattr(_spent, "seconds", 0.0)
