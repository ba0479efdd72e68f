"""Size and age limits on the remote tier (``nncc cache gc --remote``).

The remote keeps no last-use time (a read must not write), so age is the time since an
entry was uploaded, as its manifest records it. Entries go oldest first: those past the
age limit, then until the parts the remaining entries name fit the size limit. Entries
that do not verify are removed too. Parts no remaining entry names go last, but only once
they are older than a grace time: a part uploaded just now may belong to a manifest that
is being written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

UPLOAD_GRACE = 3600.0


class WrongKey(Exception):
    """gc --remote found no entry that verifies: it removes nothing."""


@dataclass
class RemoteGcReport:
    dry_run: bool = False
    entries: list[dict] = field(default_factory=list)  # removed manifests: token, reason, size named
    parts: list[dict] = field(default_factory=list)  # removed parts: hash, bytes
    kept_entries: int = 0
    kept_bytes: int = 0

    @property
    def freed(self) -> int:
        return sum(p["bytes"] for p in self.parts)

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "removed_entries": self.entries, "removed_parts": self.parts,
                "freed_bytes": self.freed, "kept_entries": self.kept_entries, "kept_bytes": self.kept_bytes}


def _named_bytes(entries) -> int:
    return sum({p.hash: p.size for _, m in entries for p in m.parts}.values())


def collect_remote(tier, max_size: int | None = None, max_age: float | None = None, dry_run: bool = False,
                   grace: float = UPLOAD_GRACE) -> RemoteGcReport:
    report = RemoteGcReport(dry_run=dry_run)
    found, parts = tier.entries()
    now = time.time()
    rejected = [(token, None, "rejected") for token, m, _ in found if m is None]
    if rejected and len(rejected) == len(found):
        # not one entry verifies: more likely this key is not the team's than that every
        # entry was planted; removing them would spoil the fleet's cache
        raise WrongKey(f"none of the {len(found)} remote entries verifies under your key; is it the team's? "
                       "Nothing was removed")
    drop = rejected
    kept = []
    for token, m in sorted(((t, m) for t, m, _ in found if m is not None), key=lambda tm: tm[1].created):
        if max_age is not None and now - m.created > max_age:
            drop.append((token, m, "age"))
        else:
            kept.append((token, m))
    while max_size is not None and kept and _named_bytes(kept) > max_size:
        token, m = kept.pop(0)
        drop.append((token, m, "size"))
    for token, m, reason in drop:
        if not dry_run:
            tier.remove(token)
        report.entries.append({"token": token, "reason": reason, "size": m.size if m else None})
    named = {p.hash for _, m in kept for p in m.parts}
    freed_by_drop = {p.hash for _, m, _ in drop if m for p in m.parts}
    modified = {item.key.rsplit("/", 1)[1]: item.modified for item in tier.store.list("parts/")}
    for digest, size in parts.items():
        if digest in named:
            continue
        when = modified.get(digest)
        if digest in freed_by_drop or when is None or now - when > grace:
            if not dry_run:
                tier.store.delete(f"parts/{digest}")
            report.parts.append({"hash": digest, "bytes": size})
    report.kept_entries = len(kept)
    report.kept_bytes = _named_bytes(kept)
    return report
