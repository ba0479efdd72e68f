"""Building an entry's optimized (native) stage and swapping it in.

``python -m nncc.preparing.upgrade --cache-dir DIR --token T --model PATH --options JSON`` is
the worker ``nncc run`` detaches (nncc/preparing/policy.py); the Python API runs
``upgrade_token`` in a thread. Either way:

1. Take the token's upgrade lock without waiting: a second builder exits at once.
2. Re-check the entry: still quick, no failed build on record (a forced build ignores
   that record).
3. The worker reads the model file and recomputes the token: bytes that no longer hash to
   it abort the build (the file changed since the entry was made).
4. Ask the remote tier for this target's optimized entry (a machine with the same C
   compiler, flags and ISA may have built it); adopted, it is the upgrade. Otherwise
   compile with the native backend, outside the token lock: readers keep stage 1, and
   share the result on the remote.
5. A failed native compile (compiler error, time-out) is recorded in the index and the
   entry stays quick. Otherwise, under the token's exclusive lock, the entry is replaced
   (files by rename, then the row): readers that mapped stage 1 keep it, the next
   prepare() gets stage 2. A crash before the commit leaves stage 1 and its row intact.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from nncc.cache.files import CacheWriteError
from nncc.cache.folder import CacheUnavailable
from nncc.cache.index import IndexCorrupt, IndexUnavailable
from nncc.cache.limits import after_store
from nncc.cache.locking import try_lock
from nncc.cache.objects import record_entry_objects
from nncc.cache.store import Cache
from nncc.preparing.token import token_context, token_from
from nncc.errors import NnccError
from nncc.preparing.compiling import compile_options, compile_source
from nncc.preparing.entries import locked, store_plan
from nncc.preparing.outcome import ModelSource
from nncc.preparing.remote import fetch_optimized, publish_optimized
from nncc.preparing.stages import OPTIMIZED, QUICK, compiler_key, upgrade_lock_path
from nncc.settings import bound_memory, cache_settings, with_remote
from nncc.util.notice import warn

UPGRADED, FAILED, SKIPPED, BUSY, CHANGED = "upgraded", "failed", "skipped", "busy", "changed"


def upgrade_token(directory: str, token: str, source, opts, force: bool = False,
                  trust_shared: bool | None = None, settings=None) -> str:
    """Build and commit the optimized stage of ``token``; returns one of UPGRADED, FAILED,
    SKIPPED (nothing to do), BUSY (another builder runs) or CHANGED (the model's bytes no
    longer hash to the token). Never raises for cache trouble: this is background work.
    ``settings``: the command's resolved settings (nncc.settings.CacheSettings: the size
    bounds, whether the remote's native code is trusted); None resolves them, once."""
    held = try_lock(upgrade_lock_path(directory, token))
    if held is None:
        return BUSY
    try:
        if settings is None:  # the detached worker: a command of its own
            settings = with_remote(cache_settings(directory))
        if trust_shared is None:
            trust_shared = settings.trust_shared
        with Cache.open(directory, trust_shared=trust_shared) as cache:
            return _upgrade(cache, token, source, opts, force, settings)
    except (CacheUnavailable, CacheWriteError, IndexCorrupt, IndexUnavailable, OSError) as exc:
        warn(f"cannot build the optimized stage of cache entry {token[:12]}: {exc}")
        return FAILED
    finally:
        held.unlink()
        held.release()


def _upgrade(cache, token: str, source, opts, force: bool, settings) -> str:
    entry = cache.index.get(token)
    if entry is None or entry.stage != QUICK or (cache.index.failure(token) is not None and not force):
        return SKIPPED
    if _token_of(cache, source, opts) != token:
        return CHANGED

    if fetch_optimized(cache, token, opts, settings.remote, settings.trust_remote_native):  # a machine of this target built it
        return UPGRADED

    start = time.perf_counter()
    try:
        plan = compile_source(source, opts, cache)  # linked from the cache's kernel objects, like a miss
    except NnccError as exc:
        cache.index.record_failure(token, str(exc), compiler_key(opts))
        return FAILED
    seconds = time.perf_counter() - start
    error = plan.options.get("native_error")
    if error:
        cache.index.record_failure(token, str(error), compiler_key(opts))
        return FAILED
    with locked(cache, token, shared=False):
        entry = cache.index.get(token)
        if entry is None or entry.stage != QUICK:
            return SKIPPED  # removed, or upgraded by `nncc compile` meanwhile
        store_plan(cache, token, plan, source, opts, seconds, counter="upgrades", stage=OPTIMIZED)
        record_entry_objects(cache, token, plan)
    publish_optimized(cache, token, settings.remote)  # the other machines of this target take it from the remote
    try:
        after_store(cache, settings, keep={token})  # native code makes it bigger
    except (IndexUnavailable, IndexCorrupt, OSError):
        pass  # housekeeping never fails the upgrade
    return UPGRADED


def _token_of(cache, source, opts) -> str:
    """The token of the model's bytes as they are now (read here, for the worker)."""
    return token_from(token_context(opts, cache.index), source.path, source.bytes, (cache.directory,)).hex()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nncc.preparing.upgrade",
                                     description="Build a cache entry's optimized (native) stage.")
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--options", required=True, help="CompileOptions as JSON")
    parser.add_argument("--trust-shared", action="store_true", help="the cache folder may be shared")
    args = parser.parse_args(argv)
    bound_memory()  # a command of its own: it resolves its settings itself
    outcome = upgrade_token(args.cache_dir, args.token, ModelSource(args.model), compile_options(json.loads(args.options)),
                            trust_shared=True if args.trust_shared else None)
    return 0 if outcome in (UPGRADED, SKIPPED, BUSY) else 1


if __name__ == "__main__":
    sys.exit(main())
