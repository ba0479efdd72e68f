"""The cache's limits, applied around a store: an entry larger than the size bound is not
stored at all (storing it would evict everything else and still leave the cache over the
bound), and after a store, entries unused for longer than the age bound and then least
recently used ones go, only until the total fits.

The prepare layer calls two functions: ``refuse_oversized`` before writing an entry's files
and ``after_store`` once its index row is committed. ``limits`` is any record with
``max_size``, ``max_age`` and ``max_size_where`` (the resolved settings: the store never
reads settings itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nncc.cache.gc import collect
from nncc.cache.objects import object_bytes
from nncc.util.units import format_bytes


class EntryTooLarge(Exception):
    """The entry alone is over the size bound: it is not stored (the run goes on)."""


@dataclass(frozen=True)
class Evicted:
    entries: int
    bytes: int

    def as_dict(self) -> dict:
        return {"entries": self.entries, "bytes": self.bytes}


def refuse_oversized(size: int, limits: Any) -> None:
    """EntryTooLarge when an entry of ``size`` bytes cannot fit under the size bound."""
    if limits is None or limits.max_size is None or size <= limits.max_size:
        return

    source = "" if limits.max_size_where == "default" else f", from {limits.max_size_where}"
    raise EntryTooLarge(f"the compiled model ({format_bytes(size)}) is larger than the cache size limit "
                        f"({format_bytes(limits.max_size)}{source}); not stored")


def after_store(cache, limits: Any, keep=()) -> Evicted | None:
    """Apply the age and size bounds, never to ``keep`` (the entry just stored) nor to a
    busy entry. None when nothing had to go."""
    if limits is None or (limits.max_size is None and limits.max_age is None):
        return None

    if limits.max_age is None and cache.index.totals()[1] + object_bytes(cache) <= limits.max_size:
        return None  # the usual case: one query

    report = collect(cache, max_size=limits.max_size, max_age=limits.max_age, keep=keep, scan=False)
    if not report.removed:
        return None
    return Evicted(len(report.removed), report.freed)
