"""A small, defensive reader for the protobuf wire format.

Only what ONNX needs: varints, fixed 32/64-bit values and length-delimited fields.
Every length is checked against the bytes actually present, so a corrupt length can
neither read out of bounds nor make us allocate more than the input's own size.
"""

from __future__ import annotations

import sys
from array import array as _array
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


_VALUE_DTYPE = {"varint": np.dtype(np.uint64), "f32": np.dtype(np.float32), "f64": np.dtype(np.float64)}
# Packed chunks up to this many bytes are decoded in Python and merged into one buffer:
# numpy's per-call cost would make a file of many tiny chunks very slow to read.
_SMALL_CHUNK = 64
_U32 = next(code for code in "IL" if _array(code).itemsize == 4)  # array.array type codes


class Repeated:
    """Accumulates a repeated scalar field that may arrive packed or one by one.

    Unpacked scalars and small packed chunks are buffered in a compact ``array.array``
    (native-endian bits) rather than one numpy array each, so a file made of many tiny
    fields cannot make memory grow much faster than the file itself.
    """

    __slots__ = ("chunks", "kind", "pending")

    def __init__(self, kind: str):
        self.kind = kind  # "varint", "f32" or "f64"
        self.chunks: list[np.ndarray] = []
        self.pending = _array(_U32 if kind == "f32" else "Q")

    def add(self, wire: int, value: object, what: str) -> None:
        if wire == LEN:
            if len(value) <= _SMALL_CHUNK:  # type: ignore[arg-type]
                self._add_small(value, what)  # type: ignore[arg-type]
            else:
                self._flush()
                self.chunks.append(self._unpack(value, what))  # type: ignore[arg-type]
        elif (
            (wire == VARINT and self.kind == "varint")
            or (wire == FIXED32 and self.kind == "f32")
            or (wire == FIXED64 and self.kind == "f64")
        ):
            self.pending.append(value)  # type: ignore[arg-type]
        else:
            raise ModelFormatError(f"{what} has wire type {wire}, which does not fit its type")

    def _add_small(self, data: memoryview, what: str) -> None:
        if self.kind == "varint":
            pos, end = 0, len(data)
            while pos < end:
                value, pos = read_varint(data, pos, end)
                self.pending.append(value)
            return
        size = 4 if self.kind == "f32" else 8
        if len(data) % size:
            raise ModelFormatError(f"packed {what} is {len(data)} bytes, not a multiple of {size}")
        bits = _array(self.pending.typecode, bytes(data))  # little-endian on the wire
        if sys.byteorder == "big":
            bits.byteswap()
        self.pending.extend(bits)

    def _flush(self) -> None:
        if self.pending:
            # The buffer holds native-endian bits; reinterpret them as the value type.
            # (the array keeps the old buffer alive; a fresh one takes further values)
            self.chunks.append(np.frombuffer(self.pending, dtype=_VALUE_DTYPE[self.kind]))
            self.pending = _array(self.pending.typecode)

    def _unpack(self, data: memoryview, what: str) -> np.ndarray:
        if self.kind == "varint":
            return decode_varints(data)
        size = 4 if self.kind == "f32" else 8
        if len(data) % size:
            raise ModelFormatError(f"packed {what} is {len(data)} bytes, not a multiple of {size}")
        return np.frombuffer(data, dtype="<f4" if size == 4 else "<f8")

    def array(self) -> np.ndarray:
        self._flush()
        if not self.chunks:
            return np.zeros(0, dtype=_VALUE_DTYPE[self.kind])
        return self.chunks[0] if len(self.chunks) == 1 else np.concatenate(self.chunks)

    def __len__(self) -> int:
        return len(self.pending) + sum(len(c) for c in self.chunks)
