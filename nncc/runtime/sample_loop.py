"""Running any count of samples with the plan compiled for one (nncc.runtime.sample_axis
says when that is the model's own answer).

The plan for one sample is static, so it has native code; it runs once per sample, each
run reading that sample's contiguous chunk of every batched input and writing straight into
that sample's chunk of every batched output, allocated once at full size (views, no
concatenation). Unbatched inputs go whole to every run; unbatched outputs are the first
run's. Anything the loop cannot take as it is (an empty batch, a size that is no multiple
of the sample's, caller buffers of another layout, memory domains) runs the general plan,
which reports any error in the inputs itself.
"""

from __future__ import annotations

import time

import numpy as np


class SampleLoop:
    """``executor``: the plan for one sample, with its native code loaded; ``separation``:
    its sample axis (nncc.runtime.sample_axis.Separation, of the general plan's slots);
    ``general``: the general plan's executor, for what the loop does not take."""

    def __init__(self, executor, separation, general):
        self.executor = executor
        self.general = general
        self.dim = separation.dim
        plan, slots = executor.plan, executor.plan.slots
        general_slots = general.plan.slots
        by_name = {slots[s].name: slots[s] for s in (*plan.inputs, *plan.outputs)}
        self._inputs = []  # (name, axis, shape of one sample's chunk)
        for slot, axis in separation.inputs.items():
            if axis is not None:
                name = general_slots[slot].name
                self._inputs.append((name, axis, tuple(by_name[name].shape)))
        self._outputs = []  # (name, axis or None, shape of one sample's chunk, dtype)
        for slot in plan.outputs:
            name = slots[slot].name
            axis = next((a for s, a in separation.outputs.items() if general_slots[s].name == name), None)
            self._outputs.append((name, axis, tuple(slots[slot].shape), slots[slot].dtype))

    @property
    def native_partitions(self) -> int:
        return self.executor.native_partitions

    @property
    def plan(self):
        return self.executor.plan

    def samples(self, feeds) -> int | None:
        """How many samples these feeds hold, or None when the loop does not take them."""
        count = None
        for name, axis, one in self._inputs:
            value = feeds.get(name)
            if not isinstance(value, np.ndarray) or value.ndim != len(one) or one[axis] == 0:
                return None
            n, rest = divmod(value.shape[axis], one[axis])
            if rest or n == 0 or (count is not None and n != count):
                return None
            if any(d != o for a, (d, o) in enumerate(zip(value.shape, one)) if a != axis):
                return None
            count = n
        return count

    def run(self, feeds, outputs=None) -> dict[str, np.ndarray]:
        n = self.samples(feeds)
        if n is None or any(shape is None or not all(isinstance(d, int) for d in shape)
                            for _, _, shape, _ in self._outputs):
            return self.general.run(feeds, outputs)
        full = {}
        for name, axis, one, dtype in self._outputs:
            shape = list(one)
            if axis is not None:
                shape[axis] *= n
            given = (outputs or {}).get(name)
            if given is not None and not (isinstance(given, np.ndarray) and given.shape == tuple(shape)
                                          and given.dtype == dtype and given.flags.c_contiguous
                                          and given.flags.writeable):
                return self.general.run(feeds, outputs)  # the general plan checks and fills it
            if axis is not None:
                full[name] = np.empty(shape, dtype) if given is None else given
        if outputs and not set(outputs) <= {name for name, _, _, _ in self._outputs}:
            return self.general.run(feeds, outputs)  # which names the unknown one
        chunks_in = {name: np.ascontiguousarray(feeds[name]).reshape(n, -1) for name, _, _ in self._inputs}
        chunks_out = {name: array.reshape(n, -1) for name, array in full.items()}
        shapes_in = {name: one for name, _, one in self._inputs}
        shapes_out = {name: one for name, _, one, _ in self._outputs}
        first = None
        sample = dict(feeds)
        for b in range(n):
            for name, chunks in chunks_in.items():
                sample[name] = chunks[b].reshape(shapes_in[name])
            results = self.executor.run(sample, {name: chunks[b].reshape(shapes_out[name])
                                                 for name, chunks in chunks_out.items()})
            if first is None:
                first = results
        answer = {}
        for name, axis, _, _ in self._outputs:
            if axis is not None:
                answer[name] = full[name]
            else:
                answer[name] = first[name]
                given = (outputs or {}).get(name)
                if given is not None:
                    np.copyto(given, first[name])
                    answer[name] = given
        return answer


class FasterOf:
    """Whichever of two executors of the same shape runs faster here, timed over their
    first runs (each runs ``ROUNDS`` times, in turn, and its fastest counts: a first run
    also warms up), then that one. The sample loop pays the executor's per-run overhead
    once per sample: a model that does little per sample can run faster as one batched
    portable plan."""

    ROUNDS = 2

    def __init__(self, *candidates):
        self.candidates = candidates
        self.seconds: list[list[float]] = [[] for _ in candidates]
        self.runs = 0
        self.chosen = None
        self.ran = candidates[0]

    @property
    def native_partitions(self) -> int:
        return self.ran.native_partitions

    @property
    def plan(self):
        return self.ran.plan

    def run(self, feeds, outputs=None):
        if self.chosen is not None:
            return self.chosen.run(feeds, outputs)
        at = self.runs % len(self.candidates)
        self.ran = candidate = self.candidates[at]
        started = time.perf_counter()
        results = candidate.run(feeds, outputs)
        self.seconds[at].append(time.perf_counter() - started)
        self.runs += 1
        if self.runs == self.ROUNDS * len(self.candidates):
            fastest = [min(s) for s in self.seconds]
            self.chosen = self.ran = self.candidates[fastest.index(min(fastest))]
        return results
