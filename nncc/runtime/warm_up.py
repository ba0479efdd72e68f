"""Running a small model on zeros while it is prepared, so that its first real run is not
its slowest.

A model whose run is one native call of some tens of microseconds spends its first run
mostly on state nothing has touched yet: the generated code and its constants are not in
the CPU's caches, the interpreter has not yet run the path from ``run()`` to the call, and
the branch predictors have not seen it. That first run cost 2-4x a later one, which a
service sees as its first answer after start-up. A run on zeros (every input's declared
dtype and shape) pays that instead, during the prepare, as a serving system's model
warm-up does. It is done only where it is cheap and changes nothing a caller sees:

- the plan is one native call (pure generated code: no kernel with a state, no random
  op) with every input of a fixed shape;
- the memory it could touch (constants, arena, outputs, inputs) is at most
  ``WARM_UP_BYTES``, so one run is short (a Gather reads only its rows of a table, so
  a model with an embedding table of a few MiB qualifies: its first run was 2.3x its
  steady one before it did);
- at most ``WARM_UP_RUNS`` runs, stopping once they took ``WARM_UP_SECONDS``;
- any failure (zeros a kernel refuses) ends it silently: a real run reports its own;
- the outputs made ahead for the first run are made again (and faulted in), so the
  caller's first results are arrays no warm-up wrote into and nothing keeps.
"""

from __future__ import annotations

import math
import time

import numpy as np

from nncc.util.prefault import populate

WARM_UP_BYTES = 8 << 20
WARM_UP_RUNS = 6
WARM_UP_SECONDS = 0.001


def zero_feeds(executor, most: int) -> dict[str, np.ndarray] | None:
    """Zeros for each input of a plan whose every input has a known dtype and shape, all of
    them at most ``most`` bytes (checked before any is made: a model may declare inputs no
    memory could hold), else None."""
    infos = executor.input_infos.values()
    if not all(info.dtype is not None and info.shape is not None and info.is_static for info in infos):
        return None
    if sum(math.prod(info.shape) * np.dtype(info.dtype).itemsize for info in infos) > most:
        return None
    return {name: np.zeros(info.shape, dtype=info.dtype) for name, info in executor.input_infos.items()}


def plan_bytes(executor) -> int:
    """What a run reads and writes besides its inputs, about: its constants, arena and outputs."""
    constants = sum(a.nbytes for a in executor.template if isinstance(a, np.ndarray))
    arena = getattr(executor, "arena", None)
    outputs = sum(a.nbytes for a in executor.first_outputs or () if isinstance(a, np.ndarray))
    return constants + (arena.nbytes if isinstance(arena, np.ndarray) else 0) + outputs


def warm_up(executor, run) -> int:
    """Run ``executor`` on zeros where that is cheap (see the module's docstring); the number
    of runs done. ``run``: what the caller's runs go through (the model's ``run``, which
    finds this executor for these shapes), so that path is warm too."""
    if not executor.runs_as_one_call:
        return 0
    feeds = zero_feeds(executor, WARM_UP_BYTES - plan_bytes(executor))
    if feeds is None:
        return 0
    runs, start = 0, time.perf_counter()
    try:
        while runs < WARM_UP_RUNS and time.perf_counter() - start < WARM_UP_SECONDS:
            run(feeds)
            runs += 1
    except Exception:  # noqa: BLE001 - a warm-up never fails a prepare: the caller's run reports its own
        pass
    executor.remake_first_outputs()
    for array in executor.first_outputs or ():  # faulted in now, as the ones the runs took were
        populate(array, write=True)
    return runs
