"""The weights file: a fixed header, then every constant the native call reads, each on a
64-byte boundary (the micro-kernels' vector loads), mapped read-only at open.

    offset size
    0      8    magic "NNCCWTS\\0"
    8      4    format version (FORMAT), little-endian like every field
    12     4    header size (HEADER)
    16     16   the model token: the library accepts only the file made with it
    32     8    the CPU features the code needs, one bit per nncc.export.cpu.FEATURES entry
    40     8    the data's offset (= HEADER)
    48     8    the data's size
    56     32   BLAKE3 of the data (plain, unkeyed)
    88     4    CRC-32 of bytes 0-87
    92     36   zero (checked)

The library knows every size and offset from its own build, never from the file: a
hostile file can be refused, never make it read out of bounds. It also carries the data's
BLAKE3 digest, compiled in at export, and hashes the data at every open: data edited to
match a rewritten header is refused all the same, because it must match the library. The
header's own check stays CRC-32: every field it covers is compared with the library's own
value anyway, so it only tells damage (DAMAGED) from another build's file (MISMATCH).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
from blake3 import blake3

MAGIC = b"NNCCWTS\0"
FORMAT = 2
HEADER = 128
ALIGN = 64


def layout(constants: list[np.ndarray]) -> tuple[list[int], int]:
    """Each constant's offset in the data, and the data's size (both multiples of ALIGN)."""
    offsets, at = [], 0
    for array in constants:
        offsets.append(at)
        at += (array.nbytes + ALIGN - 1) // ALIGN * ALIGN
    return offsets, at


def data_bytes(constants: list[np.ndarray]) -> bytes:
    offsets, size = layout(constants)
    data = bytearray(size)
    for array, offset in zip(constants, offsets):
        raw = np.ascontiguousarray(array, dtype="<f4").tobytes()
        data[offset:offset + len(raw)] = raw
    return bytes(data)


def token(description: str, data: bytes) -> bytes:
    """16 bytes naming this library's build and constants: another model's file (or
    another build's of this model) carries another token."""
    return blake3(description.encode() + b"\0" + digest(data)).digest(16)


def digest(data: bytes) -> bytes:
    """The data's plain BLAKE3, in the header and compiled into the library."""
    return blake3(data).digest()


def weights_file(model_token: bytes, features_mask: int, data: bytes) -> bytes:
    head = struct.pack("<8sII16sQQQ32s", MAGIC, FORMAT, HEADER, model_token, features_mask, HEADER, len(data),
                       digest(data))
    head += struct.pack("<I", zlib.crc32(head))
    return head + bytes(HEADER - len(head)) + data
