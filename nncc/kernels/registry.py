"""Kernel registry keyed by (domain, op_type, since_version).

A kernel is a plain function ``fn(ctx, *inputs) -> array | tuple[array, ...]`` over numpy
arrays (an omitted optional input arrives as None). Its shape function
``shape(ctx, *infos) -> list[TensorInfo]`` predicts output dtypes and shapes from input
TensorInfos, reading ``info.value`` where an output shape depends on input contents.
Resolution picks the highest since-version not above the model's opset, as ONNX does.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from nncc.errors import UnsupportedOpError
from nncc.ir.graph import normalize_domain
from nncc.kernels import load_all, load_family
from nncc.kernels.catalog import FAMILY_OF

KernelFn = Callable[..., Any]
ShapeFn = Callable[..., list]


class Ctx:
    """Per-node context handed to kernels and shape functions."""

    __slots__ = ("attrs", "opset", "num_outputs", "name", "scratch", "workspace", "constant_inputs")

    def __init__(self, attrs: dict, opset: int, num_outputs: int = 1, name: str = ""):
        self.attrs = attrs
        self.opset = opset
        self.num_outputs = num_outputs
        self.name = name
        # What a kernel keeps between runs: `scratch` is this node's own (derived tables);
        # `workspace` holds large temporary buffers by shape and is shared by all nodes of
        # an executor, which runs one kernel at a time, so the steady state allocates
        # nothing and a model needs only one buffer per distinct temporary shape.
        self.scratch: dict = {}
        self.workspace: dict = {}
        # Positions of the inputs that are plan constants: the same array, with the same
        # contents, on every run (set by the executor). Only those may be checked or
        # converted once and the result reused by identity; a read-only array from a
        # caller can be a view of memory that changes between runs.
        self.constant_inputs: frozenset = frozenset()

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def is_constant(self, index: int) -> bool:
        return index in self.constant_inputs


@dataclass(frozen=True)
class KernelDef:
    op_type: str
    domain: str
    since: int
    fn: KernelFn
    shape: ShapeFn
    # Ops whose outputs change between runs (random generators) must not be folded.
    deterministic: bool = True
    # The kernel accepts ``out=(array, ...)``: preallocated outputs it fills and returns.
    writes_out: bool = False
    # The kernel's first phase (see ``kernel``): ``prepare(ctx, *infos) -> run | None``.
    prepare: Callable | None = None

    @functools.cached_property
    def arity(self) -> tuple[int, int | None]:
        """(required, most) inputs, read from the kernel's signature: the leading
        parameters without a default are required (an omitted optional input arrives as
        None), ``*inputs`` takes any number, ``out`` is not an input. A wrapper taking
        ``*args`` for another kernel declares its own as ``fn.arity``."""
        declared = getattr(self.fn, "arity", None)
        if declared is not None:
            return declared
        required, most = 0, 0
        for p in list(inspect.signature(self.fn).parameters.values())[1:]:
            if p.kind is p.VAR_POSITIONAL:
                return required, None
            if p.kind is not p.POSITIONAL_OR_KEYWORD or p.name == "out":
                continue
            most += 1
            if p.default is p.empty and required == most - 1:
                required = most
        return required, most

    def check_inputs(self, present: list[bool], where: str) -> str | None:
        """Why these inputs (``present[i]``: input i is given, not the empty name) cannot
        be fed to the kernel, or None when they can."""
        required, most = self.arity
        if len(present) < required:
            return f"{where} has {len(present)} input(s); {self.op_type} needs at least {required}"
        if most is not None and len(present) > most:
            return f"{where} has {len(present)} inputs; {self.op_type} takes at most {most}"
        if most is None and not present:
            return f"{where} has no inputs; {self.op_type} needs at least one"
        # variadic: every one, unless the kernel takes omitted ones (Loop's trip count and
        # condition, Scan-8's sequence lengths)
        checked = required if most is not None else (0 if getattr(self.fn, "omitted_inputs_ok", False)
                                                     else len(present))
        for i in range(checked):
            if not present[i]:
                return f"{where}: input {i} of {self.op_type} is required but given as the empty name"
        return None

    @property
    def key(self) -> str:
        """Stable identifier, used by serialized plans to name the kernel."""
        return f"{self.domain or 'ai.onnx'}::{self.op_type}::{self.since}"


_REGISTRY: dict[tuple[str, str], list[KernelDef]] = {}


def kernel(op_type: str, since: int = 1, domain: str = "", *, shape: ShapeFn,
           deterministic: bool = True, writes_out: bool = False,
           prepare: Callable | None = None) -> Callable[[KernelFn], KernelFn]:
    """Register ``fn`` as the kernel of ``op_type`` from opset ``since`` on.

    With ``writes_out``, ``fn(ctx, *inputs, out=None)`` must, when ``out`` is given, write
    every output into the matching preallocated array (of the inferred dtype and shape).

    ``prepare`` is an optional first phase: ``prepare(ctx, *infos)``, given the node's
    attributes and a TensorInfo (static dtype and shape) per input (None where omitted),
    does the work that depends on those alone, once, and returns ``run(ctx, *inputs,
    out=None)``, a kernel specialized to them, or None to keep ``fn``. The executor calls
    it once per node when it is prepared, only where every input is certain to arrive
    with exactly its declared dtype and shape (a graph input, a constant or a planned
    buffer), and runs ``run`` from then on. A problem it finds is left to ``fn`` to report
    when the node runs: it returns None.
    """

    def register(fn: KernelFn) -> KernelFn:
        add(KernelDef(op_type, normalize_domain(domain), since, fn, shape, deterministic, writes_out,
                      prepare))
        return fn

    return register


def stand_ins(*infos) -> list | None:
    """For a first phase: arrays of the infos' dtypes and shapes that take no memory
    (broadcast views of one zero), to check and plan with as with the real operands (None
    for a None info); None when an info is not static."""
    if any(i is not None and (i.dtype is None or i.shape is None) for i in infos):
        return None
    return [None if i is None else np.broadcast_to(np.zeros((), i.dtype), i.shape) for i in infos]


def add(definition: KernelDef) -> None:
    versions = _REGISTRY.setdefault((definition.domain, definition.op_type), [])
    for i, existing in enumerate(versions):
        if existing.since == definition.since:
            versions[i] = definition  # re-registration (e.g. a plugin override) wins
            return
    bisect.insort(versions, definition, key=lambda d: d.since)


def resolve(op_type: str, domain: str, opset: int) -> KernelDef:
    _ensure_loaded()
    versions = _REGISTRY.get((normalize_domain(domain), op_type))
    if not versions:
        raise UnsupportedOpError(op_type, domain, opset, "no kernel is registered")
    index = bisect.bisect_right([d.since for d in versions], opset)
    if index == 0:
        raise UnsupportedOpError(
            op_type, domain, opset, f"kernels start at opset {versions[0].since}"
        )
    return versions[index - 1]


def by_key(key: str) -> KernelDef | None:
    """The kernel a serialized plan names, or None. Imports nothing a plan could name
    but the built-in family that registers the op (from catalog.FAMILY_OF), so that a
    cache hit loads only the families its plan uses."""
    try:
        domain, op_type, since = key.split("::")
        domain = normalize_domain(domain)
        version = int(since)
    except ValueError:
        return None
    found = _find(domain, op_type, version)
    if found is None and not _loaded:
        family = FAMILY_OF.get(f"{domain}::{op_type}")
        if family is not None:
            load_family(family)
            found = _find(domain, op_type, version)
        if found is None:
            _ensure_loaded()
            found = _find(domain, op_type, version)
    return found


def _find(domain: str, op_type: str, since: int) -> KernelDef | None:
    for definition in _REGISTRY.get((domain, op_type), []):
        if definition.since == since:
            return definition
    return None


def builtin_families() -> dict[str, str]:
    """"domain::op_type" -> the built-in family module (in nncc/kernels/) registering it."""
    _ensure_loaded()
    return {f"{domain}::{op}": defs[0].fn.__module__.rsplit(".", 1)[1]
            for (domain, op), defs in sorted(_REGISTRY.items())
            if defs[0].fn.__module__.startswith("nncc.kernels.")}


def registered_ops() -> list[tuple[str, str, int]]:
    _ensure_loaded()
    return sorted((d, op, k.since) for (d, op), defs in _REGISTRY.items() for k in defs)


_loaded = False
_loading = False
# A process may resolve ops on two threads at once (a plan loaded ahead beside the caller's
# own prepare): the second waits until every family is registered instead of seeing a half
# filled registry. Reentrant, so a family that resolves an op while it is imported passes.
_LOAD_LOCK = threading.RLock()


def _ensure_loaded() -> None:
    global _loaded, _loading
    if _loaded:
        return
    with _LOAD_LOCK:
        if _loaded or _loading:
            return
        _loading = True
        try:
            load_all()  # registers the built-in op families
            _loaded = True
        finally:
            _loading = False
