"""One-line warnings on stderr, in nncc's voice; the core never imports click or rich."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    sys.stderr.write(f"nncc: warning: {message}\n")
    sys.stderr.flush()
