"""Stateful execution: run a model step by step, outputs feeding inputs through buffers.

``bind`` maps an output to an input (output OUT of step k feeds input IN of step k+1). Each
pair shares one executor-managed buffer (a memory domain) for the whole sequence, so the
state never round-trips through fresh arrays.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

import numpy as np

from nncc.errors import FileAccessError, InputError


def run_steps(model, binds: Mapping[str, str], steps: int, initial: Mapping[str, np.ndarray],
              per_step: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Run ``steps`` steps; return the last step's outputs (bound ones read from their buffers).

    ``initial`` feeds step 0's bound inputs (zeros when absent) and any input that is the
    same at every step; ``per_step`` yields each step's remaining inputs.
    """
    if steps < 1:
        raise InputError("--steps must be at least 1")
    declared = model.input_infos
    buffers = {}
    for out, inp in binds.items():
        if out not in model.output_names:
            raise InputError(f"--bind {out}={inp}: the model has no output {out!r}")
        if inp not in declared:
            raise InputError(f"--bind {out}={inp}: the model has no input {inp!r}")
        try:
            buffer = model.allocate([("output", out), ("input", inp)])
        except InputError as exc:
            raise InputError(f"--bind {out}={inp}: {exc}", hint=_matching_inputs(model, out)) from None
        if inp in initial:
            buffer.copy_from(initial[inp])
        elif buffer.shape is None:
            raise InputError(f"--bind {out}={inp}: give the initial state of {inp!r} (its shape is not static)")
        buffers[out] = (inp, buffer)
    fixed = {k: v for k, v in initial.items() if k not in {inp for inp, _ in buffers.values()}}
    results: dict[str, np.ndarray] = {}
    source = iter(per_step)
    for step in range(steps):
        feeds = dict(fixed)
        try:
            feeds.update(next(source))
        except StopIteration:
            raise InputError(f"inputs ran out after {step} of {steps} steps") from None
        for out, (inp, buffer) in buffers.items():
            feeds[inp] = buffer
        results = model.run(feeds, outputs={out: buffer for out, (_, buffer) in buffers.items()})
    return {name: (buffers[name][1].copy_to() if name in buffers else value) for name, value in results.items()}


def _matching_inputs(model, output: str) -> str:
    """A hint naming the inputs that could take ``output`` back: same dtype and shape."""
    info = model.output_infos[output]
    same = [name for name, declared in model.input_infos.items()
            if declared.dtype == info.dtype and declared.shape == info.shape]
    if same:
        return f"inputs of the same dtype and shape as {output!r}: {', '.join(same)}"
    return f"bind {output!r} to an input of its dtype and shape; the model has none"


def step_files(directory: str) -> list[str]:
    """The per-step input archives of a folder: its .npz files in name order (step k is
    the k-th), e.g. step_000.npz, step_001.npz, ..."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".npz"))
    except OSError as exc:
        raise FileAccessError(f"cannot read {directory}: {exc.strerror or exc}") from None
    if not names:
        raise InputError(f"{directory} holds no .npz files (one per step: step_000.npz, ...)")
    return [os.path.join(directory, n) for n in names]
