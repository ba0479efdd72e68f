"""Seeded random feeds for `nncc run --random-inputs` and `nncc bench`.

The random bits are blake3's extendable output keyed by the seed and the input's name: an
input's values depend on nothing else (not on the other inputs or their order), and
`nncc run` does not import numpy.random, which costs 13-16 ms of a 200 ms process here.
Floats are standard normal (Box-Muller), integers uniform in [0, 10), booleans fair.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
from blake3 import blake3

from nncc.errors import InputError
from nncc.ir import low_precision
from nncc.ir.graph import TensorInfo
from nncc.util.limits import LimitError, check_bytes, check_shape


CHUNK = 1 << 20  # values made at a time: the peak stays near the input's own size


def random_bits(seed: int, name: str, count: int, start: int = 0) -> np.ndarray:
    """``count`` uniformly random uint64 words, a pure function of (seed, name): words
    ``start`` to ``start + count`` of one endless stream (blake3's output, seekable)."""
    key = f"nncc random inputs\0{seed}\0{name}".encode()
    return np.frombuffer(blake3(key).digest(length=8 * count, seek=8 * start), dtype=np.uint64)


def _unit(bits: np.ndarray) -> np.ndarray:
    """Uniform float64 in [0, 1) from the top 53 bits of each word."""
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def standard_normal(seed: int, name: str, count: int, dtype=np.float64) -> np.ndarray:
    """Box-Muller over word pairs (i, pairs + i): value i is r*cos, value pairs + i is r*sin."""
    out = np.empty(count, dtype)
    _fill_normal(out, seed, name, lambda v: v)
    return out


def _fill_normal(out: np.ndarray, seed: int, name: str, convert) -> None:
    """``out`` (1-D) filled with standard normals made CHUNK pairs at a time, each chunk
    passed through ``convert`` into the final buffer: the peak stays near ``out``'s size."""
    count = out.size
    pairs = -(-count // 2)
    for lo in range(0, pairs, CHUNK):
        hi = min(lo + CHUNK, pairs)
        radius = np.sqrt(-2.0 * np.log1p(-_unit(random_bits(seed, name, hi - lo, lo))))  # log1p(-u): no log(0)
        angle = (2.0 * math.pi) * _unit(random_bits(seed, name, hi - lo, pairs + lo))
        out[lo:hi] = convert(radius * np.cos(angle))
        top = min(hi, count - pairs)  # the sines that exist (an odd count drops the last)
        if top > lo:
            out[pairs + lo:pairs + top] = convert((radius * np.sin(angle))[:top - lo])


def _words(seed: int, name: str, count: int, dtype, convert) -> np.ndarray:
    out = np.empty(count, dtype)
    for lo in range(0, count, CHUNK):
        hi = min(lo + CHUNK, count)
        out[lo:hi] = convert(random_bits(seed, name, hi - lo, lo))
    return out


def random_feeds(declared: Mapping[str, TensorInfo], seed: int = 0,
                 dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded random inputs matching declared dtypes and shapes (symbolic dims default to 1,
    or to their value in ``dims``). An input too large to allocate is bad input (LimitError)."""
    feeds = {}
    total = 0
    for name, info in declared.items():
        if not name:
            raise InputError("the model declares an input with an empty name; it cannot be fed")
        if info.kind.startswith("optional"):
            continue  # left out: the model sees an empty optional
        if info.dtype is None or info.shape is None:
            raise InputError(f"input {name!r} declares no tensor type and shape; pass it explicitly")
        shape = tuple(
            d if isinstance(d, int) else (dims or {}).get(d, 1) if isinstance(d, str) else 1
            for d in info.shape
        )
        what = f"random input {name!r} of shape {list(shape)}"
        total += check_shape(shape, info.dtype.itemsize, what)
        check_bytes(total, "the random inputs together")
        try:
            feeds[name] = _random_value(seed, name, info.dtype, shape)
        except MemoryError:  # within the bound, but not available right now
            raise LimitError(f"the {what} needs more memory than is available") from None
    return feeds


def _random_value(seed: int, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    kind = dtype.kind
    # every kind is made in chunks straight into its final buffer (a whole-size temporary
    # of wider words would multiply the peak: 8 bytes of random bits per 4-bit value)
    if low_precision.is_integer(dtype):  # int4, uint4, int2, uint2: 0, 1, 2... as room allows
        top = np.uint64(min(low_precision.integer_range(dtype)[1] + 1, 10))
        value = _words(seed, name, count, dtype, lambda w: low_precision.convert(w % top, dtype))
    elif low_precision.is_float(dtype):  # bfloat16, float8, float4: rounded normals
        value = np.empty(count, dtype)  # rounded from float32, as one float32 array would be
        _fill_normal(value, seed, name, lambda v: low_precision.convert(v.astype(np.float32), dtype))
    elif kind == "f":
        value = standard_normal(seed, name, count, dtype)
    elif kind == "b":
        value = _words(seed, name, count, bool, lambda w: w & np.uint64(1))
    elif kind in "iu":
        value = _words(seed, name, count, dtype, lambda w: w % np.uint64(10))
    else:
        raise InputError(f"cannot make random values for input {name!r} of dtype {dtype}")
    return value.reshape(shape)
