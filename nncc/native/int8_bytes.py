"""Which quantized images travel between native int8 steps as bytes instead of float images.

A quantized tensor is carried through the graph as its exact float image (q - zero) * scale
(nncc/passes/qlinear_float.py), and each native int8 convolution recovers q from it. When
every reader of a convolution's output is another native int8 convolution of the same unit
that recovers with the very scale and zero point the producer quantized with, the recovery
is the identity: q - zero comes back exactly (|rounding error| << 0.5). Such an edge skips
the float image altogether: the producer stores q itself as one byte per element (q + 128
for int8, so every byte is unsigned as the readers' products want), NCHW, in the first
quarter of the value's float32 slot; the reader takes the bytes as they are. A quarter of
the memory traffic, and no conversion at either end.

Any other reader (an elementwise step, a partition output, a different scale) keeps the
float image, so the bytes are never seen outside the int8 convolutions' own code.
"""

from __future__ import annotations

import numpy as np

from nncc.native.graph_query import const_value

QCONV = ("nncc", "QConv")


def shift(zero_dtype) -> int:
    """What a stored byte adds to q: int8 values are shifted to be unsigned."""
    return 128 if np.dtype(zero_dtype) == np.int8 else 0


def _param(graph, infos, name):
    value = const_value(graph, infos, name) if name else None
    return None if value is None else np.asarray(value)


def _same(a, b) -> bool:
    return a is not None and b is not None and a.dtype == b.dtype and a.size == b.size == 1 \
        and a.tobytes() == b.tobytes()


def byte_output(wr, node, pixel_major) -> str | None:
    """The layout in which the native QConv ``node`` stores its output as bytes (see the
    module's docstring), or None to keep the float image. ``pixel_major(conv)``: whether a
    convolution takes the pixel-major form, which reads and writes pixels with their
    channels side by side: between two of those the bytes are NHWC, so the writer stores
    whole pixels and the reader copies whole image rows; otherwise NCHW, the layout every
    form reads."""
    out = node.outputs[0]
    readers = wr.consumers.get(out, [])
    if out in wr.outputs or not readers:
        return None
    ys, yz = (_param(wr.graph, wr.infos, n) for n in node.inputs[6:8])
    for reader in readers:
        if (reader.domain, reader.op_type) != QCONV or reader.inputs[0] != out or out in reader.inputs[1:]:
            return None
        xs, xz = (_param(wr.graph, wr.infos, n) for n in reader.inputs[1:3])
        if not (_same(xs, ys) and _same(xz, yz)):
            return None
    return "nhwc" if pixel_major(node) and all(pixel_major(r) for r in readers) else "nchw"


def image_at(ptr: str, count: int, as_bytes: bool, const: bool = False) -> str:
    """C for image ``img`` of a batch at ``ptr`` (a float pointer), ``count`` elements per
    image: float32 elements, or bytes when the image is stored as bytes."""
    if not as_bytes:
        return f"{ptr} + img * {count}"
    c = "const " if const else ""
    return f"({c}float *)(({c}uint8_t *){ptr} + img * {count})"


def byte_store(shift_out: int) -> str:
    """C that turns a saturated q (a float) into its stored byte."""
    return f"(uint8_t)(int32_t)(v + {float(shift_out)}f)"
