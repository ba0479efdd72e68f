"""RemoteTier: a team's shared cache on a remote store, in immutable content-addressed
parts plus one small authenticated manifest per token.

Layout (keys in the store)::

    parts/<blake3 of the bytes>     the model cache (plan, with any native code), the data cache
    manifests/<token>               MAC line + JSON body naming the parts (manifest.py)
    leases/<token>                  who is compiling this token right now

Writers upload the parts first and the manifest last, create-only: a reader finds no
manifest, or a manifest whose parts are all there, and no writer replaces a manifest it
cannot verify (``publish``). Parts are named by their content, so two machines
uploading the same part write the same bytes.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from dataclasses import dataclass

from nncc.cache.remote import manifest as mf
from nncc.cache.remote.backend import RemoteStore
from nncc.cache.remote.deadline import allowance, bounded
from nncc.cache.remote.errors import PoisonedEntry, RemoteConfigError
from nncc.cache.remote.record import RemoteSettings

SCHEMES = ("file", "redis", "rediss", "s3")


class MissingPart(PoisonedEntry):
    """A verified manifest whose part is gone (evicted, collected): a miss, not an attack."""


@dataclass
class Lease:
    token: str
    owner: str


def open_store(settings: RemoteSettings) -> RemoteStore:
    url = settings.url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise RemoteConfigError(f"a file remote is file:///absolute/path, not {url}")
        from nncc.cache.remote.file_store import FileStore  # lazy: start-up

        return FileStore(url, urllib.parse.unquote(parts.path))
    if parts.scheme in ("redis", "rediss"):
        from nncc.cache.remote.redis_store import RedisStore  # lazy: optional extra

        return RedisStore(url, settings.timeout)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise RemoteConfigError(f"an S3 remote is s3://bucket/prefix, not {url}")
        from nncc.cache.remote.s3_store import S3Store  # lazy: optional extra

        return S3Store(url, parts.netloc, parts.path, settings.s3_endpoint, settings.timeout)
    raise RemoteConfigError(f"unknown remote {url!r}: use redis://host:port/db, s3://bucket/prefix "
                            "or file:///path")


class RemoteTier:
    def __init__(self, store: RemoteStore, secret: bytes, settings: RemoteSettings):
        self.store = store
        self.key = mf.mac_key(secret)
        self.settings = settings
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{os.urandom(6).hex()}"

    @classmethod
    def open(cls, settings: RemoteSettings) -> "RemoteTier":
        return cls(open_store(settings), settings.key, settings)

    @property
    def url(self) -> str:
        return self.store.url

    # -- reading ---------------------------------------------------------------------

    def manifest(self, token: str) -> mf.Manifest | None:
        """The verified manifest of ``token``; None when there is none. PoisonedEntry when
        one is there that does not verify."""
        raw = self.store.get(f"manifests/{token}")
        return None if raw is None else mf.decode(raw, self.key, token)

    def part(self, part: mf.Part, check_hash: bool = True) -> bytes:
        """A part's bytes, checked against the verified manifest's size and hash (without
        ``check_hash`` the caller compares the hash it takes anyway, before any use)."""
        data = self.store.get(f"parts/{part.hash}")
        if data is None:
            raise MissingPart(f"{part.role} part {part.hash[:12]} is gone from the remote")
        mf.check_part(part, data, check_hash)
        return data

    def fetch(self, token: str, check_hashes: bool = True) -> tuple[mf.Manifest, bytes, bytes] | None:
        """(manifest, model cache bytes, data cache bytes), verified, or None. Within one
        deadline: ``remote.timeout``, plus time to move the parts (deadline.py)."""
        timeout = self.settings.timeout
        started = time.monotonic()
        manifest = bounded(f"reading remote entry {token[:12]}", timeout, lambda: self.manifest(token))
        if manifest is None:
            return None
        left = max(0.0, timeout - (time.monotonic() - started)) + allowance(0.0, manifest.size)
        return (manifest, *bounded(f"reading remote entry {token[:12]}", left, lambda: (
            self.part(manifest.part("plan"), check_hashes), self.part(manifest.part("data"), check_hashes))))

    # -- writing ---------------------------------------------------------------------

    def publish(self, token: str, plan: bytes, data, **about) -> mf.Manifest:
        """``write_entry`` within one deadline: ``remote.timeout`` plus time to move the parts."""
        return bounded(f"writing remote entry {token[:12]}",
                       allowance(self.settings.timeout, len(plan) + len(data)),
                       lambda: self.write_entry(token, plan, data, **about))

    def write_entry(self, token: str, plan: bytes, data, *, native: bool, nncc_version: str,
                    format_version: int, compile_seconds: float | None) -> mf.Manifest:
        """Share an entry under ``token`` without ever spoiling one that is there:

        * a manifest that does not verify under this machine's key is left alone
          (PoisonedEntry): it may be the team's, and this machine's key the wrong one;
          ``nncc cache gc --remote`` run with the team key removes a planted one;
        * a manifest that verifies and names these very parts stands; the parts are
          written again (content-addressed: the same bytes), which heals a part that was
          damaged or lost;
        * one that verifies but names other parts stands too, unless one of its parts is
          gone: then it is removed and this one created in its place;
        * the manifest is written create-only, so of two writers racing one wins whole.
        """
        parts = (mf.Part("plan", mf.part_hash(plan), len(plan)), mf.Part("data", mf.part_hash(data), len(data)))
        existing = self.manifest(token)  # PoisonedEntry: not ours to replace
        if existing is not None and set(existing.parts) != set(parts):
            if all(self.store.exists(f"parts/{p.hash}") for p in existing.parts):
                return existing
            self.store.delete(f"manifests/{token}")  # its parts are gone: an entry nobody can use
            existing = None
        for part, payload in zip(parts, (plan, data)):
            self.store.put(f"parts/{part.hash}", payload)
        if existing is not None:
            return existing
        manifest = mf.Manifest(token, parts, native, nncc_version, format_version, time.time(), compile_seconds)
        if not self.store.create(f"manifests/{token}", mf.encode(manifest, self.key)):  # last: it appears whole
            return self.manifest(token)  # another writer's won
        return manifest

    def remove(self, token: str) -> None:
        """Drop a token's manifest (its parts go when nothing names them: see gc)."""
        self.store.delete(f"manifests/{token}")

    # -- leases: one compile across the fleet ----------------------------------------

    def acquire(self, token: str) -> Lease | None:
        if bounded("taking a compile lease", self.settings.timeout, lambda: self.store.acquire_lease(
                f"leases/{token}", self.owner, self.settings.lease_seconds)):
            return Lease(token, self.owner)
        return None

    def renew(self, lease: Lease) -> bool:
        return bounded("renewing a compile lease", self.settings.timeout, lambda: self.store.renew_lease(
            f"leases/{lease.token}", lease.owner, self.settings.lease_seconds))

    def release(self, lease: Lease) -> None:
        bounded("releasing a compile lease", self.settings.timeout,
                lambda: self.store.release_lease(f"leases/{lease.token}", lease.owner))

    # -- listing ---------------------------------------------------------------------

    def entries(self) -> tuple[list[tuple[str, mf.Manifest | None, str | None]], dict[str, int]]:
        """([(token, manifest or None, why it was rejected)], {part hash: size})."""
        parts = {item.key.rsplit("/", 1)[1]: item.size for item in self.store.list("parts/")}
        found = []
        for item in self.store.list("manifests/"):
            token = item.key.rsplit("/", 1)[1]
            try:
                found.append((token, self.manifest(token), None))
            except PoisonedEntry as exc:
                found.append((token, None, str(exc)))
        return found, parts

    def stats(self) -> dict:
        found, parts = self.entries()
        return {"url": self.url, "entries": sum(1 for _, m, _ in found if m is not None),
                "rejected_entries": sum(1 for _, m, _ in found if m is None),
                "parts": len(parts), "bytes": sum(parts.values())}

    def close(self) -> None:
        self.store.close()
