"""Whether the model `nncc inspect` compiles, with its options, has a compilation cache
entry: its token, and the entry's stage and origin, read from the cache index.

Only the cache's public lookups are used: the token (nncc.preparing.token) and the index row,
read from an index opened for reading only: a look never creates a cache, stores, fetches,
counts or upgrades anything. A cache that cannot be read (refused, unavailable) is reported, never an error:
inspect's subject is the plan, the cache line only says where a run would find it.
"""

from __future__ import annotations

import os

from nncc._version import __version__
from nncc.cache.folder import INDEX_NAME, CacheUnavailable, check_trusted, folder_state, refuse_foreign
from nncc.cache.index import Index, IndexCorrupt, IndexUnavailable
from nncc.preparing.token import token_context, token_from
from nncc.plan.format import FORMAT_VERSION
from nncc.preparing.compiling import compile_options
from nncc.settings import cache_settings

_UNREADABLE = (CacheUnavailable, IndexCorrupt, IndexUnavailable, OSError)  # CacheRefused is a CacheUnavailable


def cache_report(path: str, model_bytes: bytes, options: dict, cache_dir, trust_shared) -> dict:
    """``{"directory", "token", "cached", "stage", "origin", "hits", "size", "created",
    "last_used", "detail"}``: ``cached`` is True or False, or None when the cache could not
    be read (``detail`` says why). ``token`` is the one `nncc run` with the same options
    stores under (and `nncc cache pull` takes), whether or not it is cached."""
    settings = cache_settings(cache_dir)
    opts = compile_options(options, settings.backend_options)  # built as a run would build it: the same token
    directory = settings.directory
    trust_shared = settings.trust_shared if trust_shared is None else trust_shared

    def token(memo=None) -> str:
        # the cache folder is skipped by the external-data search, as when a run hashes it
        return token_from(token_context(opts, memo), path, model_bytes, (directory,)).hex()

    report = dict.fromkeys(("token", "stage", "origin", "hits", "size", "created", "last_used", "detail"))
    report |= {"directory": directory, "cached": False}
    state = folder_state(directory)
    if state in ("missing", "empty") or (state == "nncc" and not os.path.lexists(os.path.join(directory, INDEX_NAME))):
        return report | {"token": token(), "detail": "no cache there yet"}
    try:
        index = _open_index(directory, state, trust_shared)
    except _UNREADABLE as exc:
        return report | {"token": token(), "cached": None, "detail": str(exc)}
    try:
        found = token(index)  # the index remembers the hashes of nncc's own files
        entry = index.get(found)
    except _UNREADABLE as exc:
        return report | {"token": token(), "cached": None, "detail": str(exc)}
    finally:
        index.close()
    report["token"] = found
    if entry is None:
        return report
    return report | {"cached": True, "stage": entry.stage, "origin": entry.origin, "hits": entry.hits,
                     "size": entry.size, "created": entry.created, "last_used": entry.last_used}


def _open_index(directory: str, state: str, trust_shared):
    """The index, opened for reading only: a look writes nothing (no schema upgrade, no
    retiring of another version's rows, no statistics), in a folder trusted as a run trusts it."""
    if state == "foreign":
        if os.path.isdir(directory):
            refuse_foreign(directory)
        raise CacheUnavailable(f"{directory} is not a directory")
    check_trusted(directory, trust_shared)
    return Index(directory, __version__, FORMAT_VERSION).open_read_only()
