"""Gather by indices known only at run time (token ids into an embedding table): each index
picks a row of ``inner`` floats, copied whole. An index may be negative (counted from the
end, as ONNX allows); one outside the axis is refused at run time: the step stores a flag
in its scratch and the partition's call fails, as the portable kernel raises, instead of
reading outside the table (codegen's ``status`` steps)."""

from __future__ import annotations

import math

from nncc.native import kernel

INDEX_CTYPES = {"int32": "int32_t", "int64": "int64_t"}


def emit(writer, node) -> None:
    data, indices, y = node.inputs[0], node.inputs[1], node.outputs[0]
    shape = writer.shape(data)
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    outer, extent, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    count = math.prod(writer.shape(indices))
    ctype = INDEX_CTYPES[str(writer.infos[indices].dtype)]
    px, pi, py = writer.ptr(data), writer.ptr(indices), writer.ptr(y)
    flag = f"*(int64_t *){kernel.SCRATCH}"
    code = f"""{flag} = 0;
for (int64_t j = 0; j < {count}; j++) {{
    int64_t at = (int64_t){pi}[j];
    if (at < 0) at += {extent};
    if (at < 0 || at >= {extent}) {{ {flag} = 1; return; }}
    for (int64_t o = 0; o < {outer}; o++)
        memcpy({py} + (o * {count} + j) * {inner}, {px} + (o * {extent} + at) * {inner}, {inner} * sizeof(float));
}}"""
    writer.step(code, [data, (indices, f"const {ctype} *")], [y], scratch=8, status=True)
