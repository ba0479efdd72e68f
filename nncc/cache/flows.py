"""Preparing a model through the cache: the hit, miss and no-cache flows.

Hit: prepare from the verified parts the store returns. Miss: compile, store both parts
atomically, then commit the index row. No cache: compile; touch nothing. Above the store
(store.py), which keeps bytes by token and knows nothing of plans or models.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nncc.cache import stats as cache_stats
from nncc.cache.files import CacheEntryError, CacheWriteError
from nncc.cache.folder import CacheUnavailable
from nncc.cache.index import Entry, IndexCorrupt, IndexUnavailable
from nncc.cache.locking import FileLock
from nncc.cache.stages import OPTIMIZED, StagePolicy, mark_stage
from nncc.cache.store import Cache
from nncc.errors import ModelFormatError, PlanFormatError
from nncc.util.notice import warn

if TYPE_CHECKING:
    from nncc.cache.limits import Evicted


@dataclass
class CacheOutcome:
    """What the cache did for one prepare: reported by ``nncc run``/``compile --json``."""

    outcome: str  # "hit" | "remote hit" | "miss" | "disabled" | "unavailable" | "recompiled" | "not-stored"
    token: str | None
    seconds: float
    directory: str | None = None
    detail: str | None = None  # why an entry was rejected or the cache was unavailable
    evicted: Evicted | None = None  # what the size and age bounds removed after this store
    stage: str | None = None  # the cache entry's stage: "quick" or "optimized" (stages.py)
    upgrade: str | None = None  # a background build of the optimized stage started: "process" | "thread"
    remote_seconds: float | None = None  # of ``seconds``, the time spent on the remote tier (None: none asked)
    remote_note: str | None = None  # why the remote tier went off during this prepare ("timed out", "failed")

    def as_dict(self) -> dict:
        return {"outcome": self.outcome, "token": self.token, "seconds": self.seconds,
                "directory": self.directory, "detail": self.detail,
                "evicted": self.evicted.as_dict() if self.evicted else None, "stage": self.stage,
                "upgrade": self.upgrade, "remote_seconds": self.remote_seconds, "remote_note": self.remote_note}


class ModelSource:
    """The model being prepared: its path, and its bytes, read at most once and only when
    needed (a direct-mode hit never reads them)."""

    def __init__(self, path, model_bytes=None):
        self.path = path
        self._bytes = model_bytes
        self.given = model_bytes is not None  # read by the caller (a pipe): no direct mode
        self.subject: bytes | None = None  # the model's half of the token, once hashed (token.model_subject)

    @property
    def bytes(self):
        if self._bytes is None:
            from nncc.util.files import read_model_file

            self._bytes = read_model_file(self.path)
        return self._bytes


def prepare(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
            use_cache: bool = True, trust_shared: bool | None = None, model_bytes: bytes | None = None,
            hash_mode: str | None = None, stage: str | None = None, background: str = "thread", **options):
    """Compile ``path`` through the cache: returns ``(CompiledModel, CacheOutcome)``.

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
    ``stage``: None (a miss stores the quick stage; hits upgrade it in the ``background``,
    "thread" or "process", see nncc/cache/stages.py), or "quick"/"optimized" to force one.
    """
    from nncc.compiler import CompileOptions

    start = time.perf_counter()
    opts = CompileOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})
    source = ModelSource(path, model_bytes)
    policy = StagePolicy(opts, stage, background, trust_shared)
    if not use_cache:
        model = _compile(source, *policy.uncached())
        return model, CacheOutcome("disabled", None, time.perf_counter() - start)
    from nncc.cache.token import token_context
    from nncc.settings import cache_settings, check_remote_settings, value

    limits = cache_settings(cache_dir)  # every cache setting, checked, once
    check_remote_settings()  # and the remote tier's, now rather than on the first local miss
    directory = limits.directory
    mode = value("cache.hash_mode", hash_mode, "--hash-mode")
    try:
        cache = Cache.open(directory, read_only_ok=True, trust_shared=trust_shared)
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


def _content_token(source: ModelSource, context: bytes, directory: str, cache: Cache | None = None) -> str:
    """The token of the model's bytes (read now). With ``cache``, remember it in the
    direct-mode manifest against the identities stat'ed before the bytes were read."""
    from nncc.cache import direct
    from nncc.cache.token import model_subject, token_of

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
    from nncc.cache import direct

    token = direct.find(cache.index, source.path, context)
    if token is None or cache.index.get(token) is None:
        return None
    if cache.read_only:
        model, _ = _try_hit(cache, token)
    else:
        with _locked(cache, token, shared=True):
            model, _ = _try_hit(cache, token)
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
    model, rejected = _try_hit(cache, token)
    if model is not None:
        return policy.after_hit(cache, token, source, model, start)
    reason = (("disk full, " if cache.disk_full else "read-only, ")
              + (f"entry rejected: {rejected.detail}" if rejected else "no entry for this model"))
    return _degraded(source, policy.uncached(), token, cache.directory, reason, start)


def load_entry(cache: Cache, entry: Entry):
    """A CompiledModel from a cache entry, parsed from the very bytes the store verified.
    Raises CacheEntryError."""
    from nncc._version import __version__
    from nncc.model import CompiledModel
    from nncc.plan.format import deserialize

    model_bytes, data = cache.get(entry)
    try:
        plan = deserialize(model_bytes, data=data)
    except PlanFormatError as exc:
        raise CacheEntryError("corrupt", f"model cache is malformed: {exc}") from None
    if plan.producer != __version__:
        raise CacheEntryError("stale", f"model cache was produced by nncc {plan.producer}")
    if entry.from_remote and plan.carries_code and not _remote_native_trusted():
        # adopted while remote.trust_native was on, which it is no longer
        from nncc.cache.stages import portable_plan

        warn(f"cache entry {entry.token[:12]} holds native code from the remote tier and remote.trust_native is "
             "off: its portable plan runs (`nncc cache rm` it to build native code here)")
        return CompiledModel(portable_plan(plan), trust_native=False)
    # the native code was hashed with the plan and is loaded from those bytes; code nncc did
    # not build here (a remote entry's) is never signed as the user's own (artifact_bytes)
    return CompiledModel(plan, trust_native=True, origin=f"cache entry {entry.token[:12]}",
                         cache_parts=(model_bytes, data), foreign=entry.from_remote)


def _remote_native_trusted() -> bool:
    from nncc.settings import value

    return bool(value("remote.trust_native"))


def _try_hit(cache: Cache, token: str):
    """(model, None) for a verified entry, (None, why) for a rejected one, (None, None)
    when there is no entry."""
    entry = cache.index.get(token)
    if entry is None:
        return None, None
    started = time.perf_counter()
    try:
        model = load_entry(cache, entry)
    except CacheEntryError as exc:
        return None, exc
    cache_stats.record_hit(cache, entry, time.perf_counter() - started)
    return model, None


def _prepare_cached(cache: Cache, token: str, source: ModelSource, policy: "StagePolicy", start: float,
                    limits=None):
    directory = cache.directory
    rejected: CacheEntryError | None = None
    model = None
    if cache.index.get(token) is not None:
        # Hit path: a shared lock keeps gc from deleting the entry while it is verified.
        with _locked(cache, token, shared=True):
            model, rejected = _try_hit(cache, token)
        if model is not None:
            return policy.after_hit(cache, token, source, model, start)
    with _locked(cache, token, shared=False) as held:
        # Re-check under the exclusive lock: another process may have compiled it while we
        # waited (make -j), or already replaced the entry we rejected.
        model, again = _try_hit(cache, token)
        hit = model is not None  # made by another process while we waited
        if not hit:
            rejected = again or rejected
            if rejected is not None:
                warn(f"cache entry {token[:12]} rejected: {rejected.detail}; recompiling")
                cache.remove(token, counter="corruptions", lock=held)
            from nncc.cache.remote.flow import after_local_commit, on_local_miss, remote_state

            stage = policy.miss_stage()
            remote_started = time.perf_counter()
            found = on_local_miss(cache, token, source, policy.opts, stage)  # the remote tier
            remote_seconds = time.perf_counter() - remote_started
            if found is not None:
                model, adopted = found
                return model, CacheOutcome("remote hit", token, time.perf_counter() - start, directory,
                                           stage=adopted, remote_seconds=remote_seconds)
            opts = policy.options_for(stage)
            from nncc.cache.objects import objects_in, record_entry_objects

            compile_start = time.perf_counter()
            with objects_in(cache):  # native code is linked from the cache's kernel objects
                plan = _compile_plan(source, opts)
            compile_seconds = time.perf_counter() - compile_start
            mark_stage(plan, stage)
            from nncc.model import CompiledModel

            model = CompiledModel(plan, trust_native=True)  # native code built just now
            from nncc.cache.limits import EntryTooLarge, after_store

            try:
                _store(cache, token, plan, source, policy.opts, compile_seconds,
                       counter="recompiles" if rejected else "misses", stage=stage, limits=limits)
            except EntryTooLarge as exc:  # an entry that cannot fit is not stored
                warn(str(exc))
                return model, CacheOutcome("not-stored", token, time.perf_counter() - start, directory, str(exc))
            except (CacheWriteError, IndexUnavailable) as exc:
                return _degraded(source, None, token, directory, f"cannot store: {exc}", start, model)
            record_entry_objects(cache, token, plan)  # gc keeps the objects a live entry needs
            cache_stats.record_miss(cache, token, source.bytes, policy.opts, rejected is not None, compile_seconds)
            policy.record_build(cache, token, plan)
            remote_started = time.perf_counter()
            after_local_commit(cache, token)  # write-back to the remote tier, if any
            remote_seconds += time.perf_counter() - remote_started
            remote_note = remote_state()
    if hit:
        return policy.after_hit(cache, token, source, model, start)  # outside the lock: it may take it
    outcome = "recompiled" if rejected else "miss"
    evicted = None
    try:
        evicted = after_store(cache, limits, keep={token})  # size and age bounds
    except (IndexUnavailable, IndexCorrupt, OSError):
        pass  # gc is housekeeping: it never fails a run
    detail = rejected.detail if rejected else None
    return model, CacheOutcome(outcome, token, time.perf_counter() - start, directory, detail, evicted,
                               stage=stage, remote_seconds=None if remote_note is None else remote_seconds,
                               remote_note=remote_note or None)


class _locked:
    """Token lock for prepare; failing to lock makes the cache unavailable (not the run)."""

    def __init__(self, cache: Cache, token: str, shared: bool):
        self.lock = cache.lock(token, shared=shared)

    def __enter__(self) -> FileLock:
        try:
            return self.lock.acquire()
        except OSError as exc:
            raise CacheUnavailable(f"cannot lock {self.lock.path}: {exc.strerror or exc}") from None

    def __exit__(self, *exc) -> None:
        self.lock.release()


def _store(cache: Cache, token: str, plan, source: ModelSource, opts, compile_seconds: float,
           counter: str, stage: str | None = None, limits=None) -> Entry:
    from blake3 import blake3

    from nncc.cache.limits import refuse_oversized
    from nncc.plan.format import serialize_parts

    model_bytes, data_bytes = serialize_parts(plan)
    refuse_oversized(len(model_bytes) + len(data_bytes), limits)  # before any file is written
    return cache.put(token, model_bytes, data_bytes, counter=counter, origin="local",
                     source_path=os.path.abspath(os.fspath(source.path)),
                     model_hash=blake3(source.bytes).hexdigest(), preference=opts.preference,
                     options=json.dumps(opts.as_dict(), sort_keys=True), compile_seconds=compile_seconds,
                     stage=stage)


def _compile_plan(source: ModelSource, opts):
    """Compile from the very bytes that were hashed into the token."""
    from nncc.compiler import compile_graph
    from nncc.frontend.onnx import parse_model

    path = source.path
    try:
        graph = parse_model(source.bytes, base_dir=os.path.dirname(os.path.abspath(path)))
    except ModelFormatError as exc:
        raise ModelFormatError(f"{os.fspath(path)} is not a valid ONNX model: {exc}") from None
    return compile_graph(graph, opts)


def _compile(source: ModelSource, opts, stage: str = OPTIMIZED):
    from nncc.model import CompiledModel

    plan = _compile_plan(source, opts)
    mark_stage(plan, stage)
    return CompiledModel(plan, trust_native=True)  # built just now


def artifact_bytes(model) -> bytes:
    """The single-file artifact (``nncc compile -o``) of a prepared model, signed with the
    user's key when it carries native code. For a model prepared from the cache it is
    assembled from the verified model and data caches, so it is byte-identical to what an
    uncached compile writes."""
    if model.cache_parts is None:
        return model.to_bytes()
    from nncc.plan.format import artifact_from_parts
    from nncc.trust.seal import sign  # native code from our own cache is signed as ours

    if model._foreign:  # another machine's code (the remote tier's): never signed as the user's
        if model.plan.carries_code:
            warn("the artifact is not signed: its native code came from the remote cache, built by another "
                 "machine (`nncc compile --no-cache` builds and signs it here)")
        return artifact_from_parts(*model.cache_parts)
    return artifact_from_parts(*model.cache_parts, seal=sign)
