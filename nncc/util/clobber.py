"""Refusing output paths that would destroy a user's files: an output that is the same file
as an input, or as another output, is an error before any work is done.

"The same file" means the same resolved path (symlinks followed, also for a file that does
not exist yet), or, for files that exist, the same device and inode (hard links).
"""

from __future__ import annotations

import os

from nncc.errors import InputError


def _identity(path: str) -> tuple[str, tuple[int, int] | None]:
    real = os.path.realpath(path)
    try:
        st = os.stat(path)
        inode = (st.st_dev, st.st_ino)
    except OSError:
        inode = None
    return real, inode


def same_file(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] or (a[1] is not None and a[1] == b[1])


def refuse_clobbering(inputs: list[tuple[str, str]], outputs: list[tuple[str, str]]) -> None:
    """``inputs`` and ``outputs`` are (what, path) pairs, e.g. ("the model", "m.onnx") and
    ("output", "m.nncc"). Raises InputError naming both when an output is the same file as an
    input or as an earlier output."""
    seen = [(what, path, _identity(path)) for what, path in inputs]
    for what, path in outputs:
        ident = _identity(path)
        for other_what, other_path, other in seen:
            if same_file(ident, other):
                raise InputError(f"{what} {path} is the same file as {other_what} {other_path}: "
                                 "nncc would overwrite it",
                                 hint="choose another output path")
        seen.append((what, path, ident))
