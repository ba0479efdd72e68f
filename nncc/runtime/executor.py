"""Runs a Plan: a flat instruction list over slots, with no access to the source model."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from nncc.errors import KernelError, NnccError, PlanFormatError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, by_key
from nncc.plan.plan import Plan
from nncc.runtime.feeds import check_feeds


class Executor:
    def __init__(self, plan: Plan):
        self.plan = plan
        opsets = plan.options.get("opsets", {})
        self.steps = []
        for ins in plan.instructions:
            definition = by_key(plan.kernels[ins.kernel])
            if definition is None:  # deserialize already checked; a Plan built in memory may not be
                raise PlanFormatError(f"kernel {plan.kernels[ins.kernel]!r} is not registered")
            attrs = {k: self._attr(v) for k, v in ins.attrs.items()}
            opset = int(opsets.get(definition.domain, definition.since))
            ctx = Ctx(attrs, opset, len(ins.outputs), ins.node)
            self.steps.append((definition.fn, ctx, ins.inputs, ins.outputs, ins.node or definition.op_type))
        self.release = self._release_plan()
        self.input_infos = {
            plan.slots[s].name: TensorInfo(plan.slots[s].dtype, plan.slots[s].shape) for s in plan.inputs
        }
        self.output_names = plan.slot_names(plan.outputs)
        self.template: list[np.ndarray | None] = [None] * len(plan.slots)
        for slot, array in plan.constants.items():
            self.template[slot] = array

    def _attr(self, value):
        if isinstance(value, dict):
            return self.plan.constants[value["$tensor"]]
        if isinstance(value, list):
            return [self._attr(v) for v in value]
        return value

    def _release_plan(self) -> list[list[int]]:
        keep = set(self.plan.outputs) | set(self.plan.constants)
        last: dict[int, int] = {}
        for step, ins in enumerate(self.plan.instructions):
            for s in ins.inputs:
                if s >= 0:
                    last[s] = step
        release: list[list[int]] = [[] for _ in self.plan.instructions]
        for slot, step in last.items():
            if slot not in keep:
                release[step].append(slot)
        return release

    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        arrays = check_feeds(self.input_infos, feeds)
        env = list(self.template)
        for slot in self.plan.inputs:
            env[slot] = arrays[self.plan.slots[slot].name]
        for (fn, ctx, ins, outs, label), release in zip(self.steps, self.release):
            args = [env[s] if s >= 0 else None for s in ins]
            try:
                result = fn(ctx, *args)
            except NnccError:
                raise
            except (ValueError, IndexError, TypeError, FloatingPointError) as exc:
                raise KernelError(f"{label} failed: {exc}") from exc
            if not isinstance(result, tuple):
                result = (result,)
            for slot, value in zip(outs, result):
                if slot >= 0:
                    env[slot] = value if isinstance(value, np.ndarray) else np.asarray(value)
            for slot in release:
                env[slot] = None
        return {self.plan.slots[s].name: env[s] for s in self.plan.outputs}
