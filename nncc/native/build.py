"""Building a plan's native code: compile the translation units no store holds yet, in
parallel, then link the shared object from every unit's object.

Objects are named by ``Toolchain.object_key`` (source, compiler, version, flags), so a unit
that is the same text under the same compiler is compiled once: by this process
(``MemoryObjects``, which also serves a cache that lacks an object this process built: the
runtime unit alone costs a second and a half of compiler time, and a process that fills
several caches, a test suite or a build script, would pay it for each), and for good with a
cache directory (the cache's kernel object store, nncc/cache/objects.py, which the caller
that opened the cache passes down as ``store``). A store hands back only bytes it has
verified, and the link reads those bytes, never a file in the cache.
How many compiler runs go at once is the toolchain's (``Toolchain.jobs``, from the
command's settings).
"""

from __future__ import annotations

import queue
import threading


class MemoryObjects:
    """Objects and linked libraries kept for the life of the process (linking is skipped
    only here: with a cache, the link is what turns verified objects into code)."""

    LIMIT = 256 << 20  # bytes of objects kept; the oldest go first beyond it

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.linked: dict[tuple, bytes] = {}
        self.size = 0

    def load(self, key: str) -> bytes | None:
        return self.objects.get(key)

    def save(self, key: str, data: bytes) -> None:
        if key in self.objects:
            return
        self.objects[key] = data
        self.size += len(data)
        while self.size > self.LIMIT and len(self.objects) > 1:
            self.size -= len(self.objects.pop(next(iter(self.objects))))


_MEMORY = MemoryObjects()


def build(toolchain, units: list[tuple[str, str]], store=None) -> tuple[bytes, list[str]]:
    """(shared object, object keys in link order) for ``units`` (label, C source).
    ``store``: where objects are kept and found (``load``/``save`` by key); None: this
    process's memory."""
    store = store or _MEMORY
    keys = [toolchain.object_key(source) for _, source in units]
    objects: dict[str, bytes] = {}
    missing: dict[str, str] = {}
    for (_, source), key in zip(units, keys):
        if key in objects or key in missing:
            continue
        data = store.load(key)
        if data is None and store is not _MEMORY:
            data = _MEMORY.load(key)  # built by this process for another cache (or none)
            if data is not None:
                store.save(key, data)
        if data is None:
            missing[key] = source
        else:
            objects[key] = data
    if missing:
        built = _compile_all(toolchain, missing, store)
        if store is not _MEMORY:
            for key, data in built.items():
                _MEMORY.save(key, data)
        objects.update(built)
    link_key = tuple(keys)  # each key covers the compiler already
    if store is _MEMORY and link_key in _MEMORY.linked:
        return _MEMORY.linked[link_key], keys
    code = toolchain.link([objects[k] for k in dict.fromkeys(keys)])
    if store is _MEMORY:
        _MEMORY.linked[link_key] = code
    return code, keys


def _compile_all(toolchain, sources: dict[str, str], store) -> dict[str, bytes]:
    """Compile every source, ``toolchain.jobs`` at a time; each object is stored (by this
    thread, which owns the store) as soon as it is built, so a failure later on keeps the work
    done. The first failure leaves the rest unstarted. Plain threads, not a concurrent.futures
    pool: a pool refuses work once the interpreter has begun to exit, which is when a
    background build (a stage upgrade, a shape's native plan) of a short process runs."""
    built: dict[str, bytes] = {}
    todo = list(sources.items())
    results: queue.Queue = queue.Queue()
    taking = threading.Lock()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            with taking:
                if not todo:
                    return
                key, source = todo.pop(0)
            try:
                results.put((key, toolchain.compile_object(source), None))
            except BaseException as exc:  # noqa: BLE001 - raised again by the thread that waits
                results.put((key, None, exc))

    workers = [threading.Thread(target=work, name="nncc-cc") for _ in range(min(toolchain.jobs, len(sources)))]
    for worker in workers:
        worker.start()
    try:
        for _ in range(len(sources)):
            key, data, exc = results.get()
            if exc is not None:
                raise exc
            built[key] = data
            store.save(key, data)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    return built
