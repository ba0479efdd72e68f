"""Plans for a list of sizes, built ahead of time.

A symbolic input dimension given a list of sizes (``--dim H=480,640,960`` on ``nncc
compile``, ``dims={"H": [480, 640, 960]}`` on ``nncc.prepare``) asks for one plan per
combination of the listed sizes, as an inference server's optimization profiles do. Each
is exactly the cache entry ``prepare(path, stage="optimized", dims=combination, **options)``
builds, so a later prepare with those sizes, or a run of a dynamic model at that shape
that looks its own entry up, is a hit.
"""

from __future__ import annotations

import itertools
from typing import Mapping

from nncc.compiler import OptionError
from nncc.errors import InputError
from nncc.preparing.flows import prepare
from nncc.preparing.stages import OPTIMIZED


def size_lists(dims: Mapping[str, object] | None) -> dict[str, tuple[int, ...]] | None:
    """``dims`` as name -> its sizes when at least one value is a list (a single size is a
    list of one), else None (a plain ``dims``: one compile). A list that is empty or holds
    anything but whole numbers from 1 is an InputError naming the dimension."""
    if not dims or not any(isinstance(v, (list, tuple)) for v in dims.values()):
        return None
    lists = {}
    for name, sizes in dims.items():
        sizes = list(sizes) if isinstance(sizes, (list, tuple)) else [sizes]
        if not sizes:
            raise InputError(f"dimension {name!r} is given an empty list of sizes")
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise InputError(f"dimension {name!r}: sizes are whole numbers from 1, not {size!r}")
        lists[str(name)] = tuple(dict.fromkeys(sizes))  # a size listed twice is one plan
    return lists


def combinations(lists: Mapping[str, tuple[int, ...]]) -> list[dict[str, int]]:
    """Every combination of the listed sizes, the first name's sizes varying slowest."""
    names = list(lists)
    return [dict(zip(names, sizes)) for sizes in itertools.product(*(lists[n] for n in names))]


def prepare_each(path, lists: Mapping[str, tuple[int, ...]], prepare_one=prepare, **kwargs) -> list[tuple]:
    """``(dims, Prepared, CacheOutcome)`` for every combination, in order, each prepared
    with ``prepare_one(path, stage="optimized", dims=combination, **kwargs)`` (``stage``
    in ``kwargs`` overrides it). A bad dimension name fails on the first combination."""
    kwargs.setdefault("stage", OPTIMIZED)
    done = []
    for dims in combinations(lists):
        prepared, outcome = prepare_one(path, dims=dims, **kwargs)
        done.append((dims, prepared, outcome))
    return done


def plans_ahead(path, options: dict, **prepare_args) -> dict:
    """For ``nncc.prepare``: when ``options["dims"]`` lists sizes, build every combination's
    entry now (prepare_each) and return the options without ``dims``: the model for every
    size, whose runs at a listed shape find their entries. Other options come back as they are."""
    lists = size_lists(options.get("dims"))
    if lists is None:
        return options
    if not prepare_args.get("use_cache", True):
        raise OptionError("dims that list sizes build cache entries; with use_cache=False none would be kept")
    rest = {name: value for name, value in options.items() if name != "dims"}
    prepare_each(path, lists, background=None, **prepare_args, **rest)
    return rest
