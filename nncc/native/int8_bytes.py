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

The native QAdd and QGlobalAveragePool (nncc/native/qimage_ops_gen.py) read bytes too,
and QAdd writes its output as bytes by the same rule, so an inverted-residual block's
stream (projection -> QAdd -> QAdd -> expansion) stays bytes end to end. QAdd is
elementwise: its inputs and output share one layout, so the values a QAdd joins are laid
out together (one group): NHWC when every member is bytes, each is written only by
pixel-major convolutions and QAdds, and read only by those and by channel-major pointwise
convolutions (an inverted residual's expansion over many pixels, which packs its operand
from whole pixels as readily as from planes); NCHW otherwise (the layout every form reads,
and a float image's).

Any other reader (another elementwise step, a partition output, a different scale) keeps
the float image, so the bytes are never seen outside the int8 steps' own code.
"""

from __future__ import annotations

import numpy as np

from nncc.native.graph_query import const_value

QCONV = ("nncc", "QConv")
QADD = ("nncc", "QAdd")
QPOOL = ("nncc", "QGlobalAveragePool")
QDQ = ("nncc", "QuantizeDequantize")  # a float input quantized: the first int8 step of a chain


def shift(zero_dtype) -> int:
    """What a stored byte adds to q: int8 values are shifted to be unsigned."""
    return 128 if np.dtype(zero_dtype) == np.int8 else 0


def _param(graph, infos, name):
    value = const_value(graph, infos, name) if name else None
    return None if value is None else np.asarray(value)


def _same(a, b) -> bool:
    return a is not None and b is not None and a.dtype == b.dtype and a.size == b.size == 1 \
        and a.tobytes() == b.tobytes()


def _reads(reader, value) -> list[tuple[str, str]] | None:
    """The (scale, zero point) names with which ``reader`` recovers ``value``, one pair per
    slot it is read through, or None when the reader cannot take bytes: not a native int8
    step, or ``value`` also in a slot that is not a quantized image."""
    key, ins = (reader.domain, reader.op_type), list(reader.inputs)
    image_slots = {QCONV: (0,), QPOOL: (0,), QADD: (0, 3)}.get(key)
    if image_slots is None:
        return None
    slots = [i for i, name in enumerate(ins) if name == value]
    if any(i not in image_slots for i in slots):
        return None
    return [(ins[i + 1], ins[i + 2] if i + 2 < len(ins) else "") for i in slots]


def _output_scale(node) -> tuple[str, str] | None:
    """The (scale, zero point) names a native int8 step quantizes its output with, or None
    for a step that writes no bytes."""
    key, ins = (node.domain, node.op_type), list(node.inputs) + [""] * 9
    if key == QDQ:
        return ins[1], ins[2]
    return (ins[6], ins[7]) if key in (QCONV, QADD) else None


def _takes_bytes(wr, node) -> bool:
    """Whether every reader of ``node``'s output recovers it exactly, as bytes."""
    out, params = node.outputs[0], _output_scale(node)
    readers = wr.consumers.get(out, [])
    if params is None or out in wr.outputs or not readers:
        return False
    ys, yz = (_param(wr.graph, wr.infos, n) for n in params)
    for reader in readers:
        pairs = _reads(reader, out)
        if pairs is None:
            return False
        for scale, zero in pairs:
            xs, xz = _param(wr.graph, wr.infos, scale), _param(wr.graph, wr.infos, zero)
            if not (_same(xs, ys) and _same(xz, yz)):
                return False
    return True


def plan(wr, pixel_major, reads_nhwc=None) -> dict[str, str]:
    """The partition's values stored as bytes and their layouts (see the module's
    docstring), computed once per writer. ``pixel_major(conv)``: whether a convolution
    takes the pixel-major form, which reads and writes pixels with their channels side by
    side: between two of those the bytes are NHWC, so the writer stores whole pixels and the
    reader copies whole image rows. ``reads_nhwc(conv)``: whether a convolution reads NHWC
    bytes (by default, when it is pixel-major)."""
    cached = getattr(wr, "_byte_plan", None)
    if cached is not None:
        return cached
    producer = {n.outputs[0]: n for n in wr.nodes if _output_scale(n) is not None and n.outputs}
    as_bytes = {out for out, node in producer.items() if _takes_bytes(wr, node)}
    group = {}  # value -> a representative: the values one QAdd joins share a layout

    def find(v):
        while group.get(v, v) != v:
            v = group[v]
        return v

    for node in wr.nodes:
        if (node.domain, node.op_type) == QADD:
            for v in (node.inputs[3], node.outputs[0]):
                ra, rb = find(node.inputs[0]), find(v)
                if ra != rb:
                    group[rb] = ra
    members: dict[str, list[str]] = {}
    for v in set(group) | set(group.values()) | as_bytes:
        members.setdefault(find(v), []).append(v)

    reads_nhwc = reads_nhwc or pixel_major

    def writes_pixels(node) -> bool:  # a step that writes NHWC bytes
        key = (node.domain, node.op_type)
        return key == QADD or (key == QCONV and pixel_major(node))

    def reads_pixels(node) -> bool:  # a step that reads NHWC bytes
        key = (node.domain, node.op_type)
        return key == QADD or (key == QCONV and reads_nhwc(node))

    layouts = {}
    for values in members.values():
        nhwc = all(v in as_bytes and writes_pixels(producer[v]) and all(reads_pixels(r) for r in wr.consumers[v])
                   for v in values)
        layouts.update((v, "nhwc" if nhwc else "nchw") for v in values if v in as_bytes)
    wr._byte_plan = layouts
    return layouts


def byte_output(wr, out, pixel_major, reads_nhwc=None) -> str | None:
    """The layout in which the native int8 step writing ``out`` stores it as bytes, or None
    to keep the float image (``plan``)."""
    return plan(wr, pixel_major, reads_nhwc).get(out)


def image_at(ptr: str, count: int, as_bytes: bool, const: bool = False) -> str:
    """C for image ``img`` of a batch at ``ptr`` (a float pointer), ``count`` elements per
    image: float32 elements, or bytes when the image is stored as bytes."""
    if not as_bytes:
        return f"{ptr} + img * {count}"
    c = "const " if const else ""
    return f"({c}float *)(({c}uint8_t *){ptr} + img * {count})"


def byte_store(shift_out: int, q: str = "v") -> str:
    """C that turns a saturated q (a float, the C variable ``q``) into its stored byte."""
    return f"(uint8_t)(int32_t)({q} + {float(shift_out)}f)"
