"""The artifact's container: header, section table, checksums, alignment (the grammar is
in nncc.plan.format). It knows sections as bytes; what they hold is the writer's and the
reader's business, and signing is nncc.plan.sealing's."""

from __future__ import annotations

import struct
from typing import Any, Callable

from blake3 import blake3

from nncc._version import FORMAT_VERSION
from nncc.errors import PlanFormatError
from nncc.plan.plan import ArtifactSeal
from nncc.plan.sealing import read_seal, seal_message
from nncc.util.files import ARTIFACT_MAGIC

MAGIC = ARTIFACT_MAGIC
ALIGN = 64
HEADER = struct.Struct("<8sII16s")
ENTRY = struct.Struct("<4sIQQ32s")
TAGS = (b"PROG", b"INLN", b"DATA", b"CODE", b"PAYL", b"SIGN")
MAX_SECTIONS = 8  # six tags, each at most once

Pieces = list  # buffers (bytes or uint8 views of constants) that concatenate to a section
Sealer = Callable[[bytes], "bytes | None"]  # seal message -> SIGN payload, or None for none (nncc.trust.seal)


def pad(n: int) -> bytes:
    """Zeros up to the next multiple of ALIGN."""
    return b"\0" * (-n % ALIGN)


def assemble(producer: str, sections: list[tuple[bytes, Any]], seal: Sealer | None = None) -> bytes:
    """Header, section table and sections; a payload is bytes or a list of pieces. Every
    byte is copied exactly once, into the result (large artifacts: copies dominate).
    ``seal`` signs the table when a CODE section is among them: only code needs a
    signature, and an artifact without one stays readable by an nncc that knows no SIGN."""
    laid = []  # (tag, pieces, length, digest)
    for tag, payload in sections:
        pieces = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else payload
        digest = blake3()
        length = 0
        for piece in pieces:
            digest.update(piece)
            length += memoryview(piece).nbytes
        laid.append((tag, pieces, length, digest.digest()))
    encoded = producer.encode()[:16]
    if seal is not None and any(tag == b"CODE" for tag, *_ in laid):
        message = seal_message(FORMAT_VERSION, encoded.ljust(16, b"\0"),
                               [(tag, 0, length, digest) for tag, _, length, digest in laid])
        signature = seal(message)
        if signature is not None:
            laid.append((b"SIGN", [signature], len(signature), blake3(signature).digest()))
    head_size = HEADER.size + ENTRY.size * len(laid)
    offset = head_size + len(pad(head_size))
    entries = []
    body: Pieces = []
    for index, (tag, pieces, length, digest) in enumerate(laid):
        entries.append(ENTRY.pack(tag, 0, offset, length, digest))
        body += pieces
        if index + 1 < len(laid):  # no padding after the last: a cut file always cuts a section
            body.append(pad(length))
            offset += length + len(pad(length))
    header = HEADER.pack(MAGIC, FORMAT_VERSION, len(laid), encoded)
    head = header + b"".join(entries)
    return b"".join([head, pad(len(head)), *body])


def read_sections(buffer) -> tuple[str, dict[bytes, memoryview]]:
    """Check the header and every section checksum; return (producer, sections)."""
    producer, sections, _seal = read_sealed(buffer)
    return producer, sections


def read_sealed(buffer) -> tuple[str, dict[bytes, memoryview], ArtifactSeal | None]:
    """read_sections, and the artifact's seal (its SIGN section and the message it signs,
    both from the same in-memory copy of the header the sections were checked against)."""
    view = memoryview(buffer)
    if len(view) < HEADER.size:
        raise PlanFormatError("too short to be an nncc artifact")
    magic, version, count, producer = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise PlanFormatError("not an nncc artifact (bad magic)")
    if version != FORMAT_VERSION:
        raise PlanFormatError(f"artifact format version {version}; this nncc reads version {FORMAT_VERSION}")
    if not 0 < count <= MAX_SECTIONS or HEADER.size + count * ENTRY.size > len(view):
        raise PlanFormatError(f"bad section count {count}")
    head = bytes(view[: HEADER.size + count * ENTRY.size])  # one copy: checked and signed alike
    sections: dict[bytes, memoryview] = {}
    signed = []
    for i in range(count):
        tag, flags, offset, length, digest = ENTRY.unpack_from(head, HEADER.size + i * ENTRY.size)
        if tag not in TAGS or tag in sections:
            raise PlanFormatError(f"unknown or repeated section {tag!r}")
        if offset % ALIGN or offset + length > len(view):
            raise PlanFormatError(f"section {tag.decode()} lies outside the file")
        # TOCTOU: the program, inline constants and payloads are copied into memory first,
        # and the checksum is taken of that copy, which is then parsed. DATA stays
        # memory-mapped: it holds only numbers, so a change after the check yields wrong
        # values at worst.
        payload = view[offset : offset + length]
        if tag != b"DATA":
            payload = memoryview(bytes(payload))
        if blake3(payload).digest() != digest:
            raise PlanFormatError(f"section {tag.decode()} fails its checksum")
        sections[tag] = payload
        if tag != b"SIGN":
            signed.append((tag, flags, length, digest))
    if b"PROG" not in sections:
        raise PlanFormatError("artifact has no program section")
    try:
        producer_text = producer.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise PlanFormatError("producer version is not ASCII") from None
    seal = None
    if b"SIGN" in sections:
        seal = read_seal(bytes(sections[b"SIGN"]), seal_message(version, producer, signed))
    return producer_text, sections, seal
