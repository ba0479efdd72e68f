"""Backends' payloads in an artifact: where their bytes lie and what the reader checks.

    payloads := [[backend, section, offset, length, [partition, ...], meta], ...]

sorted by backend, one per backend. A code payload's bytes lie in the CODE section (signed
with the artifact, and trusted like native code), any other's in PAYL; offset and length
place them within it. The partitions are ones the plan assigns to that backend; meta is
the backend's own JSON. The reader checks all that, then lets the backend check its meta
(``Backend.check_payload``) when the backend is registered in this process; a payload of a
backend that is not is kept, unread, and its partitions run their instructions.
"""

from __future__ import annotations

from typing import Any

from nncc.errors import PlanFormatError
from nncc.plan.container import Pieces
from nncc.plan.plan import BackendPayload, Plan

SECTIONS = {"CODE": b"CODE", "PAYL": b"PAYL"}


def encode_payloads(plan: Plan) -> tuple[list, Pieces, Pieces]:
    """(the program's payload table, CODE pieces, PAYL pieces)."""
    table, pieces = [], {"CODE": [], "PAYL": []}
    sizes = {"CODE": 0, "PAYL": 0}
    for name, payload in sorted(plan.payloads.items()):
        section = "CODE" if payload.code else "PAYL"
        table.append([name, section, sizes[section], len(payload.data), list(payload.partitions), payload.meta])
        pieces[section].append(payload.data)
        sizes[section] += len(payload.data)
    return table, pieces["CODE"], pieces["PAYL"]


def decode_payloads(entries: Any, sections: dict[bytes, memoryview], plan: Plan) -> dict[str, BackendPayload]:
    """The checked payloads of ``plan`` (already read) from its program's table."""
    from nncc.backends.registry import loaded_backend  # lazy: start-up

    if type(entries) is not list:
        raise PlanFormatError("program field 'payloads' has the wrong type")
    payloads: dict[str, BackendPayload] = {}
    for entry in entries:
        if not (type(entry) is list and len(entry) == 6 and type(entry[0]) is str and entry[1] in SECTIONS
                and all(type(x) is int for x in entry[2:4]) and type(entry[4]) is list):
            raise PlanFormatError("bad payload entry")
        name, section, offset, length, partitions, meta = entry
        if name in payloads:
            raise PlanFormatError(f"backend {name!r} has two payloads")
        source = sections.get(SECTIONS[section], memoryview(b""))
        if not (0 <= offset and 0 <= length and offset + length <= len(source)):
            raise PlanFormatError(f"the payload of backend {name!r} lies outside its section")
        for index in partitions:
            if not (type(index) is int and 0 <= index < len(plan.partitions)
                    and plan.partitions[index].backend == name):
                raise PlanFormatError(f"the payload of backend {name!r} names a partition not its own")
        if len(set(partitions)) != len(partitions):
            raise PlanFormatError(f"the payload of backend {name!r} names a partition twice")
        payload = BackendPayload(name, list(partitions), meta, bytes(source[offset : offset + length]),
                                 code=section == "CODE")
        backend = loaded_backend(name)
        if backend is not None:
            backend.check_payload(payload, plan)
        payloads[name] = payload
    return payloads
