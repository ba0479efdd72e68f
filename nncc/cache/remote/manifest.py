"""Remote manifests: which content-addressed parts make up one token's entry, and a keyed
blake3 MAC that proves a holder of the team key wrote it.

Anyone who can write to the bucket or the Redis can plant objects there; only a key holder
can make a manifest whose MAC verifies. The MAC covers the whole manifest body: the token,
each part's role, blake3 hash and size, and the versions. A part is then accepted only
when its bytes have the size and hash the verified manifest names, so a swapped, truncated
or replaced part is caught, and so is a genuine manifest copied under another token.

Stored form: the MAC in hex, a newline, then the body as canonical JSON (the MAC is taken
over exactly those bytes, so no re-encoding is ever compared).
"""

from __future__ import annotations

import hmac
import json
import re
from dataclasses import dataclass

from blake3 import blake3

from nncc.cache.remote.errors import PoisonedEntry

SCHEME = "nncc-remote-manifest/1"
MAC_CONTEXT = "nncc remote cache 2026 manifest MAC"  # derives the MAC key from the secret
ROLES = ("plan", "data")  # the model cache (with any native code) and the data cache
MAX_MANIFEST = 64 << 10
MAX_PART = 16 << 30
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Part:
    role: str
    hash: str
    size: int


@dataclass(frozen=True)
class Manifest:
    token: str
    parts: tuple[Part, ...]
    native: bool  # the plan part carries native code (it runs only because the MAC verified)
    nncc_version: str
    format_version: int
    created: float
    compile_seconds: float | None

    def part(self, role: str) -> Part:
        return next(p for p in self.parts if p.role == role)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)


def mac_key(secret: bytes) -> bytes:
    """A 32-byte MAC key from a team secret of any length."""
    return blake3(secret, derive_key_context=MAC_CONTEXT).digest()


def part_hash(data) -> str:
    size = len(data)
    return blake3(data, max_threads=blake3.AUTO if size >= (8 << 20) else 1).hexdigest()


def encode(manifest: Manifest, key: bytes) -> bytes:
    body = json.dumps({
        "scheme": SCHEME, "token": manifest.token,
        "parts": [{"role": p.role, "hash": p.hash, "size": p.size} for p in manifest.parts],
        "native": manifest.native, "nncc_version": manifest.nncc_version,
        "format_version": manifest.format_version, "created": manifest.created,
        "compile_seconds": manifest.compile_seconds,
    }, sort_keys=True, separators=(",", ":")).encode()
    return blake3(body, key=key).hexdigest().encode() + b"\n" + body


def decode(raw: bytes, key: bytes, token: str) -> Manifest:
    """The verified manifest of ``token``; PoisonedEntry for anything else."""
    if len(raw) > MAX_MANIFEST:
        raise PoisonedEntry(f"manifest is {len(raw)} bytes, more than any nncc writes")
    mac, sep, body = bytes(raw).partition(b"\n")
    if not sep:
        raise PoisonedEntry("manifest is not nncc's (no MAC line)")
    if not hmac.compare_digest(mac, blake3(body, key=key).hexdigest().encode()):
        raise PoisonedEntry("manifest MAC does not verify under the team key")
    # From here on the body was written by a key holder; it is still checked, not trusted to be sane.
    try:
        doc = json.loads(body)
        if doc["scheme"] != SCHEME:
            raise PoisonedEntry(f"manifest scheme {doc['scheme']!r:.40} is not {SCHEME}")
        parts = tuple(Part(str(p["role"]), str(p["hash"]), p["size"]) for p in doc["parts"])
        manifest = Manifest(str(doc["token"]), parts, bool(doc["native"]), str(doc["nncc_version"]),
                            int(doc["format_version"]), float(doc["created"]),
                            None if doc["compile_seconds"] is None else float(doc["compile_seconds"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise PoisonedEntry(f"manifest body is malformed ({exc!s:.60})") from None
    if manifest.token != token:
        raise PoisonedEntry(f"manifest is a valid entry for another token ({manifest.token[:12]})")
    if sorted(p.role for p in parts) != sorted(ROLES):
        raise PoisonedEntry("manifest does not name exactly a plan part and a data part")
    for p in parts:
        if not _HEX64.match(p.hash) or type(p.size) is not int or not 0 <= p.size <= MAX_PART:
            raise PoisonedEntry(f"manifest names a malformed {p.role} part")
    return manifest


def check_part(part: Part, data, check_hash: bool = True) -> None:
    """The bytes fetched for ``part`` are exactly the ones the manifest names."""
    if data is None:
        raise PoisonedEntry(f"{part.role} part {part.hash[:12]} is missing")
    if len(data) != part.size:
        raise PoisonedEntry(f"{part.role} part has {len(data)} bytes, the manifest names {part.size}")
    if check_hash:
        check_hash_of(part, part_hash(data))


def check_hash_of(part: Part, digest: str) -> None:
    if not hmac.compare_digest(digest, part.hash):
        raise PoisonedEntry(f"{part.role} part does not match the hash its manifest names")
