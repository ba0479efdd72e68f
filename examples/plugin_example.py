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

A fuller plugin, with a typed custom-op interface (named inputs, typed attributes with
defaults), is tests/plugins/mulsub_plugin.py.
"""

from __future__ import annotations

import numpy as np

from nncc.backends.base import Backend, CompiledPartition, Instruction
from nncc.backends.registry import register_backend
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


def register() -> None:
    """Called by --plugin after the import: register the backend."""
    register_backend(ExampleBackend)
