"""The nncc artifact format: a compiled Plan as bytes, and back.

Grammar (all integers little-endian; offsets are from the start of the file):

    artifact  := header section_entry{section_count} padding section{section_count}
    header    := magic:"NNCCPLAN"  format_version:u32  section_count:u32
                 producer:u8[16]                      (nncc version, ASCII, NUL-padded)
    section_entry := tag:u8[4]  flags:u32  offset:u64  length:u64  blake3:u8[32]
    section   := the `length` bytes at `offset`; every offset is a multiple of 64 (zero
                 padding between sections; none after the last, so the file ends with it)

Sections (each at most once, tags ASCII):

    "PROG"  UTF-8 JSON object, keys sorted, no whitespace:
              kernels      [kernel key, ...]          e.g. "ai.onnx::Conv::11"
              slots        [[name, dtype|null, shape|null(, kind)], ...]; dim = int|str|null
                           dtype: numpy's str ("<f4"), or a low-precision type's name
                           ("bfloat16", "float8_e4m3fn", "int4"...), from a closed list
                           kind (only when not a tensor): "sequence", "optional_tensor"
                           or "optional_sequence"; dtype is then the element dtype
              inputs, outputs   [slot, ...]
              constants    [[slot, storage, offset, length(, expand)], ...]
                           expand (optional): the stored shape of a partial broadcast,
                           each dim 1 or the slot's; loaded as a broadcast view
                           storage "inline": bytes in INLN at offset (CONSTANT_COPY)
                           storage "data":   bytes in DATA at offset (CONSTANT_REFERENCE,
                                             64-byte aligned, memory-mappable)
                           storage "splat":  one element in INLN, repeated to the shape
                           storage "strings": a string tensor (slot dtype "|O"): its
                                             elements in row-major order as an ASCII JSON
                                             array of strings in INLN (lossless for any
                                             str, lone surrogates included)
              instructions [[kernel, [in slot|-1, ...], [out slot|-1, ...], attrs, node], ...]
                           attrs: JSON values; a tensor is {"$tensor": constant slot};
                           a subgraph (If/Loop/Scan body) is
                             {"$graph": {"name": str, "inputs": [slot entry, ...],
                                         "outputs": [slot entry, ...],
                                         "initializers": [[name, {"$tensor": slot}], ...],
                                         "nodes": [[op_type, domain, [in name|"", ...],
                                                    [out name|"", ...], attrs, node], ...]}}
                           its node attrs encoded alike (nested at most 32 deep); every
                           node input is defined before use (by an input, initializer,
                           earlier node or captured name) and every op resolves to a
                           registered kernel at options.opsets; "__captures__" [name,
                           ...] names the outer values the subgraphs read, bound to the
                           instruction's (or node's) last inputs in that order
              partitions   [[backend, backend version, entry, first, count], ...]
                           instructions [first, first + count) are the partition's portable
                           form; it runs as the unit its backend makes of them when that
                           backend is loaded (never imported because a plan names it)
              arena        [[slot, offset], ...]   arena_bytes: int
              options      object (preference, opt_level, threads, ...; "native": the
                           compiler, flags and CPU features the CODE section was built with)
              fallbacks    [{"node", "op", "reason"}, ...]
              native       (optional) [[partition, symbol, [arg slot, ...], inputs, workspace], ...]
                           partition `partition` runs as the CODE entry point `symbol`
                           (nncc_partition_N), given the buffers of its arg slots (its
                           inputs, the first `inputs` of them, then its outputs) and
                           `workspace` bytes of scratch, instead of its instructions
    "INLN"  small constants, concatenated
    "DATA"  large constants, each at a 64-byte aligned offset within the section
    "CODE"  (optional) an ELF shared object holding the native entry points; model cache:
            verified with PROG and loaded from the verified bytes in memory
    "SIGN"  (optional; written only with CODE, never in the model cache)
            scheme:u32 (1)  key_fingerprint:u8[8]  mac:u8[32]
            mac: keyed blake3 of the seal message under the signer's 32-byte key, where
            seal message := "nncc artifact seal 1" 0x0A  magic  format_version:u32
                            producer:u8[16]  n:u32  (tag flags:u32 length:u64 blake3){n}
            over every other section's table entry in table order. Each entry's blake3 is
            checked against its section's bytes, so the MAC covers every byte that decides
            what runs (program, native code, constants) and the producer; offsets only
            place those bytes. An nncc without this tag refuses the file as having an
            unknown section. Whether a seal is trusted is nncc.trust's decision, not the
            format's.

Loading never evaluates code: JSON only, kernels are looked up in the registry by key and
never imported by name, and every index, offset, length, dtype and shape is checked
before use; any violation raises PlanFormatError. Serializing the same Plan twice gives
the same bytes.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Callable

import numpy as np
from blake3 import blake3

from nncc.errors import PlanFormatError
from nncc.ir import low_precision
from nncc.kernels.attributes import attribute_problem
from nncc.ir.splats import compact, stores_as_splat
from nncc.plan.memory import aligned_constant
from nncc.ir.graph import KINDS
from nncc.plan.plan import ArtifactSeal, NativeCall, PartitionInfo, Plan, PlanInstruction, Slot
from nncc.plan.subgraph import GraphChecker
from nncc.util.files import ARTIFACT_MAGIC
from nncc.util.limits import MAX_RANK, check_bytes, check_shape, element_count

MAGIC = ARTIFACT_MAGIC
FORMAT_VERSION = 1
ALIGN = 64
INLINE_LIMIT = 1024  # constants up to this many bytes travel inline (CONSTANT_COPY)
_HEADER = struct.Struct("<8sII16s")
_ENTRY = struct.Struct("<4sIQQ32s")
_TAGS = (b"PROG", b"INLN", b"DATA", b"CODE", b"SIGN")
_SEAL = struct.Struct("<I8s32s")  # scheme, key fingerprint, MAC
SEAL_SCHEME = 1
SEAL_BYTES = _SEAL.size
_SEAL_DOMAIN = b"nncc artifact seal 1\n"
MAX_WORKSPACE = 2**40  # bytes of scratch a native call may ask for
MAX_SECTIONS = 8  # five tags, each at most once
MAX_CONSTANT_BYTES = 2**48  # a declared constant larger than this is surely hostile
ALLOWED_DTYPES = {
    np.dtype(t).str: np.dtype(t)
    for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
              np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128,
              object)  # object: ONNX strings, as Python str
}
STRING = np.dtype(object)
# The low-precision types (bfloat16, float8, float4, int4, int2) are written by name: their
# numpy str ("<V1", "<V2") says nothing. Only these names are accepted, and ml_dtypes is
# imported only when a plan names one.
LOW_PRECISION_DTYPES = frozenset(low_precision.CODES)


def _dtype_key(dtype: np.dtype) -> str:
    return dtype.name if low_precision.is_low_precision(dtype) else dtype.str


def _allowed_dtype(key: str) -> np.dtype | None:
    if key in LOW_PRECISION_DTYPES:
        return low_precision.dtype_named(key)
    return ALLOWED_DTYPES.get(key)


# -- writing -----------------------------------------------------------------------------


Pieces = list  # buffers (bytes or uint8 views of constants) that concatenate to a section


def _encode(plan: Plan) -> tuple[str, bytes, Pieces, Pieces]:
    """(producer, PROG, INLN pieces, DATA pieces). The large constants are not copied here:
    DATA's pieces are views of the arrays, copied once, into the artifact itself."""
    inline: Pieces = []
    inline_size = 0
    data: Pieces = []
    data_size = 0
    table = []
    for slot in sorted(plan.constants):
        array = plan.constants[slot]
        if array.dtype == STRING:
            raw = _strings_out(plan.slots[slot].name, array)
            table.append([slot, "strings", inline_size, len(raw)])
            inline.append(raw)
            inline_size += len(raw)
            continue
        if _allowed_dtype(_dtype_key(array.dtype)) != array.dtype:
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
            pad = _pad(data_size)
            data.append(pad)
            data_size += len(pad)
            table.append([slot, "data", data_size, raw.nbytes, *extra])
            data.append(raw)
            data_size += raw.nbytes
    program = {
        "kernels": plan.kernels,
        "slots": [_slot_out(s) for s in plan.slots],
        "inputs": plan.inputs,
        "outputs": plan.outputs,
        "constants": table,
        "instructions": [[i.kernel, i.inputs, i.outputs, i.attrs, i.node] for i in plan.instructions],
        "partitions": [[p.backend, p.backend_version, p.entry, p.first, p.count] for p in plan.partitions],
        "arena": sorted([slot, off] for slot, off in plan.arena.items()),
        "arena_bytes": plan.arena_bytes,
        "options": plan.options,
        "fallbacks": plan.fallbacks,
    }
    if plan.native and plan.code is not None:
        program["native"] = [[c.partition, c.symbol, c.args, c.n_inputs, c.workspace] for c in plan.native]
    prog = json.dumps(program, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()
    return plan.producer, prog, inline, data


Sealer = Callable[[bytes], "bytes | None"]  # seal message -> SIGN payload, or None for none (nncc.trust.seal)


def serialize(plan: Plan, seal: Sealer | None = None) -> bytes:
    """One self-contained artifact: program, inline constants, the data section, and any
    native code; with ``seal``, an artifact with native code is signed (a SIGN section)."""
    producer, prog, inline, data = _encode(plan)
    return _assemble(producer, [(b"PROG", prog), (b"INLN", inline), (b"DATA", data), *_code(plan)], seal)


def serialize_parts(plan: Plan) -> tuple[bytes, bytes]:
    """(model cache, data cache): the security-sensitive program with its inline constants
    and native code, and the large constants alone, 64-byte aligned, to be memory-mapped."""
    producer, prog, inline, data = _encode(plan)
    return _assemble(producer, [(b"PROG", prog), (b"INLN", inline), *_code(plan)]), b"".join(data)


def artifact_from_parts(model_cache, data, seal: Sealer | None = None) -> bytes:
    """The artifact ``serialize`` writes, assembled from the two parts ``serialize_parts``
    made (verified ones, from the cache): the same bytes, without the plan."""
    producer, sections = read_sections(model_cache)
    return _assemble(producer, [
        (b"PROG", bytes(sections[b"PROG"])),
        (b"INLN", bytes(sections.get(b"INLN", b""))),
        (b"DATA", bytes(data)),
        *([(b"CODE", bytes(sections[b"CODE"]))] if b"CODE" in sections else []),
    ], seal)


def _code(plan: Plan) -> list:
    return [(b"CODE", plan.code)] if plan.native and plan.code is not None else []


def _assemble(producer: str, sections: list[tuple[bytes, Any]], seal: Sealer | None = None) -> bytes:
    """Header, section table and sections; a payload is bytes or a list of pieces. Every
    byte is copied exactly once, into the result (large artifacts: copies dominate).
    ``seal`` signs the table when a CODE section is among them: only native code needs a
    signature, and an artifact without one stays readable by an nncc that knows no SIGN."""
    laid = []  # (tag, pieces, length, digest)
    for tag, payload in sections:
        pieces = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else payload
        digest = blake3()
        length = 0
        for piece in pieces:
            digest.update(piece)
            length += memoryview(piece).nbytes
        laid.append((tag, pieces, length, digest.digest()))
    encoded = producer.encode()[:16]
    if seal is not None and any(tag == b"CODE" for tag, *_ in laid):
        message = seal_message(FORMAT_VERSION, encoded.ljust(16, b"\0"),
                               [(tag, 0, length, digest) for tag, _, length, digest in laid])
        signature = seal(message)
        if signature is not None:
            laid.append((b"SIGN", [signature], len(signature), blake3(signature).digest()))
    head_size = _HEADER.size + _ENTRY.size * len(laid)
    offset = head_size + len(_pad(head_size))
    entries = []
    body: Pieces = []
    for index, (tag, pieces, length, digest) in enumerate(laid):
        entries.append(_ENTRY.pack(tag, 0, offset, length, digest))
        body += pieces
        if index + 1 < len(laid):  # no padding after the last: a cut file always cuts a section
            body.append(_pad(length))
            offset += length + len(_pad(length))
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(laid), encoded)
    head = header + b"".join(entries)
    return b"".join([head, _pad(len(head)), *body])


def seal_message(version: int, producer: bytes, entries: list[tuple[bytes, int, int, bytes]]) -> bytes:
    """What an artifact's MAC covers: the header and the (tag, flags, length, blake3) of
    every section but SIGN, in table order (see the grammar above)."""
    parts = [_SEAL_DOMAIN, MAGIC, struct.pack("<I", version), producer, struct.pack("<I", len(entries))]
    parts += [struct.pack("<4sIQ32s", tag, flags, length, digest) for tag, flags, length, digest in entries]
    return b"".join(parts)


def seal_payload(fingerprint: bytes, mac: bytes) -> bytes:
    """The SIGN section's bytes."""
    return _SEAL.pack(SEAL_SCHEME, fingerprint, mac)


def _strings_out(name: str, array: np.ndarray) -> bytes:
    values = array.reshape(-1).tolist()
    if not all(isinstance(v, str) for v in values):
        raise PlanFormatError(f"constant {name!r} is an object tensor that holds more than strings")
    return json.dumps(values, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _strings_in(slot: int, raw: memoryview, shape: tuple) -> np.ndarray:
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


def _pad(n: int) -> bytes:
    return b"\0" * (-n % ALIGN)


def _shape_out(shape):
    return None if shape is None else list(shape)


def _slot_out(slot: Slot) -> list:
    entry = [slot.name, None if slot.dtype is None else _dtype_key(slot.dtype), _shape_out(slot.shape)]
    if slot.kind != "tensor":
        entry.append(slot.kind)
    return entry


def slot_from_entry(entry: Any) -> Slot:
    """A checked slot-table entry (also a subgraph's input or output description)."""
    return _Validator.slot(entry)


# -- reading -----------------------------------------------------------------------------


def read_sections(buffer) -> tuple[str, dict[bytes, memoryview]]:
    """Check the header and every section checksum; return (producer, sections)."""
    producer, sections, _seal = read_sealed(buffer)
    return producer, sections


def read_sealed(buffer) -> tuple[str, dict[bytes, memoryview], ArtifactSeal | None]:
    """read_sections, and the artifact's seal (its SIGN section and the message it signs,
    both from the same in-memory copy of the header the sections were checked against)."""
    view = memoryview(buffer)
    if len(view) < _HEADER.size:
        raise PlanFormatError("too short to be an nncc artifact")
    magic, version, count, producer = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise PlanFormatError("not an nncc artifact (bad magic)")
    if version != FORMAT_VERSION:
        raise PlanFormatError(f"artifact format version {version}; this nncc reads version {FORMAT_VERSION}")
    if not 0 < count <= MAX_SECTIONS or _HEADER.size + count * _ENTRY.size > len(view):
        raise PlanFormatError(f"bad section count {count}")
    head = bytes(view[: _HEADER.size + count * _ENTRY.size])  # one copy: checked and signed alike
    sections: dict[bytes, memoryview] = {}
    signed = []
    for i in range(count):
        tag, flags, offset, length, digest = _ENTRY.unpack_from(head, _HEADER.size + i * _ENTRY.size)
        if tag not in _TAGS or tag in sections:
            raise PlanFormatError(f"unknown or repeated section {tag!r}")
        if offset % ALIGN or offset + length > len(view):
            raise PlanFormatError(f"section {tag.decode()} lies outside the file")
        # TOCTOU: the program and inline constants are copied into memory first, and the
        # checksum is taken of that copy, which is then parsed. DATA stays memory-mapped:
        # it holds only numbers, so a change after the check yields wrong values at worst.
        payload = view[offset : offset + length]
        if tag != b"DATA":
            payload = memoryview(bytes(payload))
        if blake3(payload).digest() != digest:
            raise PlanFormatError(f"section {tag.decode()} fails its checksum")
        sections[tag] = payload
        if tag != b"SIGN":
            signed.append((tag, flags, length, digest))
    if b"PROG" not in sections:
        raise PlanFormatError("artifact has no program section")
    try:
        producer_text = producer.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise PlanFormatError("producer version is not ASCII") from None
    seal = None
    if b"SIGN" in sections:
        raw = bytes(sections[b"SIGN"])
        if len(raw) != _SEAL.size:
            raise PlanFormatError(f"signature section has {len(raw)} bytes, not {_SEAL.size}")
        scheme, fingerprint, mac = _SEAL.unpack(raw)
        seal = ArtifactSeal(scheme, fingerprint, mac, seal_message(version, producer, signed))
    return producer_text, sections, seal


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
    plan = _Validator(program, sections).plan(producer)
    plan.seal = seal
    return plan


class _Validator:
    def __init__(self, program: Any, sections: dict[bytes, memoryview]):
        if not isinstance(program, dict):
            raise PlanFormatError("program section is not an object")
        self.p = program
        self.inline = sections.get(b"INLN", memoryview(b""))
        self.data = sections.get(b"DATA", memoryview(b""))
        code = sections.get(b"CODE")
        self.code = None if code is None else bytes(code)  # already a verified in-memory copy

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
        from nncc.kernels.registry import by_key

        kernels = self.get("kernels", list)
        for key in kernels:
            if not isinstance(key, str) or by_key(key) is None:
                raise PlanFormatError(f"plan uses kernel {key!r}, which is not registered "
                                      f"({self._plugin_hint()})")
        slots = [self.slot(entry) for entry in self.get("slots", list)]
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
        arena = {}
        for entry in self.get("arena", list):
            if not (isinstance(entry, list) and len(entry) == 2):
                raise PlanFormatError("bad arena entry")
            slot = self.index(entry[0], n, "arena slot")
            offset = entry[1]
            if not isinstance(offset, int) or offset < 0 or offset > arena_bytes:
                raise PlanFormatError("arena offset out of range")
            arena[slot] = offset
        options = self.options(self.get("options", dict))
        fallbacks = self.fallbacks(self.get("fallbacks", list))
        native = self.native(slots, partitions, constants, inputs)
        return Plan(producer, kernels, slots, inputs, outputs, constants, instructions, partitions,
                    arena, arena_bytes, options, fallbacks, native, self.code if native else None)

    def native(self, slots: list[Slot], partitions: list[PartitionInfo], constants, inputs) -> list[NativeCall]:
        """The native call table: each call names one partition once, an entry point of our
        own naming, and arguments that are that partition's static float32 slots; outputs
        are never constants or graph inputs. The code itself is checked by whoever loads it."""
        from nncc.backends.native import safe_symbol

        entries = self.p.get("native", [])
        if type(entries) is not list:
            raise PlanFormatError("program field 'native' has the wrong type")
        if entries and self.code is None:
            raise PlanFormatError("plan names native entry points but carries no CODE section")
        calls, seen = [], set()
        for entry in entries:
            if not (type(entry) is list and len(entry) == 5 and type(entry[1]) is str and type(entry[2]) is list):
                raise PlanFormatError("bad native call entry")
            part = self.index(entry[0], len(partitions), "native partition")
            if part in seen or not safe_symbol(entry[1]):
                raise PlanFormatError(f"bad native call for partition {part}")
            seen.add(part)
            args = [self.index(s, len(slots), "native argument slot") for s in entry[2]]
            n_inputs = self.index(entry[3], len(args) + 1, "native input count")
            workspace = entry[4]
            if type(workspace) is not int or not 0 <= workspace <= MAX_WORKSPACE:
                raise PlanFormatError("bad native workspace size")
            for s in args:
                info = slots[s]
                if (info.kind != "tensor" or info.dtype != np.float32 or info.shape is None
                        or not all(type(d) is int for d in info.shape)):
                    raise PlanFormatError(f"native argument slot {s} is not a static float32 tensor")
            if any(s in constants or s in inputs for s in args[n_inputs:]):
                raise PlanFormatError(f"native call for partition {part} writes a constant or an input")
            calls.append(NativeCall(part, entry[1], args, n_inputs, workspace))
        return calls

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

    @staticmethod
    def slot(entry: Any) -> Slot:
        if not (type(entry) is list and len(entry) in (3, 4) and type(entry[0]) is str):
            raise PlanFormatError("bad slot entry")
        name, dtype, shape = entry[:3]
        kind = entry[3] if len(entry) == 4 else "tensor"
        if kind not in KINDS or kind == "tensor" and len(entry) == 4:
            raise PlanFormatError(f"slot {name!r} has a bad kind {kind!r}")
        if kind != "tensor" and shape is not None:
            raise PlanFormatError(f"slot {name!r} is a {kind} and cannot have a shape")
        if dtype is not None:
            dtype = _allowed_dtype(dtype) if type(dtype) is str else None
            if dtype is None:
                raise PlanFormatError(f"slot {name!r} has unsupported dtype {entry[1]!r}")
        if shape is not None:
            if type(shape) is not list or len(shape) > MAX_RANK:
                raise PlanFormatError(f"slot {name!r} has a bad shape")
            for d in shape:
                if not (0 <= d < 2**40 if type(d) is int else d is None or type(d) is str):
                    raise PlanFormatError(f"slot {name!r} has a bad dimension {d!r}")
            shape = tuple(shape)
            if dtype is not None:  # the static part alone must fit in memory
                check_shape([d for d in shape if type(d) is int], dtype.itemsize, f"slot {name!r}",
                            PlanFormatError)
        return Slot(name, dtype, shape, kind)

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
                out[slot] = _strings_in(slot, self.inline[offset : offset + length], info.shape)
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
        GraphChecker(constants, self.opsets(), self.slot).attrs(
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
