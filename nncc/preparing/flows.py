"""Preparing a model through the cache: the hit, miss and no-cache flows.

Hit: prepare from the verified parts the store returns. Miss: compile, store both parts
atomically, then commit the index row. No cache: compile; touch nothing. Above the store
(store.py), which keeps bytes by token and knows nothing of plans or models.
"""

from __future__ import annotations

import os
import time

import nncc.cache.direct as direct
import nncc.cache.stats as cache_stats
from nncc.cache.files import CacheEntryError, CacheWriteError
from nncc.cache.folder import CacheUnavailable
from nncc.cache.index import IndexCorrupt, IndexUnavailable
from nncc.cache.store import Cache
from nncc.preparing.token import model_subject, token_context, token_of
from nncc.preparing.compiling import compile_options, compile_source
from nncc.preparing.entries import locked, store_plan
from nncc.preparing.outcome import CacheOutcome, ModelSource, Prepared
from nncc.preparing.policy import StagePolicy
from nncc.preparing.storage import Storage
from nncc.preparing.stages import OPTIMIZED, mark_stage
from nncc.settings import CacheSettings, build_settings, cache_settings, value, with_remote
from nncc.util.notice import warn


def prepare(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
            use_cache: bool = True, trust_shared: bool | None = None, model_bytes: bytes | None = None,
            hash_mode: str | None = None, stage: str | None = None, background: str | None = "thread",
            settings=None, **options) -> tuple[Prepared, CacheOutcome]:
    """Compile ``path`` through the cache: returns ``(Prepared, CacheOutcome)``, the
    verified Plan with what nncc.model needs to build the runnable model (nothing is
    loaded or allocated here, and so nothing under a lock).

    Hit: prepare from the verified cache files. Miss: compile, store, return. use_cache
    False: compile, read and write nothing. A cache that cannot be used (read-only, full,
    broken index) degrades to an in-memory compile with one warning line; it never fails.
    So does a folder that is not nncc's or not private to this user (``trust_shared``,
    default $NNCC_CACHE_TRUST_SHARED, trusts a shared one).
    ``model_bytes``: the model file's bytes when the caller has read them already (a model
    read from a pipe can be read only once); external data is still found next to ``path``.
    ``hash_mode``: "direct" (default; the cache.hash_mode setting) finds the token of an unchanged
    model file from its identity without reading it (nncc/cache/direct.py); "content"
    always hashes.
    ``stage``: None (a miss stores the quick stage, and the miss itself or a later hit,
    per ``cache.upgrade_after``, starts its upgrade in the ``background``, "thread" or
    "process", see nncc/preparing/stages.py), or "quick"/"optimized" to force one.
    ``settings``: the command's resolved settings (nncc.settings.CacheSettings); None
    resolves them now, once.
    """
    start = time.perf_counter()
    source = ModelSource(path, model_bytes)
    if settings is None:
        settings = resolve_settings(cache_dir, hash_mode, use_cache)
    opts = compile_options(options, settings.backend_options)
    if trust_shared is None:
        trust_shared = settings.trust_shared
    policy = StagePolicy(opts, stage, background, settings, trust_shared)
    if not use_cache:
        prepared = _compile(source, *policy.uncached())
        return prepared, CacheOutcome("disabled", None, time.perf_counter() - start)

    limits = settings
    directory = settings.directory
    mode = settings.hash_mode
    try:
        cache = Cache.open(directory, read_only_ok=True, trust_shared=policy.trust_shared)
    except CacheUnavailable as exc:
        reason = f"{exc}; {exc.hint}" if exc.hint else str(exc)
        return _degraded(source, policy.uncached(), _content_token(source, token_context(opts), directory),
                         directory, reason, start)
    try:
        context = token_context(opts, cache.index)  # the index remembers nncc's own file hashes
    except BaseException:
        cache.close()
        raise
    token = None
    try:
        for attempt in (0, 1):
            try:
                if mode == "direct" and not source.given:
                    found = _direct_hit(cache, source, context, start, policy)
                    if found is not None:
                        return found
                if token is None:
                    token = _content_token(source, context, directory, cache if mode == "direct" else None)
                if cache.read_only:
                    return _prepare_read_only(cache, token, source, policy, start)
                return _prepare_cached(cache, token, source, policy, start, limits)
            except IndexCorrupt as exc:
                if attempt or cache.read_only:
                    raise CacheUnavailable(str(exc)) from None
                cache.rebuild_index(str(exc))
    except (CacheUnavailable, IndexUnavailable, IndexCorrupt, OSError) as exc:
        if token is None:
            token = _content_token(source, context, directory)
        return _degraded(source, policy.uncached(), token, directory, str(exc), start)
    finally:
        cache.close()


def resolve_settings(cache_dir, hash_mode, use_cache: bool, remote_url: str | None = None):
    """Every setting a prepare uses, checked now: a bad one is a usage error before any
    work, whatever the cache holds. ``remote_url``: the command's --remote, if given."""
    if not use_cache:  # only what a compile without the cache uses
        return CacheSettings("", None, None, "content", upgrade_after=value("cache.upgrade_after"),
                             shape_plans=value("run.shape_plans"),  # trust_shared: no folder is used
                             backend_options=build_settings())
    return with_remote(cache_settings(cache_dir, hash_mode), remote_url)  # the remote tier's too, now


def _content_token(source: ModelSource, context: bytes, directory: str, cache: Cache | None = None) -> str:
    """The token of the model's bytes (read now). With ``cache``, remember it in the
    direct-mode manifest against the identities stat'ed before the bytes were read."""
    started = time.time()
    st = direct.stat_model(source.path) if cache is not None and not source.given else None
    seen: list | None = [] if st is not None else None
    source.subject = model_subject(source.path, source.bytes, (directory,), seen)
    token = token_of(source.subject, context).hex()
    if st is not None and not cache.read_only:
        try:
            direct.record(cache.index, source.path, st, context, token, seen, started)
        except IndexUnavailable:
            pass  # the manifest only saves time; the hash was taken
    return token


def _direct_hit(cache: Cache, source: ModelSource, context: bytes, start: float, policy: "StagePolicy"):
    """A verified hit found by the model file's identity, or None (then hash the bytes)."""
    token = direct.find(cache.index, source.path, context)
    if token is None or cache.index.get(token) is None:
        return None
    model, _ = Storage(cache, policy.settings).get(token)
    if model is None:
        return None  # rejected: the content flow finds it again, reports it and recompiles
    return policy.after_hit(cache, token, source, model, start)


def _degraded(source: ModelSource, compiling, token, directory, reason, start, model=None):
    """``compiling``: (options, stage) to compile with when ``model`` is None."""
    warn(f"compilation cache at {directory} is unavailable ({reason}); compiling in memory")
    if model is None:
        model = _compile(source, *compiling)
    return model, CacheOutcome("unavailable", token, time.perf_counter() - start, directory, reason)


def _prepare_read_only(cache: Cache, token: str, source: ModelSource, policy: "StagePolicy", start: float):
    """A cache on read-only storage serves verified hits (no lock: nothing here can
    remove an entry, and the files are verified in memory as always) and stores nothing."""
    model, rejected = Storage(cache, policy.settings).get(token)
    if model is not None:
        return policy.after_hit(cache, token, source, model, start)
    reason = (("disk full, " if cache.disk_full else "read-only, ")
              + (f"entry rejected: {rejected.detail}" if rejected else "no entry for this model"))
    return _degraded(source, policy.uncached(), token, cache.directory, reason, start)


def _prepare_cached(cache: Cache, token: str, source: ModelSource, policy: "StagePolicy", start: float,
                    limits=None):
    storage = Storage(cache, policy.settings)
    directory = cache.directory
    rejected: CacheEntryError | None = None
    model = None
    if cache.index.get(token) is not None:
        model, rejected = storage.get(token)
        if model is not None:
            return policy.after_hit(cache, token, source, model, start)
        if rejected is not None:
            with locked(cache, token, shared=False) as held:
                model, again = storage.read(token)  # replaced meanwhile by another process?
                if model is None:
                    rejected = again or rejected
                    warn(f"cache entry {token[:12]} rejected: {rejected.detail}; recompiling")
                    cache.remove(token, counter="corruptions", lock=held)
            if model is not None:
                return policy.after_hit(cache, token, source, model, start)
    stage = policy.miss_stage()
    remote_started = time.perf_counter()
    found = storage.read_through(token, source, policy.opts, stage)  # the remote tier: no local lock held
    remote_seconds = time.perf_counter() - remote_started
    if found is not None:
        model, adopted = found
        started = policy.after_miss(cache, token, source, adopted)
        return model, CacheOutcome("remote hit", token, time.perf_counter() - start, directory,
                                   stage=adopted, remote_seconds=remote_seconds, upgrade=started)
    with locked(cache, token, shared=False) as held:
        # Re-check under the exclusive lock: another process may have compiled it while we
        # waited (make -j), or already replaced the entry we rejected.
        model, again = storage.read(token)
        hit = model is not None  # made by another process while we waited
        if not hit:
            if again is not None:
                rejected = again
                warn(f"cache entry {token[:12]} rejected: {again.detail}; recompiling")
                cache.remove(token, counter="corruptions", lock=held)
            opts = policy.options_for(stage)
            from nncc.cache.objects import record_entry_objects  # lazy: start-up

            compile_start = time.perf_counter()
            plan = compile_source(source, opts, cache)  # linked from the cache's kernel objects
            compile_seconds = time.perf_counter() - compile_start
            mark_stage(plan, stage)
            model = Prepared(plan, trust_native=True)  # native code built just now
            from nncc.cache.limits import EntryTooLarge, after_store  # lazy: start-up

            try:
                store_plan(cache, token, plan, source, policy.opts, compile_seconds,
                           counter="recompiles" if rejected else "misses", stage=stage, limits=limits)
            except EntryTooLarge as exc:  # an entry that cannot fit is not stored
                warn(str(exc))
                storage.abandon(token)
                return model, CacheOutcome("not-stored", token, time.perf_counter() - start, directory, str(exc))
            except (CacheWriteError, IndexUnavailable) as exc:
                storage.abandon(token)
                return _degraded(source, None, token, directory, f"cannot store: {exc}", start, model)
            record_entry_objects(cache, token, plan)  # gc keeps the objects a live entry needs
            cache_stats.record_miss(cache, token, source.bytes, policy.opts, rejected is not None, compile_seconds)
            policy.record_build(cache, token, plan)
    if hit:
        storage.abandon(token)  # stored here by another process: it shares it
        return policy.after_hit(cache, token, source, model, start)  # outside the lock: it may take it
    remote_started = time.perf_counter()
    storage.write_back(token)  # to the remote tier, if any, outside the lock
    remote_seconds += time.perf_counter() - remote_started
    remote_note = storage.remote_state()
    outcome = "recompiled" if rejected else "miss"
    evicted = None
    try:
        evicted = after_store(cache, limits, keep={token})  # size and age bounds
    except (IndexUnavailable, IndexCorrupt, OSError):
        pass  # gc is housekeeping: it never fails a run
    detail = rejected.detail if rejected else None
    started = policy.after_miss(cache, token, source, stage)  # outside the lock: the builder takes it
    return model, CacheOutcome(outcome, token, time.perf_counter() - start, directory, detail, evicted,
                               stage=stage, remote_seconds=None if remote_note is None else remote_seconds,
                               remote_note=remote_note or None, upgrade=started)


def _compile(source: ModelSource, opts, stage: str = OPTIMIZED) -> Prepared:
    plan = compile_source(source, opts)
    mark_stage(plan, stage)
    return Prepared(plan, trust_native=True)  # built just now
