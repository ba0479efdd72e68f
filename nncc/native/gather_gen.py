"""Gather whose indices or data are not float32 constants: ids known only at run time into
an embedding table, and columns picked out of an int32 or int64 tensor (the categorical
columns of a tabular model) by constant indices. Each index picks a block of ``inner``
elements, copied whole; the data may be float32, int32 or int64, the output the same.

An index may be negative (counted from the end, as ONNX allows). A constant index is
normalised and checked here, at compile time, and written into the code as a table. A
run-time index outside the axis is refused at run time: the step stores a flag in its
scratch and the partition's call fails, as the portable kernel raises, instead of reading
outside the table (codegen's ``status`` steps)."""

from __future__ import annotations

import math

import numpy as np

from nncc.native import kernel

INDEX_CTYPES = {"int32": "int32_t", "int64": "int64_t"}
DATA_CTYPES = {"float32": "float", **INDEX_CTYPES}


def constant_positions(indices, extent: int) -> np.ndarray | None:
    """Constant indices as positions in [0, extent), negatives counted from the end; None
    when one lies outside the axis (the node stays portable, whose kernel raises)."""
    flat = np.asarray(indices).astype(np.int64).reshape(-1)
    if flat.size and (flat.min() < -extent or flat.max() >= extent):
        return None
    return np.where(flat < 0, flat + extent, flat)


def emit(writer, node, positions: np.ndarray | None = None, axis: int | None = None) -> None:
    """The step of ``node`` (a Gather, or a Slice of integers along one ``axis``);
    ``positions``: its constant indices as ``constant_positions`` gives them, or None when
    they come at run time."""
    data, y = node.inputs[0], node.outputs[0]
    shape = writer.shape(data)
    axis = int(node.attrs.get("axis", 0) if axis is None else axis) % len(shape)
    outer, extent, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    ctype = DATA_CTYPES[str(writer.infos[data].dtype)]
    px, py = writer.ptr(data), writer.ptr(y)
    reads = [data] if ctype == "float" else [(data, f"const {ctype} *")]
    writes = [y] if ctype == "float" else [(y, f"{ctype} *")]
    copy = f"memcpy({py} + (o * COUNT + j) * {inner}, {px} + (o * {extent} + at) * {inner}, {inner} * sizeof({ctype}));"
    if positions is not None:
        count = int(positions.size)  # not 0: the entry's check refuses an empty pick
        table = ", ".join(map(str, positions.tolist()))
        copy = copy.replace("COUNT", str(count))
        if inner == 1:  # one element per pick (a column of a table): no memcpy call per element
            copy = f"{py}[o * {count} + j] = {px}[o * {extent} + at];"
        code = f"""static const int64_t picks[{count}] = {{{table}}};
for (int64_t o = 0; o < {outer}; o++)
    for (int64_t j = 0; j < {count}; j++) {{
        const int64_t at = picks[j];
        {copy}
    }}"""
        writer.step(code, reads, writes)
        return
    indices = node.inputs[1]
    count = math.prod(writer.shape(indices))
    copy = copy.replace("COUNT", str(count))
    pi = writer.ptr(indices)
    flag = f"*(int64_t *){kernel.SCRATCH}"
    code = f"""{flag} = 0;
for (int64_t j = 0; j < {count}; j++) {{
    int64_t at = (int64_t){pi}[j];
    if (at < 0) at += {extent};
    if (at < 0 || at >= {extent}) {{ {flag} = 1; return; }}
    for (int64_t o = 0; o < {outer}; o++)
        {copy}
}}"""
    index_ctype = INDEX_CTYPES[str(writer.infos[indices].dtype)]
    writer.step(code, reads + [(indices, f"const {index_ctype} *")], writes, scratch=8, status=True)


def concat(writer, node) -> None:
    """Concat of int32 or int64 values (picked ids joined into one index tensor): per row
    of the axes before ``axis``, each input's block copied in turn."""
    y = node.outputs[0]
    shape = writer.shape(y)
    axis = int(node.attrs["axis"]) % len(shape)
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    ctype = DATA_CTYPES[str(writer.infos[y].dtype)]
    width, lines, at = shape[axis] * inner, [], 0
    for x in node.inputs:
        block = writer.shape(x)[axis] * inner
        if block:
            lines.append(f"    memcpy({writer.ptr(y)} + o * {width} + {at}, {writer.ptr(x)} + o * {block}, "
                         f"{block} * sizeof({ctype}));")
        at += block
    code = f"for (int64_t o = 0; o < {outer}; o++) {{\n" + "\n".join(lines) + "\n}"
    writer.step(code, [(x, f"const {ctype} *") for x in dict.fromkeys(node.inputs)], [(y, f"{ctype} *")])
