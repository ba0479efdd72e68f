"""Symbolic dimension names as exporters write them.

A name binds: every axis that carries it has one size in a run (``batch`` on two inputs).
But some exporters write a placeholder where the size is simply unknown: paddle2onnx
declares ``float32[-1, 3, '?', '?']``, two independent sizes under one "name". A name with
no letter in it ("?", "-1", "*") is such a placeholder: on each input axis it becomes a name
of its own, ``<input>:<axis>`` ("x:2", "x:3"), so the axes bind independently as
onnxruntime runs them; anywhere else (outputs, intermediate values) it is an unknown size.
A name with a letter keeps binding, and a run that breaks it is an error naming both axes.

A model input's axis with no name at all (``dim_value`` -1 or absent: paddle2onnx's batch)
is named the same way (``x:0``): left unknown, no ``--dim`` could fix it, no shape plan or
cache entry could key it, and it would keep the model on its portable plan. A subgraph's
inputs are left alone: its operator gives them, sized by the outer graph.
"""

from __future__ import annotations

from dataclasses import replace


def is_placeholder(dim) -> bool:
    """Whether a symbolic dimension is an unknown size rather than a name ("?", "-1")."""
    return isinstance(dim, str) and not any(c.isalpha() for c in dim)


def name_placeholders(values: dict, inputs: list[str], unnamed: bool = False) -> dict:
    """``values`` (name -> TensorInfo) with every placeholder dimension replaced: on the
    ``inputs`` by a name of its own per axis, elsewhere by None (unknown). ``unnamed``: an
    input axis with no name (None) is named too (a model's own inputs, fed by its caller)."""
    feeds = set(inputs)

    def renamed_here(name: str, dim) -> bool:
        return is_placeholder(dim) or (unnamed and dim is None and name in feeds)

    def needs(name: str, info) -> bool:
        return any(renamed_here(name, d) for d in (getattr(info, "shape", None) or ()))

    if not any(needs(name, info) for name, info in values.items()):
        return values
    taken = {d for info in values.values() for d in (getattr(info, "shape", None) or ()) if isinstance(d, str)}
    renamed = {}
    for name, info in values.items():
        if not needs(name, info):
            renamed[name] = info
            continue
        dims = []
        for axis, dim in enumerate(info.shape):
            if renamed_here(name, dim):
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
