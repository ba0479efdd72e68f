"""Direct-mode tokens: a hit that reads neither the model nor its external data.

Hashing a model to find its token costs time in proportion to its size (about 0.2 s/GB
to read and 0.2 s/GB to hash). Like ccache's direct mode, the index keeps a manifest: the
*identity* of a model file (resolved path, size, mtime_ns, ctime_ns, inode, device) and
of everything the external-data search looked at, together with every other token
ingredient (``token_context``), maps to the token its bytes hashed to. When all of those
identities still match, that token is used without reading anything.

The trade-off (docs/cache.md): a file rewritten with the same size and the same times on
the same inode would be taken for the old one. Times are in nanoseconds and ctime cannot
be set by a user, so that takes a file system with coarse timestamps and a write within
one tick of the hashing. Identities of files changed in the last ``TOO_NEW`` seconds
before the hashing started are therefore never recorded (ccache's guard), and
``--hash-mode content`` (``NNCC_CACHE_HASH_MODE``, ``cache.hash_mode``) always hashes.
"""

from __future__ import annotations

import json
import os
import stat as stat_mod

from blake3 import blake3

TOO_NEW = 2.0  # seconds
_SCHEME = b"nncc-direct/1"


def identity(st) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def lookup_key(path, st, context: bytes) -> str:
    """The manifest key of a model file: its resolved path and identity, and the token's
    other ingredients."""
    h = blake3(_SCHEME)
    h.update(context)
    h.update(os.fsencode(os.path.realpath(path)) + b"\0")
    h.update(json.dumps(identity(st)).encode())
    return h.hexdigest()


def stat_model(path):
    """os.stat of a regular model file, or None (a pipe, a missing file: no direct mode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat_mod.S_ISREG(st.st_mode) else None


def find(index, path, context: bytes) -> str | None:
    """The token recorded for ``path`` as it is now, or None (then hash it)."""
    st = stat_model(path)
    if st is None:
        return None
    found = index.manifest_get(lookup_key(path, st, context))
    if found is None:
        return None
    token, files = found
    try:
        recorded = json.loads(files)
        for name, ident in recorded:
            try:
                now = identity(os.stat(name))
            except OSError:
                now = None
            if now != ident:
                return None
    except (ValueError, TypeError):
        return None
    return token


def record(index, path, st, context: bytes, token: str, seen: list, started: float) -> bool:
    """Remember ``token`` for the identities stat'ed before hashing (``st`` of the model,
    ``seen`` of the external-data search) unless one of them changed within TOO_NEW
    seconds of ``started`` (it might change again within the same time-stamp tick).
    A folder or file the search found missing is recorded as missing."""
    items = [(name, None if s is None else identity(s)) for name, s in seen]
    newest = max([st.st_mtime_ns, st.st_ctime_ns]
                 + [t for _, s in seen if s is not None for t in (s.st_mtime_ns, s.st_ctime_ns)])
    if newest / 1e9 >= started - TOO_NEW:
        return False
    index.manifest_put(lookup_key(path, st, context), token, json.dumps(items))
    return True
