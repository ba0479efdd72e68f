"""A small, defensive reader for the protobuf wire format.

Only what ONNX needs: varints, fixed 32/64-bit values and length-delimited fields.
Every length is checked against the bytes actually present, so a corrupt length can
neither read out of bounds nor make us allocate more than the input's own size.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from nncc.errors import ModelFormatError

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
_GROUP_START, _GROUP_END = 3, 4

Field = tuple[int, int, object]  # (number, wire type, int value or memoryview)


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ModelFormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise ModelFormatError("varint longer than 10 bytes")


def iter_fields(buf: memoryview) -> Iterator[Field]:
    """Yield (field number, wire type, value) for each field of one message.

    LEN values are zero-copy memoryview slices; VARINT and FIXED values are ints.
    """
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ModelFormatError("field number 0 is invalid")
        if wire == VARINT:
            value, pos = read_varint(buf, pos, end)
        elif wire == LEN:
            length, pos = read_varint(buf, pos, end)
            if length > end - pos:
                raise ModelFormatError(
                    f"field {number} claims {length} bytes but only {end - pos} remain"
                )
            value = buf[pos : pos + length]
            pos += length
        elif wire == FIXED32:
            if end - pos < 4:
                raise ModelFormatError("truncated fixed32 field")
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        elif wire == FIXED64:
            if end - pos < 8:
                raise ModelFormatError("truncated fixed64 field")
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        else:  # groups are deprecated and never used by ONNX
            raise ModelFormatError(f"unsupported wire type {wire} in field {number}")
        yield number, wire, value


def as_int64(value: int) -> int:
    """Reinterpret an unsigned 64-bit varint as two's-complement int64."""
    return value - (1 << 64) if value >= 1 << 63 else value


def as_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def as_float32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def decode_string(value: object, what: str) -> str:
    if not isinstance(value, memoryview):
        raise ModelFormatError(f"{what} must be a length-delimited string")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise ModelFormatError(f"{what} is not valid UTF-8") from None


def decode_varints(data: memoryview) -> np.ndarray:
    """Decode a packed run of varints into uint64, vectorized."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size == 0:
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero(raw < 0x80)
    if ends.size == 0 or ends[-1] != raw.size - 1:
        raise ModelFormatError("truncated packed varint field")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise ModelFormatError("varint longer than 10 bytes")
    position = np.arange(raw.size) - np.repeat(starts, lengths)
    parts = (raw & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.add.reduceat(parts, starts)


class Repeated:
    """Accumulates a repeated scalar field that may arrive packed or one by one."""

    __slots__ = ("chunks", "kind")

    def __init__(self, kind: str):
        self.kind = kind  # "varint", "f32" or "f64"
        self.chunks: list[np.ndarray] = []

    def add(self, wire: int, value: object, what: str) -> None:
        if wire == LEN:
            self.chunks.append(self._unpack(value, what))
        elif wire == VARINT and self.kind == "varint":
            self.chunks.append(np.array([value], dtype=np.uint64))
        elif wire == FIXED32 and self.kind == "f32":
            self.chunks.append(np.array([value], dtype=np.uint32).view(np.float32))
        elif wire == FIXED64 and self.kind == "f64":
            self.chunks.append(np.array([value], dtype=np.uint64).view(np.float64))
        else:
            raise ModelFormatError(f"{what} has wire type {wire}, which does not fit its type")

    def _unpack(self, data: memoryview, what: str) -> np.ndarray:
        if self.kind == "varint":
            return decode_varints(data)
        size = 4 if self.kind == "f32" else 8
        if len(data) % size:
            raise ModelFormatError(f"packed {what} is {len(data)} bytes, not a multiple of {size}")
        return np.frombuffer(data, dtype="<f4" if size == 4 else "<f8")

    def array(self) -> np.ndarray:
        if not self.chunks:
            dtype = {"varint": np.uint64, "f32": np.float32, "f64": np.float64}[self.kind]
            return np.zeros(0, dtype=dtype)
        return self.chunks[0] if len(self.chunks) == 1 else np.concatenate(self.chunks)

    def __len__(self) -> int:
        return sum(len(c) for c in self.chunks)
