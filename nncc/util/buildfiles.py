"""Build-system helpers: write a file only when its content changes, and Make depfiles.

``write_if_changed`` keeps a file (and its mtime) untouched when the new content is the same,
so build tools that re-check timestamps after a step (GNU make does, ninja with
``restat``) skip everything downstream of an unchanged output.

``depfile`` renders the dependency file of one output, in the format ``gcc -MD -MP``
writes and GNU make, ninja (``depfile =``) and others read::

    build/model.nncc: \\
      models/model.onnx \\
      models/model.weights

    models/model.weights:

The first rule says what the output was built from; the empty rules (one per prerequisite
other than the first) keep make going when such a file is deleted or renamed: the output
is then rebuilt instead of make stopping with "No rule to make target".
"""

from __future__ import annotations

import os
import stat

from nncc.errors import InputError
from nncc.util.atomic import write_atomic

_CHUNK = 1 << 20


def same_content(path: str | os.PathLike, data: bytes | memoryview) -> bool:
    """True when ``path`` is a regular file holding exactly ``data`` (compared in chunks)."""
    view = memoryview(data).cast("B")
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size != len(view):
                return False
            offset = 0
            while offset < len(view):
                chunk = f.read(_CHUNK)
                if not chunk or chunk != view[offset:offset + len(chunk)]:
                    return False
                offset += len(chunk)
            return f.read(1) == b""
    except OSError:
        return False


def write_if_changed(path: str | os.PathLike, data: bytes | memoryview, force: bool = False) -> bool:
    """Write ``data`` atomically unless ``path`` already holds it. Returns whether it wrote.

    With ``force`` the file is always rewritten (and so gets a new mtime).
    """
    if not force and same_content(path, data):
        return False
    write_atomic(path, data)
    return True


def _escape(path: str) -> str:
    """A path as GNU make reads it in a rule: spaces, '#' and '$' escaped."""
    if "\n" in path or "\r" in path:
        raise InputError(f"cannot write a dependency file for a path with a line break: {path!r}")
    return path.replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")


def depfile(target: str, prerequisites: list[str]) -> str:
    """The text of a Make dependency file: ``target`` depends on ``prerequisites``
    (the first one being the main input), plus an empty rule for each other prerequisite."""
    seen: list[str] = []
    for p in prerequisites:
        if p not in seen:
            seen.append(p)
    lines = [f"{_escape(target)}:" + "".join(f" \\\n  {_escape(p)}" for p in seen)]
    for p in seen[1:]:
        lines.append("")
        lines.append(f"{_escape(p)}:")
    return "\n".join(lines) + "\n"
