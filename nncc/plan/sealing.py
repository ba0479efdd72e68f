"""An artifact's signature as bytes: the message a MAC covers and the SIGN section.

Whether a seal is trusted is nncc.trust's decision; this module only says what is signed
(see nncc.plan.format for the grammar) and how the signature is laid out.
"""

from __future__ import annotations

import struct

from nncc.errors import PlanFormatError
from nncc.plan.plan import ArtifactSeal
from nncc.util.files import ARTIFACT_MAGIC

SEAL = struct.Struct("<I8s32s")  # scheme, key fingerprint, MAC
SEAL_SCHEME = 1
SEAL_BYTES = SEAL.size
SEAL_DOMAIN = b"nncc artifact seal 1\n"


def seal_message(version: int, producer: bytes, entries: list[tuple[bytes, int, int, bytes]]) -> bytes:
    """What an artifact's MAC covers: the header and the (tag, flags, length, blake3) of
    every section but SIGN, in table order."""
    parts = [SEAL_DOMAIN, ARTIFACT_MAGIC, struct.pack("<I", version), producer, struct.pack("<I", len(entries))]
    parts += [struct.pack("<4sIQ32s", tag, flags, length, digest) for tag, flags, length, digest in entries]
    return b"".join(parts)


def seal_payload(fingerprint: bytes, mac: bytes) -> bytes:
    """The SIGN section's bytes."""
    return SEAL.pack(SEAL_SCHEME, fingerprint, mac)


def read_seal(raw: bytes, message: bytes) -> ArtifactSeal:
    """The SIGN section's bytes as a seal over ``message`` (not yet checked)."""
    if len(raw) != SEAL.size:
        raise PlanFormatError(f"signature section has {len(raw)} bytes, not {SEAL.size}")
    scheme, fingerprint, mac = SEAL.unpack(raw)
    return ArtifactSeal(scheme, fingerprint, mac, message)
