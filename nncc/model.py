"""The public Python API: compile a model, save and load the artifact, run it."""

from __future__ import annotations

import mmap
import os
from typing import Mapping

import numpy as np

from nncc.compiler import CompileOptions, compile_graph
from nncc.errors import PlanFormatError
from nncc.plan.plan import Plan


class CompiledModel:
    """A prepared model: a verified Plan bound to an executor."""

    def __init__(self, plan: Plan, raw: bytes | None = None, trust_native: bool = False,
                 origin: str = "the artifact", cache_parts: tuple | None = None):
        """``trust_native``: run the plan's native code (when it has any and this CPU can);
        otherwise its portable plan runs, with one warning if native code was skipped.
        ``cache_parts``: the verified (model cache, data cache) a cache hit parsed the plan
        from, from which its artifact is assembled without serializing again."""
        from nncc.native.activate import activate
        from nncc.runtime.executor import Executor

        self.plan = plan
        self._raw = raw
        self.cache_parts = cache_parts
        self._native = activate(plan, trust_native, origin)
        self._executor = Executor(plan, native=self._native)

    @property
    def native_partitions(self) -> int:
        """How many partitions run as native code in this process."""
        return self._executor.native_partitions

    @property
    def input_infos(self):
        return self._executor.input_infos

    @property
    def output_names(self) -> list[str]:
        return self._executor.output_names

    @property
    def output_infos(self):
        from nncc.ir.graph import TensorInfo

        slots = self.plan.slots
        return {slots[s].name: TensorInfo(slots[s].dtype, slots[s].shape) for s in self.plan.outputs}

    def run(self, feeds: Mapping[str, np.ndarray],
            outputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run one inference. Inputs that are already C-contiguous with the right dtype
        are used in place; ``outputs`` (name -> array) receives results in caller memory."""
        return self._executor.run(feeds, outputs)

    def allocate(self, roles, shape=None, dtype=None):
        """An executor-managed buffer (a memory domain) for the given roles of this model,
        e.g. ``[("output", "h_out"), ("input", "h_in")]`` for a recurrent state."""
        return self._executor.allocate(roles, shape, dtype)

    def to_bytes(self) -> bytes:
        if self._raw is None:
            from nncc.plan.format import serialize

            self._raw = serialize(self.plan)
        return self._raw

    def save(self, path: str | os.PathLike) -> None:
        from nncc.util.atomic import write_atomic

        write_atomic(path, self.to_bytes())


def compile_model(path: str | os.PathLike, model_bytes: bytes | None = None, **options) -> CompiledModel:
    """Read an ONNX model and compile it. Options: preference, opt_level, backends, plugins.
    ``model_bytes``: the file's bytes when already read (external data is found next to
    ``path``)."""
    return CompiledModel(compile_plan(path, model_bytes, options), trust_native=True)  # code built just now


def compile_plan(path: str | os.PathLike, model_bytes: bytes | None, options: dict) -> Plan:
    """The Plan compile_model runs, without preparing it to run (nothing is allocated)."""
    from nncc.frontend.onnx import load_model

    opts = CompileOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})
    return compile_graph(load_model(path, model_bytes), opts)


def prepare(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
            trust_shared: bool | None = None, model_bytes: bytes | None = None, hash_mode: str | None = None,
            stage: str | None = None, **options):
    """Compile through the verified cache: ``(CompiledModel, CacheOutcome)``.

    A hit prepares from the cache files after checking them against the hash index; a miss
    compiles and stores; ``use_cache=False`` compiles and touches nothing. ``cache_dir``
    defaults to $NNCC_CACHE_DIR, else the user cache directory. Options and ``model_bytes``
    as compile_model. ``trust_shared`` (default $NNCC_CACHE_TRUST_SHARED) uses a cache
    folder that another user owns or others can write; without it such a cache is left
    alone (one warning). ``hash_mode``: "direct" (default, $NNCC_HASH_MODE) finds an
    unchanged model's entry by the file's identity without reading it; "content" always
    hashes the model (docs/cache.md).

    Stages: a miss stores the quick portable plan and returns at once; once the entry has
    been hit $NNCC_UPGRADE_AFTER times (default 2) a background thread builds its native
    stage, which the next prepare() picks up. ``stage="quick"`` or ``"optimized"`` forces
    one (optimized: the native code is built now).
    """
    from nncc.cache.flows import prepare as cached_prepare

    return cached_prepare(path, cache_dir=cache_dir, use_cache=use_cache, trust_shared=trust_shared,
                          model_bytes=model_bytes, hash_mode=hash_mode, stage=stage, background="thread",
                          **options)


def load(source: str | os.PathLike | bytes | bytearray | memoryview | mmap.mmap,
         trust_native: bool = False) -> CompiledModel:
    """Load a compiled artifact from a path (memory-mapped) or from bytes (or a mapping).
    Its native code runs only with ``trust_native=True``: running it is running whoever
    built the file."""
    origin = "the artifact" if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)) else os.fspath(source)
    return CompiledModel(read_artifact(source), trust_native=trust_native, origin=origin)


def read_artifact(source: str | os.PathLike | bytes | bytearray | memoryview | mmap.mmap) -> Plan:
    """The verified Plan of an artifact, without preparing it to run."""
    from nncc.plan.format import deserialize

    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        return deserialize(source)
    from nncc.util.files import read_source

    buffer, _ = read_source(source, "artifact")  # mapped when a regular file; never blocks on a FIFO
    if len(buffer) == 0:
        raise PlanFormatError(f"{source} is empty, not an nncc artifact")
    return deserialize(buffer)
