"""Symbolic dimension names as exporters write them.

A name binds: every axis that carries it has one size in a run (``batch`` on two inputs).
But some exporters write a placeholder where the size is simply unknown: paddle2onnx
declares ``float32[-1, 3, '?', '?']``, two independent sizes under one "name". A name with
no letter in it ("?", "-1", "*") is such a placeholder: on each input axis it becomes a name
of its own, ``<input>:<axis>`` ("x:2", "x:3"), so the axes bind independently as
onnxruntime runs them; anywhere else (outputs, intermediate values) it is an unknown size.
A name with a letter keeps binding, and a run that breaks it is an error naming both axes.
"""

from __future__ import annotations

from dataclasses import replace


def is_placeholder(dim) -> bool:
    """Whether a symbolic dimension is an unknown size rather than a name ("?", "-1")."""
    return isinstance(dim, str) and not any(c.isalpha() for c in dim)


def name_placeholders(values: dict, inputs: list[str]) -> dict:
    """``values`` (name -> TensorInfo) with every placeholder dimension replaced: on the
    ``inputs`` by a name of its own per axis, elsewhere by None (unknown)."""
    if not any(is_placeholder(d) for info in values.values() for d in (getattr(info, "shape", None) or ())):
        return values
    taken = {d for info in values.values() for d in (getattr(info, "shape", None) or ()) if isinstance(d, str)}
    feeds = set(inputs)
    renamed = {}
    for name, info in values.items():
        shape = getattr(info, "shape", None)
        if not shape or not any(is_placeholder(d) for d in shape):
            renamed[name] = info
            continue
        dims = []
        for axis, dim in enumerate(shape):
            if is_placeholder(dim):
                dim = _unique(f"{name}:{axis}", taken) if name in feeds else None
            dims.append(dim)
        renamed[name] = replace(info, shape=tuple(dims))
    return renamed


def _unique(name: str, taken: set) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}#{n}"
    taken.add(candidate)
    return candidate
