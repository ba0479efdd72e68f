"""Reading an artifact (the grammar is in nncc.plan.format) into a Plan, checking
everything before use: loading never evaluates code. JSON only, kernels are looked up in
the registry by key and never imported by name, and every index, offset, length, dtype
and shape is checked; any violation raises PlanFormatError."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from nncc.errors import PlanFormatError
from nncc.kernels.attributes import attribute_problem
from nncc.plan.container import ALIGN, read_sealed
from nncc.plan.memory import aligned_constant
from nncc.plan.payload_codec import decode_payloads
from nncc.plan.plan import PartitionInfo, Plan, PlanInstruction, Slot
from nncc.plan.slot_codec import STRING, decode_slot
from nncc.plan.subgraph import GraphChecker
from nncc.util.limits import check_bytes, element_count

MAX_CONSTANT_BYTES = 2**48  # a declared constant larger than this is surely hostile


def deserialize(buffer, data=None) -> Plan:
    """Parse a verified artifact. ``data`` supplies the data section when it is stored
    apart (the data cache); the caller has checked its hash against the index."""
    producer, sections, seal = read_sealed(buffer)
    if data is not None:
        if b"DATA" in sections:
            raise PlanFormatError("artifact carries its own data section")
        sections[b"DATA"] = memoryview(data)
        seal = None  # a model cache is trusted by its hash in the index, never by a seal
    try:
        program = json.loads(bytes(sections[b"PROG"]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PlanFormatError(f"program section is not valid JSON: {exc}") from None
    plan = ProgramReader(program, sections).plan(producer)
    plan.seal = seal
    return plan


class ProgramReader:
    """Checks a program section and builds the Plan it describes."""

    def __init__(self, program: Any, sections: dict[bytes, memoryview]):
        if not isinstance(program, dict):
            raise PlanFormatError("program section is not an object")
        self.p = program
        self.inline = sections.get(b"INLN", memoryview(b""))
        self.data = sections.get(b"DATA", memoryview(b""))
        self.sections = sections

    def get(self, key: str, kind: type) -> Any:
        value = self.p.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise PlanFormatError(f"program field {key!r} is missing or has the wrong type")
        return value

    def _plugin_hint(self) -> str:
        """Which --plugin to pass: the plugins the plan records it was compiled with."""
        options = self.p.get("options")
        plugins = options.get("plugins") if isinstance(options, dict) else None
        names = ([p for p in plugins if isinstance(p, str) and p.isprintable() and len(p) <= 100][:4]
                 if isinstance(plugins, list) else [])  # printable only: the artifact is untrusted
        if names:
            return ("it was compiled with " + " ".join(f"--plugin {p}" for p in names)
                    + ": pass the same to load it")
        return "a plugin may be needed: pass --plugin"

    def plan(self, producer: str) -> Plan:
        from nncc.kernels.registry import by_key  # lazy: start-up

        kernels = self.get("kernels", list)
        for key in kernels:
            if not isinstance(key, str) or by_key(key) is None:
                raise PlanFormatError(f"plan uses kernel {key!r}, which is not registered "
                                      f"({self._plugin_hint()})")
        slots = [decode_slot(entry) for entry in self.get("slots", list)]
        n = len(slots)
        inputs = [self.index(s, n, "input slot") for s in self.get("inputs", list)]
        outputs = [self.index(s, n, "output slot") for s in self.get("outputs", list)]
        constants = self.constants(slots)
        defined = set(inputs) | set(constants)
        instructions = []
        for entry in self.get("instructions", list):
            ins = self.instruction(entry, len(kernels), n, constants)
            definition = by_key(kernels[ins.kernel])
            where = f"instruction {len(instructions)} ({definition.op_type})"
            why = definition.check_inputs([s >= 0 for s in ins.inputs], where)
            for name, value in ins.attrs.items():  # the types the ONNX frontend also checks
                if isinstance(value, dict) and "$graph" in value:
                    continue  # a subgraph: checked by GraphChecker when its nodes are read
                tensor = isinstance(value, dict)  # {"$tensor": slot}, checked by attr()
                problem = attribute_problem(definition.op_type, definition.domain, name,
                                            constants[value["$tensor"]] if tensor else value)
                why = why or (problem and f"{where}: {problem}")
            if why:  # the kernel could not even be called with these operands
                raise PlanFormatError(why)
            for s in ins.inputs:
                if s >= 0 and s not in defined:
                    raise PlanFormatError(f"instruction {len(instructions)} reads slot {s} before it is written")
            for s in ins.outputs:
                if s >= 0 and (s in constants or s in inputs):
                    raise PlanFormatError(f"instruction {len(instructions)} overwrites constant or input slot {s}")
            defined.update(s for s in ins.outputs if s >= 0)
            instructions.append(ins)
        for s in outputs:
            if s not in defined:
                raise PlanFormatError(f"output slot {s} is never written")
        partitions = [self.partition(e, len(instructions)) for e in self.get("partitions", list)]
        arena_bytes = self.get("arena_bytes", int)
        if arena_bytes < 0:
            raise PlanFormatError("arena_bytes is negative")
        check_bytes(arena_bytes, "the plan's arena", PlanFormatError)
        options = self.options(self.get("options", dict))
        fallbacks = self.fallbacks(self.get("fallbacks", list))
        plan = Plan(producer, kernels, slots, inputs, outputs, constants, instructions, partitions,
                    arena_bytes, options, fallbacks)
        plan.payloads = decode_payloads(self.p.get("payloads", []), self.sections, plan)
        return plan

    @staticmethod
    def index(value: Any, limit: int, what: str, optional: bool = False) -> int:
        # JSON gives exact types: `type(...) is int` also rules out bool
        if type(value) is not int:
            raise PlanFormatError(f"{what} is not an integer")
        if optional and value == -1:
            return value
        if not 0 <= value < limit:
            raise PlanFormatError(f"{what} {value} is out of range")
        return value

    def constants(self, slots: list[Slot]) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        expanded = 0  # bytes the broadcast constants take once expanded (runtime/expansion.py)
        for entry in self.get("constants", list):
            if not (isinstance(entry, list) and len(entry) in (4, 5)):
                raise PlanFormatError("bad constant entry")
            slot = self.index(entry[0], len(slots), "constant slot")
            storage, offset, length = entry[1:4]
            expand = entry[4] if len(entry) == 5 else None
            info = slots[slot]
            if slot in out:
                raise PlanFormatError(f"constant slot {slot} is listed twice")
            if info.kind != "tensor" or info.dtype is None or info.shape is None \
                    or not all(isinstance(d, int) for d in info.shape):
                raise PlanFormatError(f"constant slot {slot} has no static type")
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, length)):
                raise PlanFormatError(f"constant slot {slot} has a bad offset or length")
            stored = info.shape
            if expand is not None:
                if storage == "splat" or not (
                    isinstance(expand, list) and len(expand) == len(info.shape)
                    and all(type(e) is int and e in (1, d) for e, d in zip(expand, info.shape))
                ):
                    raise PlanFormatError(f"constant slot {slot} has a bad broadcast shape")
                stored = tuple(expand)
            count = 1
            for d in stored:
                count *= d
            if count * info.dtype.itemsize > MAX_CONSTANT_BYTES:
                raise PlanFormatError(f"constant slot {slot} ({info.name!r}) is implausibly large")
            if (storage == "strings") != (info.dtype == STRING) or (storage == "strings" and expand):
                raise PlanFormatError(f"constant slot {slot} ({info.name!r}): strings need "
                                      "the strings storage, and only strings use it")
            if storage == "strings":
                if offset + length > len(self.inline):
                    raise PlanFormatError(f"constant slot {slot} ({info.name!r}) has a bad byte range")
                out[slot] = strings_in(slot, self.inline[offset : offset + length], info.shape)
                continue
            sources = {"inline": self.inline, "splat": self.inline, "data": self.data}
            source = sources.get(storage) if isinstance(storage, str) else None
            if source is None:
                raise PlanFormatError(f"constant slot {slot} has unknown storage {storage!r}")
            expected = info.dtype.itemsize * (1 if storage == "splat" else count)
            if length != expected or offset + length > len(source):
                raise PlanFormatError(f"constant slot {slot} ({info.name!r}) has a bad byte range")
            if storage == "data" and offset % ALIGN:
                raise PlanFormatError(f"constant slot {slot} is not 64-byte aligned")
            raw = np.frombuffer(source[offset : offset + length], dtype=info.dtype)
            if storage == "splat":
                # a read-only zero-copy view, as constant folding made it: a hostile
                # shape costs no memory, and a re-serialization gives the same bytes
                array = np.broadcast_to(raw.reshape(()).copy(), info.shape)
            else:
                # zero-copy where the bytes lie on a 64-byte boundary (DATA, memory-mapped);
                # otherwise an aligned copy, placed as an in-process compile places it
                array = aligned_constant(raw.reshape(stored))
                if expand is not None:  # a read-only view, as constant folding made it
                    array = np.broadcast_to(array, info.shape)
            if storage == "splat" or expand is not None:
                expanded += element_count(info.shape) * info.dtype.itemsize
                check_bytes(expanded, "expanding the plan's broadcast constants", PlanFormatError)
            out[slot] = array
        return out

    def instruction(self, entry: Any, kernels: int, n: int, constants: dict) -> PlanInstruction:
        if not (isinstance(entry, list) and len(entry) == 5 and isinstance(entry[1], list)
                and isinstance(entry[2], list) and isinstance(entry[3], dict) and isinstance(entry[4], str)):
            raise PlanFormatError("bad instruction entry")
        kernel = self.index(entry[0], kernels, "kernel id")
        ins = [self.index(s, n, "instruction input", optional=True) for s in entry[1]]
        outs = [self.index(s, n, "instruction output", optional=True) for s in entry[2]]
        GraphChecker(constants, self.opsets(), decode_slot).attrs(
            entry[3], ins, lambda v: self.attr(v, constants), 0)
        return PlanInstruction(kernel, ins, outs, entry[3], entry[4])

    def opsets(self) -> dict:
        """The opsets subgraph nodes resolve their kernels at (checked by ``options``)."""
        if not hasattr(self, "_opsets"):
            self._opsets = self.options(self.get("options", dict)).get("opsets", {})
        return self._opsets

    def attr(self, value: Any, constants: dict, depth: int = 0) -> Any:
        kind = type(value)
        if kind is int or kind is str or kind is float or kind is bool or value is None:
            return value
        if depth > 4:
            raise PlanFormatError("attribute nested too deeply")
        if kind is dict:
            ref = value.get("$tensor")
            if (set(value) != {"$tensor"} or not isinstance(ref, int) or isinstance(ref, bool)
                    or ref not in constants):
                raise PlanFormatError("attribute tensor does not name a constant")
            return value
        if kind is list:
            return [self.attr(v, constants, depth + 1) for v in value]
        raise PlanFormatError("bad attribute value")

    @staticmethod
    def options(options: dict) -> dict:
        """The executor reads ``opsets``; inspect renders the rest. Check what they use."""
        opsets = options.get("opsets", {})
        if not (isinstance(opsets, dict) and all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 for v in opsets.values())):
            raise PlanFormatError("options.opsets must map domains to opset versions")
        for key in ("backends", "plugins"):
            value = options.get(key, [])
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise PlanFormatError(f"options.{key} must be a list of names")
        return options

    @staticmethod
    def fallbacks(entries: list) -> list:
        for entry in entries:
            if not (isinstance(entry, dict) and set(entry) == {"node", "op", "reason"}
                    and all(isinstance(v, str) for v in entry.values())):
                raise PlanFormatError("bad fallback entry")
        return entries

    def partition(self, entry: Any, count: int) -> PartitionInfo:
        if not (isinstance(entry, list) and len(entry) == 5 and all(isinstance(x, str) for x in entry[:3])):
            raise PlanFormatError("bad partition entry")
        first, length = entry[3], entry[4]
        if not (isinstance(first, int) and isinstance(length, int) and 0 <= first and 0 <= length
                and first + length <= count):
            raise PlanFormatError("partition instruction range is out of bounds")
        return PartitionInfo(entry[0], entry[1], entry[2], first, length)


def strings_in(slot: int, raw: memoryview, shape: tuple) -> np.ndarray:
    try:
        values = json.loads(bytes(raw).decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise PlanFormatError(f"constant slot {slot} holds malformed strings") from None
    count = 1
    for d in shape:
        count *= d
    if not (type(values) is list and len(values) == count and all(type(v) is str for v in values)):
        raise PlanFormatError(f"constant slot {slot} does not hold {count} strings")
    array = np.empty(count, dtype=object)
    array[:] = values
    array = array.reshape(shape)
    array.flags.writeable = False
    return array
