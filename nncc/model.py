"""The public Python API: compile a model, save and load the artifact, run it."""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
from typing import Mapping

import numpy as np

from nncc.backends.payloads import activate_payloads
from nncc.backends.registry import loaded_backend
from nncc.compiler import compile_graph
from nncc.errors import PlanFormatError
from nncc.ir.graph import TensorInfo
from nncc.ir.opsets import warn_newer_opsets
from nncc.plan.format import SEAL_SCHEME, artifact_from_parts, deserialize, seal_payload, serialize
from nncc.plan.plan import Plan
from nncc.preparing.calibration import checked
from nncc.preparing.compiling import compile_options
from nncc.preparing.flows import prepare as prepare_through_cache, resolve_settings
from nncc.preparing.shapes import NativeShapes
from nncc.preparing.size_lists import plans_ahead
from nncc.preparing.stages import has_later_stage
from nncc.runtime.executor import Executor
from nncc.runtime.specialize import shape_plans
from nncc.settings import bound_memory, trust_key_file, value
from nncc.util.files import read_source
from nncc.util.notice import warn
from nncc.util.prefault import populate_in_background
from nncc.runtime.warm_up import warm_up


LOAD_AHEAD = 2  # the shapes of a dynamic model's earlier processes loaded ahead by a prepare, at most
WARM_UP_PLANS = LOAD_AHEAD  # the shape plans a prepare warms up (nncc.runtime.warm_up), at most


class CompiledModel:
    """A prepared model: a verified Plan bound to an executor."""

    def __init__(self, plan: Plan, raw: bytes | None = None, trust_native: bool = False,
                 origin: str = "the artifact", foreign: bool = False, cache_parts: tuple | None = None,
                 natives=None, shape_plans_limit: int | None = None, team_key_file: str | None = None):
        """``trust_native``: run the plan's native code (when it has any and this CPU can)
        even if the plan's artifact is not signed by a trusted key; otherwise its portable
        plan runs, with one warning if native code was skipped. ``foreign``: the plan was
        read from an artifact, so its code is not this user's to sign when saved.
        ``cache_parts``: the verified (model cache, data cache) a cache hit parsed the plan
        from, from which its artifact is assembled without serializing again.
        ``shape_plans_limit``: how many input shapes get a plan of their own (the
        ``run.shape_plans`` setting, resolved by the caller); None: none.
        ``team_key_file``: the team's signing key, trusted beside the user's own and signed
        with (None: $NNCC_TRUST_KEY_FILE, resolved now)."""
        warn_newer_opsets(plan.options.get("opsets") or {})  # on every path: compiled, cached, loaded
        self.plan = plan
        self._raw = raw
        self._foreign = foreign
        self.cache_parts = cache_parts
        self._team_key_file = trust_key_file() if team_key_file is None else team_key_file or None
        if foreign:  # an artifact from outside: its shapes agree before they size anything
            from nncc.runtime.plan_shapes import check_plan_shapes  # lazy: start-up

            with naming_the_artifact(None if origin == "the artifact" else origin):
                check_plan_shapes(plan)
        self._executor = Executor(plan, loaded=activate_payloads(plan, trust_native, origin, self._team_key_file))
        # the first run would fault in every page of the mapped constants, the arena and the native calls'
        # workspaces: mapped now, beside the caller's own work (the data cache's mapping, as a hit verified it)
        data = cache_parts[1] if cache_parts is not None else None
        self.prefaulting = populate_in_background([(data, False)] + [(b, True) for b in scratch(self._executor)])
        self._blas_threads = plan.recorded_threads
        self._shape_plans = shape_plans(self._executor, shape_plans_limit, natives)
        self._last = self._executor  # what ran last: the general plan, a shape's own, a sample loop
        self.warmed_up = 0  # runs on zeros done ahead of the caller's first (warm_up)

    def warm_up(self) -> int:
        """Run the plans a first run may take on zeros, where that is cheap (a small model
        that is one native call: nncc.runtime.warm_up), the most recently used last; the
        runs done. ``prepare`` does it, so that a service's first answer is not its slowest."""
        executors = [self._executor]
        if self._shape_plans is not None:
            executors += self._shape_plans.executors()[-WARM_UP_PLANS:]
        self.warmed_up = sum(warm_up(executor, self.run) for executor in executors)
        return self.warmed_up

    @classmethod
    def from_prepared(cls, prepared, natives=None, shape_plans_limit: int | None = None):
        """The runnable model of what nncc.preparing returned: built here, outside every
        cache lock (native code is loaded, the arena allocated)."""
        return cls(prepared.plan, trust_native=prepared.trust_native, origin=prepared.origin,
                   foreign=prepared.foreign, cache_parts=prepared.cache_parts, natives=natives,
                   shape_plans_limit=shape_plans_limit)

    @property
    def foreign(self) -> bool:
        """Read from an artifact or built by another machine: never signed as this user's."""
        return self._foreign

    @property
    def executor(self):
        """The executor that runs the general plan (its native code loaded)."""
        return self._executor

    @property
    def native_partitions(self) -> int:
        """How many partitions run as native code in this process."""
        return self._executor.native_partitions

    @property
    def last_run_native_partitions(self) -> int:
        """How many native partitions the plan that ran last holds: for a model with
        dynamic dimensions, the plan of the last run's input shape (before any run, the
        general plan's)."""
        return self._last.native_partitions

    @property
    def last_run_partitions(self) -> int:
        """How many partitions the plan that ran last holds, native or not (see
        last_run_native_partitions)."""
        return max(len(self._last.plan.partitions), 1)

    @property
    def sample_axes(self) -> list[str]:
        """The symbolic dimensions found to be sample axes (each sample's outputs computed
        from its inputs alone: nncc.runtime.sample_axis), which run natively at any size
        through the plan for one sample. Known once a run has met them."""
        return [] if self._shape_plans is None else self._shape_plans.sample_axes

    @property
    def input_infos(self):
        return self._executor.input_infos

    @property
    def output_names(self) -> list[str]:
        return self._executor.output_names

    @property
    def output_infos(self):
        slots = self.plan.slots
        return {slots[s].name: TensorInfo(slots[s].dtype, slots[s].shape) for s in self.plan.outputs}

    def run(self, feeds: Mapping[str, np.ndarray],
            outputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run one inference. Inputs that are already C-contiguous with the right dtype
        are used in place; ``outputs`` (name -> array) receives results in caller memory.
        A plan compiled with a thread count (low-power: 1) runs BLAS at that count, and the
        count before is restored afterwards (the native pool was sized at activation)."""
        executor = self._executor
        # a dict first: the Mapping check is an ABC's, slower than a small model's whole run
        if self._shape_plans is not None and (type(feeds) is dict or isinstance(feeds, Mapping)):
            executor = self._shape_plans.executor_for(feeds)
            self._last = executor
        if self._blas_threads:
            from nncc.util.threads import limit_blas_threads  # lazy: start-up

            with limit_blas_threads(self._blas_threads):
                return executor.run(feeds, outputs)
        return executor.run(feeds, outputs)

    @property
    def shape_plans(self) -> list[tuple]:
        """The input shapes (of the inputs with dynamic dimensions, in order) that have a
        plan of their own (or a sample loop), least recently used first: a shape an earlier
        process ran gets one from the prepare on (its native plan, loaded ahead), another
        on its first run when the cache holds its native plan, else on its second, and at
        most the ``run.shape_plans`` setting are kept."""
        return [] if self._shape_plans is None else self._shape_plans.shapes()

    def allocate(self, roles, shape=None, dtype=None):
        """An executor-managed buffer (a memory domain) for the given roles of this model,
        e.g. ``[("output", "h_out"), ("input", "h_in")]`` for a recurrent state."""
        return self._executor.allocate(roles, shape, dtype)

    def to_bytes(self) -> bytes:
        """The artifact. Native code built here (or read from nncc's own cache) is signed
        with the user's key; a loaded artifact keeps its own signature, if its bytes are
        unchanged, and is never signed by this user."""
        if self._raw is None:
            self._raw = _serialize(self.plan, self._foreign, self._team_key_file)
        return self._raw

    def save(self, path: str | os.PathLike) -> None:
        from nncc.util.atomic import write_atomic  # lazy: start-up

        write_atomic(path, self.to_bytes())


def scratch(executor) -> list[np.ndarray]:
    """The memory an executor writes on every run and allocated up front: its arena, each
    native call's workspace, and the outputs of its first run."""
    found = [getattr(executor, "arena", None), *(getattr(executor, "first_outputs", None) or ())]
    found += [getattr(call.fn, "workspace", None) for unit in executor.units if unit.kind == "native"
              for call in unit.calls]
    return [b for b in found if isinstance(b, np.ndarray) and b.nbytes]


def _serialize(plan: Plan, foreign: bool, team_key_file: str | None) -> bytes:
    """The artifact of ``plan``: signed with the user's key (the team's, ``team_key_file``,
    when one is set), unless it is foreign (then it keeps its own signature, if that still
    signs it)."""
    if foreign:
        seal = plan.seal
        return serialize(plan, seal=lambda message: _same_seal(seal, message))
    from nncc.trust.seal import sign  # lazy: start-up

    return serialize(plan, seal=functools.partial(sign, team_key_file=team_key_file))


def _same_seal(seal, message: bytes) -> bytes | None:
    """The artifact's own SIGN section, when it still signs what is being written."""
    if seal is None or seal.scheme != SEAL_SCHEME or seal.message != message:
        return None
    return seal_payload(seal.fingerprint, seal.mac)


def compile_model(path: str | os.PathLike, model_bytes: bytes | None = None, **options) -> CompiledModel:
    """Read an ONNX model and compile it. Options: preference, opt_level, backends, plugins,
    dims, precision ("bf16": products by constant weights in bfloat16, docs/native.md), and
    a backend's own options by name (``target``: the native backend's ISA), or whole
    records by backend name (``backend_options``: nncc.backends.base.Backend.options_from).
    ``model_bytes``: the file's bytes when already read (external data is found next to
    ``path``)."""
    bound_memory()
    return CompiledModel(compile_plan(path, model_bytes, options), trust_native=True,  # code built just now
                         natives=CompiledSamplePlans(path, model_bytes, options),
                         shape_plans_limit=_shape_plans_setting())


def compile_plan(path: str | os.PathLike, model_bytes: bytes | None, options: dict) -> Plan:
    """The Plan compile_model runs, without preparing it to run (nothing is allocated)."""
    from nncc.frontend.onnx import load_model  # lazy: onnx

    bound_memory()
    return checked(lambda opts: compile_graph(load_model(path, model_bytes), opts), compile_options(options))


def prepare(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
            trust_shared: bool | None = None, model_bytes: bytes | None = None, hash_mode: str | None = None,
            stage: str | None = None, background: str | None = "thread", settings=None, **options):
    """Compile through the verified cache: ``(CompiledModel, CacheOutcome)``.

    A hit prepares from the cache files after checking them against the hash index; a miss
    compiles and stores; ``use_cache=False`` compiles and touches nothing. ``cache_dir``
    defaults to $NNCC_CACHE_DIR, else the user cache directory. Options and ``model_bytes``
    as compile_model. ``trust_shared`` (default $NNCC_CACHE_TRUST_SHARED) uses a cache
    folder that another user owns or others can write; without it such a cache is left
    alone (one warning). ``hash_mode``: "direct" (default, $NNCC_CACHE_HASH_MODE) finds an
    unchanged model's entry by the file's identity without reading it; "content" always
    hashes the model (docs/cache.md).

    Stages: a miss stores the quick portable plan and returns at once; a background thread
    builds its native stage, started by the miss (or after $NNCC_UPGRADE_AFTER hits; default
    0, the miss), which the next prepare() picks up. ``stage="quick"`` or ``"optimized"`` forces
    one (optimized: the native code is built now). ``background``: "thread" (default) or
    "process" (a detached worker, for a command that exits at once), or None: no upgrade.

    Dynamic input dimensions: an input shape whose native plan the cache holds (an entry
    for those sizes: ``stage="optimized", dims=...``) runs it from its first run (the plans
    of the shapes earlier processes ran are loaded and kept by the prepare); otherwise,
    where a stage upgrade would happen, that plan is built in the ``background`` (a thread,
    or a detached process) through the cache, and the shape gets a portable plan of its own
    on its second run (nncc.runtime.specialize, nncc.preparing.shapes). A batch dimension
    that is a sample axis (nncc.runtime.sample_axis) runs every size through the plan for
    one sample, one cache entry (``use_cache=False``: compiled now, as compile_model does),
    until the size's own native plan, asked for on its first run, is built.
    ``dims={"H": [480, 640]}`` (lists of sizes) builds each combination's optimized entry
    now, then prepares the model for every size (nncc.preparing.size_lists).
    ``settings``: the command's resolved settings (nncc.settings.CacheSettings), else
    resolved now.
    """
    bound_memory()
    if settings is None:
        settings = resolve_settings(cache_dir, hash_mode, use_cache)
    options = plans_ahead(path, options, cache_dir=cache_dir, use_cache=use_cache, trust_shared=trust_shared,
                          model_bytes=model_bytes, hash_mode=hash_mode, settings=settings)
    natives = ahead = None
    # the fixed-size entries are found and built from the model's file: not for a pipe
    if use_cache and stage != "quick" and background is not None and (model_bytes is None or os.path.isfile(path)):
        natives = ShapeExecutors(NativeShapes(path, {"trust_shared": trust_shared, "hash_mode": hash_mode},
                                              options, settings, background))
        # before the general plan is read: the two overlap (only a model with dynamic dimensions has such entries)
        ahead = natives.load_ahead(min(settings.shape_plans or 0, LOAD_AHEAD))
    prepared, outcome = prepare_through_cache(path, cache_dir=cache_dir, use_cache=use_cache,
                                              trust_shared=trust_shared, model_bytes=model_bytes,
                                              hash_mode=hash_mode, stage=stage, background=background,
                                              settings=settings, **options)
    if not use_cache and stage != "quick" and outcome.outcome == "disabled":  # as compile_model: compiled now
        natives = CompiledSamplePlans(path, model_bytes, options)
    model = CompiledModel.from_prepared(prepared, natives, settings.shape_plans)  # outside every lock
    if ahead is not None:
        # the load overlapped the general plan's; what is left of it is waited for here, not
        # by the first run, whose latency is a service's first answer after its start-up
        ahead.join()
        if model._shape_plans is not None:  # kept now: a seen shape's first run finds its plan as a later run does
            model._shape_plans.adopt(natives.loaded_ahead())
    model.warm_up()
    return model, outcome


class ShapeExecutors:
    """A dynamic model's fixed-size native plans from the cache (nncc.preparing.shapes), as
    the executors its shape plans run (nncc.runtime.specialize): each is built to run
    here, with its native code loaded.

    ``load_ahead`` loads the plans of the shapes the model's earlier processes ran (the
    cache's entries for it) in a thread, from the prepare on: a process's first run of
    such a shape then finds its plan loaded (or waits for the load under way) instead of
    looking it up, verifying, parsing and loading it itself."""

    exact = True  # looked up for every new shape: a lookup compiles nothing
    builds_native = True  # an entry may be there whatever this process would build

    def __init__(self, natives):
        self.natives = natives
        self._ahead: dict[frozenset, "LoadedAhead"] = {}
        self._guessed = threading.Event()  # set once _ahead holds every shape being loaded ahead
        self._guessed.set()

    def load_ahead(self, most: int) -> threading.Thread | None:
        """Start loading, in a thread, the plans of at most ``most`` shapes this model ran
        before (most recently used first); the thread, or None (``most`` 0)."""
        if most < 1:
            return None
        self._guessed.clear()
        thread = threading.Thread(target=self._load_ahead, args=(most,), name="nncc-load-ahead", daemon=True)
        thread.start()
        return thread

    def _load_ahead(self, most: int) -> None:
        try:
            loading = [(dims, LoadedAhead()) for dims in self.natives.seen_sizes(most)]
            self._ahead.update((frozenset(dims.items()), ahead) for dims, ahead in loading)
        finally:
            self._guessed.set()  # a run's lookup waits for the guess, never longer
        for dims, ahead in loading:
            try:
                ahead.executor = self.find_now(dims, populated=True)
                ahead.loaded = True
            except Exception:  # noqa: BLE001 - background work never fails a run: the run looks it up itself
                pass
            finally:
                ahead.done.set()

    def loaded_ahead(self) -> list[tuple[dict[str, int], object]]:
        """The plans the load ahead found, (sizes, executor) most recently used first; a
        ``find`` of those sizes still gets them (a sample loop asks for the plan of one
        sample by its sizes). Called once the load is over."""
        return [(dict(dims), ahead.executor) for dims, ahead in self._ahead.items() if ahead.executor is not None]

    def find(self, dims):
        self._guessed.wait()
        ahead = self._ahead.pop(frozenset(dims.items()), None)
        if ahead is not None:
            ahead.done.wait()
            if ahead.loaded:
                return ahead.executor
        return self.find_now(dims)

    def find_now(self, dims, populated: bool = False):
        """The executor of the cache's plan for these sizes, looked up and loaded now, or
        None. Its memory is faulted in on a thread of its own, which a run does not wait
        for (it faults in what it touches first itself); ``populated``: before this returns
        (the load ahead's thread, which the first run does not wait on: its faults would
        fall in the run, beside it)."""
        prepared = self.natives.find(dims)
        return None if prepared is None else _executor_of(prepared, populated)

    def build(self, dims, deliver):
        return self.natives.build(dims, lambda prepared: deliver(_executor_of(prepared)))


class LoadedAhead:
    """A shape's plan being loaded ahead: ``done`` once tried, ``loaded`` when the lookup
    ran to its end (``executor``: what it found, None for nothing)."""

    def __init__(self):
        self.done = threading.Event()
        self.loaded = False
        self.executor = None


def _executor_of(prepared, populated: bool = False):
    model = CompiledModel.from_prepared(prepared, shape_plans_limit=None)
    if populated and model.prefaulting is not None:
        model.prefaulting.join()
    return model.executor


class CompiledSamplePlans:
    """compile_model's plans for one sample of a dynamic model (nncc.runtime.specialize's
    sample loop), compiled directly, without a cache, when first asked for: the very plan
    ``prepare`` finds or builds through the cache."""

    exact = False  # only the plan of one sample is asked for: a compile, not a lookup

    def __init__(self, path, model_bytes, options: dict):
        self.path, self.model_bytes, self.options = path, model_bytes, options

    @functools.cached_property
    def builds_native(self) -> bool:
        """Whether the options ask for a backend that builds native code (else the plan
        for one sample would run no faster than the general plan)."""
        return has_later_stage(compile_options(self.options))

    def find(self, dims):
        if not self.builds_native:
            return None
        fixed = dict(self.options.get("dims") or {}) | dict(dims)
        plan = compile_plan(self.path, self.model_bytes, dict(self.options, dims=fixed))
        return CompiledModel(plan, trust_native=True, shape_plans_limit=None).executor  # code built just now

    def build(self, dims, deliver):
        return None


def preparer():
    """prepare(), for one command that prepares many times (``nncc bench``): the settings
    are resolved by its first call of each kind (one cache folder, or no cache) and every
    later call reuses them, as a command resolves its settings once."""
    resolved: dict[tuple, object] = {}

    def prepare_again(path, cache_dir=None, use_cache: bool = True, hash_mode: str | None = None, **kwargs):
        kind = (os.fspath(cache_dir) if cache_dir is not None else None, hash_mode, use_cache)
        if kind not in resolved:
            resolved[kind] = resolve_settings(cache_dir, hash_mode, use_cache)
        return prepare(path, cache_dir=cache_dir, use_cache=use_cache, hash_mode=hash_mode,
                       settings=resolved[kind], **kwargs)

    return prepare_again


def prepare_plan(path: str | os.PathLike, **kwargs):
    """``(Prepared, CacheOutcome)``: what prepare() builds its model from, for a caller
    that only writes the artifact (``nncc compile``); arguments as prepare(). No native
    code is loaded and no memory planned; no background upgrade is started."""
    kwargs.setdefault("background", None)
    bound_memory()
    prepared, outcome = prepare_through_cache(path, **kwargs)
    warn_newer_opsets(prepared.plan.options.get("opsets") or {})  # as building the model would
    return prepared, outcome


def refuse_unloadable(prepared, origin: str) -> None:
    """What building the runnable model would refuse here, checked without loading
    anything: native code built in the sanitize mode, in a process without the sanitizer
    runtime (``nncc compile`` writes nothing ``nncc run`` could not load alike). Each
    payload's backend says (``Backend.check_loadable``)."""
    if not (prepared.trust_native and prepared.plan.carries_code):
        return
    for name, payload in sorted(prepared.plan.payloads.items()):
        backend = loaded_backend(name)
        if backend is not None:
            backend.check_loadable(payload, prepared.plan, origin)


def artifact_bytes(prepared) -> bytes:
    """The single-file artifact (``nncc compile -o``) of a prepared model (a CompiledModel,
    or what nncc.preparing returned, which is never built to run only to be written),
    signed with the user's key when it carries native code. For a model prepared from the
    cache it is assembled from the verified model and data caches, so it is byte-identical
    to what an uncached compile writes."""
    if prepared.cache_parts is None:
        if isinstance(prepared, CompiledModel):
            return prepared.to_bytes()
        return _serialize(prepared.plan, prepared.foreign, trust_key_file())
    from nncc.trust.seal import sign  # lazy: start-up (native code from our own cache is signed as ours)

    if prepared.foreign:  # another machine's code (the remote tier's): never signed as the user's
        if prepared.plan.carries_code:
            warn("the artifact is not signed: its native code came from the remote cache, built by another "
                 "machine (`nncc compile --no-cache` builds and signs it here)")
        return artifact_from_parts(*prepared.cache_parts)
    return artifact_from_parts(*prepared.cache_parts, seal=functools.partial(sign, team_key_file=trust_key_file()))


def load(source: str | os.PathLike | bytes | bytearray | memoryview | mmap.mmap,
         trust_native: bool = False, name: str | None = None) -> CompiledModel:
    """Load a compiled artifact from a path (memory-mapped) or from bytes (or a mapping).
    Its native code runs only when the file is signed by the user's key (or the
    NNCC_TRUST_KEY_FILE key), or with ``trust_native=True``: running it is running whoever
    built the file. ``name``: the file the bytes came from, for messages."""
    if name is None and not isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        name = os.fspath(source)
    return CompiledModel(read_artifact(source, name), trust_native=trust_native, origin=name or "the artifact",
                         foreign=True, shape_plans_limit=_shape_plans_setting())


def _shape_plans_setting() -> int | None:
    """``run.shape_plans``, resolved once by each entry point that builds a model without
    the cache's settings record (compile_model, load)."""
    return value("run.shape_plans")


def read_artifact(source: str | os.PathLike | bytes | bytearray | memoryview | mmap.mmap,
                  name: str | None = None) -> Plan:
    """The verified Plan of an artifact, without preparing it to run. A malformed or
    damaged artifact raises PlanFormatError naming the file (``name``, or the path)."""
    bound_memory()
    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        with naming_the_artifact(name):
            return deserialize(source)

    name = name or os.fspath(source)
    buffer, _ = read_source(source, "artifact")  # mapped when a regular file; never blocks on a FIFO
    if len(buffer) == 0:
        raise PlanFormatError(f"{name} is empty, not an nncc artifact")
    with naming_the_artifact(name):
        return deserialize(buffer)


@contextlib.contextmanager
def naming_the_artifact(name: str | None):
    """Put the artifact's file name in front of a PlanFormatError raised inside, with a hint
    where nncc knows what to do: a failed checksum means the file changed after it was
    written, another format version needs a recompile."""
    try:
        yield
    except PlanFormatError as exc:
        if name is None:
            raise
        message = str(exc)
        if "checksum" in message:
            hint = f"{name} was damaged or modified after it was written: compile the model again"
        elif "format version" in message:
            hint = "compile the model again with this nncc"
        else:
            hint = exc.hint
        raise PlanFormatError(f"{name}: {message}", hint=hint) from None
