"""The compiled kernel objects a plan's native code was linked from.

A plan records its objects' keys (``options["native"]["objects"]``) and the cache keeps
the objects, verified against its index, beside its entries. When one is not there (no
cache, an entry from the remote tier, a removed object), the model is compiled again in
this process with a store that keeps every object it builds or finds: the same text under
the same compiler gives the same keys, so the library is the same either way.
"""

from __future__ import annotations

from nncc.cache.objects import CacheObjects
from nncc.cache.store import Cache
from nncc.compiler import compile_graph
from nncc.errors import NnccError
from nncc.preparing.compiling import compile_options


class Keeping:
    """An object store that remembers every object that passes through it, in front of
    another store (the cache's) or none."""

    def __init__(self, inner=None):
        self.inner = inner
        self.kept: dict[str, bytes] = {}

    def load(self, key: str) -> bytes | None:
        data = self.kept.get(key)
        if data is None and self.inner is not None:
            data = self.inner.load(key)
            if data is not None:
                self.kept[key] = data
        return data

    def save(self, key: str, data: bytes) -> None:
        self.kept[key] = data
        if self.inner is not None:
            self.inner.save(key, data)


def cached_objects(directory: str | None, keys: list[str], trust_shared: bool = False) -> dict[str, bytes] | None:
    """Every object of ``keys`` from the cache in ``directory``, or None if one is missing."""
    if not directory or not keys:
        return None
    try:
        cache = Cache.open(directory, create=False, read_only_ok=True, trust_shared=trust_shared)
    except NnccError:
        return None
    try:
        store = CacheObjects(cache)
        found = {}
        for key in dict.fromkeys(keys):
            data = store.load(key)
            if data is None:
                return None
            found[key] = data
        return found
    finally:
        cache.close()


def open_store(directory: str | None, trust_shared: bool = False):
    """(the cache's object store or None, what to close afterwards or None)."""
    if not directory:
        return None, None
    try:
        cache = Cache.open(directory, create=False, read_only_ok=True, trust_shared=trust_shared)
    except NnccError:
        return None, None
    return CacheObjects(cache), cache


def compile_keeping(model: str, model_bytes: bytes, options: dict, build, objects: Keeping):
    """The Plan of ``model`` compiled in this process as the cache's compile does
    (``options`` as nncc.model.prepare takes them, ``build``: the backends' option records
    the command's settings resolved), every kernel object it builds or finds kept in
    ``objects``."""
    from nncc.frontend.onnx import load_model  # lazy: onnx

    return compile_graph(load_model(model, model_bytes), compile_options(options, build), objects)
