"""Symbolic input dimensions ("batch", "N"): which a model has, and fixing them to sizes.

``--dim NAME=SIZE`` names a symbolic dimension of the model's inputs. A name the inputs do
not use is an error that lists the ones they do: a typo must not leave a dimension at its
default size unnoticed."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from nncc.errors import InputError


def symbolic_dims(infos: Mapping[str, object]) -> dict[str, list[str]]:
    """Symbolic dimension name -> the inputs that use it, in declaration order."""
    found: dict[str, list[str]] = {}
    for name, info in infos.items():
        for dim in getattr(info, "shape", None) or ():
            if isinstance(dim, str) and name not in found.setdefault(dim, []):
                found[dim].append(name)
    return found


def check_dim_names(dims: Mapping[str, int], infos: Mapping[str, object], what: str) -> None:
    """Raise InputError when ``dims`` names a dimension no input of ``what`` declares."""
    known = symbolic_dims(infos)
    unknown = [name for name in dims if name not in known]
    if not unknown:
        return
    names = ", ".join(repr(n) for n in unknown)
    if known:
        hint = "its symbolic dimensions are " + ", ".join(
            f"{d!r} (in {', '.join(inputs)})" for d, inputs in known.items())
    else:
        hint = "its inputs have static shapes only: drop --dim"
    raise InputError(f"--dim {names}: {what} has no symbolic input dimension of that name", hint=hint)


def specialize(graph, dims: Mapping[str, int]):
    """The graph with each named symbolic dimension replaced by its size, in every declared
    value (inputs, outputs, value infos): one name is one size throughout the model."""
    if not dims:
        return graph
    check_dim_names(dims, {name: graph.values.get(name) for name in graph.inputs}, "the model")
    values = {}
    for name, info in graph.values.items():
        shape = getattr(info, "shape", None)
        if shape is not None and any(isinstance(d, str) and d in dims for d in shape):
            info = replace(info, shape=tuple(dims[d] if isinstance(d, str) and d in dims else d for d in shape))
        values[name] = info
    return replace(graph, values=values)

