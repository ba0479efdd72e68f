"""Dense copies of the plan's broadcast constants, made by two threads.

Broadcast constants (folded ConstantOfShape, per-channel BatchNormalization scales) stay
compact in the plan and the cache, but a kernel handed a zero-stride view would copy it at
every run, so they are expanded once when a plan is prepared. That copy is most of a cache
hit (light_resnet50: 97 MB), and it is bound by page faults and memory bandwidth, not by
Python: numpy releases the GIL while it copies, so a helper thread and the caller share it.

(Starting the helper earlier, while the executor builds its steps in Python, was slower:
after each constant the helper waits up to the interpreter's 5 ms switch interval to get
the GIL back from the busy caller.)
"""

from __future__ import annotations

import os
import threading

import numpy as np

from nncc.plan.memory import ALIGN, aligned_empty

# Below this many bytes a helper thread costs more than it saves (its start-up is about
# 0.1 ms on a loaded 2-core VM; copying 4 MB of fresh pages takes about as long).
THREADED_MIN_BYTES = 4 << 20


def is_broadcast(array: np.ndarray) -> bool:
    return array.size > 1 and any(st == 0 for st, d in zip(array.strides, array.shape) if d > 1)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


class Expansion:
    """Start with ``Expansion(constants)``; ``result()`` returns the constants with every
    broadcast one replaced by a read-only dense copy.

    All copies share ONE block: numpy backs a large allocation with transparent huge pages,
    so filling it faults in a few dozen 2 MB pages instead of tens of thousands of small
    ones. The block is cut largest-first into jobs that the helper thread and, once it calls
    ``result()``, the caller take from the same list."""

    def __init__(self, constants: dict[int, np.ndarray]):
        self._constants = constants
        self._dense: dict[int, np.ndarray] = {}
        self._jobs: list[tuple[np.ndarray, np.ndarray]] = []  # popped from the end
        self._error: BaseException | None = None
        self._thread = None
        broadcast = {slot: a for slot, a in constants.items() if is_broadcast(a)}
        if not broadcast:
            return
        sizes = {slot: -(-a.nbytes // ALIGN) * ALIGN for slot, a in broadcast.items()}
        block = aligned_empty((sum(sizes.values()),), np.uint8)
        offset = 0
        for slot, array in broadcast.items():
            dense = block[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
            self._dense[slot] = dense
            self._jobs.append((dense, array))
            offset += sizes[slot]
        self._jobs.sort(key=lambda job: job[0].nbytes)
        if offset >= THREADED_MIN_BYTES and _cpus() > 1:
            self._thread = threading.Thread(target=self._work, name="nncc-expand", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        try:
            while True:
                try:
                    dense, array = self._jobs.pop()  # atomic: the two workers never share a job
                except IndexError:
                    return
                np.copyto(dense, array)
        except BaseException as exc:  # noqa: BLE001 - re-raised in result()
            self._error = exc
            self._jobs.clear()

    def result(self) -> dict[int, np.ndarray]:
        self._work()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        result = dict(self._constants)
        for slot, dense in self._dense.items():
            dense.flags.writeable = False
            result[slot] = dense
        return result
