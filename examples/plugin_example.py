"""A minimal nncc plugin: one custom op and one backend, written against the public plugin API.

Use it from the repository root (the folder must be importable, hence PYTHONPATH)::

    mkdir -p build
    PYTHONPATH=examples nncc compile fixtures/mobilenet.onnx -o build/mobilenet-example.nncc \\
        --plugin plugin_example --backend example --backend numpy
    PYTHONPATH=examples nncc inspect build/mobilenet-example.nncc --plugin plugin_example
    PYTHONPATH=examples nncc run build/mobilenet-example.nncc --plugin plugin_example --random-inputs

``--plugin MODULE`` imports the module (which registers its kernels) and calls its
``register()`` (which registers its backends). ``--backend example --backend numpy`` offers
every node to ``example`` first, then to ``numpy``; what neither takes runs on the portable
backend (numpy) all the same. An installed package can instead declare an entry point in
the group ``nncc.backends`` naming its Backend class. The plugin's name and ``__version__``
are part of the cache key, and an artifact that uses the plugin's kernels needs
``--plugin`` to load: nncc never imports a module because a model or an artifact names it.

The backend shows the whole life of a backend's own form of its partitions:

* ``compile`` keeps the portable instructions (bound to this plugin's kernels: they run
  wherever the backend is not loaded) and notes each partition's program;
* ``link`` encodes every partition's program as bytecode, one payload for the plan, which
  nncc stores in the artifact (its PAYL section: bytecode is data, not machine code) and so
  in the cache entry;
* ``check_payload`` checks it when a plan is read (an artifact is input like any file);
* ``activate`` decodes it when a plan is loaded; ``load_unit`` runs each partition as one
  call (``ExampleUnit``) that executes its bytecode, each intermediate in a buffer made
  once, so the executor makes one call per partition instead of one per node.

nncc.backends.base lists the hooks; nncc.backends.unit describes what a unit may do.
A fuller plugin, with a typed custom-op interface (named inputs, typed attributes with
defaults), is tests/plugins/mulsub_plugin.py.
"""

from __future__ import annotations

import struct

import numpy as np

from nncc.backends.base import Backend, CompiledPartition, Instruction
from nncc.backends.registry import register_backend
from nncc.backends.unit import Call, Unit, UnitSource
from nncc.errors import PlanFormatError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, kernel, resolve
from nncc.kernels.shapes import broadcast
from nncc.plan.plan import BackendPayload

__version__ = "2.0"  # part of the cache key: bump it when the plugin's output changes

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


# -- 2. a backend: takes float32 Mul and Add nodes, runs them as its own bytecode ------------


@kernel("Mul", since=1, domain=DOMAIN, shape=broadcast_two)
def mul(ctx: Ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.multiply(a, b)


@kernel("Add", since=1, domain=DOMAIN, shape=broadcast_two)
def add(ctx: Ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.add(a, b)


# The bytecode: one 7-byte instruction per node, (opcode, operand, operand, result), each a
# register: the partition's inputs, then its outputs, then its intermediates.
OPCODES = {"Mul": 0, "Add": 1}
UFUNCS = (np.multiply, np.add)  # by opcode
INSTRUCTION = struct.Struct("<BHHH")


class ExampleBackend(Backend):
    name = "example"
    version = __version__
    maker = "nncc examples"
    targets = "float32 Mul and Add (its own bytecode, run with numpy)"

    def partition(self, graph, infos):
        """The nodes this backend takes: {node index: group}; group None lets nncc group
        neighbouring nodes into maximal acyclic partitions. Static shapes only: the unit
        makes every buffer once."""
        taken = {}
        for index, node in enumerate(graph.nodes):
            values = [infos.get(name) for name in [*node.inputs, *node.outputs]]
            if node.domain == "" and node.op_type in OPCODES and all(
                    info is not None and info.dtype == FLOAT32 and info.is_static for info in values):
                taken[index] = None
        return taken

    def compile(self, partition, graph, infos) -> CompiledPartition:
        """One instruction per node, bound to this plugin's kernels (the portable form), and
        the partition's program for ``link``: its boundary and its nodes."""
        instructions = [
            Instruction(resolve(node.op_type, DOMAIN, 1).key, list(node.inputs), list(node.outputs), {},
                        node.name)
            for node in partition.nodes
        ]
        program = (list(partition.inputs), list(partition.outputs),
                   [(node.op_type, *node.inputs, node.outputs[0]) for node in partition.nodes])
        return CompiledPartition(partition.index, self.name, f"example_{partition.index}", instructions,
                                 payload=program)

    def link(self, plan, compiled, slots) -> BackendPayload:
        """Every partition's bytecode, concatenated: one payload for the plan. Its meta says
        where each partition's bytecode lies and which slots its registers stand for."""
        data, programs = bytearray(), []
        for index, part in compiled:
            inputs, outputs, nodes = part.payload
            registers = inputs + outputs
            temps = [out for *_, out in nodes if out not in registers]
            registers += temps
            number = {name: i for i, name in enumerate(registers)}
            code = b"".join(INSTRUCTION.pack(OPCODES[op], number[a], number[b], number[out])
                            for op, a, b, out in nodes)
            programs.append([index, len(data), len(code), *([slots[n] for n in names]
                                                             for names in (inputs, outputs, temps))])
            data += code
        return BackendPayload(self.name, [p[0] for p in programs], {"programs": programs}, bytes(data))

    def check_payload(self, payload, plan) -> None:
        decode(payload, plan)

    def activate(self, payload, plan, origin):
        return decode(payload, plan)

    def load_unit(self, source: UnitSource) -> Unit:
        """The partition as one call of its bytecode, when the payload has its program and
        the program reads and writes what the partition's instructions do (a plan is input
        like any file); else its instructions."""
        program = None if source.loaded is None else source.loaded.get(source.index)
        inputs, outputs = source.boundary()
        if program is None or (set(program.inputs), set(program.outputs)) != (set(inputs), set(outputs)):
            return super().load_unit(source)
        unit = ExampleUnit(source.plan, program)
        return Unit(source.partition.entry, [Call(unit, program.inputs, program.outputs, source.partition.entry, 1)],
                    kind="example")


class Program:
    """One partition's decoded bytecode: (ufunc, register, register, result register)
    steps over registers that stand for the ``inputs``, ``outputs`` and ``temps`` slots."""

    def __init__(self, inputs, outputs, temps, steps):
        self.inputs, self.outputs, self.temps, self.steps = inputs, outputs, temps, steps


def decode(payload: BackendPayload, plan) -> dict[int, Program]:
    """Partition -> its program, every field checked: registers name static float32
    slots, an input is never written, every step's registers exist."""
    meta = payload.meta
    entries = meta.get("programs") if type(meta) is dict and set(meta) == {"programs"} else None
    if type(entries) is not list:
        raise PlanFormatError("the example payload has no program table")
    programs = {}
    for entry in entries:
        if not (type(entry) is list and len(entry) == 6 and all(type(x) is int for x in entry[:3])
                and all(type(r) is list and all(type(s) is int for s in r) for r in entry[3:])):
            raise PlanFormatError("bad example program entry")
        partition, offset, length, inputs, outputs, temps = entry
        if partition not in payload.partitions or partition in programs:
            raise PlanFormatError(f"bad example program for partition {partition}")
        for slot in inputs + outputs + temps:
            info = plan.slots[slot] if 0 <= slot < len(plan.slots) else None
            if info is None or info.dtype != FLOAT32 or info.shape is None \
                    or not all(type(d) is int for d in info.shape):
                raise PlanFormatError(f"example program register slot {slot} is not a static float32 tensor")
        if offset < 0 or length % INSTRUCTION.size or offset + length > len(payload.data):
            raise PlanFormatError(f"example program for partition {partition} lies outside the payload")
        count, steps = len(inputs) + len(outputs) + len(temps), []
        for op, a, b, out in INSTRUCTION.iter_unpack(payload.data[offset : offset + length]):
            if op >= len(UFUNCS) or max(a, b, out) >= count or out < len(inputs):
                raise PlanFormatError(f"bad example bytecode for partition {partition}")
            steps.append((UFUNCS[op], a, b, out))
        programs[partition] = Program(inputs, outputs, temps, steps)
    return programs


class ExampleUnit:
    """A whole partition as one call: ``unit(ctx, *inputs, out=outputs)`` runs its
    bytecode. The registers hold the partition's inputs, then its outputs (the buffers the
    executor planned for them), then its intermediates, which live in arrays made once
    here: a run allocates nothing."""

    runs = 0  # calls made, over every unit: shows the unit, not the kernels, ran

    def __init__(self, plan, program: Program):
        self.n_inputs = len(program.inputs)
        self.n_outputs = len(program.outputs)
        self.registers: list = [None] * (self.n_inputs + self.n_outputs)
        self.registers += [np.empty(plan.slots[s].shape, FLOAT32) for s in program.temps]
        self.steps = program.steps

    def __call__(self, ctx: Ctx, *arrays, out):
        registers = self.registers
        registers[: self.n_inputs] = arrays
        registers[self.n_inputs : self.n_inputs + self.n_outputs] = out
        for ufunc, a, b, result in self.steps:
            ufunc(registers[a], registers[b], out=registers[result])
        ExampleUnit.runs += 1
        return out


def register() -> None:
    """Called by --plugin after the import: register the backend."""
    register_backend(ExampleBackend)
