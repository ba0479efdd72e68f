"""Two stages per cache entry: the quick plan now, the optimized plan later.

A miss compiles the *quick* stage: every backend but those that declare themselves slow
to build (``slow_to_build``, e.g. a C compiler's), so it costs milliseconds, and runs it at
once. The *optimized* stage (everything asked for) replaces it in the same entry later:
built by ``nncc compile`` or ``--stage optimized``, or automatically in the background (a
thread for the Python API, a detached worker process for the CLI: nncc/preparing/policy.py
and upgrade.py), started by the miss itself (``cache.upgrade_after`` 0, the default: the
model's next process runs native code) or once the entry has been hit that many times. The stage
is an attribute of the entry, not part of its token: one entry per model and options.
"""

from __future__ import annotations

import dataclasses
import json
import os

from nncc.backends.registry import loaded_backend, slow_backends

QUICK = "quick"
OPTIMIZED = "optimized"


def deferred_backends(opts) -> tuple[str, ...]:
    """The backends of ``opts`` the quick stage leaves for later: the slow ones to build."""
    return slow_backends(opts.backends)


def has_later_stage(opts) -> bool:
    return bool(deferred_backends(opts))


def miss_stage(opts, forced: str | None) -> str:
    """The stage a miss compiles: the forced one, else quick when a slow backend was
    asked for (it comes later), else optimized (there is nothing more to build)."""
    if forced:
        return forced
    return QUICK if has_later_stage(opts) else OPTIMIZED


def stage_options(opts, stage: str):
    """The options that compile ``stage``: the quick stage drops the slow backends."""
    if stage == QUICK:
        slow = set(deferred_backends(opts))
        return dataclasses.replace(opts, backends=tuple(b for b in opts.backends if b not in slow))
    return opts


def build_tool(opts) -> dict | None:
    """The key of the tool the deferred backends build with here (the native backend's C
    compiler), or None when none of them has one."""
    for name in deferred_backends(opts):
        tool = loaded_backend(name).build_tool(opts)
        if tool is not None:
            return tool
    return None


def upgrades_wanted(opts, upgrade_after: int | None) -> bool:
    """Whether a later, optimized build is ever started in the background for these
    options: a slow backend asked for, upgrades not off, not low-power, a tool to build with."""
    return (upgrade_after is not None and has_later_stage(opts) and opts.preference != "low-power"
            and build_tool(opts) is not None)


def mark_stage(plan, stage: str) -> None:
    """A quick plan says so in its options (``nncc inspect`` shows it); an optimized one is
    what a plain compile produces, byte for byte, so it carries no mark."""
    if stage == QUICK:
        plan.options["stage"] = QUICK


def compiler_key(opts) -> str | None:
    """What a failed build is recorded against: the build tool's key, as JSON."""
    tool = build_tool(opts)
    return None if tool is None else json.dumps(tool, sort_keys=True)


def upgrade_lock_path(directory: str, token: str) -> str:
    """Held (flock) by whoever builds the token's optimized stage: one builder per token."""
    return os.path.join(directory, "locks", token + ".upgrade")


def portable_plan(plan):
    """A copy of ``plan`` without its native code (it runs its portable partitions)."""
    plan = plan.without_code()
    mark_stage(plan, QUICK)
    return plan
