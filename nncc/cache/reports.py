"""What gc and verify report: records that the store's housekeeping modules share
(gc, verify and the kernel objects each add to them), kept apart so none imports another
for a type."""

from __future__ import annotations

from dataclasses import dataclass, field

PROBLEMS = ("CORRUPT", "MISSING", "STALE")
DEBRIS = ("ORPHAN", "LEFTOVER")


@dataclass
class Finding:
    status: str
    token: str | None
    detail: str = ""
    paths: list[str] = field(default_factory=list)
    bytes: int = 0
    source: str | None = None
    fixed: bool = False
    not_fixed: str | None = None  # with fix: why it could not be removed ("busy", or the reason)

    def as_dict(self) -> dict:
        return {"status": self.status, "token": self.token, "detail": self.detail, "paths": self.paths,
                "bytes": self.bytes, "source": self.source, "fixed": self.fixed, "not_fixed": self.not_fixed}


@dataclass
class VerifyReport:
    findings: list[Finding]
    fix: bool

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status in PROBLEMS]

    @property
    def ok(self) -> bool:
        """True when nothing is wrong, or (with fix) everything wrong was removed and no
        debris failed to go for another reason than being busy. Debris alone is not wrong."""
        if not self.fix:
            return not self.problems
        return (all(f.fixed for f in self.problems)
                and not any(f.not_fixed not in (None, "busy") for f in self.findings))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.findings:
            out[f.status] = out.get(f.status, 0) + 1
        return out

    def as_dict(self) -> dict:
        return {"ok": self.ok, "fix": self.fix, "counts": self.counts(),
                "findings": [f.as_dict() for f in self.findings]}


@dataclass
class Removal:
    token: str | None
    reason: str  # "stale" | "orphan" | "leftover" | "age" | "size"
    bytes: int
    source: str | None = None
    paths: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"token": self.token, "reason": self.reason, "bytes": self.bytes,
                "source": self.source, "paths": self.paths}


@dataclass
class GcReport:
    removed: list[Removal] = field(default_factory=list)
    skipped_busy: list[str] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)  # {"token", "paths", "reason"}: could not be removed
    dry_run: bool = False

    @property
    def freed(self) -> int:
        return sum(r.bytes for r in self.removed)

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "removed": [r.as_dict() for r in self.removed],
                "freed_bytes": self.freed, "skipped_busy": self.skipped_busy, "failed": self.failed}

    def not_removed(self, cache, removal: Removal) -> None:
        """Account for a removal that did not happen: busy, or a file that could not go."""
        if cache.last_failure:
            self.failed.append({"token": removal.token, "paths": removal.paths, "reason": cache.last_failure})
        elif removal.token:
            self.skipped_busy.append(removal.token)
