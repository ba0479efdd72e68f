"""Checks made before any work: a file nncc is asked to write must have a folder to go into.

Compiling can take minutes; a typo in ``-o`` should cost none of them. The write itself
still reports what goes wrong later (a full disk, a folder removed meanwhile)."""

from __future__ import annotations

import os

from nncc.errors import FileAccessError


def check_writable(path: str | os.PathLike, what: str = "the output") -> None:
    """Raise FileAccessError when ``path`` cannot be created or replaced: its folder is
    missing, is not a folder, or is not writable, or ``path`` itself is a folder."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise FileAccessError(f"cannot write {what} {path}: it is a folder", hint="name a file inside it")
    if not os.path.exists(folder):
        raise FileAccessError(f"cannot write {what} {path}: the folder {folder} does not exist",
                              hint=f"create it first (mkdir -p {folder}) or write somewhere else")
    if not os.path.isdir(folder):
        raise FileAccessError(f"cannot write {what} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FileAccessError(f"cannot write {what} {path}: permission denied in {folder}")
