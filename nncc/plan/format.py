"""The nncc artifact format: a compiled Plan as bytes, and back.

This module states the format and is where callers import it from; each job lives in a
module of its own: nncc.plan.container (header, section table, checksums),
nncc.plan.writer (Plan -> sections), nncc.plan.reader (sections -> a checked Plan),
nncc.plan.sealing (what a signature covers), nncc.plan.slot_codec (a value's type, in the
slot table and in subgraphs alike) and nncc.plan.payload_codec (backends' payloads).

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
                           (nncc.plan.slot_codec) dtype: numpy's str ("<f4"), or a
                           low-precision type's name ("bfloat16", "float8_e4m3fn",
                           "int4"...), from a closed list; kind (only when not a
                           tensor): "sequence", "optional_tensor" or
                           "optional_sequence"; dtype is then the element dtype
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
              arena_bytes  int: the portable program's intermediates (a report figure and
                           a bound; the arena's layout is planned again by the executor)
              options      object (preference, opt_level, threads, ...; "native": the
                           compiler, flags and CPU features the native payload was built with)
              fallbacks    [{"node", "op", "reason"}, ...]
              payloads     (optional) [[backend, "CODE"|"PAYL", offset, length,
                            [partition, ...], meta], ...]: what each backend's ``link``
                           stored beside its partitions' instructions, sorted by backend;
                           its bytes at [offset, offset + length) of the section named;
                           meta is the backend's JSON (the native backend's:
                           {"calls": [[partition, symbol, [arg slot, ...], inputs,
                           workspace], ...]}: partition `partition` runs as the entry
                           point `symbol` (nncc_partition_N), given the buffers of its arg
                           slots (its inputs, the first `inputs` of them, then its
                           outputs) and `workspace` bytes of scratch, instead of its
                           instructions); checked by the backend when it is registered,
                           else kept unread
    "INLN"  small constants, concatenated
    "DATA"  large constants, each at a 64-byte aligned offset within the section
    "CODE"  (optional) the payloads that are machine code, concatenated (the native
            backend's: an ELF shared object holding its entry points); model cache:
            verified with PROG and loaded from the verified bytes in memory
    "PAYL"  (optional) every other payload (a backend's bytecode), concatenated
    "SIGN"  (optional; written only with CODE, never in the model cache)
            scheme:u32 (1)  key_fingerprint:u8[8]  mac:u8[32]
            mac: keyed blake3 of the seal message under the signer's 32-byte key, where
            seal message := "nncc artifact seal 1" 0x0A  magic  format_version:u32
                            producer:u8[16]  n:u32  (tag flags:u32 length:u64 blake3){n}
            over every other section's table entry in table order. Each entry's blake3 is
            checked against its section's bytes, so the MAC covers every byte that decides
            what runs (program, payloads, constants) and the producer; offsets only
            place those bytes. An nncc without this tag refuses the file as having an
            unknown section. Whether a seal is trusted is nncc.trust's decision, not the
            format's.

Loading never evaluates code: JSON only, kernels are looked up in the registry by key and
never imported by name, and every index, offset, length, dtype and shape is checked
before use; any violation raises PlanFormatError. Serializing the same Plan twice gives
the same bytes.
"""

from __future__ import annotations

from nncc.plan.container import (  # noqa: F401  (the format's public names)
    ALIGN,
    FORMAT_VERSION,
    MAGIC,
    MAX_SECTIONS,
    Sealer,
    assemble,
    read_sealed,
    read_sections,
)
from nncc.plan.reader import MAX_CONSTANT_BYTES, deserialize  # noqa: F401
from nncc.plan.sealing import SEAL_BYTES, SEAL_SCHEME, seal_message, seal_payload  # noqa: F401
from nncc.plan.slot_codec import ALLOWED_DTYPES, LOW_PRECISION_DTYPES, STRING, decode_slot  # noqa: F401
from nncc.plan.writer import INLINE_LIMIT, artifact_from_parts, serialize, serialize_parts  # noqa: F401
