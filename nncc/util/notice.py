"""One-line warnings on stderr, in nncc's voice; the core never imports click or rich."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    sys.stderr.write(f"nncc: warning: {message}\n")
    sys.stderr.flush()


_said: set = set()


def warn_once(key, message: str) -> None:
    """``warn``, once per process for ``key`` (a tuple naming what it is about): a process
    that prepares many models, as bench does, says a thing once."""
    if key not in _said:
        _said.add(key)
        warn(message)
