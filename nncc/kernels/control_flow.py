"""Control flow with subgraphs: If, Loop and Scan (opset 8 with a batch axis, 9 on).

Loop-carried values and branch outputs may be tensors, sequences (lists) or optionals
(None when empty); scan outputs are tensors stacked along a new axis.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import known_value, normalize_axis
from nncc.kernels.subgraphs import (
    UNKNOWN,
    body_infos,
    carried_infos,
    empty_stack,
    merge,
    owned,
    required,
    run_body,
    split_args,
    subgraph,
)

_VERSIONS = (1, 11, 13, 16, 19, 21, 23, 24, 25)
_SCAN_VERSIONS = (8, 9, 11, 16, 19, 21, 23, 24, 25)
_INT64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)


def _scalar_bool(value) -> bool:
    array = np.asarray(value)
    if array.size != 1:
        raise KernelError(f"a condition must have one element, not shape {array.shape}")
    return bool(array.reshape(-1)[0])


# -- If ---------------------------------------------------------------------------------


def _if_shape(ctx, *infos):
    (cond, *_), outer = split_args(ctx, infos)
    known = known_value(cond)
    if known is not None and known.size == 1:
        branch = "then_branch" if bool(known.reshape(-1)[0]) else "else_branch"
        return [TensorInfo(i.dtype, i.shape, kind=i.kind) for i in body_infos(ctx, branch, [], outer)]
    then = body_infos(ctx, "then_branch", [], outer)
    other = body_infos(ctx, "else_branch", [], outer)
    return [merge(a, b) for a, b in zip(then, other)]


def _if(ctx, *args):
    (cond, *_), outer = split_args(ctx, args)
    branch = "then_branch" if _scalar_bool(cond) else "else_branch"
    outs = run_body(ctx, branch, [], outer)
    if len(outs) < ctx.num_outputs:
        raise KernelError(f"If: {branch} has {len(outs)} outputs, the node {ctx.num_outputs}")
    return tuple(owned(v, list(outer.values())) for v in outs)


# -- Loop -------------------------------------------------------------------------------


def _loop_shape(ctx, *infos):
    own, outer = split_args(ctx, infos)
    own += [None] * (2 - len(own))
    carried = own[2:]
    fixed = [TensorInfo(_INT64, ()), TensorInfo(_BOOL, ())]
    state, outs = carried_infos(ctx, "body", fixed, carried, outer, 1)
    scans = [TensorInfo(o.dtype, None if o.shape is None else (None, *o.shape))
             for o in outs[1 + len(carried):]]
    return state + scans


def _loop(ctx, *args):
    own, outer = split_args(ctx, args)
    own += [None] * (2 - len(own))
    trip, cond, carried = own[0], own[1], list(own[2:])
    body = subgraph(ctx, "body")
    if trip is None and cond is None:
        raise KernelError("Loop has neither a trip count nor a condition: it would never end")
    limit = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
    keep = True if cond is None else _scalar_bool(cond)
    count = len(carried)
    scans: list[list] = [[] for _ in range(len(body.outputs) - 1 - count)]
    if len(body.outputs) < 1 + count:
        raise KernelError(f"Loop body has {len(body.outputs)} outputs for {count} loop-carried values")
    step = 0
    while keep and (limit is None or step < limit):
        outs = run_body(ctx, "body", [np.array(step, _INT64), np.array(keep), *carried], outer)
        if cond is not None:  # with no condition input, the body's condition is ignored
            keep = _scalar_bool(outs[0])
        carried = outs[1:1 + count]
        for values, value in zip(scans, outs[1 + count:]):
            values.append(value)
        step += 1
    results = [owned(v, args) for v in carried]
    for values, name in zip(scans, body.outputs[1 + count:]):
        results.append(_stack(values, 0) if values else empty_stack(body, name))
    return tuple(results)


def _stack(values: list, axis: int) -> np.ndarray:
    try:
        return np.stack([np.asarray(v) for v in values], axis=axis)
    except ValueError as exc:
        raise KernelError(f"scan outputs differ in shape between iterations: {exc}") from None


# -- Scan -------------------------------------------------------------------------------


def _scan_layout(ctx, own_count: int):
    """(state count, scan input count, input axes, input directions, output axes,
    output directions) from the attributes; opset 8 has a leading sequence_lens input."""
    scan_count = int(required(ctx, "num_scan_inputs"))
    offset = 1 if ctx.opset < 9 else 0
    states = own_count - offset - scan_count
    if scan_count < 1 or states < 0:
        raise KernelError(f"Scan has {own_count} inputs for {scan_count} scan inputs")
    outputs = max(0, ctx.num_outputs - states)
    in_axes = list(ctx.attrs.get("scan_input_axes") or [0] * scan_count)
    in_dirs = list(ctx.attrs.get("scan_input_directions") or ctx.attrs.get("directions")
                   or [0] * scan_count)
    out_axes = list(ctx.attrs.get("scan_output_axes") or [0] * outputs)
    out_dirs = list(ctx.attrs.get("scan_output_directions") or [0] * outputs)
    if len(in_axes) != scan_count or len(in_dirs) != scan_count or len(out_axes) != outputs \
            or len(out_dirs) != outputs:
        raise KernelError("Scan: axes or directions do not match the number of scan inputs/outputs")
    return states, scan_count, in_axes, in_dirs, out_axes, out_dirs


def _scan_shape(ctx, *infos):
    own, outer = split_args(ctx, infos)
    states, _, in_axes, _, out_axes, _ = _scan_layout(ctx, len(own))
    if ctx.opset < 9:  # per-batch bodies: states and scan slices lose the batch axis first
        state, outs = carried_infos(ctx, "body", [], [_drop(i, 0) for i in own[1:1 + states]],
                                    outer, 0, [_drop(_drop(i, 0), 0) for i in own[1 + states:]])
        return ([TensorInfo(s.dtype, None, kind=s.kind) for s in state]
                + [TensorInfo(o.dtype, None) for o in outs[states:]])
    scans = own[states:]
    slices = [_drop(info, axis) for info, axis in zip(scans, in_axes)]
    length = None
    for info, axis in zip(scans, in_axes):
        if info is not None and info.shape is not None:
            length = info.shape[normalize_axis(axis, len(info.shape))]
            break
    state, outs = carried_infos(ctx, "body", [], own[:states], outer, 0, slices)
    results = list(state)
    for info, axis in zip(outs[states:], out_axes):
        if info.shape is None:
            results.append(TensorInfo(info.dtype, None))
            continue
        shape = list(info.shape)
        shape.insert(normalize_axis(axis, len(shape) + 1), length)
        results.append(TensorInfo(info.dtype, tuple(shape)))
    return results


def _drop(info: TensorInfo | None, axis: int) -> TensorInfo:
    if info is None:
        return UNKNOWN
    if info.shape is None:
        return TensorInfo(info.dtype, None)
    shape = list(info.shape)
    del shape[normalize_axis(axis, len(shape))]
    return TensorInfo(info.dtype, tuple(shape))


def _scan(ctx, *args):
    own, outer = split_args(ctx, args)
    states, _, in_axes, in_dirs, out_axes, out_dirs = _scan_layout(ctx, len(own))
    if ctx.opset >= 9:
        return tuple(_scan_once(ctx, own[:states], own[states:], in_axes, in_dirs, out_axes,
                                out_dirs, outer, None, args))
    lengths, initial, scans = own[0], own[1:1 + states], own[1 + states:]
    batch = scans[0].shape[0]
    per_batch = []
    for b in range(batch):
        length = None if lengths is None else int(np.asarray(lengths).reshape(-1)[b])
        per_batch.append(_scan_once(ctx, [s[b] for s in initial], [x[b] for x in scans],
                                    [0] * len(scans), in_dirs, [0] * len(out_axes),
                                    [0] * len(out_dirs), outer, length, args))
    results = []
    for j in range(len(per_batch[0]) if per_batch else 0):
        values = [r[j] for r in per_batch]
        if j >= states:  # pad shorter sequences with zeros to the input's sequence length
            longest = scans[0].shape[1]
            values = [np.concatenate([v, np.zeros((longest - v.shape[0], *v.shape[1:]), v.dtype)])
                      if v.shape[0] < longest else v for v in values]
        results.append(_stack(values, 0))
    return tuple(results)


def _scan_once(ctx, state, scans, in_axes, in_dirs, out_axes, out_dirs, outer, length, args):
    body = subgraph(ctx, "body")
    axes = [normalize_axis(a, x.ndim) for a, x in zip(in_axes, scans)]
    lengths = {x.shape[a] for x, a in zip(scans, axes)}
    if len(lengths) != 1:
        raise KernelError(f"Scan inputs differ in sequence length: {sorted(lengths)}")
    steps = lengths.pop() if length is None else min(length, lengths.pop())
    state = list(state)
    collected: list[list] = [[] for _ in range(len(body.outputs) - len(state))]
    for t in range(steps):
        slices = [np.take(x, steps - 1 - t if d else t, axis=a) for x, a, d in zip(scans, axes, in_dirs)]
        outs = run_body(ctx, "body", state + slices, outer)
        state = outs[:len(state)]
        for values, value in zip(collected, outs[len(state):]):
            values.append(value)
    results = [owned(v, list(args)) for v in state]
    for values, axis, direction, name in zip(collected, out_axes, out_dirs, body.outputs[len(state):]):
        if not values:
            results.append(empty_stack(body, name, axis))
            continue
        if direction:
            values = values[::-1]
        rank = np.asarray(values[0]).ndim
        results.append(_stack(values, normalize_axis(axis, rank + 1)))
    return results


# Loop's trip count and condition, and Scan-8's sequence lengths, may be omitted (the
# empty name): the node validator must not call them required.
_loop.omitted_inputs_ok = True
_scan.omitted_inputs_ok = True

for _since in _VERSIONS:
    kernel("If", since=_since, shape=_if_shape, deterministic=False)(_if)
    kernel("Loop", since=_since, shape=_loop_shape, deterministic=False)(_loop)
for _since in _SCAN_VERSIONS:
    kernel("Scan", since=_since, shape=_scan_shape, deterministic=False)(_scan)
