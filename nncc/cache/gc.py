"""Garbage collection: stale versions, orphans, leftovers, old entries, and LRU down to a size.

The size bound counts kernel objects (nncc/cache/objects.py) with the entries; an object
goes only when no entry that is left was linked from it.

Every removal takes the token's lock exclusively *without waiting* and skips tokens that
are busy: a process that is reading (shared lock) or writing (exclusive lock) an entry is
never disturbed. A run that has already verified an entry holds its bytes in memory (model
cache) or in a mapping (data cache); unlinking the files under it is harmless on POSIX.
"""

from __future__ import annotations

import os
import time

from nncc.cache.folder import LOCK_NAME, UPGRADE_LOCK_NAME
from nncc.cache.locking import try_lock
from nncc.cache.objects import collect_objects, dry_release, object_bytes
from nncc.cache.reports import GcReport, Removal  # noqa: F401 (their home)
from nncc.cache.verify import classify_files
from nncc.util import progress



def collect(cache, max_size: int | None = None, max_age: float | None = None, dry_run: bool = False,
            keep=(), scan: bool = True) -> GcReport:
    """Remove garbage, then entries unused for ``max_age`` seconds, then least recently used
    entries until the recorded total is at most ``max_size`` bytes."""
    report = GcReport(dry_run=dry_run)
    keep = set(keep)
    with progress.task("collecting cache garbage") as task:
        if scan:
            task.describe("looking for stale, orphan and leftover files")
            _collect_garbage(cache, report, dry_run)
        entries = cache.index.entries(order="last_used ASC")
        now = time.time()
        alive = []
        task.describe("evicting entries")
        for entry in entries:
            if max_age is not None and entry.last_used < now - max_age and entry.token not in keep:
                _evict(cache, entry, "age", report, dry_run)
            else:
                alive.append(entry)
        if scan:  # kernel objects no entry needs (any more)
            collect_objects(cache, report, dry_run)
        if max_size is not None:  # objects count too; those no entry needs go first
            total = sum(e.size for e in alive) + object_bytes(cache)
            if total > max_size and not scan:
                total -= collect_objects(cache, report, dry_run, scan=False, over=total - max_size)
            remaining = {e.token for e in alive}
            for entry in alive:  # oldest use first
                if total <= max_size:
                    break
                if entry.token in keep:
                    continue
                if _evict(cache, entry, "size", report, dry_run):
                    total -= entry.size
                    remaining.discard(entry.token)
                    if dry_run:  # the objects only that entry needed would go with it
                        total -= dry_release(cache, report, entry.token, remaining)
                    else:
                        total -= collect_objects(cache, report, dry_run, scan=False,
                                                 over=None if scan else total - max_size)
    return report


def _evict(cache, entry, reason: str, report: GcReport, dry_run: bool) -> bool:
    removal = Removal(entry.token, reason, entry.size, entry.source_path, list(cache.paths(entry.token)))
    if dry_run:
        report.removed.append(removal)
        return True
    if cache.remove(entry.token, counter="evictions"):
        report.removed.append(removal)
        return True
    report.not_removed(cache, removal)
    return False


def _collect_garbage(cache, report: GcReport, dry_run: bool) -> None:
    stale_rows = cache.index.stale()
    for finding in classify_files(cache):
        if finding.status not in ("STALE", "ORPHAN", "LEFTOVER"):
            continue
        removal = Removal(finding.token, finding.status.lower(), finding.bytes, finding.source,
                          finding.paths)
        if dry_run:
            report.removed.append(removal)
        elif cache.remove_files(finding.paths, finding.token):
            report.removed.append(removal)
        else:
            report.not_removed(cache, removal)
    # Stale rows whose files are already gone, and lock files of tokens with no entry.
    tokens, _ = cache.scan()
    for token in stale_rows:
        if token not in tokens and not dry_run:
            cache.delete_row(token)
    if not dry_run:
        _collect_locks(cache, set(tokens))


def _collect_locks(cache, tokens_on_disk: set[str]) -> None:
    if os.path.islink(cache.locks_dir):
        return  # refused at open; never followed
    try:
        names = os.listdir(cache.locks_dir)
    except OSError:
        return
    for name in names:
        if UPGRADE_LOCK_NAME.match(name):
            _collect_upgrade_lock(os.path.join(cache.locks_dir, name))
            continue
        if not LOCK_NAME.match(name):
            continue  # index.lock, or not a name nncc writes
        token = name[: -len(".lock")]
        if token in tokens_on_disk:
            continue
        held = try_lock(os.path.join(cache.locks_dir, name))
        if held is None:
            continue
        try:
            if cache.index.get(token) is None and not any(os.path.exists(p) for p in cache.paths(token)):
                held.unlink()
        finally:
            held.release()


def _collect_upgrade_lock(path: str) -> None:
    """An upgrade lock nobody holds was left by a killed builder (a live one holds it)."""
    held = try_lock(path)
    if held is not None:
        try:
            held.unlink()
        finally:
            held.release()
