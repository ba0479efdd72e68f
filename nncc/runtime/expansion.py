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

from nncc.ir.splats import is_broadcast
from nncc.plan.memory import ALIGN, aligned_empty

# Below this many bytes a helper thread costs more than it saves (its start-up is about
# 0.1 ms on a loaded 2-core VM; copying 4 MB of fresh pages takes about as long).
THREADED_MIN_BYTES = 4 << 20


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def expanded(constants: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """The constants, with every broadcast one replaced by a read-only dense copy.

    All copies share ONE block: numpy backs a large allocation with transparent huge pages,
    so filling it faults in a few dozen 2 MB pages instead of tens of thousands of small
    ones. The copies are jobs, largest first, that a helper thread and the caller take from
    one list (list.pop is atomic: no job is done twice)."""
    broadcast = {slot: a for slot, a in constants.items() if is_broadcast(a)}
    if not broadcast:
        return dict(constants)
    sizes = {slot: -(-a.nbytes // ALIGN) * ALIGN for slot, a in broadcast.items()}
    block = aligned_empty((sum(sizes.values()),), np.uint8)
    result, jobs, offset = dict(constants), [], 0
    for slot, array in broadcast.items():
        dense = block[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
        result[slot] = dense
        jobs.append((dense, array))
        offset += sizes[slot]
    jobs.sort(key=lambda job: job[0].nbytes)  # popped from the end: largest first
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while jobs:
                try:
                    dense, array = jobs.pop()
                except IndexError:  # the other worker took the last one
                    return
                np.copyto(dense, array)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller below
            errors.append(exc)
            jobs.clear()

    helper = None
    if offset >= THREADED_MIN_BYTES and _cpus() > 1:
        helper = threading.Thread(target=work, name="nncc-expand", daemon=True)
        helper.start()
    work()
    if helper is not None:
        helper.join()
    if errors:
        raise errors[0]
    for slot in broadcast:
        result[slot].flags.writeable = False
    return result
