"""Two stages per cache entry: the quick portable plan now, the native plan later.

A miss compiles the *quick* stage (every backend but native: no C compiler runs, so it
costs milliseconds) and runs it at once. The *optimized* stage (native code) replaces it in
the same entry later: built by ``nncc compile`` or ``--stage optimized``, or automatically
once the entry has been hit ``upgrade_after()`` times, in the background (a thread for the
Python API, a detached worker process for the CLI: nncc/cache/upgrade.py). The stage is an
attribute of the entry, not part of its token: one entry per model and options.
"""

from __future__ import annotations

import dataclasses
import json
import os

QUICK = "quick"
OPTIMIZED = "optimized"


def upgrade_after() -> int | None:
    """Hits after which a quick entry is upgraded: the cache.upgrade_after setting
    ($NNCC_UPGRADE_AFTER, default 2); None (0, off): only on request (``nncc compile``,
    ``--stage optimized``). A bad value is a SettingError, as for every setting."""
    from nncc.settings import value

    return value("cache.upgrade_after")


def wants_native(opts) -> bool:
    return "native" in opts.backends


def miss_stage(opts, forced: str | None) -> str:
    """The stage a miss compiles: the forced one, else quick when native code was asked
    for (it comes later), else optimized (there is nothing more to build)."""
    if forced:
        return forced
    return QUICK if wants_native(opts) else OPTIMIZED


def stage_options(opts, stage: str):
    """The options that compile ``stage``: the quick stage drops the native backend."""
    if stage == QUICK:
        return dataclasses.replace(opts, backends=tuple(b for b in opts.backends if b != "native"))
    return opts


def mark_stage(plan, stage: str) -> None:
    """A quick plan says so in its options (``nncc inspect`` shows it); an optimized one is
    what a plain compile produces, byte for byte, so it carries no mark."""
    if stage == QUICK:
        plan.options["stage"] = QUICK


def compiler_key(opts) -> str | None:
    toolchain = opts.toolchain()
    return None if toolchain is None else json.dumps(toolchain.key(), sort_keys=True)


def upgrade_due(cache, entry, opts) -> bool:
    """Whether a hit on ``entry`` (its row read after the hit was counted) should start
    building its native stage: a quick entry of options that want native code, hit
    ``upgrade_after()`` times, not low-power, no failed build on
    record, and a C compiler to run."""
    limit = upgrade_after()
    if (entry.stage != QUICK or limit is None or entry.hits < limit or cache.read_only
            or not wants_native(opts) or opts.preference == "low-power"):
        return False
    if cache.index.failure(entry.token) is not None:
        return False  # a failed build is not retried on every run (``nncc compile`` retries)
    return opts.toolchain() is not None


def upgrade_lock_path(directory: str, token: str) -> str:
    """Held (flock) by whoever builds the token's native stage: one builder per token."""
    return os.path.join(directory, "locks", token + ".upgrade")


def start_upgrade(cache, token: str, source, opts, background: str, trust_shared: bool | None = None) -> str | None:
    """Start building the optimized stage in the background: "process" (a detached worker
    that outlives this command) or "thread". Returns what was started, or None when a
    builder already runs (or the model cannot be read again, e.g. from a pipe)."""
    from nncc.cache.locking import try_lock

    held = try_lock(upgrade_lock_path(cache.directory, token))
    if held is None:
        return None  # a builder holds it
    held.release()  # the builder takes it itself; a second one that races us exits at once
    if background == "thread":
        import threading

        thread = threading.Thread(target=_upgrade_in_thread, name=f"nncc-upgrade-{token[:12]}",
                                  args=(cache.directory, token, source, opts, trust_shared))
        thread.start()  # not a daemon: exiting waits for the build rather than tearing its write
        return "thread"
    if not os.path.isfile(source.path):
        return None  # the worker reads the model file itself (and checks it still hashes to the token)
    spawn_worker(cache.directory, token, os.path.abspath(os.fspath(source.path)), opts, trust_shared)
    return "process"


def spawn_worker(directory: str, token: str, model_path: str, opts, trust_shared: bool | None = None):
    """``python -m nncc.cache.upgrade``, in its own session, detached from this terminal."""
    import subprocess
    import sys

    options = json.dumps(dataclasses.asdict(opts))
    cmd = [sys.executable, "-m", "nncc.cache.upgrade", "--cache-dir", directory, "--token", token,
           "--model", model_path, "--options", options] + (["--trust-shared"] if trust_shared else [])
    with open(os.devnull, "r+b") as null:
        return subprocess.Popen(cmd, stdin=null, stdout=null, stderr=null, start_new_session=True,
                                close_fds=True)


def _upgrade_in_thread(directory: str, token: str, source, opts, trust_shared: bool | None) -> None:
    from nncc.cache.upgrade import upgrade_token

    upgrade_token(directory, token, source, opts, trust_shared=trust_shared)


class StagePolicy:
    """What one prepare() does about stages: which stage a miss compiles, and what a hit
    does (start a background upgrade, build the forced optimized stage now, or serve only
    the portable plan of an optimized entry when the quick stage is forced)."""

    def __init__(self, opts, forced: str | None, background: str | None, trust_shared: bool | None = None):
        from nncc.compiler import OptionError

        if forced not in (None, QUICK, OPTIMIZED):
            raise OptionError(f"unknown stage {forced!r}; choose from {QUICK}, {OPTIMIZED}")
        if background not in (None, "thread", "process"):
            raise OptionError(f"unknown background mode {background!r}; choose thread or process")
        self.opts = opts
        self.forced = forced
        self.background = background
        self.trust_shared = trust_shared  # the worker opens the cache as this prepare did
        if forced is None:
            upgrade_after()  # a bad setting is a usage error now, not on the entry's first hit

    def uncached(self):
        """(options, stage) without a cache, where there is no later stage: the forced
        stage, else everything now."""
        stage = QUICK if self.forced == QUICK else OPTIMIZED
        return stage_options(self.opts, stage), stage

    def miss_stage(self) -> str:
        return miss_stage(self.opts, self.forced)

    def options_for(self, stage: str):
        return stage_options(self.opts, stage)

    def record_build(self, cache, token: str, plan) -> None:
        """A native compile that failed during a miss is recorded like a failed upgrade."""
        error = plan.options.get("native_error")
        if error:
            cache.index.record_failure(token, str(error), compiler_key(self.opts))

    def after_hit(self, cache, token: str, source, model, start: float):
        """``(model, CacheOutcome)`` for a verified hit, once the stage policy has acted."""
        import time

        from nncc.cache.flows import CacheOutcome

        entry = cache.index.get(token)
        stage = entry.stage if entry is not None else None
        started = None
        if self.forced == OPTIMIZED and stage == QUICK and not cache.read_only:
            model, stage = self._build_now(cache, token, source, model)
        elif self.forced == QUICK and stage == OPTIMIZED:
            model = portable_only(model)
        elif self.forced is None and self.background and entry is not None and upgrade_due(cache, entry, self.opts):
            started = start_upgrade(cache, token, source, self.opts, self.background, self.trust_shared)
        return model, CacheOutcome("hit", token, time.perf_counter() - start, cache.directory,
                                   stage=stage, upgrade=started)

    def _build_now(self, cache, token: str, source, model):
        """``--stage optimized`` on a quick entry: build the native stage in this process
        (after any background builder finishes), then prepare the committed entry."""
        from nncc.cache.files import CacheEntryError
        from nncc.cache.flows import _locked, load_entry
        from nncc.cache.locking import FileLock
        from nncc.cache.upgrade import BUSY, upgrade_token

        while upgrade_token(cache.directory, token, source, self.opts, force=True,
                            trust_shared=self.trust_shared) == BUSY:
            with FileLock(upgrade_lock_path(cache.directory, token)):
                pass  # wait for the builder, then look again
        with _locked(cache, token, shared=True):
            entry = cache.index.get(token)
            if entry is None or entry.stage != OPTIMIZED:
                return model, QUICK if entry is not None else None
            try:
                return load_entry(cache, entry), OPTIMIZED
            except CacheEntryError:
                return model, QUICK


def portable_only(model):
    """``model`` without its native code: the quick stage of an optimized entry."""
    from nncc.model import CompiledModel

    if not model.plan.carries_code:
        return model
    return CompiledModel(portable_plan(model.plan), trust_native=False)


def portable_plan(plan):
    """A copy of ``plan`` without its native code (it runs its portable partitions)."""
    plan = plan.without_code()
    mark_stage(plan, QUICK)
    return plan
