"""Progress of long work, reported by the core without any UI dependency.

The core says what it is doing; a front end decides whether and how to show it. Without
an installed reporter every call here is a cheap no-op, so library users see nothing.

    from nncc.util import progress

    with progress.task("verifying cache entries", total=len(entries)) as t:
        for entry in entries:
            ...
            t.advance()

    progress.describe("partitioning")    # relabel the innermost running task, if any

The CLI installs a reporter (``nncc.cli.progress``) that draws a rich progress bar on
stderr when stderr is a terminal, and installs none otherwise. A reporter's failure never
fails the work it reports on. Reporting is per thread of control (a ``ContextVar``):
work done in other threads is not shown.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator


class Reporter:
    """What a front end implements. ``start`` returns an opaque handle for the task."""

    def start(self, description: str, total: int | None):  # pragma: no cover - interface
        return None

    def update(self, handle, description: str | None = None, advance: int = 0) -> None:  # pragma: no cover
        pass

    def finish(self, handle) -> None:  # pragma: no cover - interface
        pass


_state: contextvars.ContextVar[tuple[Reporter | None, tuple]] = contextvars.ContextVar(
    "nncc_progress", default=(None, ()))


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[Reporter | None]:
    """Send the progress of the work done inside the block to ``reporter``."""
    token = _state.set((reporter, ()))
    try:
        yield reporter
    finally:
        _state.reset(token)


def active() -> bool:
    """True when a reporter is installed (worth computing a total for)."""
    return _state.get()[0] is not None


class Task:
    """A running task: ``advance(n)`` and ``describe(text)``; no-ops without a reporter."""

    __slots__ = ("_reporter", "_handle")

    def __init__(self, reporter: Reporter | None, handle):
        self._reporter = reporter
        self._handle = handle

    def advance(self, n: int = 1) -> None:
        if self._reporter is not None:
            _safely(self._reporter.update, self._handle, advance=n)

    def describe(self, text: str) -> None:
        if self._reporter is not None:
            _safely(self._reporter.update, self._handle, description=text)


_NO_TASK = Task(None, None)


@contextlib.contextmanager
def task(description: str, total: int | None = None) -> Iterator[Task]:
    """A unit of work with an optional number of steps (``None``: a spinner)."""
    reporter, stack = _state.get()
    if reporter is None:
        yield _NO_TASK
        return
    handle = _safely(reporter.start, description, total)
    token = _state.set((reporter, stack + (handle,)))
    try:
        yield Task(reporter, handle)
    finally:
        _state.reset(token)
        _safely(reporter.finish, handle)


def describe(text: str) -> None:
    """Relabel the innermost running task (a phase of it); nothing when none runs."""
    reporter, stack = _state.get()
    if reporter is not None and stack:
        _safely(reporter.update, stack[-1], description=text)


def _safely(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception:  # drawing progress is cosmetic: it must never fail the work
        return None
