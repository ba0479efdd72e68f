"""Transposes sunk and cancelled (-O2), as exporters from channels-last frameworks need:
a Keras model through tf2onnx transposes each convolution's result to NHWC for its
per-channel elementwise ops and back to NCHW for the next convolution.

A Transpose moves down past the elementwise op that alone reads it (the op then runs on
the untransposed value: a constant operand is brought to full rank, as broadcasting
would, and permuted by the inverse; an operand that is the same Transpose of another value
reads that value; a scalar stays), or past a Concat or a Softmax (its axis renumbered),
until it meets:

* another Transpose: the two become one (composed permutations), or nothing when they
  are inverses;
* a Reduce: its axes are permuted instead; with keepdims the Transpose moves after the
  (smaller) result, without it only a Transpose of the kept axes remains, if they are
  out of order.

A Transpose moves only when walking down from it reaches such a meeting point, so a
Transpose in front of a convolution, a MatMul or a graph output stays where it is (the
attention fusion absorbs the ones around its products). A value the rewrite changes is
read by nothing else, and no graph output changes its name or shape. The elementwise ops
between then form a plain chain after the convolution, which the later fusions fold.
"""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.passes.cleanup import all_names, fresh_name, frozen, rebuild, subgraph_references
from nncc.passes.dce import eliminate_dead_code

# elementwise on one tensor (any other inputs are scalars, such as Clip's bounds)
UNARY = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Cast", "Ceil", "Celu", "Clip", "Cos",
    "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity", "IsInf",
    "IsNaN", "LeakyRelu", "Log", "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu",
    "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
    "ThresholdedRelu",
})
# elementwise over operands that broadcast together
BROADCASTING = frozenset({
    "Add", "And", "BitShift", "Div", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual",
    "Max", "Mean", "Min", "Mod", "Mul", "Or", "Pow", "PRelu", "Sub", "Sum", "Where", "Xor",
})
# along one axis, which the move renumbers (the Softmax family only from opset 13, before
# which it flattened the axes around its axis)
ALONG_AXIS = frozenset({"Concat", "Hardmax", "LogSoftmax", "Softmax"})
REDUCES = frozenset({
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
})


def sink_transposes(graph: Graph) -> Graph:
    sinker = Sinker(graph)
    # each rewrite moves a Transpose down its finite path or removes one: bounded
    for _ in range(4 * len(graph.nodes) + 1):
        if not sinker.sweep():
            break
    if not sinker.changed:
        return rebuild(graph)
    return eliminate_dead_code(sinker.graph())


class Sinker:
    """The graph under rewrite, by sweeps over its node list. The producer and consumer maps
    are built once per sweep; a rewrite claims every value whose readers or producer it
    changes or relies on, and one that would need a value an earlier rewrite of the sweep
    claimed waits for the next sweep, so each sees maps that are still true for it. A chain
    then takes one sweep per op the Transpose moves past, whatever the graph's size."""

    def __init__(self, graph: Graph):
        self.base = graph
        self.nodes = list(graph.nodes)
        self.initializers = dict(graph.initializers)
        self.values = dict(graph.values)
        self.pinned = set(graph.outputs) | subgraph_references(graph)
        self.taken = all_names(graph)
        self.changed = False

    def graph(self) -> Graph:
        return rebuild(self.base, nodes=self.nodes, initializers=self.initializers, values=self.values)

    def sweep(self) -> bool:
        """Every rewrite the node list offers whose values no other one claimed; False when
        there was none."""
        self.producers = {out: node for node in self.nodes for out in node.outputs if out}
        self.consumers: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    self.consumers.setdefault(name, []).append(node)
        self.claimed: set[str] = set()
        self.replaced: dict[int, list[Node]] = {}
        self.dropped: set[int] = set()
        self.renamed: dict[str, str] = {}
        done = False
        for node in self.nodes:
            perm = self.perm(node)
            if perm is None or node.inputs[0] in self.claimed or node.outputs[0] in self.claimed:
                continue
            if self.compose(node, perm) or self.push(node, perm) or self.fold_reduce(node, perm):
                done = self.changed = True
        if done:
            nodes = []
            for node in self.nodes:
                if id(node) in self.dropped:
                    continue
                for new in self.replaced.get(id(node), [node]):
                    if any(name in self.renamed for name in new.inputs):
                        new = Node(new.op_type, [self.renamed.get(n, n) for n in new.inputs], list(new.outputs),
                                   dict(new.attrs), new.domain, new.name)
                    nodes.append(new)
            self.nodes = nodes
        return done

    def claim(self, names) -> bool:
        """Claim ``names`` for this sweep's rewrite, unless one of them is already claimed."""
        names = {name for name in names if name}
        if names & self.claimed:
            return False
        self.claimed |= names
        return True

    # ----------------------------------------------------------------------- facts

    def perm(self, node: Node) -> list[int] | None:
        """A plain Transpose's permutation (the reversal when the attribute is absent and the
        rank is known), else None."""
        if node.op_type != "Transpose" or node.domain != "" or len(node.inputs) != 1 \
                or not node.inputs[0] or len(node.outputs) != 1 or not node.outputs[0]:
            return None
        info = self.values.get(node.inputs[0])
        rank = None if info is None or info.shape is None else len(info.shape)
        perm = node.attrs.get("perm")
        if perm is None:
            if rank is None:
                return None
            perm = list(range(rank))[::-1]
        perm = [int(axis) for axis in perm]
        if sorted(perm) != list(range(len(perm))) or rank not in (None, len(perm)):
            return None  # a bad Transpose stays for its kernel to report
        return perm

    def only_reader(self, name: str) -> Node | None:
        """The one node reading ``name`` (perhaps more than once), when nothing else needs it."""
        readers = self.consumers.get(name, [])
        if name in self.pinned or not readers or any(r is not readers[0] for r in readers):
            return None
        return readers[0]

    def scalar(self, name: str) -> bool:
        array = self.initializers.get(name)
        if array is not None:
            return array.ndim == 0
        info = self.values.get(name)
        return info is not None and info.shape == ()

    def operands(self, op: Node, moved: str, perm: list[int]) -> list | None:
        """How each input of elementwise ``op`` reads once the Transpose of ``moved`` comes
        after it: ``moved`` or an untransposed name, a constant to permute, or None where
        ``op`` cannot take the move."""
        if op.domain != "" or len(op.outputs) != 1 or not op.outputs[0]:
            return None
        if op.op_type in UNARY:
            others_ok = all(not name or (name != moved and self.scalar(name)) for name in op.inputs[1:])
            return list(op.inputs) if op.inputs[0] == moved and others_ok else None
        along = op.op_type in ALONG_AXIS
        if (self.moved_attrs(op, perm) is None) if along else op.op_type not in BROADCASTING:
            return None
        plan = []
        for name in op.inputs:
            if not name or name == moved or (not along and self.scalar(name)):
                plan.append(name)
                continue
            array = self.initializers.get(name)
            if array is not None:
                if array.ndim > len(perm) or (along and array.ndim != len(perm)):
                    return None
                plan.append(array)
                continue
            source = self.producers.get(name)
            if source is None or self.perm(source) != perm:
                return None
            plan.append(source.inputs[0])
        return plan

    def moved_attrs(self, op: Node, perm: list[int]) -> dict | None:
        """``op``'s attributes once it runs before the Transpose: its axis renumbered."""
        if op.op_type not in ALONG_AXIS:
            return dict(op.attrs)
        if op.op_type != "Concat" and self.base.opset("") < 13:
            return None
        axis = op.attrs.get("axis", -1 if op.op_type != "Concat" else None)
        if axis is None or not -len(perm) <= int(axis) < len(perm):
            return None
        return {**op.attrs, "axis": perm[int(axis) % len(perm)]}

    def reduce_axes(self, node: Node, rank: int) -> list[int] | None:
        """The normalized axes of a Reduce we can rewrite ([] for all of them), else None."""
        if node.op_type not in REDUCES or node.domain != "" or len(node.outputs) != 1 or not node.outputs[0]:
            return None
        if len(node.inputs) > 1 and node.inputs[1]:
            array = self.initializers.get(node.inputs[1])
            if array is None or array.dtype.kind not in "iu" or array.ndim > 1:
                return None
            axes = [int(a) for a in np.asarray(array).reshape(-1)]
        else:
            axes = [int(a) for a in node.attrs.get("axes") or []]
        if not axes:
            return None if int(node.attrs.get("noop_with_empty_axes", 0)) else []
        axes = [a + rank if a < 0 else a for a in axes]
        if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
            return None
        return axes

    def reaches_meeting(self, transpose: Node, perm: list[int]) -> bool:
        """Walking down from ``transpose`` through the elementwise ops that alone read each
        value, do we meet another Transpose or a Reduce? (Not through a value this sweep
        changed: the next sweep walks it.)"""
        name = transpose.outputs[0]
        for _ in range(len(self.nodes)):
            reader = None if name in self.claimed else self.only_reader(name)
            if reader is None:
                return False
            if self.perm(reader) is not None:
                return True
            if reader.inputs[0] == name and self.reduce_axes(reader, len(perm)) is not None:
                return True
            if self.operands(reader, name, perm) is None:
                return False
            name = reader.outputs[0]
        return False

    # ----------------------------------------------------------------------- rewrites

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def constant(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers[name] = frozen(array)
        self.values[name] = TensorInfo.of(self.initializers[name], keep_value=False)
        return name

    def replace(self, old: Node, new: list[Node], drop: Node | None = None) -> None:
        """``new`` in ``old``'s place at the end of the sweep; ``drop`` leaves the list."""
        self.replaced[id(old)] = new
        if drop is not None:
            self.dropped.add(id(drop))

    def compose(self, second: Node, perm: list[int]) -> bool:
        """Transpose of a Transpose: one Transpose of the first one's input, or none."""
        first = self.producers.get(second.inputs[0])
        inner = None if first is None else self.perm(first)
        if inner is None or len(inner) != len(perm):
            return False
        source, out = first.inputs[0], second.outputs[0]
        if not self.claim([source, second.inputs[0], out]):
            return False
        if self.only_reader(second.inputs[0]) is second:
            self.dropped.add(id(first))  # dead now: it must not count as a reader of its input
        combined = [inner[axis] for axis in perm]
        if combined != list(range(len(perm))):
            self.replace(second, [Node("Transpose", [source], [out], {"perm": combined}, "", second.name)])
        elif out in self.pinned:
            self.replace(second, [Node("Identity", [source], [out], {}, "", second.name)])
        else:  # the pair cancels: the readers of the result read the source
            self.renamed[out] = source
            self.dropped.add(id(second))
            self.values.pop(out, None)
        return True

    def push(self, transpose: Node, perm: list[int]) -> bool:
        """The Transpose moves past the elementwise op that alone reads it."""
        moved = transpose.outputs[0]
        op = self.only_reader(moved)
        if op is None or not self.reaches_meeting(transpose, perm):
            return False
        plan = self.operands(op, moved, perm)
        if plan is None or not self.claim([transpose.inputs[0], *op.inputs, op.outputs[0],
                                           *(how for how in plan if isinstance(how, str))]):
            return False
        for name in op.inputs:  # the same Transposes of other values, dead once op reads those
            source = self.producers.get(name)
            if name != moved and source is not None and self.perm(source) == perm and self.only_reader(name) is op:
                self.dropped.add(id(source))
        inverse = list(np.argsort(perm))
        inputs = []
        for name, how in zip(op.inputs, plan):
            if isinstance(how, np.ndarray):
                full = how.reshape((1,) * (len(perm) - how.ndim) + how.shape)
                inputs.append(self.constant(f"{name}/untransposed", np.transpose(full, inverse)))
            else:
                inputs.append(transpose.inputs[0] if how == moved else how)
        out = op.outputs[0]
        inner = self.fresh(f"{out}/untransposed")
        self.replace(op, [Node(op.op_type, inputs, [inner], self.moved_attrs(op, perm), op.domain, op.name),
                          Node("Transpose", [inner], [out], {"perm": perm}, "", transpose.name)],
                     drop=transpose)
        self.values.pop(moved, None)
        return True

    def fold_reduce(self, transpose: Node, perm: list[int]) -> bool:
        """A Reduce of a Transpose: the Reduce over the permuted axes of its input."""
        moved = transpose.outputs[0]
        reduce = self.only_reader(moved)
        if reduce is None or reduce.inputs[0] != moved:
            return False
        axes = self.reduce_axes(reduce, len(perm))
        if axes is None or not self.claim([transpose.inputs[0], moved, reduce.outputs[0]]):
            return False
        keep = int(reduce.attrs.get("keepdims", 1))
        source, out = transpose.inputs[0], reduce.outputs[0]
        if not axes:  # every axis: the result is the same whatever the order
            new_axes, after = [], None
        else:
            new_axes = sorted(perm[a] for a in axes)
            if keep:
                after = perm
            else:
                kept = [perm[i] for i in range(len(perm)) if i not in axes]
                order = sorted(kept)
                after = [order.index(axis) for axis in kept]
        if after is not None and after == list(range(len(after))):
            after = None  # the kept axes are already in order
        inputs, attrs = [source, *reduce.inputs[1:]], dict(reduce.attrs)
        if new_axes:
            if len(reduce.inputs) > 1 and reduce.inputs[1]:
                inputs[1] = self.constant(f"{reduce.inputs[1]}/untransposed", np.array(new_axes, np.int64))
            else:
                attrs["axes"] = new_axes
        result = out if after is None else self.fresh(f"{out}/untransposed")
        new = [Node(reduce.op_type, inputs, [result], attrs, reduce.domain, reduce.name)]
        if after is not None:
            new.append(Node("Transpose", [result], [out], {"perm": after}, "", transpose.name))
        self.replace(reduce, new, drop=transpose)
        self.values.pop(moved, None)
        return True
