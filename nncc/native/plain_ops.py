"""Native C for the data-movement, reduction and normalisation ops of convnets, over plain
(NCHW, row-major) float32 data with static shapes: LRN, Pad, Slice, Split, Resize and
Upsample, Expand, Tile, Gather and GatherND with constant indices, the Reduce family, and
Softmax/LogSoftmax over an inner axis.

The ops that only move elements (Pad, Slice, Split, nearest Resize, Expand, Tile, Gather,
GatherND) are one generator, ``gather``, which also moves bool and integer values as they
are (all but Pad, the one that fills): per axis, the input position every output position reads
is computed here at compile time (with the numpy kernels' own attribute handling, so the
two backends agree), checked to lie inside the input, and written into the code as a
literal table or, for a run of consecutive positions, as a copy. A generated loop
therefore cannot leave its buffers whatever the attributes were. Linear and cubic Resize
use the numpy kernel's per-axis taps and weights the same way, one axis per pass.

``plan`` computes a node's step or says why it cannot be generated (its entry,
nncc/native/ops/data_movement.py, decides which nodes come here); ``emit`` adds the step
to the partition writer (nncc/native/codegen.py), which has already turned blocked inputs
back into NCHW.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nncc.errors import KernelError
from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.kernels import reduce as reduce_math
from nncc.kernels import resize as resize_math
from nncc.kernels import tensor as tensor_math
from nncc.kernels.registry import Ctx
from nncc.native.c_literal import c_float
from nncc.native.kernel import scratch_arg

F32 = np.dtype(np.float32)
GATHERS = {"Pad", "Slice", "Split", "Expand", "Tile", "Gather", "GatherND"}
# the element types a gather that fills nothing moves as they are (a mask, integers from a
# Cast): only inside a partition, whose edges carry float32 and run-time indices
# (nncc/native/arguments.py)
ELEMENT_CTYPES = {F32: "float", np.dtype(np.bool_): "uint8_t", np.dtype(np.int32): "int32_t",
                  np.dtype(np.int64): "int64_t"}
TYPED_GATHERS = GATHERS - {"Pad"}
REDUCES = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
           "ReduceL2"}
OPS = GATHERS | REDUCES | {"LRN", "Resize", "Upsample", "Softmax", "LogSoftmax"}


class Refused(Exception):
    """Why a node cannot be generated."""


def plan(node: Node, graph: Graph, infos: dict[str, TensorInfo]):
    """What ``node``'s step computes (per output a Gather, else an Lrn, Reduce,
    InnerSoftmax or Resample); raises Refused saying why it cannot be generated."""
    return _plan(node, _View(graph, infos))


def emit(writer, node: Node, plan) -> None:
    """Add ``node``'s step, as ``plan`` says, to ``writer``: it reads the data input and
    writes every output."""
    ptr = writer.ptr
    outputs = [o for o in node.outputs if o]
    support, code, scratch = "", [], 0
    if isinstance(plan, list):  # gathers, one per output
        ctype = element_ctype(writer.infos, node.inputs[0])
        for i, (gather, out) in enumerate(zip(plan, outputs)):
            s, c = gather_code(gather, ptr(node.inputs[0]), ptr(out), f"gather{i}", ctype)
            support += s
            code.append(c)
        if ctype != "float":
            writer.step("\n".join(code) or ";", [(node.inputs[0], f"const {ctype} *")],
                        [(o, f"{ctype} *") for o in outputs], support=support)
            return
    else:
        x, y = ptr(node.inputs[0]), ptr(outputs[0])
        if isinstance(plan, Lrn):
            s, c = lrn_code(plan.shape, plan.size, plan.alpha, plan.beta, plan.bias, x, y)
        elif isinstance(plan, Reduce):
            s, c = reduce_code(plan.op, plan.shape, plan.axes, x, y)
        elif isinstance(plan, InnerSoftmax):
            s, c = softmax_code(plan.outer, plan.n, plan.inner, plan.log, x, y)
        else:
            s, c, scratch = interpolate_code((plan.shape, plan.passes), x, y)
        support, code = s, [c]
    writer.step("\n".join(code) or ";", node.inputs[:1], outputs, scratch, support=support)


# -- what a node is ---------------------------------------------------------------------------


class _View:
    """Shapes and compile-time contents of a graph's values."""

    def __init__(self, graph: Graph, infos: dict[str, TensorInfo]):
        self.graph, self.infos = graph, infos

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.infos[name].shape)

    def const(self, name: str | None, what: str) -> np.ndarray | None:
        """The constant contents of an optional input (None when omitted)."""
        if not name:
            return None
        if name in self.graph.initializers:
            return np.asarray(self.graph.initializers[name])
        info = self.infos.get(name)
        if info is None or info.value is None:
            raise Refused(f"{what} is not a constant")
        return np.asarray(info.value)

    def ctx(self, node: Node) -> Ctx:
        return Ctx(node.attrs, self.graph.opset(node.domain), len(node.outputs), node.name)


def _static_f32(info: TensorInfo | None) -> bool:
    return info is not None and info.dtype == F32 and info.is_static


def _plan(node: Node, view: _View):
    op = node.op_type
    outputs = [o for o in node.outputs if o]
    data = node.inputs[0] if node.inputs else ""
    if op not in TYPED_GATHERS or _static_f32(view.infos.get(data)):
        for name in [data] + outputs:
            if not _static_f32(view.infos.get(name)):
                raise Refused(f"value {name!r} is not a static float32 tensor")
    else:
        _check_typed(data, outputs, view)
    if op == "Split" and len(outputs) != len(node.outputs):
        raise Refused("Split with an omitted output")
    try:
        if op == "Pad":
            plans = [_pad(node, view)]
        elif op == "Slice":
            plans = [_slice(node, view)]
        elif op == "Split":
            plans = _split(node, view)
        elif op == "Expand":
            plans = [_expand(node, view)]
        elif op == "Tile":
            plans = [_tile(node, view)]
        elif op == "Gather":
            plans = [_gather(node, view)]
        elif op == "GatherND":
            plans = [_gather_nd(node, view)]
        elif op in ("Resize", "Upsample"):
            return _resize(node, view)
        elif op == "LRN":
            return _lrn(node, view)
        elif op in REDUCES:
            return _reduce(node, view)
        else:
            return _softmax(node, view)
    except KernelError as why:  # the numpy kernel's own attribute checks
        raise Refused(str(why)) from None
    for plan, out in zip(plans, outputs):
        if plan.out_shape != view.shape(out):
            raise Refused(f"output shape {list(view.shape(out))} differs from {list(plan.out_shape)}")
    return plans


def _check_typed(data: str, outputs: list[str], view: _View) -> None:
    """A gather of a bool or integer value: static, its outputs of its type, and computed
    at run time (a constant of another type is packed as float32, so not readable so)."""
    info = view.infos.get(data)
    if info is None or info.dtype not in ELEMENT_CTYPES or not info.is_static:
        raise Refused(f"value {data!r} is not a static float32, bool, int32 or int64 tensor")
    if data in view.graph.initializers or info.value is not None:
        raise Refused(f"a {info.dtype} constant {data!r} (packed constants are float32)")
    for name in outputs:
        out = view.infos.get(name)
        if out is None or out.dtype != info.dtype or not out.is_static:
            raise Refused(f"value {name!r} is not a static {info.dtype} tensor")


def element_ctype(infos: dict[str, TensorInfo], name: str) -> str:
    """The C type of one element of ``name`` (float for a float32 value)."""
    return ELEMENT_CTYPES[infos[name].dtype]


# -- element gathers ---------------------------------------------------------------------------


class Gather:
    """out[o_0, ..., o_r] = x[t_0[o_0], ..., t_r[o_r]], or ``fill`` where any t_d[o_d] is -1.
    ``tables[d]`` is None for an axis read as it is."""

    def __init__(self, in_shape, tables, fill: float = 0.0):
        self.in_shape = tuple(int(d) for d in in_shape)
        self.tables = [None if t is None else np.asarray(t, np.int64).reshape(-1) for t in tables]
        self.fill = float(fill)
        self.sizes = tuple(d if t is None else int(t.size) for d, t in zip(self.in_shape, self.tables))
        self.out_shape = self.sizes  # the output's shape: the same elements in another shape for Gather
        for d, t in zip(self.in_shape, self.tables):
            # every position inside the input: what keeps the generated loops in bounds
            # (an empty output reads nothing)
            if t is not None and t.size and math.prod(self.sizes) and (t.min() < -1 or t.max() >= d):
                raise AssertionError(f"gather table outside [0, {d}): a generator bug")


def _pad(node: Node, view: _View) -> Gather:
    ctx = view.ctx(node)
    mode = tensor_math.pad_mode(ctx, KernelError)
    shape = view.shape(node.inputs[0])
    ins = list(node.inputs) + [""] * 4
    pads = view.const(ins[1], "Pad pads") if ctx.opset >= 11 else None
    axes = view.const(ins[3], "Pad axes") if ctx.opset >= 18 else None
    widths = tensor_math.pad_widths(ctx, len(shape), pads, axes, KernelError)
    value = tensor_math.pad_value(ctx, view.const(ins[2], "Pad value") if ctx.opset >= 11 else None)
    tables = []
    for d, (before, after) in zip(shape, widths):
        if before == after == 0:
            tables.append(None)
            continue
        if mode != "constant" and (before < 0 or after < 0):
            raise Refused(f"negative pads in mode {mode!r}")
        if mode != "constant" and d == 0:
            raise Refused(f"Pad mode {mode!r} of an empty axis")
        if mode == "reflect" and max(before, after) > d - 1:
            raise Refused(f"reflect pads {before, after} larger than the axis ({d}) less one")
        if mode == "wrap" and max(before, after) > d:
            raise Refused(f"wrap pads {before, after} larger than the axis ({d})")
        if d + before + after < 0:
            raise Refused(f"pads {before, after} remove more than the axis ({d})")
        index = np.arange(d, dtype=np.int64)[max(-before, 0):d - max(-after, 0)]  # negative pads crop
        widths_kept = (max(before, 0), max(after, 0))
        if mode == "constant":
            tables.append(np.pad(index, widths_kept, constant_values=-1))
        else:
            tables.append(np.pad(index, widths_kept, mode=mode))
    return Gather(shape, tables, float(np.float32(value)))


def _slice(node: Node, view: _View) -> Gather:
    ctx = view.ctx(node)
    shape = view.shape(node.inputs[0])
    ins = list(node.inputs) + [""] * 5
    values = [view.const(ins[i], f"Slice input {i}") if ctx.opset >= 10 else None for i in range(1, 5)]
    lists = tensor_math.slice_inputs(ctx, *values, KernelError)
    tables: list = [None] * len(shape)
    for axis, start, end, step in tensor_math.slice_spec(ctx, len(shape), *lists, KernelError):
        bounds, length = tensor_math.slice_bounds(shape[axis], start, end, step)
        tables[axis] = np.arange(shape[axis], dtype=np.int64)[bounds][:length]
    return Gather(shape, tables)


def _split(node: Node, view: _View) -> list[Gather]:
    """Each output a run of the axis: its length read from the output's own shape."""
    shape = view.shape(node.inputs[0])
    axis = int(node.attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        raise Refused(f"axis {axis} out of range")
    axis %= len(shape)
    plans, offset = [], 0
    for out in node.outputs:
        width = view.shape(out)[axis]
        tables: list = [None] * len(shape)
        tables[axis] = np.arange(offset, offset + width)
        if offset + width > shape[axis]:
            raise Refused("split sizes exceed the axis")
        plans.append(Gather(shape, tables))
        offset += width
    if offset != shape[axis]:
        raise Refused("split sizes do not cover the axis")
    return plans


def _broadcast_tables(in_shape, out_shape) -> Gather:
    """``in_shape`` (left-padded with 1s) read broadcast to ``out_shape``."""
    padded = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    tables = []
    for d, o in zip(padded, out_shape):
        if d == o:
            tables.append(None)
        elif d == 1:
            tables.append(np.zeros(o, np.int64))
        else:
            raise Refused(f"shape {list(in_shape)} does not broadcast to {list(out_shape)}")
    return Gather(padded, tables)


def _expand(node: Node, view: _View) -> Gather:
    out = view.shape(node.outputs[0])
    if len(out) < len(view.shape(node.inputs[0])):
        raise Refused("Expand to a lower rank")
    return _broadcast_tables(view.shape(node.inputs[0]), out)


def _tile(node: Node, view: _View) -> Gather:
    shape = view.shape(node.inputs[0])
    repeats = view.const(node.inputs[1] if len(node.inputs) > 1 else "", "Tile repeats")
    if repeats is None or repeats.size != len(shape) or np.any(repeats < 0):
        raise Refused("Tile repeats are not one non-negative count per axis")
    tables = [None if r == 1 else np.arange(d * int(r)) % max(d, 1) for d, r in zip(shape, repeats.tolist())]
    return Gather(shape, tables)


def _gather(node: Node, view: _View) -> Gather:
    shape = view.shape(node.inputs[0])
    indices = view.const(node.inputs[1], "Gather indices")
    axis = int(node.attrs.get("axis", 0))
    if indices.dtype.kind not in "iu" or not -len(shape) <= axis < len(shape):
        raise Refused("Gather indices are not integers, or the axis is out of range")
    axis %= len(shape)
    flat = indices.astype(np.int64).reshape(-1)
    if flat.size and (flat.min() < -shape[axis] or flat.max() >= shape[axis]):
        raise Refused("Gather index out of range")
    tables: list = [None] * len(shape)
    tables[axis] = np.where(flat < 0, flat + shape[axis], flat)
    gather = Gather(shape, tables)
    # the output has the indices' shape in place of the axis: the same elements in order
    gather.out_shape = shape[:axis] + tuple(indices.shape) + shape[axis + 1:]
    return gather


def _gather_nd(node: Node, view: _View) -> Gather:
    """GatherND with constant indices and no batch axes (how torch's exporter writes
    ``x[rows, cols]``): the first k axes of the data, one axis of prod(dims) rows in
    memory, read through one table of row numbers."""
    shape = view.shape(node.inputs[0])
    indices = view.const(node.inputs[1], "GatherND indices")
    if int(node.attrs.get("batch_dims", 0)):
        raise Refused("GatherND with batch_dims")
    if indices.dtype.kind not in "iu" or indices.ndim < 1 or not 1 <= indices.shape[-1] <= len(shape):
        raise Refused("GatherND indices that are not integer tuples of at most the data's rank")
    k = indices.shape[-1]
    dims, rest = shape[:k], shape[k:]
    tuples = indices.astype(np.int64).reshape(-1, k)
    sizes = np.asarray(dims, np.int64)
    if tuples.size and ((tuples < -sizes).any() or (tuples >= sizes).any()):
        raise Refused("GatherND index out of range")
    tuples = np.where(tuples < 0, tuples + sizes, tuples)
    rows = np.ravel_multi_index(tuple(tuples.T), dims) if tuples.size else np.zeros(0, np.int64)
    gather = Gather((math.prod(dims),) + tuple(rest), [rows] + [None] * len(rest))
    gather.out_shape = tuple(indices.shape[:-1]) + tuple(rest)  # the same elements in order
    return gather


def _axes_of(gather: Gather):
    """(out size, in size, input stride, table or None, run start) per axis, with axes of one
    output position folded into a base offset and runs merged with the identity axes inside
    them; tables hold input offsets (position times stride), -1 for the fill value."""
    shape = gather.in_shape
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    base, axes = 0, []
    for d, table in enumerate(gather.tables):
        n_in, n_out = shape[d], gather.sizes[d]
        start = 0
        if table is not None and table.size and table.min() >= 0 and \
                np.array_equal(table, np.arange(table[0], table[0] + table.size)):
            start, table = int(table[0]), None  # a run of consecutive positions
        if table is None and n_out == 1:
            base += start * strides[d]
            continue
        axes.append([n_out, n_in, strides[d], table, start])
    merged: list = []
    for axis in axes:
        if merged and merged[-1][3] is None and axis[3] is None and axis[4] == 0 and axis[0] == axis[1] \
                and merged[-1][2] == axis[1] * axis[2]:
            prev = merged[-1]
            merged[-1] = [prev[0] * axis[0], prev[1] * axis[1], axis[2], None, prev[4] * axis[1]]
        else:
            merged.append(axis)
    out = []
    for n_out, n_in, stride, table, start in merged:
        if table is not None:
            table = np.where(table < 0, -1, table * stride)
        out.append((n_out, n_in, stride, table, start))
    return base, out


def _segments(table: np.ndarray) -> list[tuple[str, int, int, int]]:
    """A last-axis table (offsets, stride 1) as (kind, first output, count, first input)
    pieces: "fill" runs, "copy" runs of consecutive inputs, "pick" single positions."""
    pieces: list[list] = []
    for j, v in enumerate(table.tolist()):
        last = pieces[-1] if pieces else None
        if v < 0:
            if last and last[0] == "fill":
                last[2] += 1
                continue
            pieces.append(["fill", j, 1, 0])
        elif last and last[0] in ("copy", "pick") and v == last[3] + last[2]:
            last[0], last[2] = "copy", last[2] + 1
        else:
            pieces.append(["pick", j, 1, v])
    return [tuple(p) for p in pieces]


def gather_code(gather: Gather, x: str, y: str, name: str, ctype: str = "float") -> tuple[str, str]:
    """C for one gather of ``ctype`` elements: parallel over output rows (every axis but
    the last)."""
    total = math.prod(gather.sizes)
    if total == 0:
        return "", ""
    fill = c_float(gather.fill) if ctype == "float" else f"({ctype})0"  # only Pad fills, float32 only
    base, axes = _axes_of(gather)
    if not axes:
        return "", f"{y}[0] = {x}[{base}];"
    tables, body = [], []
    outer, (n_last, _, stride_last, table_last, start_last) = axes[:-1], axes[-1]
    rows = math.prod(a[0] for a in outer)
    body.append(f"int64_t rem = t, off = {base};")
    for d in range(len(outer) - 1, -1, -1):
        n_out, _, stride, table, start = outer[d]
        body.append(f"const int64_t i{d} = rem % {n_out}; rem /= {n_out};")
        if table is None:
            body.append(f"off += (i{d} + {start}) * {stride};")
        else:
            tables.append(_table(f"{name}_t{d}", table))
            if table.min() < 0:
                body.append(f"if ({name}_t{d}[i{d}] < 0) {{ for (int64_t j = 0; j < {n_last}; j++) "
                            f"yr[j] = {fill}; continue; }}")
            body.append(f"off += {name}_t{d}[i{d}];")
    body.insert(0, f"{ctype} *yr = y + t * {n_last};")
    if table_last is None:
        if stride_last == 1:
            body.append(f"memcpy(yr, x + off + {start_last}, {n_last} * sizeof({ctype}));")
        else:
            body.append(f"for (int64_t j = 0; j < {n_last}; j++) yr[j] = x[off + (j + {start_last}) * {stride_last}];")
    else:
        pieces = _segments(table_last) if stride_last == 1 else []
        if pieces and len(pieces) <= 8 and any(p[0] != "pick" for p in pieces):
            for kind, j0, count, src in pieces:
                if kind == "fill":
                    body.append(f"for (int64_t j = {j0}; j < {j0 + count}; j++) yr[j] = {fill};")
                elif kind == "copy":
                    body.append(f"memcpy(yr + {j0}, x + off + {src}, {count} * sizeof({ctype}));")
                else:
                    body.append(f"yr[{j0}] = x[off + {src}];")
        else:
            tables.append(_table(f"{name}_tl", table_last))
            read = f"x[off + {name}_tl[j]]"
            if table_last.min() < 0:
                read = f"({name}_tl[j] < 0 ? {fill} : {read})"
            body.append(f"for (int64_t j = 0; j < {n_last}; j++) yr[j] = {read};")
    return _task(name, ["x", "y"], [x, y], rows, total, body, "".join(tables), ctype)


def _table(name: str, values: np.ndarray) -> str:
    kind = "int32_t" if values.max(initial=0) < 2 ** 31 else "int64_t"
    return f"static const {kind} {name}[{values.size}] = {{{', '.join(map(str, values.tolist()))}}};\n"


def _task(name: str, names: list[str], pointers: list[str], tasks: int, work: int, body: list[str],
          statics: str = "", ctype: str = "float") -> tuple[str, str]:
    """(support, call): ``body`` run for every task index t in [0, tasks), split over the
    thread pool, with the buffers ``pointers`` (of ``ctype`` elements) known inside it as
    ``names``: the last one written, the others read."""
    lines = "\n    ".join(body)
    fields = " ".join([f"const {ctype} *{n};" for n in names[:-1]] + [f"{ctype} *{names[-1]};"])
    unpack = " ".join([f"const {ctype} *{n} = a->{n};" for n in names[:-1]]
                      + [f"{ctype} *{names[-1]} = a->{names[-1]};"])
    support = f"""{statics}
typedef struct {{ {fields} }} {name}_job;
static void {name}(void *p, int64_t lo, int64_t hi) {{
  const {name}_job *a = p;
  {unpack}
  for (int64_t t = lo; t < hi; t++) {{
    {lines}
  }}
}}
"""
    call = (f"{{ {name}_job a = {{{', '.join(pointers)}}}; "
            f"nn_parallel({tasks}, {work}, {name}, &a); }}")
    return support, call


# -- Resize -----------------------------------------------------------------------------------


def _resize(node: Node, view: _View):
    ctx = view.ctx(node)
    shape = view.shape(node.inputs[0])
    out_shape = view.shape(node.outputs[0])
    if not shape:
        raise Refused("Resize of a scalar")
    ins = list(node.inputs) + [""] * 4
    if node.op_type == "Upsample":
        scales = ctx.get("scales") if ctx.opset < 9 else view.const(ins[1], "scales")
        if scales is None or np.any(np.asarray(scales, np.float32) < 1):
            raise Refused("Upsample scales below 1")
        ctx = Ctx(node.attrs, 10)  # Upsample is Resize-10 with scales >= 1
        roi, sizes = None, None
    elif ctx.opset < 11:
        roi, scales, sizes = None, view.const(ins[1], "scales"), None
    else:
        roi, scales, sizes = (view.const(ins[i], name) for i, name in ((1, "roi"), (2, "scales"), (3, "sizes")))
    opts = resize_math.resize_options(ctx, KernelError)
    out_sizes, factors = resize_math.resize_plan(ctx, shape, scales, sizes, KernelError)
    if tuple(out_sizes) != out_shape:
        raise Refused(f"output shape {list(out_shape)} differs from {out_sizes}")
    axes = resize_math.resize_axes(ctx, len(shape), KernelError)
    roi_of = {}
    if opts["coord"] == "tf_crop_and_resize":
        if not resize_math.is_present(roi) or np.asarray(roi).size != 2 * len(axes):
            raise Refused("tf_crop_and_resize without a matching roi")
        flat = np.asarray(roi, np.float32).reshape(-1)
        roi_of = {a: (flat[i], flat[len(axes) + i]) for i, a in enumerate(axes)}
    resized = []
    for a in axes:
        lo, hi = roi_of.get(a, (0.0, 1.0))
        if out_sizes[a] == shape[a] and factors[a] == 1.0 and lo == 0.0 and hi == 1.0 \
                and opts["coord"] != "half_pixel_symmetric":
            continue
        resized.append((a, lo, hi))
    if math.prod(out_shape) == 0 or not resized:  # nothing to write, or a copy
        return [Gather(shape, [None if shape[d] == out_shape[d] else np.zeros(out_shape[d], np.int64)
                               for d in range(len(shape))])]
    if math.prod(shape) == 0:
        raise Refused("Resize of an empty input")
    if opts["mode"] == "nearest":
        tables: list = [None] * len(shape)
        for a, lo, hi in resized:
            index, outside = resize_math.nearest_plan(shape[a], out_sizes[a], factors[a], opts, lo, hi)
            index = np.asarray(index, np.int64)
            if outside is None and np.array_equal(index, np.arange(shape[a])):
                continue  # an axis read as it is
            if outside is not None:
                index = np.where(outside, -1, index)
            tables[a] = index
        return [Gather(shape, tables, opts["extrapolation"] if roi_of else 0.0)]
    passes = []
    for a, lo, hi in resized:
        x, outside = resize_math.source_coords(shape[a], out_sizes[a], factors[a], opts, lo, hi)
        index, weights = resize_math.filter_taps(opts["mode"], x, shape[a], factors[a], opts["antialias"],
                                                  opts["cubic_a"], opts["exclude_outside"])
        index, weights = np.asarray(index, np.int64), np.asarray(weights, np.float32)
        positions = np.arange(shape[a])
        if outside is None and out_sizes[a] == shape[a] and \
                np.all(np.where(index == positions, weights, 0.0).sum(axis=0) == 1.0) and \
                np.all(np.where(index == positions, 0.0, weights) == 0.0):
            continue  # every output reads its own position: nothing to do on this axis
        passes.append(Interp(a, shape[a], out_sizes[a], index, weights, outside, opts["extrapolation"]))
    if not passes:
        return [Gather(shape, [None] * len(shape))]
    return Resample(tuple(shape), tuple(passes))


@dataclass(frozen=True)
class Resample:
    """A linear or cubic Resize: one Interp pass per resized axis of ``shape``."""

    shape: tuple[int, ...]
    passes: tuple["Interp", ...]


class Interp:
    """One axis of a linear or cubic Resize: out[o] = sum_k weights[k, o] * in[index[k, o]],
    or ``fill`` where ``outside`` (tf_crop_and_resize)."""

    def __init__(self, axis, n_in, n_out, index, weights, outside, fill):
        self.axis, self.n_in, self.n_out = axis, n_in, n_out
        self.index, self.weights, self.outside, self.fill = index, weights, outside, float(fill)
        if index.size and (index.min() < 0 or index.max() >= n_in):
            raise AssertionError("interpolation tap outside the input: a generator bug")


def interpolate_code(plan, x: str, y: str) -> tuple[str, str, int]:
    """One pass per resized axis, each reading the previous pass's result; intermediates
    in the step's scratch, two buffers used in turn."""
    shape, passes = plan
    shape = list(shape)
    sizes, current = [], list(shape)
    for p in passes:
        current[p.axis] = p.n_out
        sizes.append(math.prod(current))
    scratch_a = max([s for i, s in enumerate(sizes[:-1]) if i % 2 == 0], default=0)
    scratch_b = max([s for i, s in enumerate(sizes[:-1]) if i % 2 == 1], default=0)
    scratch = (_round_up(scratch_a) + scratch_b) * 4
    buffers = [f"(float *){scratch_arg(scratch)}", f"((float *){scratch_arg(scratch)} + {_round_up(scratch_a)})"]
    support, calls, source, current = "", [], x, list(shape)
    for i, p in enumerate(passes):
        target = y if i == len(passes) - 1 else buffers[i % 2]
        pre, post = math.prod(current[:p.axis]), math.prod(current[p.axis + 1:])
        s, c = _interp_pass(p, pre, post, source, target, f"interp{i}")
        support += s
        calls.append(c)
        current[p.axis] = p.n_out
        source = target
    return support, "\n".join(calls), scratch


def _round_up(n: int) -> int:
    return (n + 15) // 16 * 16  # floats: keeps the second buffer 64-byte aligned


def _interp_pass(p: Interp, pre: int, post: int, x: str, y: str, name: str) -> tuple[str, str]:
    taps = p.index.shape[0]
    weights = ", ".join(c_float(v) for v in p.weights.T.reshape(-1))
    statics = _table(f"{name}_i", p.index.T.reshape(-1)) + \
        f"static const float {name}_w[{p.weights.size}] = {{{weights}}};\n"
    outside = ""
    if p.outside is not None:
        statics += _table(f"{name}_o", p.outside.astype(np.int64))
        outside = f"if ({name}_o[o]) {{ for (int64_t q = 0; q < {post}; q++) yr[q] = {c_float(p.fill)}; continue; }}"
    if post == 1:  # the innermost axis: each output a short dot product
        body = [f"const float *xr = x + t * {p.n_in}; float *yrow = y + t * {p.n_out};",
                f"for (int64_t o = 0; o < {p.n_out}; o++) {{",
                f"  const int32_t *ix = {name}_i + o * {taps}; const float *w = {name}_w + o * {taps};",
                "  float s = 0.0f;",
                f"  for (int k = 0; k < {taps}; k++) s += w[k] * xr[ix[k]];",
                "  yrow[o] = s;",
                "}"]
        if p.outside is not None:
            body.insert(2, f"  if ({name}_o[o]) {{ yrow[o] = {c_float(p.fill)}; continue; }}")
        return _task(name, ["x", "y"], [x, y], pre, pre * p.n_out * taps, body, statics)
    # an outer axis: each output row a weighted sum of whole input rows
    body = [f"const int64_t o = t % {p.n_out}, r = t / {p.n_out};",
            f"float *yr = y + t * {post};",
            "do {",
            f"  {outside}",
            f"  const int32_t *ix = {name}_i + o * {taps}; const float *w = {name}_w + o * {taps};",
            f"  const float *x0 = x + (r * {p.n_in} + ix[0]) * {post};",
            f"  for (int64_t q = 0; q < {post}; q++) yr[q] = w[0] * x0[q];",
            f"  for (int k = 1; k < {taps}; k++) {{",
            f"    const float *xk = x + (r * {p.n_in} + ix[k]) * {post}; const float wk = w[k];",
            f"    for (int64_t q = 0; q < {post}; q++) yr[q] += wk * xk[q];",
            "  }",
            "} while (0);"]
    return _task(name, ["x", "y"], [x, y], pre * p.n_out, pre * p.n_out * post * taps, body, statics)


# -- LRN --------------------------------------------------------------------------------------


def _lrn(node: Node, view: _View):
    shape = view.shape(node.inputs[0])
    if len(shape) != 4:
        raise Refused("LRN of other than 4-D data")
    a = node.attrs
    size = int(a.get("size", 0))
    if size < 1:
        raise Refused("LRN size below 1")
    return Lrn(shape, size, float(a.get("alpha", 1e-4)), float(a.get("beta", 0.75)), float(a.get("bias", 1.0)))


@dataclass(frozen=True)
class Lrn:
    shape: tuple[int, ...]
    size: int
    alpha: float
    beta: float
    bias: float


def lrn_code(shape, size: int, alpha: float, beta: float, bias: float, x: str, y: str) -> tuple[str, str]:
    """y = x / (bias + alpha / size * (sum of x^2 over the channel window)) ^ beta, the window
    [c - (size - 1) / 2, c + size / 2] clipped to the channels; 64 positions at a time."""
    n, c, hw = shape[0], shape[1], math.prod(shape[2:])
    if n * c * hw == 0:
        return "", ""
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    if beta == 0.75:  # d^-0.75 without powf: vectorizes
        scale = "1.0f / (sqrtf(d) * sqrtf(sqrtf(d)))"
    elif beta == 0.5:
        scale = "1.0f / sqrtf(d)"
    else:
        scale = f"powf(d, {c_float(-beta)})"
    body = [f"const int64_t ch = t % {c}, img = t / {c};",
            f"const int64_t c0 = ch < {lo} ? 0 : ch - {lo}, c1 = ch + {hi} > {c - 1} ? {c - 1} : ch + {hi};",
            f"const float *xi = x + img * {c * hw}; const float *xc = x + t * {hw}; float *yc = y + t * {hw};",
            f"for (int64_t i0 = 0; i0 < {hw}; i0 += 64) {{",
            f"  const int64_t m = {hw} - i0 < 64 ? {hw} - i0 : 64;",
            "  float s[64];",
            "  for (int64_t i = 0; i < m; i++) s[i] = 0.0f;",
            "  for (int64_t k = c0; k <= c1; k++) {",
            f"    const float *xk = xi + k * {hw} + i0;",
            "    for (int64_t i = 0; i < m; i++) s[i] += xk[i] * xk[i];",
            "  }",
            f"  for (int64_t i = 0; i < m; i++) {{ const float d = {c_float(bias)} + {c_float(alpha / size)} * s[i]; "
            f"yc[i0 + i] = xc[i0 + i] * ({scale}); }}",
            "}"]
    return _task("lrn_task", ["x", "y"], [x, y], n * c, n * c * hw * size, body)


# -- reductions -------------------------------------------------------------------------------

# (initial value, accumulate a with v, final value from a and the count)
_REDUCTIONS = {
    "ReduceSum": ("0.0f", "a + v", "a"),
    "ReduceMean": ("0.0f", "a + v", "a / (float)COUNT"),
    "ReduceMax": ("(-INFINITY)", "(a > v || a != a) ? a : v", "a"),
    "ReduceMin": ("INFINITY", "(a < v || a != a) ? a : v", "a"),
    "ReduceProd": ("1.0f", "a * v", "a"),
    "ReduceSumSquare": ("0.0f", "a + v * v", "a"),
    "ReduceL1": ("0.0f", "a + fabsf(v)", "a"),
    "ReduceL2": ("0.0f", "a + v * v", "sqrtf(a)"),
}


def _reduce(node: Node, view: _View):
    ctx = view.ctx(node)
    shape = view.shape(node.inputs[0])
    since = 13 if node.op_type == "ReduceSum" else 18
    if ctx.opset < since:
        axes = ctx.get("axes") or None
    else:
        axes = reduce_math.axes_from_input(view.const(node.inputs[1] if len(node.inputs) > 1 else "", "axes"))
        if axes is None and ctx.get("noop_with_empty_axes", 0):
            return Reduce(node.op_type, shape, ())  # a copy
    axes = reduce_math.norm_axes(range(len(shape)) if axes is None else axes, len(shape), KernelError)
    if any(shape[a] == 0 for a in axes):
        raise Refused("reduction over an empty axis")
    if math.prod(view.shape(node.outputs[0])) != math.prod(d for i, d in enumerate(shape) if i not in axes):
        raise Refused("output shape does not match the reduction")
    return Reduce(node.op_type, shape, tuple(axes))


@dataclass(frozen=True)
class Reduce:
    op: str  # the Reduce op: its start, step and finish (_REDUCTIONS)
    shape: tuple[int, ...]
    axes: tuple[int, ...]  # reduced; none: a copy


def reduce_code(op: str, shape, axes, x: str, y: str) -> tuple[str, str]:
    """Reduced and kept axes merged into alternating groups; parallel over the first group
    when it is kept. The innermost group accumulates in a register when it is reduced."""
    total = math.prod(shape)
    if total == 0:
        return "", ""
    if not axes:
        return "", f"memcpy({y}, {x}, {total} * sizeof(float));"
    groups: list[list] = []  # [size, reduced]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        red = d in axes
        if groups and groups[-1][1] == red:
            groups[-1][0] *= n
        else:
            groups.append([n, red])
    init, acc, final = _REDUCTIONS[op]
    count = math.prod(shape[a] for a in axes)
    final = final.replace("COUNT", str(count))
    if not groups:
        groups = [[1, False]]
    kept_total = math.prod(g[0] for g in groups if not g[1])
    par = not groups[0][1]
    tasks = groups[0][0] if par else 1
    per_task = kept_total // tasks  # outputs each task owns
    inner = groups[1:] if par else groups
    body = [f"float *yt = y + t * {per_task}; const float *xt = x + t * {total // tasks};",
            f"for (int64_t k = 0; k < {per_task}; k++) yt[k] = {init};"]
    # loops over the remaining groups: input offsets run in order, output offsets over kept ones
    out_strides, stride = [], 1
    for size, red in reversed(inner):
        out_strides.insert(0, 0 if red else stride)
        if not red:
            stride *= size
    in_strides, stride = [], 1
    for size, _ in reversed(inner):
        in_strides.insert(0, stride)
        stride *= size
    depth = len(inner)
    last_reduced = depth and inner[-1][1]
    loops = depth - 1 if last_reduced else depth
    for d in range(loops):
        body.append(f"{'  ' * d}for (int64_t i{d} = 0; i{d} < {inner[d][0]}; i{d}++) {{")
    xi = " + ".join([f"i{d} * {in_strides[d]}" for d in range(loops)]) or "0"
    yi = " + ".join([f"i{d} * {out_strides[d]}" for d in range(loops) if out_strides[d]]) or "0"
    pad = "  " * loops
    if last_reduced:  # eight independent partial results, so the loop vectorizes
        n = inner[-1][0]
        combine = acc if op in ("ReduceMax", "ReduceMin", "ReduceProd") else "a + v"
        body.append(f"{pad}{{ const float *xr = xt + {xi}; float l[8]; int64_t j = 0;")
        body.append(f"{pad}  for (int k = 0; k < 8; k++) l[k] = {init};")
        body.append(f"{pad}  for (; j + 8 <= {n}; j += 8) for (int k = 0; k < 8; k++) "
                    f"{{ const float a = l[k], v = xr[j + k]; l[k] = {acc}; }}")
        body.append(f"{pad}  float a = yt[{yi}];")
        body.append(f"{pad}  for (; j < {n}; j++) {{ const float v = xr[j]; a = {acc}; }}")
        body.append(f"{pad}  for (int k = 0; k < 8; k++) {{ const float v = l[k]; a = {combine}; }}")
        body.append(f"{pad}  yt[{yi}] = a; }}")
    else:
        body.append(f"{pad}{{ const float v = xt[{xi}]; const float a = yt[{yi}]; yt[{yi}] = {acc}; }}")
    for d in range(loops - 1, -1, -1):
        body.append(f"{'  ' * d}}}")
    if final != "a":
        body.append(f"for (int64_t k = 0; k < {per_task}; k++) {{ const float a = yt[k]; yt[k] = {final}; }}")
    return _task("reduce_task", ["x", "y"], [x, y], tasks, total, body)


# -- Softmax over an inner axis -------------------------------------------------------------


def inner_softmax_axis(node: Node, graph: Graph, infos) -> int | None:
    """The axis when it is not the last (opset 13 on); None otherwise."""
    info = infos.get(node.inputs[0]) if node.inputs else None
    if graph.opset(node.domain) < 13 or info is None or info.shape is None or not info.shape:
        return None
    rank = len(info.shape)
    axis = int(node.attrs.get("axis", -1))
    if not -rank <= axis < rank:
        return None
    axis %= rank
    return axis if axis != rank - 1 else None


def _softmax(node: Node, view: _View):
    axis = inner_softmax_axis(node, view.graph, view.infos)
    if axis is None:
        raise Refused("softmax over the last axis is not written here")
    shape = view.shape(node.inputs[0])
    return InnerSoftmax(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]),
                        node.op_type == "LogSoftmax")


@dataclass(frozen=True)
class InnerSoftmax:
    """Softmax (``log``: LogSoftmax) over the middle axis of [outer, n, inner]."""

    outer: int
    n: int
    inner: int
    log: bool


def softmax_code(outer: int, n: int, inner: int, log: bool, x: str, y: str) -> tuple[str, str]:
    """Over [outer, n, inner] along n: 64 columns at a time, each pass along n reading
    whole rows of them (unit stride)."""
    if outer * n * inner == 0:
        return "", ""
    finish = ("for (int64_t j = 0; j < m; j++) s[j] = m_[j] + logf(s[j]);",
              "yr[j] = xr[j] - s[j];") if log else \
        ("for (int64_t j = 0; j < m; j++) s[j] = 1.0f / s[j];", "yr[j] *= s[j];")
    store = "" if log else "yr[j] = e; "
    body = [f"const float *xo = x + t * {n * inner}; float *yo = y + t * {n * inner};",
            f"for (int64_t j0 = 0; j0 < {inner}; j0 += 64) {{",
            f"  const int64_t m = {inner} - j0 < 64 ? {inner} - j0 : 64;",
            "  float m_[64], s[64];",
            "  for (int64_t j = 0; j < m; j++) { m_[j] = -INFINITY; s[j] = 0.0f; }",
            f"  for (int64_t k = 0; k < {n}; k++) {{ const float *xr = xo + k * {inner} + j0; "
            "for (int64_t j = 0; j < m; j++) m_[j] = xr[j] > m_[j] ? xr[j] : m_[j]; }",
            f"  for (int64_t k = 0; k < {n}; k++) {{ const float *xr = xo + k * {inner} + j0; "
            f"float *yr = yo + k * {inner} + j0; (void)yr;",
            f"    for (int64_t j = 0; j < m; j++) {{ const float e = nn_exp(xr[j] - m_[j]); {store}s[j] += e; }} }}",
            f"  {finish[0]}",
            f"  for (int64_t k = 0; k < {n}; k++) {{ const float *xr = xo + k * {inner} + j0; "
            f"float *yr = yo + k * {inner} + j0; (void)xr;",
            f"    for (int64_t j = 0; j < m; j++) {finish[1]} }}",
            "}"]
    return _task("softmax_task", ["x", "y"], [x, y], outer, outer * n * inner * 3, body)
