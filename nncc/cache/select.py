"""Which cache entries a command-line argument names: a token prefix (hex digits) or a
model-name pattern (a shell glob, as `pip cache list PATTERN`).

A pattern matches the model's file name (``resnet*``, ``mlp.onnx``), its name without the
extension (``mlp``), or, when it holds a ``/``, the model's whole path as recorded.
"""

from __future__ import annotations

import fnmatch
import os

HEX = frozenset("0123456789abcdef")


def is_token_prefix(text: str) -> bool:
    return bool(text) and all(ch in HEX for ch in text.lower())


def name_matches(source_path: str | None, pattern: str) -> bool:
    if not isinstance(source_path, str) or not source_path:
        return False
    if "/" in pattern:
        return fnmatch.fnmatchcase(source_path, pattern)
    name = os.path.basename(source_path)
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(os.path.splitext(name)[0], pattern)


def token_matches(token: str, text: str) -> bool:
    return is_token_prefix(text) and isinstance(token, str) and token.startswith(text.lower())


def matches(token: str, source_path: str | None, text: str) -> bool:
    """``text`` names this entry by token prefix or by model name."""
    return token_matches(token, text) or name_matches(source_path, text)
