"""Writing a Plan as an artifact (the grammar is in nncc.plan.format): the program as
canonical JSON, constants inline or 64-byte aligned in DATA, backends' payloads in CODE
and PAYL. Serializing the same Plan twice gives the same bytes."""

from __future__ import annotations

import json

import numpy as np

from nncc.errors import PlanFormatError
from nncc.ir.splats import compact, stores_as_splat
from nncc.plan.container import Pieces, Sealer, assemble, pad, read_sections
from nncc.plan.payload_codec import encode_payloads
from nncc.plan.plan import Plan
from nncc.plan.slot_codec import STRING, dtype_from_key, dtype_key, encode_slot

INLINE_LIMIT = 1024  # constants up to this many bytes travel inline (CONSTANT_COPY)


def encode(plan: Plan) -> tuple[str, list[tuple[bytes, object]]]:
    """(producer, sections in order). The large constants are not copied here: DATA's
    pieces are views of the arrays, copied once, into the artifact itself. CODE and PAYL
    appear only when a payload needs them."""
    table, inline, data = encode_constants(plan)
    payloads, code, blobs = encode_payloads(plan)
    program = {
        "kernels": plan.kernels,
        "slots": [encode_slot(s.name, s.dtype, s.shape, s.kind) for s in plan.slots],
        "inputs": plan.inputs,
        "outputs": plan.outputs,
        "constants": table,
        "instructions": [[i.kernel, i.inputs, i.outputs, i.attrs, i.node] for i in plan.instructions],
        "partitions": [[p.backend, p.backend_version, p.entry, p.first, p.count] for p in plan.partitions],
        "arena_bytes": plan.arena_bytes,
        "options": plan.options,
        "fallbacks": plan.fallbacks,
    }
    if payloads:
        program["payloads"] = payloads
    prog = json.dumps(program, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()
    sections = [(b"PROG", prog), (b"INLN", inline), (b"DATA", data)]
    sections += [(tag, pieces) for tag, pieces in ((b"CODE", code), (b"PAYL", blobs)) if pieces]
    return plan.producer, sections


def encode_constants(plan: Plan) -> tuple[list, Pieces, Pieces]:
    """(the program's constant table, INLN pieces, DATA pieces)."""
    inline: Pieces = []
    inline_size = 0
    data: Pieces = []
    data_size = 0
    table = []
    for slot in sorted(plan.constants):
        array = plan.constants[slot]
        if array.dtype == STRING:
            raw = strings_out(plan.slots[slot].name, array)
            table.append([slot, "strings", inline_size, len(raw)])
            inline.append(raw)
            inline_size += len(raw)
            continue
        if dtype_from_key(dtype_key(array.dtype)) != array.dtype:
            raise PlanFormatError(f"constant {plan.slots[slot].name!r} has unsupported dtype {array.dtype}")
        if stores_as_splat(array):
            raw = np.asarray(array[(0,) * array.ndim], dtype=array.dtype).tobytes()  # no reshape: it would copy
            table.append([slot, "splat", inline_size, len(raw)])
            inline.append(raw)
            inline_size += len(raw)
            continue
        distinct = compact(array)  # a partial broadcast: its distinct values; the loader broadcasts
        extra = [] if distinct is array else [list(distinct.shape)]
        raw = np.ascontiguousarray(distinct).reshape(-1).view(np.uint8)  # a view when contiguous
        if raw.nbytes <= INLINE_LIMIT:
            table.append([slot, "inline", inline_size, raw.nbytes, *extra])
            inline.append(raw.tobytes())
            inline_size += raw.nbytes
        else:
            gap = pad(data_size)
            data.append(gap)
            data_size += len(gap)
            table.append([slot, "data", data_size, raw.nbytes, *extra])
            data.append(raw)
            data_size += raw.nbytes
    return table, inline, data


def strings_out(name: str, array: np.ndarray) -> bytes:
    values = array.reshape(-1).tolist()
    if not all(isinstance(v, str) for v in values):
        raise PlanFormatError(f"constant {name!r} is an object tensor that holds more than strings")
    return json.dumps(values, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def serialize(plan: Plan, seal: Sealer | None = None) -> bytes:
    """One self-contained artifact: program, inline constants, the data section, and any
    payloads; with ``seal``, an artifact with code is signed (a SIGN section)."""
    producer, sections = encode(plan)
    return assemble(producer, sections, seal)


def serialize_parts(plan: Plan) -> tuple[bytes, bytes]:
    """(model cache, data cache): the security-sensitive program with its inline constants
    and payloads, and the large constants alone, 64-byte aligned, to be memory-mapped."""
    producer, sections = encode(plan)
    parts = dict(sections)
    return assemble(producer, [(t, p) for t, p in sections if t != b"DATA"]), b"".join(parts[b"DATA"])


def artifact_from_parts(model_cache, data, seal: Sealer | None = None) -> bytes:
    """The artifact ``serialize`` writes, assembled from the two parts ``serialize_parts``
    made (verified ones, from the cache): the same bytes, without the plan."""
    producer, sections = read_sections(model_cache)
    ordered = [(b"PROG", bytes(sections[b"PROG"])), (b"INLN", bytes(sections.get(b"INLN", b""))),
               (b"DATA", bytes(data))]
    ordered += [(tag, bytes(sections[tag])) for tag in (b"CODE", b"PAYL") if tag in sections]
    return assemble(producer, ordered, seal)
