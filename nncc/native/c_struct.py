"""A C struct defined once in Python: it renders the ``struct`` declaration a kernel reads
and packs the bytes the plan stores, field by field in the same order and with the same
alignment (numpy's aligned structured dtype lays fields out as the C compiler does).

A kernel's table of mixed integers and floats (a quantized layer's scales, zero points,
int32 biases, multipliers) is one of these: the kernel takes ``const struct tag *`` and
reads named fields, instead of floats at offsets with integers punned into them.

The plan stores every packed constant as a float32 array (nncc/native/codegen.py's
``pack``), so ``pack`` returns the struct's bytes in one, padded to whole floats: only the
storage is float32; the kernel's parameter is typed as the struct.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the C types a table may hold: fixed widths, so the layout is the same for every compiler
_NUMPY = {"float": np.float32, "int32_t": np.int32, "uint32_t": np.uint32, "int64_t": np.int64,
          "int8_t": np.int8, "uint8_t": np.uint8}


@dataclass(frozen=True)
class Field:
    name: str
    ctype: str  # a key of _NUMPY
    count: int = 0  # 0: a scalar; else an array of this many (at least one: C has no empty arrays)

    def __post_init__(self):
        if self.ctype not in _NUMPY:
            raise ValueError(f"field {self.name!r}: C type {self.ctype!r} is not one a table holds")
        if self.count < 0:
            raise ValueError(f"field {self.name!r}: {self.count} elements")


@dataclass(frozen=True)
class Struct:
    tag: str  # the struct's C tag; one per layout (array lengths included), so the tag names the type
    fields: tuple[Field, ...]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype([(f.name, _NUMPY[f.ctype], (max(f.count, 1),)) if f.count else (f.name, _NUMPY[f.ctype])
                         for f in self.fields], align=True)

    @property
    def declaration(self) -> str:
        members = " ".join(f"{f.ctype} {f.name}[{max(f.count, 1)}];" if f.count else f"{f.ctype} {f.name};"
                           for f in self.fields)
        return f"struct {self.tag} {{ {members} }};\n"

    @property
    def pointer(self) -> str:
        """The C type of a kernel parameter that reads one."""
        return f"const struct {self.tag} *"

    def pack(self, **values) -> np.ndarray:
        """The struct's bytes, as float32 storage: every field given (an array field may be
        given shorter than its length, the rest zero)."""
        missing = {f.name for f in self.fields} ^ set(values)
        if missing:
            raise ValueError(f"struct {self.tag}: fields {sorted(missing)} missing or unknown")
        record = np.zeros((), self.dtype)
        for f in self.fields:
            value = np.asarray(values[f.name])
            if f.count:
                flat = value.reshape(-1)
                if flat.size > max(f.count, 1):
                    raise ValueError(f"struct {self.tag}: {flat.size} values for {f.name}[{f.count}]")
                record[f.name][:flat.size] = flat
            else:
                record[f.name] = value.reshape(())
        raw = record.tobytes()
        storage = np.zeros(-(-len(raw) // 4), np.float32)
        storage.view(np.uint8)[:len(raw)] = np.frombuffer(raw, np.uint8)
        return storage
