"""The CLI's progress display: a rich progress bar on stderr, only on a live terminal.

    with live_progress():
        with progress.task("verifying cache entries", total=n) as t: ...

Nothing is drawn when stderr is not a terminal (pipes, files, CI logs), when TERM is
"dumb", or with --quiet. A display appears only once some task has been running for
``NNCC_PROGRESS_DELAY`` seconds (default 0.3), so quick commands never flicker, and it is
erased when the work ends (transient). stdout is never redirected: requested output
stays on stdout while a bar is shown. NO_COLOR is honoured by rich's Console.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from nncc.cli.output import verbosity
from nncc.util import progress

DEFAULT_DELAY = 0.3


def _delay() -> float:
    try:
        return max(0.0, float(os.environ.get("NNCC_PROGRESS_DELAY", DEFAULT_DELAY)))
    except ValueError:
        return DEFAULT_DELAY


def animated() -> bool:
    """Whether a progress display may be drawn on stderr right now."""
    if verbosity() < 0:
        return False
    try:
        if not sys.stderr.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    return os.environ.get("TERM", "") != "dumb"


class RichReporter:
    """Implements nncc.util.progress.Reporter with rich.progress."""

    def __init__(self, delay: float):
        from rich.console import Console  # lazy: rich
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # lazy: rich

        class Count(TextColumn):
            def render(self, task):
                if task.total is None:
                    return ""
                return super().render(task)

        self.delay = delay
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            Count("{task.completed}/{task.total}"), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
            redirect_stdout=False, redirect_stderr=True,
        )
        self._lock = threading.Lock()
        self._running = 0
        self._shown = False
        self._timer: threading.Timer | None = None

    def start(self, description: str, total: int | None):
        handle = self.progress.add_task(description, total=total)
        with self._lock:
            self._running += 1
            if self._running == 1 and not self._shown:
                if self.delay <= 0:
                    self._show_locked()
                else:
                    self._timer = threading.Timer(self.delay, self._show)
                    self._timer.daemon = True
                    self._timer.start()
        return handle

    def update(self, handle, description: str | None = None, advance: int = 0) -> None:
        if handle is None:
            return
        kwargs = {"advance": advance} if advance else {}
        if description is not None:
            kwargs["description"] = description
        self.progress.update(handle, **kwargs)

    def finish(self, handle) -> None:
        if handle is not None:
            self.progress.remove_task(handle)
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._hide_locked()

    def close(self) -> None:
        """Stop the display on every exit path, interrupts included: rich's stop() is a
        no-op for a display that never started and shows the cursor again otherwise. It is
        called even when an interrupt cut the start short (the cursor already hidden, the
        display not yet marked shown), and SIGINT/SIGTERM wait until it is done."""
        from nncc.util.interrupts import held_signals  # lazy: start-up

        with held_signals():
            with self._lock:
                self._running = 0
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                self._shown = False
                try:
                    self.progress.stop()
                except Exception:  # drawing is cosmetic; the cursor is put back all the same
                    self.progress.console.show_cursor(True)

    def _show(self) -> None:
        with self._lock:
            if self._running and not self._shown:
                self._show_locked()

    def _show_locked(self) -> None:
        self.progress.start()
        self._shown = True

    def _hide_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._shown:
            self.progress.stop()
            self._shown = False


@contextlib.contextmanager
def live_progress():
    """Show the progress the core reports inside the block, if stderr is a terminal."""
    if not animated():
        yield
        return
    reporter = RichReporter(_delay())
    try:
        with progress.reporting(reporter):
            yield
    finally:
        reporter.close()
