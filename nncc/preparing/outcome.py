"""The records the prepare layer hands around: the model being prepared, what a prepare
returns (a verified Plan with the parts it was read from and how far its native code is
trusted) and what the cache did for it. No module here imports another for a type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nncc.preparing.stages import portable_plan
from nncc.util.files import read_model_file

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


@dataclass(frozen=True)
class Prepared:
    """A verified Plan and what nncc.model needs to build the runnable model from it
    (nothing is loaded or allocated yet: that happens outside every cache lock).

    ``trust_native``: run its native code (built here, or read from nncc's own cache).
    ``origin``: where it came from, for messages. ``cache_parts``: the verified (model
    cache, data cache) bytes it was parsed from, from which its artifact is assembled.
    ``foreign``: built by another machine (the remote tier): never signed as this user's."""

    plan: object
    trust_native: bool = True
    origin: str = "the artifact"
    cache_parts: tuple | None = None
    foreign: bool = False

    def portable(self) -> "Prepared":
        """This plan without its native code (its portable partitions run)."""
        if not self.plan.carries_code:
            return self
        return Prepared(portable_plan(self.plan), trust_native=False)


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
            self._bytes = read_model_file(self.path)
        return self._bytes
