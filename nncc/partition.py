"""Assign nodes to backends and group them into maximal acyclic sub-DAGs (partitions).

Backends are asked in priority order; the first that selects a node gets it, and the
fallback (the portable backend) takes every node nobody selected. Every node that a
backend ahead of its owner passed on is a fallback, with the reason each of those backends
gave: a node outside the first backend's partitions is never silent (a numpy partition
between two native ones says why). A backend that cannot pass some values between its
partitions and the others (native code takes float32 arguments only: a bool mask must stay
inside one) says so with ``crossing_refused``; a node whose such value would cross is
given to the next backend that selected it, and the grouping is made again. Nodes are
grouped greedily in topological
order: a node joins an existing partition of the same backend and group index unless
that would make the contracted graph cyclic, i.e. unless a partition the node reads from
already depends (in the contracted graph) on that partition.
"""

from __future__ import annotations

from dataclasses import dataclass

from nncc.backends.base import Backend, Partition
from nncc.ir.graph import Graph, TensorInfo


@dataclass
class PartitionResult:
    partitions: list[Partition]  # in an order that respects data dependencies
    fallbacks: list[tuple[str, str, str]]  # (node name, op type, why the backends ahead of its owner passed)


def partition_graph(graph: Graph, infos: dict[str, TensorInfo], backends: list[Backend],
                    fallback: Backend) -> PartitionResult:
    selected = [backend.partition(graph, infos) for backend in backends]
    # (backend position, node) -> why that backend's partitions cannot hold the node after all
    # (a value of the node that its partition could not pass in or out: ``crossing_refused``)
    dropped: dict[tuple[int, int], str] = {}
    while True:
        owner: dict[int, tuple[str, int | None]] = {}
        rank: dict[int, int] = {}  # node -> the priority of the backend that selected it
        for position, backend in enumerate(backends):
            for index, group in selected[position].items():
                if index not in owner and (position, index) not in dropped:
                    owner[index], rank[index] = (backend.name, group), position
        for index in range(len(graph.nodes)):
            owner.setdefault(index, (fallback.name, None))
        partitions = _group(graph, owner)
        crossing = _crossings(graph, infos, partitions, backends, rank)
        if not crossing:
            break
        dropped.update(crossing)  # each round drops a node from a backend: this ends
    fallbacks = []
    for index, node in enumerate(graph.nodes):
        passed = range(rank.get(index, len(backends)))  # the backends ahead of its owner
        if passed:  # an unnamed node is named by its first output, unique in the graph
            label = node.name or next((f"output {o!r}" for o in node.outputs if o), "")
            reasons = [f"{backends[p].name}: {dropped[p, index]}" if (p, index) in dropped
                       else _reason(node, graph, infos, backends[p]) for p in passed]
            fallbacks.append((label, node.op_type, "; ".join(reasons)))
    return PartitionResult(partitions, fallbacks)


def _crossings(graph: Graph, infos, partitions: list[Partition], backends: list[Backend],
               rank: dict[int, int]) -> dict[tuple[int, int], str]:
    """The nodes whose value crosses the edge of their backend's partition where that
    backend cannot pass it (``crossing_refused(name, readers, graph, infos)``: the nodes of
    the partition that read the value, none for one it writes), as (backend position, node)
    -> why: the readers of such an input, the producer of such an output."""
    position = {id(node): i for i, node in enumerate(graph.nodes)}
    by_name = {backend.name: p for p, backend in enumerate(backends)}
    found: dict[tuple[int, int], str] = {}
    for part in partitions:
        p = by_name.get(part.backend)
        refused = getattr(backends[p], "crossing_refused", None) if p is not None else None
        if refused is None:
            continue
        for name in part.inputs:
            readers = [n for n in part.nodes if name in n.inputs]
            why = refused(name, readers, graph, infos)
            if why:
                found.update(((p, position[id(n)]), why) for n in readers if rank.get(position[id(n)]) == p)
        for name in part.outputs:
            why = refused(name, [], graph, infos)
            if why:
                found.update(((p, position[id(n)]), why) for n in part.nodes
                             if name in n.outputs and rank.get(position[id(n)]) == p)
    return found


def _group(graph: Graph, owner: dict[int, tuple[str, int | None]]) -> list[Partition]:
    """The nodes grouped into partitions by owner (backend and group), acyclic."""
    producer = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs if out}
    part_of: dict[int, int] = {}
    keys: list[tuple[str, int | None]] = []
    members: list[list[int]] = []
    # partition -> the partitions it (transitively) depends on in the *contracted* graph.
    # Tracked per partition, not per node: once a node joins a partition, everything
    # downstream of any of that partition's nodes depends on all of its inputs.
    ancestors: list[set[int]] = []
    by_key: dict[tuple[str, int | None], list[int]] = {}
    for index, node in enumerate(graph.nodes):
        pred_parts = {part_of[producer[n]] for n in node.inputs if n in producer}
        chosen = None
        # Newest partition first: joining one is safe unless a partition this node reads
        # from already depends on it (the new edge would close a cycle through it).
        for candidate in reversed(by_key.get(owner[index], [])):
            if all(q == candidate or candidate not in ancestors[q] for q in pred_parts):
                chosen = candidate
                break
        if chosen is None:
            chosen = len(keys)
            keys.append(owner[index])
            members.append([])
            ancestors.append(set())
            by_key.setdefault(owner[index], []).append(chosen)
        members[chosen].append(index)
        part_of[index] = chosen
        gained = set()
        for q in pred_parts - {chosen}:
            gained |= ancestors[q] | {q}
        if not gained <= ancestors[chosen]:
            ancestors[chosen] |= gained
            for upstream in ancestors:
                if chosen in upstream:
                    upstream |= gained

    order = _partition_order(graph, producer, part_of, len(keys))
    consumers: dict[str, set[int]] = {}
    for index, node in enumerate(graph.nodes):
        for name in node.inputs:
            if name:
                consumers.setdefault(name, set()).add(part_of[index])
    graph_outputs = set(graph.outputs)
    partitions = []
    for new_index, old in enumerate(order):
        nodes = [graph.nodes[i] for i in members[old]]
        produced = {o for n in nodes for o in n.outputs if o}
        inputs = sorted({i for n in nodes for i in n.inputs if i and i not in produced})
        outputs = sorted(
            o for o in produced if o in graph_outputs or consumers.get(o, set()) - {old}
        )
        partitions.append(Partition(new_index, keys[old][0], nodes, inputs, outputs))
    return partitions


def _partition_order(graph, producer, part_of, count) -> list[int]:
    """Topological order of the contracted partition graph (stable by first node)."""
    edges: dict[int, set[int]] = {p: set() for p in range(count)}
    indegree = [0] * count
    for index, node in enumerate(graph.nodes):
        for name in node.inputs:
            if name in producer:
                src, dst = part_of[producer[name]], part_of[index]
                if src != dst and dst not in edges[src]:
                    edges[src].add(dst)
                    indegree[dst] += 1
    ready = [p for p in range(count) if indegree[p] == 0]
    order = []
    while ready:
        ready.sort()
        current = ready.pop(0)
        order.append(current)
        for nxt in edges[current]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if len(order) != count:  # cannot happen if grouping kept the contraction acyclic
        raise AssertionError("partitioning produced a cyclic partition graph")
    return order


def _reason(node, graph, infos, backend) -> str:
    """Why ``backend`` passed on the node, named: one that cannot say (no ``reject_reason``,
    or None from it) is named as passing without a reason."""
    explain = getattr(backend, "reject_reason", None)
    reason = explain(node, graph, infos) if explain is not None else None
    return f"{backend.name}: {reason or 'passed on it without saying why'}"
