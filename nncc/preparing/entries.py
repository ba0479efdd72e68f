"""Reading a cache entry as a Plan, and the token locks the prepare layer holds.

The store verifies an entry's bytes against the index; here they are parsed into the Plan
(nothing is loaded or allocated: nncc.model builds the runnable model once every lock is
released)."""

from __future__ import annotations

import json
import os

from blake3 import blake3

from nncc.cache.files import CacheEntryError
from nncc.cache.folder import CacheUnavailable
from nncc.cache.locking import FileLock
from nncc.cache.versions import stale_writer
from nncc.errors import PlanFormatError
from nncc.plan import format as plan_format
from nncc.preparing.deviation import PLAN_KEY
from nncc.preparing.outcome import Prepared
from nncc.util.notice import warn


def read_entry(cache, entry, trust_remote_native: bool) -> Prepared:
    """The verified Plan of a cache entry, parsed from the very bytes the store verified.
    ``trust_remote_native``: the remote.trust_native setting, for an entry adopted from
    the remote tier. Raises CacheEntryError."""
    model_bytes, data = cache.get(entry)
    try:
        plan = plan_format.deserialize(model_bytes, data=data)
    except PlanFormatError as exc:
        raise CacheEntryError("corrupt", f"model cache is malformed: {exc}") from None
    stale = stale_writer(plan.producer)
    if stale:
        raise CacheEntryError("stale", f"model cache {stale}")
    prepared = Prepared(plan, trust_native=True, origin=f"cache entry {entry.token[:12]}",
                        cache_parts=(model_bytes, data), foreign=entry.from_remote)
    if entry.from_remote and plan.carries_code and not trust_remote_native:
        # adopted while remote.trust_native was on, which it is no longer
        warn(f"cache entry {entry.token[:12]} holds native code from the remote tier and remote.trust_native is "
             "off: its portable plan runs (`nncc cache rm` it to build native code here)")
        return prepared.portable()
    # the native code was hashed with the plan and is loaded from those bytes; code nncc did
    # not build here (a remote entry's) is never signed as the user's own (artifact_bytes)
    return prepared


class locked:
    """A token's lock for prepare; failing to lock makes the cache unavailable (not the run)."""

    def __init__(self, cache, token: str, shared: bool):
        self.lock = cache.lock(token, shared=shared)

    def __enter__(self) -> FileLock:
        try:
            return self.lock.acquire()
        except OSError as exc:
            raise CacheUnavailable(f"cannot lock {self.lock.path}: {exc.strerror or exc}") from None

    def __exit__(self, *exc) -> None:
        self.lock.release()


def store_plan(cache, token: str, plan, source, opts, compile_seconds: float,
               counter: str, stage: str | None = None, limits=None):
    """Store a compiled Plan as ``token``'s entry (EntryTooLarge when it cannot fit under
    the size bound of ``limits``); the caller holds the token's exclusive lock."""
    from nncc.cache.limits import refuse_oversized  # lazy: start-up

    model_bytes, data_bytes = plan_format.serialize_parts(plan)
    refuse_oversized(len(model_bytes) + len(data_bytes), limits)  # before any file is written
    return cache.put(token, model_bytes, data_bytes, counter=counter, origin="local",
                     source_path=os.path.abspath(os.fspath(source.path)),
                     model_hash=blake3(source.bytes).hexdigest(), preference=opts.preference,
                     options=json.dumps(_row_options(plan, opts), sort_keys=True), compile_seconds=compile_seconds,
                     stage=stage)


def _row_options(plan, opts) -> dict:
    """The index row's options: the compile's, and a precision's measured deviation from
    float32 (nncc/preparing/calibration.py), which `nncc cache ls` shows without reading
    the plan."""
    check = plan.options.get(PLAN_KEY)
    return opts.as_dict() | ({PLAN_KEY: check} if check else {})
