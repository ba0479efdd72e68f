"""What a remote store must do: whole objects by key (replaced, or created only where there
is none), create-only leases that expire, and listing. Each store (file, Redis, S3) maps these onto its engine; the tier above never
knows which one it talks to. Every failure of the engine is raised as RemoteFault."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Listed:
    key: str
    size: int
    modified: float | None  # seconds since the epoch, where the store records it


class RemoteStore:
    url: str

    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no such object."""
        raise NotImplementedError

    def put(self, key: str, data) -> None:
        """Store a whole object; readers see the old one or all of the new one, never part."""
        raise NotImplementedError

    def create(self, key: str, data) -> bool:
        """Store a whole object only if there is none under ``key`` (one atomic step: a
        file linked into place, SET NX, a PUT with If-None-Match). False when one is there:
        it is never replaced."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        return self.get(key) is not None

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def list(self, prefix: str) -> list[Listed]:
        raise NotImplementedError

    def acquire_lease(self, key: str, owner: str, seconds: float) -> bool:
        """Create ``key`` for ``owner`` unless a live lease is there; an expired one is taken over."""
        raise NotImplementedError

    def renew_lease(self, key: str, owner: str, seconds: float) -> bool:
        """Push the expiry of ``owner``'s lease ``seconds`` ahead; False if it is no longer ours."""
        raise NotImplementedError

    def release_lease(self, key: str, owner: str) -> None:
        """Delete the lease if ``owner`` still holds it."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def lease_record(owner: str, expires: float) -> bytes:
    """How stores without expiring keys (files, S3) write a lease: owner and deadline."""
    return f"{owner} {expires:.3f}\n".encode()


def parse_lease(raw: bytes | None) -> tuple[str, float] | None:
    try:
        owner, expires = raw.decode().split()
        return owner, float(expires)
    except (AttributeError, ValueError, UnicodeDecodeError):
        return None


class RecordedLeases:
    """Renewing and releasing a lease kept as a record (lease_record) by a store without
    expiring keys: only the lease's owner may do either."""

    def renew_lease(self, key: str, owner: str, seconds: float) -> bool:
        record = parse_lease(self.get(key))
        if record is None or record[0] != owner:
            return False
        self.put(key, lease_record(owner, time.time() + seconds))
        return True

    def release_lease(self, key: str, owner: str) -> None:
        record = parse_lease(self.get(key))
        if record is not None and record[0] == owner:
            self.delete(key)
