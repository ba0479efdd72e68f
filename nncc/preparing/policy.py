"""What one prepare() does about stages (nncc/preparing/stages.py): which stage a miss
compiles, whether the miss itself starts the background upgrade (``cache.upgrade_after``
0, the default), and what a hit does: start a background upgrade (a thread, or a detached
worker process that outlives the command), build the forced optimized stage now, or serve
only the portable plan of an optimized entry when the quick stage is forced."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

from nncc.cache.files import CacheEntryError
from nncc.cache.locking import FileLock, try_lock
from nncc.compiler import OptionError
from nncc.preparing.entries import locked, read_entry
from nncc.preparing.outcome import CacheOutcome
from nncc.preparing.stages import OPTIMIZED, QUICK, compiler_key, miss_stage, stage_options, upgrade_lock_path, \
    upgrades_wanted


def upgrade_due(cache, entry, opts, upgrade_after: int | None) -> bool:
    """Whether a hit on ``entry`` (its row read after the hit was counted) should start
    building its optimized stage: a quick entry hit ``upgrade_after`` times, of options
    that want a later stage, and no failed build on record."""
    if entry.stage != QUICK or upgrade_after is None or entry.hits < upgrade_after or cache.read_only:
        return False
    if cache.index.failure(entry.token) is not None:
        return False  # a failed build is not retried on every run (``nncc compile`` retries)
    return upgrades_wanted(opts, upgrade_after)


def start_upgrade(cache, token: str, source, opts, background: str, trust_shared: bool | None = None,
                  settings=None) -> str | None:
    """Start building the optimized stage in the background: "process" (a detached worker
    that outlives this command, and resolves the settings itself) or "thread" (with this
    command's resolved ``settings``). Returns what was started, or None when a builder
    already runs (or the model cannot be read again, e.g. from a pipe)."""
    held = try_lock(upgrade_lock_path(cache.directory, token))
    if held is None:
        return None  # a builder holds it
    held.release()  # the builder takes it itself; a second one that races us exits at once
    if background == "thread":
        from nncc.preparing.upgrade import upgrade_token  # lazy: start-up

        thread = threading.Thread(target=upgrade_token, name=f"nncc-upgrade-{token[:12]}",
                                  args=(cache.directory, token, source, opts),
                                  kwargs={"trust_shared": trust_shared, "settings": settings})
        thread.start()  # not a daemon: exiting waits for the build rather than tearing its write
        return "thread"
    if not os.path.isfile(source.path):
        return None  # the worker reads the model file itself (and checks it still hashes to the token)
    spawn_worker(cache.directory, token, os.path.abspath(os.fspath(source.path)), opts, trust_shared)
    return "process"


def spawn_worker(directory: str, token: str, model_path: str, opts, trust_shared: bool | None = None):
    """``python -m nncc.preparing.upgrade``, in its own session, detached from this terminal."""
    options = json.dumps(dataclasses.asdict(opts))
    cmd = [sys.executable, "-m", "nncc.preparing.upgrade", "--cache-dir", directory, "--token", token,
           "--model", model_path, "--options", options] + (["--trust-shared"] if trust_shared else [])
    with open(os.devnull, "r+b") as null:
        return subprocess.Popen(cmd, stdin=null, stdout=null, stderr=null, start_new_session=True,
                                close_fds=True)


class StagePolicy:
    """The stage decisions of one prepare (see the module's docstring)."""

    def __init__(self, opts, forced: str | None, background: str | None, settings, trust_shared: bool | None = None):
        if forced not in (None, QUICK, OPTIMIZED):
            raise OptionError(f"unknown stage {forced!r}; choose from {QUICK}, {OPTIMIZED}")
        if background not in (None, "thread", "process"):
            raise OptionError(f"unknown background mode {background!r}; choose thread or process")
        self.opts = opts
        self.forced = forced
        self.background = background
        self.settings = settings  # the resolved settings of this prepare (nncc.settings.CacheSettings)
        self.trust_shared = trust_shared  # the worker opens the cache as this prepare did

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

    def after_miss(self, cache, token: str, source, stage: str | None) -> str | None:
        """Start building the optimized stage of the quick entry just stored (or adopted
        from the remote tier) when ``cache.upgrade_after`` is 0: the model's next process
        then finds native code. Returns what was started ("thread", "process") or None."""
        if (self.forced is not None or not self.background or stage != QUICK or cache.read_only
                or self.settings.upgrade_after != 0 or not upgrades_wanted(self.opts, 0)):
            return None
        if cache.index.failure(token) is not None:
            return None  # a failed build is not retried on every run (``nncc compile`` retries)
        return start_upgrade(cache, token, source, self.opts, self.background, self.trust_shared, self.settings)

    def after_hit(self, cache, token: str, source, prepared, start: float):
        """``(prepared, CacheOutcome)`` for a verified hit, once the stage policy has acted."""
        entry = cache.index.get(token)
        stage = entry.stage if entry is not None else None
        started = None
        if self.forced == OPTIMIZED and stage == QUICK and not cache.read_only:
            prepared, stage = self._build_now(cache, token, source, prepared)
        elif self.forced == QUICK and stage == OPTIMIZED:
            prepared = prepared.portable()
        elif (self.forced is None and self.background and entry is not None
              and upgrade_due(cache, entry, self.opts, self.settings.upgrade_after)):
            started = start_upgrade(cache, token, source, self.opts, self.background, self.trust_shared,
                                    self.settings)
        return prepared, CacheOutcome("hit", token, time.perf_counter() - start, cache.directory,
                                      stage=stage, upgrade=started)

    def _build_now(self, cache, token: str, source, prepared):
        """``--stage optimized`` on a quick entry: build the optimized stage in this process
        (after any background builder finishes), then read the committed entry."""
        from nncc.preparing.upgrade import BUSY, upgrade_token  # lazy: start-up

        while upgrade_token(cache.directory, token, source, self.opts, force=True,
                            trust_shared=self.trust_shared, settings=self.settings) == BUSY:
            with FileLock(upgrade_lock_path(cache.directory, token)):
                pass  # wait for the builder, then look again
        with locked(cache, token, shared=True):
            entry = cache.index.get(token)
            if entry is None or entry.stage != OPTIMIZED:
                return prepared, QUICK if entry is not None else None
            try:
                return read_entry(cache, entry, self.settings.trust_remote_native), OPTIMIZED
            except CacheEntryError:
                return prepared, QUICK
