"""Native step time per convolution class, with the FLOPs that time bought.

    from step_classes import profile_classes
    profile_classes("build/real-models/resnet18.onnx", threads=2, runs=20)

Compiles the model with every step of the generated code timed from inside (the
profile_steps argument of nncc.native.codegen.generate, which this passes: such code is
never cached), runs it, and sums each step's time into a class: Conv "1x1", "3x3", "7x7
stem", "depthwise", "other conv", "GEMM" (MatMul and Gemm, fused or not), and "no FLOPs"
(everything else: elementwise, pools, normalisations, copies).

The class is read from the model, not from how the code is written: a step's label names
the node it was generated for, and the node's weight shape and group say its class. A node
that does MACs but has no step of its own was fused into another step (a convolution
written by the residual Add that consumes it, say); its FLOPs and class go to the step of
its nearest consumer, else producer, that has one. So the table stays right however the
convolution code is split into steps or fused, as long as each label names a node.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

CLASSES = ("1x1", "3x3", "7x7 stem", "depthwise", "other conv", "GEMM", "no FLOPs")
CONV = ("Conv", "FusedConv", "QConv")  # QConv: the int8 convolution on float images, weights 4th
GEMM = ("MatMul", "FusedMatMul", "Gemm", "FusedGemm")


def _shape(infos, name):
    info = infos.get(name) if name else None
    shape = getattr(info, "shape", None)
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def node_class(node, infos) -> tuple[str, int] | None:
    """(class, 2 x MACs) of a node that multiplies and accumulates; None for any other node
    (and for one whose shapes are not static: its FLOPs are unknown)."""
    op = node.op_type
    if op in CONV or op == "ConvTranspose":
        x, w = _shape(infos, node.inputs[0]), _shape(infos, node.inputs[3 if op == "QConv" else 1])
        y = _shape(infos, node.outputs[0])
        if x is None or w is None or y is None or len(w) < 3:
            return None
        if op == "ConvTranspose":
            return "other conv", 2 * math.prod(x) * math.prod(w[1:])
        flops = 2 * math.prod(y) * math.prod(w[1:])
        group, kernel = int(node.attrs.get("group", 1)), w[2:]
        if group > 1 and w[1] == 1 and group == x[1]:
            return "depthwise", flops
        if group == 1 and all(k == 1 for k in kernel):
            return "1x1", flops
        if group == 1 and all(k == 3 for k in kernel):
            return "3x3", flops
        if group == 1 and all(k == 7 for k in kernel) and x[1] <= 4:  # on the image itself
            return "7x7 stem", flops
        return "other conv", flops
    if op in GEMM:
        a, y = _shape(infos, node.inputs[0]), _shape(infos, node.outputs[0])
        if a is None or y is None or not a:
            return None
        k = a[0] if op.endswith("Gemm") and node.attrs.get("transA", 0) else a[-1]
        return "GEMM", 2 * math.prod(y) * k
    return None


def classify(nodes, infos, labels: list[str], step_ns: list[int]) -> dict[str, Any]:
    """Sum one partition's step times (ns, over all runs) into classes.

    Returns {"classes": {class: {"ns", "flops", "steps", "nodes"}}, "unmatched_ns": time of
    steps whose label names no node, "unplaced_flops": FLOPs of nodes no step could take}."""
    by_name = {n.name: n for n in nodes if n.name}
    step_of: dict[str, int] = {}  # node name -> the (first) step labelled with it
    step_nodes: list[list] = [[] for _ in labels]
    unmatched = 0
    for index, label in enumerate(labels):
        node = next((by_name[t] for t in label.split() if t in by_name), None)
        if node is None:
            unmatched += step_ns[index]
            continue
        step_nodes[index].append(node)
        step_of.setdefault(node.name, index)
    producer = {o: n for n in nodes for o in n.outputs if o}
    consumers: dict[str, list] = {}
    for n in nodes:
        for i in n.inputs:
            if i:
                consumers.setdefault(i, []).append(n)

    def nearest_step(node) -> int | None:  # breadth first over consumers, then producers
        for edges in (lambda n: [c for o in n.outputs for c in consumers.get(o, ())],
                      lambda n: [producer[i] for i in n.inputs if i in producer]):
            seen, frontier = {id(node)}, [node]
            while frontier:
                nxt = []
                for n in frontier:
                    for m in edges(n):
                        if m.name in step_of:
                            return step_of[m.name]
                        if id(m) not in seen:
                            seen.add(id(m))
                            nxt.append(m)
                frontier = nxt
        return None

    unplaced = 0
    for node in nodes:
        if node.name in step_of or node_class(node, infos) is None:
            continue
        index = nearest_step(node)
        if index is None:
            unplaced += node_class(node, infos)[1]
        else:
            step_nodes[index].append(node)
    classes: dict[str, dict[str, Any]] = {}
    counted_nodes: set[int] = set()  # a node's FLOPs count once, however many steps it has
    for index, members in enumerate(step_nodes):
        if not members:
            continue
        counted = [(id(n), c) for n in members if (c := node_class(n, infos)) is not None]
        # a step holding several MAC nodes belongs to the class of its largest
        name = max(counted, key=lambda item: item[1][1])[1][0] if counted else "no FLOPs"
        entry = classes.setdefault(name, {"ns": 0, "flops": 0, "steps": 0, "nodes": 0})
        entry["ns"] += step_ns[index]
        entry["steps"] += 1
        for key, (_, flops) in counted:
            if key not in counted_nodes:
                counted_nodes.add(key)
                entry["flops"] += flops
                entry["nodes"] += 1
    return {"classes": classes, "unmatched_ns": unmatched, "unplaced_flops": unplaced}


def compile_profiled(path: str, **options):
    """``nncc.compile_model`` with every native step timed from inside the generated code:
    (the model, [(symbol, partition nodes, value infos, step labels)] per native unit)."""
    import nncc
    from nncc.native import codegen

    units: list[tuple[str, list, Any, list[str]]] = []
    generate = codegen.generate

    def keep(partition, graph, infos, symbol, *rest, **named):
        unit = generate(partition, graph, infos, symbol, *rest, **named, profile_steps=True)
        units.append((symbol, list(partition.nodes), infos, list(getattr(unit, "labels", []) or [])))
        return unit

    codegen.generate = keep
    try:
        return nncc.compile_model(path, **options), units
    finally:
        codegen.generate = generate


def step_times(model, units) -> dict[str, list[int]]:
    """Each unit's steps' nanoseconds so far, summed over every run since the load."""
    times = {}
    for symbol, _, _, labels in units:
        table = (ctypes.c_int64 * max(1, len(labels)))()
        getattr(model._executor.loaded["native"].handle, f"{symbol}_profile")(table)
        times[symbol] = list(table)[:len(labels)]
    return times


def profile_classes(path: str, threads: int, runs: int = 20, dims: dict | None = None) -> dict[str, Any]:
    """Compile ``path`` with timed steps, run it ``runs`` times after one untimed run, and
    return {"classes": {class: {"ms", "gflops", "gflop_per_second", "steps", "nodes"}},
    "native_ms", "unmatched_ms", "unplaced_gflop", "partitions", "native_partitions"} per run."""
    from nncc.runtime.random_inputs import random_feeds
    from nncc.util.threads import set_blas_threads

    set_blas_threads(threads)
    model, units = compile_profiled(path)
    feeds = random_feeds(model.input_infos, 0, dims or {})
    model.run(feeds)
    before = step_times(model, units) if units else {}  # the untimed run's, taken off below
    for _ in range(runs):
        model.run(feeds)
    after = step_times(model, units) if units else {}
    total: dict[str, dict[str, Any]] = {}
    unmatched = unplaced = native_ns = 0
    for symbol, nodes, infos, labels in units:
        step_ns = [a - b for a, b in zip(after[symbol], before[symbol])]
        native_ns += sum(step_ns)
        found = classify(nodes, infos, labels, step_ns)
        unmatched += found["unmatched_ns"]
        unplaced += found["unplaced_flops"]
        for name, entry in found["classes"].items():
            into = total.setdefault(name, {"ns": 0, "flops": 0, "steps": 0, "nodes": 0})
            for key in into:
                into[key] += entry[key]
    classes = {}
    for name in CLASSES:
        if name not in total:
            continue
        entry = total[name]
        classes[name] = {"ms": entry["ns"] / 1e6 / runs, "gflops": entry["flops"] / 1e9, "steps": entry["steps"],
                         "nodes": entry["nodes"],
                         "gflop_per_second": entry["flops"] / (entry["ns"] / runs) if entry["ns"] and
                         entry["flops"] else None}
    return {"classes": classes, "native_ms": native_ns / 1e6 / runs, "unmatched_ms": unmatched / 1e6 / runs,
            "unplaced_gflop": unplaced / 1e9, "partitions": len(model.plan.partitions),
            "native_partitions": model.native_partitions}
