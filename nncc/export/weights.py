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
    56     4    CRC-32 of the data
    60     4    CRC-32 of bytes 0-59
    64     64   zero (checked)

The library knows every size and offset from its own build, never from the file: a
hostile file can be refused or change numbers, never make it read out of bounds. The
checksum is CRC-32 (zlib's polynomial), not a cryptographic hash, on purpose: the file is
data, not code, and whoever can write it can change the results anyway, so the check is
for damage (a truncated copy, a flipped bit), which CRC-32 finds (every burst of up to 32
bits, any other change but for 1 in 2^32), in a few lines of C that run at open.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
from blake3 import blake3

MAGIC = b"NNCCWTS\0"
FORMAT = 1
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
    return blake3(description.encode() + b"\0" + blake3(data).digest()).digest(16)


def weights_file(model_token: bytes, features_mask: int, data: bytes) -> bytes:
    head = struct.pack("<8sII16sQQQI", MAGIC, FORMAT, HEADER, model_token, features_mask, HEADER, len(data),
                       zlib.crc32(data))
    head += struct.pack("<I", zlib.crc32(head))
    return head + bytes(HEADER - len(head)) + data
