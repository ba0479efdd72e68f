"""The remote tier in the cache's flows: read-through on a local miss, write-back after a
local commit, one compile across the fleet, and faults that never fail a run.

The prepare layer reaches it through nncc/preparing/storage.py, the local cache and this
tier behind one interface; no call here is made under a local token lock:

* ``on_local_miss(cache, token, source, opts, stage, remote, trust_native)``, before compiling: returns
  (prepared, stage) read from the local cache after a verified remote entry was put there
  (``adopt``: the local store's atomic put, under the token's lock only while it writes),
  or None to compile. When another machine holds the token's lease it waits (polling) for
  that machine's entry, up to a bound; otherwise it takes the lease and the caller compiles.
* ``after_local_commit(cache, token, remote)`` once the compiled entry is committed locally:
  uploads it (parts, then the manifest) and releases the lease; ``abandon(token)`` releases
  a lease when nothing was stored.

The upgrade to the optimized stage asks the remote first (``fetch_optimized``) and shares
what it builds (``publish_optimized``), so a fleet builds native code once per target.

Any fault of the remote (down, slow, black-holed, full) turns the tier off for the rest of
the process with one warning line; the local path goes on.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time

from blake3 import blake3

from nncc.cache.files import CacheEntryError, CacheWriteError, chunk_hashes, read_entry_file
from nncc.cache.index import Entry, IndexUnavailable
from nncc.cache.remote.deadline import bounded
from nncc.cache.remote.errors import PoisonedEntry, RemoteConfigError, RemoteFault, RemoteTimeout
from nncc.cache.remote.manifest import check_hash_of, part_hash
from nncc.cache.remote.record import shown
from nncc.cache.remote.tier import MissingPart, RemoteTier
from nncc.preparing.token import model_subject, token_context, token_of
from nncc.cache.versions import stale_writer
from nncc.errors import PlanFormatError
from nncc.plan.format import read_sections
from nncc.preparing.entries import locked, read_entry
from nncc.preparing.stages import OPTIMIZED, QUICK, has_later_stage, stage_options
from nncc.util import progress
from nncc.util.interrupts import held_signals
from nncc.util.notice import warn

_tiers: dict[str, object] = {}  # url -> RemoteTier, or the reason it is off
_warned: set[str] = set()
_faults: dict[str, str] = {}  # url -> "timed out" | "failed", for the status line
_rejected: set[tuple[str, str]] = set()  # (url, token) already reported this run
_leases: dict[str, tuple[object, object, "_Heartbeat"]] = {}  # token -> (tier, lease, heartbeat)


def _warn_once(url: str, message: str) -> None:
    if url not in _warned:
        _warned.add(url)
        warn(message)


def active_tier(remote):
    """The configured RemoteTier, or None (none configured, no key, or off after a fault).
    ``remote``: the command's RemoteSettings, built once on first call (CacheSettings.remote;
    None: no tier). A URL nncc cannot use raises RemoteConfigError (one clear error)."""
    settings = None if remote is None else remote()
    if settings is None or settings.url is None:
        return None
    known = _tiers.get(settings.url)
    if known is not None:
        return None if isinstance(known, str) else known
    if settings.key is None:
        _tiers[settings.url] = settings.key_problem
        _warn_once(settings.url, f"remote cache {shown(settings.url)} is off: {settings.key_problem} "
                                 "(entries are trusted only under the team key)")
        return None

    tier = RemoteTier.open(settings)
    _tiers[settings.url] = tier
    return tier


def turn_off(tier, exc: BaseException, cache=None) -> None:
    """A fault: count it, say so once, and use only the local cache for the rest of the run
    (nothing more is asked of that remote: not even a lease's release, which would only
    wait for it again)."""
    _tiers[tier.settings.url] = str(exc)
    _faults[tier.settings.url] = "timed out" if isinstance(exc, RemoteTimeout) else "failed"
    _bump(cache, "remote_errors")
    _warn_once(tier.settings.url, f"remote cache {tier.url} failed ({exc}); going on with the local cache only")


def _bump(cache, counter: str) -> None:
    if cache is None or cache.read_only:
        return
    try:
        cache.index.bump(counter)
    except IndexUnavailable:
        pass  # statistics only


def reject(tier, cache, token: str, exc: PoisonedEntry, kept: bool = False) -> None:
    """A remote entry that does not verify: reported, counted (once per run), never used,
    never replaced."""
    if (tier.url, token) in _rejected:
        return
    _rejected.add((tier.url, token))
    _bump(cache, "remote_rejected")
    warn(f"remote cache entry {token[:12]} at {tier.url} rejected: {exc}; not used"
         + (", and not replaced" if kept else "") + " (check that your remote key is the team's)")


# -- read-through ------------------------------------------------------------------------
# Remote names: an entry with native code is shared under its token, which covers the C
# compiler, its flags and the ISA (machines of one target share it); the quick stage, a
# portable plan, is shared under the token of the same model compiled without the native
# backend (its "portable name"), which every target shares.


def portable_name(cache, token: str, source, opts) -> str:
    """The token the quick stage of ``token`` is shared under remotely."""
    quick = stage_options(opts, QUICK)
    if quick == opts:
        return token
    subject = source.subject
    if subject is None:
        subject = source.subject = model_subject(source.path, source.bytes, (cache.directory,))
    return token_of(subject, token_context(quick, cache.index)).hex()


def remote_names(cache, token: str, source, opts, stage: str,
                 trust_native: bool) -> tuple[list[tuple[str, str]], str]:
    """([(remote name, the stage it is adopted as)] to look up, in order; the name this
    machine publishes what it compiles under). An entry shared under its token holds
    native code when the options name the native backend: it is looked up only when
    ``trust_native`` (the remote.trust_native setting, as the command resolved it)."""
    native = has_later_stage(opts)  # a slow backend (native code) is asked for
    if stage != QUICK:
        return ([(token, stage)] if not native or trust_native else []), token
    portable = portable_name(cache, token, source, opts)
    if portable == token:
        return [(token, QUICK)], token
    if not trust_native:
        return [(portable, QUICK)], portable
    return [(token, OPTIMIZED), (portable, QUICK)], portable  # this target's native entry first


_publish_as: dict[str, str] = {}  # local token -> the remote name its entry is published under


def on_local_miss(cache, token: str, source, opts, stage: str, remote, trust_native: bool):
    """``(model, stage)`` prepared from the local cache after a remote hit, or None:
    compile ``stage`` (holding the fleet's lease on it when this machine got it).
    ``remote``, ``trust_native``: the remote tier's settings and remote.trust_native, as
    the command resolved them."""
    tier = active_tier(remote)
    if tier is None:
        return None
    try:
        lookups, publish = remote_names(cache, token, source, opts, stage, trust_native)
        _publish_as[token] = publish
        found = _try_all(tier, cache, token, lookups, source, opts, trust_native)
        if found is not None:
            if publish != token and not trust_native:
                _say_untrusted(tier, token)
            return found
        deadline = None
        while True:
            lease = tier.acquire(publish)  # free: nobody compiles it, or its holder released it or died
            if lease is not None:
                # its holder may have uploaded just before releasing: look once more before compiling
                found = _try_all(tier, cache, token, lookups, source, opts, trust_native)
                if found is not None:
                    tier.release(lease)
                    return found
                return _compile_here(tier, cache, token, lease)
            if deadline is None:
                progress.describe(f"waiting for another machine compiling {token[:12]}")
                deadline = time.monotonic() + tier.settings.wait_seconds
            if time.monotonic() >= deadline:
                warn(f"waited {tier.settings.wait_seconds:g} s for another machine to compile {token[:12]}; "
                     "compiling here")
                _bump(cache, "remote_misses")
                return None
            time.sleep(tier.settings.poll_seconds)  # another machine compiles it: wait for its entry
            found = _try_all(tier, cache, token, lookups, source, opts, trust_native)
            if found is not None:
                return found
    except RemoteFault as exc:
        turn_off(tier, exc, cache)
        return None


def _say_untrusted(tier, token: str) -> None:
    """Once per run: the remote has this target's native code, which is not run here."""
    key = f"{tier.settings.url} untrusted native"
    if key in _warned or not bounded("looking up a remote entry", tier.settings.timeout,
                                     lambda: tier.store.exists(f"manifests/{token}")):
        return
    _warn_once(key, f"remote cache {tier.url} has native code for this machine's target; remote.trust_native "
                    "is off, so the portable plan runs and native code is built here")


def _compile_here(tier, cache, token, lease):
    """This machine compiles ``token``: keep its lease alive until the upload is done."""
    beat = _Heartbeat(tier, lease)
    _leases[token] = (tier, lease, beat)
    beat.start()
    _bump(cache, "remote_misses")
    return None


def _try_all(tier, cache, token, lookups, source, opts, trust_native: bool):
    for name, stage in lookups:
        model = _try_remote(tier, cache, token, name, stage, trust_native, source, opts)
        if model is not None:
            return model, stage
    return None


def _try_remote(tier, cache, token, name, stage, trust_native: bool, source=None, opts=None,
                counter="remote_hits", check_hashes=False, replaces=None):
    try:
        # sizes are checked here; the hashes when the local write takes them (one hash, not two)
        found = tier.fetch(name, check_hashes=check_hashes)
        if found is None:
            return None
        manifest, plan, payload = found
        return adopt(cache, token, manifest, plan, payload, path=None if source is None else source.path,
                     model_data=None if source is None else source.bytes, opts=opts, counter=counter,
                     stage=stage, origin=f"remote {tier.url}", replaces=replaces, trust_native=trust_native)
    except MissingPart:
        return None  # evicted or collected remotely: a plain miss
    except PoisonedEntry as exc:
        reject(tier, cache, name, exc)
        return None


def adopt(cache, token, manifest, plan: bytes, payload: bytes, path=None, model_data=None, opts=None,
          counter: str = "remote_hits", stage: str | None = None, origin: str = "remote", replaces=None,
          trust_native: bool = False):
    """Store a verified remote entry in the local cache under ``token`` (its remote name
    may be another: a portable entry's), as ``stage`` (default: optimized when it carries
    native code), through its atomic write and index commit, then prepare it from there
    (verified once more, as every local hit is). Native code in it runs because the
    manifest's MAC verified under the team key and the plan's bytes matched the hash it
    names, checked on the hashes the local write takes, before the index row that makes
    the entry usable is committed: PoisonedEntry otherwise (the files are removed). None
    when the local cache cannot store it, or when it carries native code and
    ``trust_native`` (the remote.trust_native setting) is off (then this machine compiles,
    and builds its own).

    It is a put: the token's exclusive local lock is held only while the entry is written
    and read back. ``replaces``: which local row it may replace (a function of the row, or
    None); by default only an absent one, and a row another process committed meanwhile
    is the hit instead."""
    stale = stale_writer(manifest.nncc_version, manifest.format_version)
    if stale:
        warn(f"remote entry {token[:12]} was {stale}; not used")
        return None
    if _carries_code(plan) and not trust_native:
        warn(f"remote entry {token[:12]} carries native code and remote.trust_native is off: not used "
             "(compiling here; set remote.trust_native to run the team's native code)")
        return None
    if stage is None:
        stage = OPTIMIZED if manifest.native else None

    with locked(cache, token, shared=False):
        current = cache.index.get(token)
        if replaces is None and current is not None:  # stored meanwhile by another process here
            try:
                return read_entry(cache, current, trust_native)
            except CacheEntryError:
                return None
        if replaces is not None and not replaces(current):
            return None
        return _put(cache, token, manifest, plan, payload, path, model_data, opts, counter, stage, origin,
                    trust_native)


def _put(cache, token, manifest, plan, payload, path, model_data, opts, counter, stage, origin, trust_native):
    """adopt's write, under the token's exclusive lock."""
    committed = False
    try:
        plan_hash, data_hash = cache.write(token, plan, payload)
        check_hash_of(manifest.part("plan"), plan_hash)
        check_hash_of(manifest.part("data"), data_hash)
        with held_signals():
            now = time.time()
            entry = Entry(
                token=token, plan_hash=plan_hash, data_hash=data_hash, plan_size=len(plan),
                data_size=len(payload), nncc_version=manifest.nncc_version,
                format_version=manifest.format_version,
                source_path=os.path.abspath(os.fspath(path)) if path is not None else None,
                model_hash=blake3(model_data, max_threads=blake3.AUTO).hexdigest() if model_data is not None
                else None,
                preference=opts.preference if opts is not None else None,
                options=json.dumps(opts.as_dict(), sort_keys=True) if opts is not None else None,
                created=now, last_used=now, hits=0, compile_seconds=manifest.compile_seconds, stage=stage,
                origin=origin)
            cache.index.insert(entry, counter=counter, chunks=chunk_hashes(payload))
            committed = True
        return read_entry(cache, entry, trust_native)
    except (CacheWriteError, IndexUnavailable, CacheEntryError) as exc:
        warn(f"cannot store remote entry {token[:12]} in the local cache ({exc}); not used")
        return None
    finally:
        if not committed:
            for p in cache.paths(token):
                try:
                    os.unlink(p)
                except OSError:
                    pass


def _carries_code(plan: bytes) -> bool:
    """Whether a model cache holds native code (its CODE section), whatever its manifest says."""
    try:
        return b"CODE" in read_sections(plan)[1]
    except PlanFormatError:
        return False  # not a plan at all: its hash check (or the local load) rejects it


# -- the optimized stage across the fleet ------------------------------------------------


def fetch_optimized(cache, token: str, opts, remote, trust_native: bool) -> bool:
    """Before building ``token``'s native stage here: take this target's optimized entry
    from the remote instead, if a machine of the same target published one and
    ``trust_native`` (the remote.trust_native setting) is on. The caller replaces the
    local entry (under its lock) only while that is still quick; True when the entry is
    now optimized."""
    try:
        tier = active_tier(remote)
    except RemoteConfigError:
        return False  # reported by the run that stored the entry; background work goes on
    if tier is None or not trust_native:
        return False  # built here: only the team key's native code may run, and only when trusted
    try:
        # hashes checked before the write: the quick entry's files are replaced only by verified ones
        model = _try_remote(tier, cache, token, token, OPTIMIZED, trust_native, opts=opts, counter="upgrades",
                            check_hashes=True, replaces=lambda row: row is not None and row.stage == QUICK)
    except RemoteFault as exc:
        turn_off(tier, exc, cache)
        return False
    if model is None:
        return False
    _bump(cache, "remote_hits")
    return True


def publish_optimized(cache, token: str, remote) -> None:
    """After this machine built ``token``'s native stage: share it with its target."""

    try:
        tier = active_tier(remote)
    except RemoteConfigError:
        return
    if tier is None:
        return
    try:
        push_entry(tier, cache, token)
    except RemoteFault as exc:
        turn_off(tier, exc, cache)
    except PoisonedEntry as exc:
        reject(tier, cache, token, exc, kept=True)
    except CacheEntryError:
        pass  # removed or replaced meanwhile: nothing to share


# -- write-back --------------------------------------------------------------------------


def after_local_commit(cache, token: str, remote) -> None:
    """Upload the entry just committed locally, then release the lease (if this machine
    held one). A fault is counted and warned about once; the run goes on."""
    held = _leases.pop(token, None)
    name = _publish_as.pop(token, token)
    tier = active_tier(remote) if held is None else held[0]
    if held is not None:
        held[2].stop()
    try:
        if tier is not None and not isinstance(_tiers.get(tier.settings.url), str):  # not turned off meanwhile
            push_entry(tier, cache, token, name)
    except RemoteFault as exc:
        turn_off(tier, exc, cache)
    except PoisonedEntry as exc:  # an entry this machine cannot verify stays as it is
        reject(tier, cache, name, exc, kept=True)
    except CacheEntryError:
        pass  # removed or replaced locally since (no lock is held here): nothing to share
    finally:
        if held is not None:
            _release(tier, held[1])


def abandon(token: str) -> None:
    """Nothing was stored for ``token`` (another process here stored it, or it did not fit):
    release this machine's lease on it, if any."""
    _publish_as.pop(token, None)
    held = _leases.pop(token, None)
    if held is not None:
        held[2].stop()
        _release(held[0], held[1])


def push_entry(tier, cache, token: str, name: str | None = None):
    """Upload one committed local entry, read back and checked against its index row,
    under ``name`` (default: its token)."""
    entry = cache.index.get(token)
    if entry is None:
        raise CacheEntryError("missing", "no such entry")
    plan_path, data_path = cache.paths(token)
    plan = read_entry_file(plan_path, "model cache", entry.plan_size)
    payload = read_entry_file(data_path, "data cache", entry.data_size)
    if part_hash(plan) != entry.plan_hash or part_hash(payload) != entry.data_hash:
        raise CacheEntryError("corrupt", "does not match its recorded hashes")
    _, sections = read_sections(plan)
    return tier.publish(name or token, plan, payload, native=b"CODE" in sections, nncc_version=entry.nncc_version,
                        format_version=entry.format_version, compile_seconds=entry.compile_seconds)


def _release(tier, lease) -> None:
    if isinstance(_tiers.get(tier.settings.url), str):
        return  # the remote failed: it expires by itself, and asking would wait again
    try:
        tier.release(lease)
    except RemoteFault:
        pass  # it expires by itself


def remote_state(remote) -> str | None:
    """For the status line: None when no remote tier is configured (``remote``: as
    active_tier takes it), else "" (working), or why it is off ("timed out", "failed", "off")."""
    url = None if remote is None else remote().url
    if url is None:
        return None
    known = _tiers.get(url)
    if isinstance(known, str):
        return _faults.get(url, "off")
    return ""


@atexit.register
def _release_all() -> None:
    """A compile that failed, or a run that stored nothing, still frees its leases."""
    for token in list(_leases):
        tier, lease, beat = _leases.pop(token)
        beat.stop()
        _release(tier, lease)


class _Heartbeat(threading.Thread):
    """Keeps a lease alive while this process compiles; if the process dies, the lease
    expires within one lease time and another machine takes over."""

    def __init__(self, tier, lease):
        super().__init__(name=f"nncc-lease-{lease.token[:8]}", daemon=True)
        self.tier, self.lease = tier, lease
        self._done = threading.Event()

    def run(self) -> None:
        interval = self.tier.settings.lease_seconds / 3
        while not self._done.wait(interval):
            try:
                if not self.tier.renew(self.lease):
                    return
            except RemoteFault:
                return

    def stop(self) -> None:
        self._done.set()
