"""A third-party-style nncc plugin, written only against nncc's public plugin interface.

Load it with ``nncc.backends.registry.load_plugin("tests.plugins.mulsub_plugin")`` or
``nncc compile --plugin tests.plugins.mulsub_plugin --backend mulsub --backend numpy``.

It shows both halves of the extension story:

* a **backend** (DOMAIN.md section 3, LiteRT compiler plugins): ``mulsub`` selects only
  float32 ``Mul`` and ``Sub`` nodes (checking dtypes through the inferred infos) and compiles
  each partition into instructions bound to its *own* kernels, registered in its own
  domain ``test.mulsub``; nodes it does not take go to the next backend or the CPU fallback;
* a **custom op** (DOMAIN.md section 4): ``test.mulsub::ScaledAdd`` (``C = A + alpha * B``)
  registered with a typed interface (named inputs and outputs, a float attribute ``alpha``
  defaulting to 1.0); the interface is enforced at compile time by the shape function, and
  the kernel always sees every attribute, defaults filled in.

Importing the module registers the kernels; ``register()`` (called by ``load_plugin``)
registers the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from nncc.backends.base import Backend, CompiledPartition, Instruction
from nncc.backends.registry import register_backend
from nncc.errors import OptionError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, kernel, resolve
from nncc.kernels.shapes import broadcast

__version__ = "1.0"

DOMAIN = "test.mulsub"
OPSET = 1
FLOAT32 = np.dtype(np.float32)


# -- custom-op registration with a typed interface ------------------------------------------


@dataclass(frozen=True)
class Attribute:
    name: str
    type: type  # float, int or str
    default: Any = None  # None: required


@dataclass(frozen=True)
class OpSchema:
    """The interface of an op: named inputs and outputs, typed attributes with defaults."""

    domain: str
    op_type: str
    since: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[Attribute, ...] = ()

    def bind(self, attrs: dict[str, Any], n_inputs: int, where: str) -> dict[str, Any]:
        """Check a node against the interface; return its attributes with defaults filled."""
        if n_inputs != len(self.inputs):
            raise ShapeInferenceError(
                f"{where}: {self.op_type} takes inputs ({', '.join(self.inputs)}), got {n_inputs}")
        known = {a.name: a for a in self.attributes}
        unknown = sorted(set(attrs) - set(known))
        if unknown:
            raise ShapeInferenceError(f"{where}: {self.op_type} has no attribute {unknown[0]!r}")
        bound = {}
        for spec in self.attributes:
            value = attrs.get(spec.name, spec.default)
            if value is None:
                raise ShapeInferenceError(f"{where}: {self.op_type} requires attribute {spec.name!r}")
            if type(value) is not spec.type:
                raise ShapeInferenceError(
                    f"{where}: {self.op_type} attribute {spec.name!r} must be "
                    f"{spec.type.__name__}, not {type(value).__name__}")
            bound[spec.name] = value
        return bound


SCHEMAS: dict[tuple[str, str], OpSchema] = {}


def register_op(schema: OpSchema, shape: Callable) -> Callable:
    """Register ``schema`` and bind the decorated numpy function to it as its kernel."""

    def wrap_shape(ctx: Ctx, *infos):
        schema.bind(ctx.attrs, len(infos), ctx.name or schema.op_type)
        return shape(ctx, *infos)

    def decorate(fn: Callable) -> Callable:
        def run(ctx: Ctx, *arrays):
            bound = schema.bind(ctx.attrs, len(arrays), ctx.name or schema.op_type)
            return fn(Ctx(bound, ctx.opset, ctx.num_outputs, ctx.name), *arrays)

        SCHEMAS[(schema.domain, schema.op_type)] = schema
        kernel(schema.op_type, since=schema.since, domain=schema.domain, shape=wrap_shape)(run)
        return fn

    return decorate


def _elementwise_shape(ctx: Ctx, a: TensorInfo, b: TensorInfo) -> list[TensorInfo]:
    if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
        raise ShapeInferenceError(f"operands have dtypes {a.dtype} and {b.dtype}")
    return [TensorInfo(a.dtype, broadcast(a.shape, b.shape))]


@register_op(
    OpSchema(DOMAIN, "ScaledAdd", OPSET, inputs=("A", "B"), outputs=("C",),
             attributes=(Attribute("alpha", float, 1.0),)),
    shape=_elementwise_shape,
)
def scaled_add(ctx: Ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    alpha = np.asarray(ctx.attrs["alpha"], dtype=a.dtype)
    return np.add(a, alpha * b, dtype=a.dtype)


# -- the backend's own kernels ----------------------------------------------------------------


@kernel("Mul", since=OPSET, domain=DOMAIN, shape=_elementwise_shape)
def mul(ctx: Ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.multiply(a, b)


@kernel("Sub", since=OPSET, domain=DOMAIN, shape=_elementwise_shape)
def sub(ctx: Ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.subtract(a, b)


# -- the backend ------------------------------------------------------------------------------


OPS = ("Mul", "Sub")


@dataclass(frozen=True)
class MulSubOptions:
    """The backend's own option, which only it reads: the ops it takes
    (``compile_model(path, mulsub_ops=["Mul"])``)."""

    mulsub_ops: tuple[str, ...] = OPS

    def __post_init__(self):
        object.__setattr__(self, "mulsub_ops", tuple(self.mulsub_ops))  # its JSON form has a list
        unknown = [op for op in self.mulsub_ops if op not in OPS]
        if unknown or not self.mulsub_ops:
            raise OptionError(f"mulsub_ops must name some of {', '.join(OPS)}, not {list(self.mulsub_ops)}")


class MulSubBackend(Backend):
    name = "mulsub"
    version = __version__
    maker = "nncc test suite"
    targets = "float32 Mul and Sub (numpy)"
    options_type = MulSubOptions

    def __init__(self, ops: tuple[str, ...] = OPS):
        self.ops = ops

    def for_compile(self, options) -> "MulSubBackend":
        return type(self)(self.own_options(options).mulsub_ops)

    def compile_facts(self, options) -> dict:
        """Fewer ops is another compile; the default keeps every other token as it was."""
        ops = self.own_options(options).mulsub_ops
        return {} if ops == OPS else {"mulsub_ops": list(ops)}

    def partition(self, graph, infos):
        return {
            index: self.group(index, node)
            for index, node in enumerate(graph.nodes)
            if self.reject_reason(node, graph, infos) is None
        }

    def group(self, index: int, node) -> int | None:
        """The partition index to force for a node (None: let the framework group freely)."""
        return None

    def reject_reason(self, node, graph, infos) -> str | None:
        if node.domain != "" or node.op_type not in self.ops:
            return f"takes only {' and '.join(self.ops)}"
        if graph.opset("") < 7:
            return "needs opset 7 or later (numpy broadcasting)"
        for name in list(node.inputs) + list(node.outputs):
            info = infos.get(name)
            if info is None or info.dtype != FLOAT32:
                dtype = None if info is None else info.dtype
                return f"value {name!r} has dtype {dtype}, not float32"
        return None

    def compile(self, partition, graph, infos) -> CompiledPartition:
        instructions = []
        for node in partition.nodes:
            own = resolve(node.op_type, DOMAIN, OPSET)  # our kernel, never the built-in one
            instructions.append(Instruction(own.key, list(node.inputs), list(node.outputs), {}, node.name))
        return CompiledPartition(partition.index, self.name, f"mulsub_module_{partition.index}", instructions)


def register() -> None:
    register_backend(MulSubBackend)
