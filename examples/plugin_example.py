"""A minimal nncc plugin: one custom op and one backend, written against the public plugin API.

Use it from the repository root (the folder must be importable, hence PYTHONPATH)::

    mkdir -p build
    PYTHONPATH=examples nncc compile fixtures/mobilenet.onnx -o build/mobilenet-example.nncc \\
        --plugin plugin_example --backend example --backend numpy
    PYTHONPATH=examples nncc inspect build/mobilenet-example.nncc --plugin plugin_example
    PYTHONPATH=examples nncc run build/mobilenet-example.nncc --plugin plugin_example --random-inputs

``--plugin MODULE`` imports the module (which registers its kernels) and calls its
``register()`` (which registers its backends). ``--backend example --backend numpy`` offers
every node to ``example`` first, then to ``numpy``; what neither takes runs on the CPU
fallback. An installed package can instead declare an entry point in the group
``nncc.backends`` naming its Backend class. The plugin's name and ``__version__`` are part of
the cache key, and an artifact that uses the plugin's kernels needs ``--plugin`` to load:
nncc never imports a module because a model or an artifact names it.

The backend also shows how a backend runs its partitions its own way: ``load_unit``
turns each of its partitions into one call (``ExampleUnit``) that evaluates the
partition's Mul and Add nodes itself, each into a buffer of its own made once, so the
executor makes one call per partition instead of one per node. nncc.backends.unit
describes the contract.

A fuller plugin, with a typed custom-op interface (named inputs, typed attributes with
defaults), is tests/plugins/mulsub_plugin.py.
"""

from __future__ import annotations

import numpy as np

from nncc.backends.base import Backend, CompiledPartition, Instruction
from nncc.backends.registry import register_backend
from nncc.backends.unit import Call, Unit, UnitSource
from nncc.errors import ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, kernel, resolve
from nncc.kernels.shapes import broadcast

__version__ = "1.0"  # part of the cache key: bump it when the plugin's output changes

DOMAIN = "example"  # the ONNX domain of this plugin's ops and kernels
FLOAT32 = np.dtype(np.float32)


# -- shape functions: (ctx, *input infos) -> output infos; they run at compile time ----------


def same_as_input(ctx: Ctx, x: TensorInfo) -> list[TensorInfo]:
    return [TensorInfo(x.dtype, x.shape)]


def broadcast_two(ctx: Ctx, a: TensorInfo, b: TensorInfo) -> list[TensorInfo]:
    if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
        raise ShapeInferenceError(f"{ctx.name}: operands have dtypes {a.dtype} and {b.dtype}")
    return [TensorInfo(a.dtype, broadcast(a.shape, b.shape))]


# -- 1. a custom op: example::Swish(X) = X * sigmoid(beta * X), attribute beta (default 1.0) --


@kernel("Swish", since=1, domain=DOMAIN, shape=same_as_input)
def swish(ctx: Ctx, x: np.ndarray) -> np.ndarray:
    beta = float(ctx.attrs.get("beta", 1.0))
    return (x / (1.0 + np.exp(-beta * x))).astype(x.dtype, copy=False)


# -- 2. a backend: takes float32 Mul and Add nodes and runs them with its own kernels ---------


@kernel("Mul", since=1, domain=DOMAIN, shape=broadcast_two)
def mul(ctx: Ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.multiply(a, b)


@kernel("Add", since=1, domain=DOMAIN, shape=broadcast_two)
def add(ctx: Ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.add(a, b)


class ExampleBackend(Backend):
    name = "example"
    version = __version__
    maker = "nncc examples"
    targets = "float32 Mul and Add (numpy)"
    OPS = ("Mul", "Add")

    def partition(self, graph, infos):
        """The nodes this backend takes: {node index: group}; group None lets nncc group
        neighbouring nodes into maximal acyclic partitions."""
        taken = {}
        for index, node in enumerate(graph.nodes):
            if node.domain == "" and node.op_type in self.OPS and all(
                    infos.get(name) is not None and infos[name].dtype == FLOAT32
                    for name in [*node.inputs, *node.outputs]):
                taken[index] = None
        return taken

    def compile(self, partition, graph, infos) -> CompiledPartition:
        """One instruction per node, bound to this plugin's kernels (not the built-in ones)."""
        instructions = [
            Instruction(resolve(node.op_type, DOMAIN, 1).key, list(node.inputs), list(node.outputs), {},
                        node.name)
            for node in partition.nodes
        ]
        return CompiledPartition(partition.index, self.name, f"example_{partition.index}", instructions)

    def load_unit(self, source: UnitSource) -> Unit:
        """Each partition as one call of this backend's own, when it holds only this
        backend's Mul and Add and every value it touches has a static shape (so all its
        buffers can be made now); else its instructions."""
        plan, slots = source.plan, source.plan.slots
        # a plan is input like any file: take only what this backend's compile makes
        ours = all(plan.kernels[ins.kernel] in ExampleUnit.UFUNCS and len(ins.inputs) == 2
                   and len(ins.outputs) == 1 for ins in source.instructions)
        touched = {s for ins in source.instructions for s in [*ins.inputs, *ins.outputs]}
        if not ours or not all(s >= 0 and isinstance(slots[s].shape, tuple)
                               and all(type(d) is int for d in slots[s].shape) for s in touched):
            return super().load_unit(source)
        inputs, outputs = source.boundary()
        unit = ExampleUnit(source, inputs, outputs)
        return Unit(source.partition.entry, [Call(unit, inputs, outputs, source.partition.entry, 1)],
                    kind="example")


class ExampleUnit:
    """A whole partition as one call: ``unit(ctx, *inputs, out=outputs)``.

    Its program is a list of (ufunc, operand register, operand register, result register)
    over registers that hold the partition's inputs, then its outputs (the buffers the
    executor planned for them), then its intermediates, which live in arrays made once
    here: a run evaluates the nodes in order and allocates nothing.
    """

    runs = 0  # calls made, over every unit: shows the unit, not the kernels, ran

    UFUNCS = {f"{DOMAIN}::Mul::1": np.multiply, f"{DOMAIN}::Add::1": np.add}

    def __init__(self, source: UnitSource, inputs: list[int], outputs: list[int]):
        plan = source.plan
        register = {slot: i for i, slot in enumerate([*inputs, *outputs])}
        self.n_inputs = len(inputs)
        self.registers: list = [None] * len(register)
        self.program = []
        for ins in source.instructions:
            ufunc = self.UFUNCS[plan.kernels[ins.kernel]]  # compile bound every node to these
            (result,) = ins.outputs
            if result not in register:  # an intermediate: its buffer, made once
                register[result] = len(self.registers)
                info = plan.slots[result]
                self.registers.append(np.empty(info.shape, info.dtype))
            a, b = (register[s] for s in ins.inputs)
            self.program.append((ufunc, a, b, register[result]))

    def __call__(self, ctx: Ctx, *arrays, out):
        registers = self.registers
        registers[: self.n_inputs] = arrays
        registers[self.n_inputs : self.n_inputs + len(out)] = out
        for ufunc, a, b, result in self.program:
            ufunc(registers[a], registers[b], out=registers[result])
        ExampleUnit.runs += 1
        return out


def register() -> None:
    """Called by --plugin after the import: register the backend."""
    register_backend(ExampleBackend)
