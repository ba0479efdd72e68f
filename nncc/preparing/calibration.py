"""What a precision below float32 costs a model, measured when it is compiled.

A plan compiled at ``precision="bf16"`` (or ``auto``) is run twice on its inputs: as it
is, and as its portable program, which computes every value in float32 (the same plan
without its native code, so no second compile). Per output the deviation is the largest,
over the inputs, of ``max |a - b| / max |a|``, a the float32 output and b the chosen
precision's (0 when both are all zeros; infinite when b is NaN or infinite where a is
finite, or a is all zeros and b is not). The figures go in the plan's options
(``deviation.PLAN_KEY``), so the artifact and the cache entry carry them, and ``nncc inspect`` and
``nncc cache ls`` show them.

The inputs: one seeded random input (nncc.runtime.random_inputs, seed 0), or every
``.npz`` of the calibration folder (one feed per file, arrays named as the inputs).

A tolerance makes a plan whose deviation exceeds it an error, raised before the plan is
stored or written anywhere. ``auto`` keeps layers float32 until the plan is within its
tolerance: each bfloat16 layer's own deviation is estimated on the portable program with
only that layer's weights rounded to bfloat16, the layers are ranked by it, the shortest
prefix of the ranking whose float32 keeps the estimated deviation within the tolerance is
chosen (by halving), and the plan compiled with it is measured for real; while it is still
over, twice as many more layers stay float32.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np

from nncc.backends.payloads import activate_payloads
from nncc.compiler import AUTO_TOLERANCE, OptionError, calibration_files
from nncc.errors import InputError
from nncc.native.precision import WIDENING_COSTS
from nncc.runtime.executor import Executor
from nncc.runtime.random_inputs import random_feeds
from nncc.preparing.deviation import PLAN_KEY, describe
from nncc.util import progress

# one seeded random input: the float32 reference is the portable program, which takes most
# of the check's time (bert: about 1 s a run, a tenth of its cold compile), and a check
# should cost a small part of a compile; --calibration gives as many inputs as wanted
RANDOM_SEEDS = (0,)
LOW_FORMS = ("bf16",)  # a packed constant whose form names one of these is computed below float32
FLOAT32_GEMM_FORM = re.compile(r"gemm\d+(T|\*|$)")  # the float32 GEMM's packed weights (gemm_gen.F32.form)


class ToleranceExceeded(OptionError):
    """A compile whose outputs deviate from float32 by more than the tolerance: exit 2."""


def checked(build, opts):
    """The plan ``build(opts)`` compiles, its deviation from float32 measured and recorded
    when ``opts.precision`` is not f32; with auto, the plan within the tolerance. Raises
    ToleranceExceeded when a tolerance is exceeded (nothing is stored before this returns)."""
    plan = build(opts)
    if opts.precision == "f32" and opts.tolerance is None:
        return plan
    tolerance = opts.tolerance if opts.tolerance is not None or opts.precision != "auto" else AUTO_TOLERANCE
    if not low_layers(plan):  # nothing computed below float32 (no native code, or no product by weights)
        return _record(plan, {name: 0.0 for name in plan.slot_names(plan.outputs)}, 0, opts, tolerance)
    progress.describe("measuring the deviation from float32")
    reference = Executor(plan.without_code())
    feeds = _feeds(reference.input_infos, opts)
    want = [reference.run(f) for f in feeds]
    deviation = _deviation(want, _outputs(plan, feeds))
    if opts.precision == "auto" and _worst(deviation) > tolerance:
        plan, deviation = _fall_back(build, opts, plan, reference, feeds, want, tolerance)
    plan = _record(plan, deviation, len(feeds), opts, tolerance)
    worst = _worst(deviation)
    if tolerance is not None and worst > tolerance:
        name = max(deviation, key=lambda n: deviation[n])
        raise ToleranceExceeded(f"precision {opts.precision} deviates from float32 by {describe(worst)} on output "
                                f"{name!r} (max |a-b| / max |a| over {len(feeds)} inputs), over the tolerance "
                                f"{tolerance:g}")
    return plan


def low_layers(plan) -> list[str]:
    """The weights (by name) whose products the plan computes below float32, then the fused
    attentions (by output) whose products it computes in bfloat16."""
    names = []
    for slot in plan.slots:
        source, _, form = slot.name.partition("#")
        if form and any(low in form for low in LOW_FORMS) and source not in names:
            names.append(source)
    return names + [name for name in plan.options.get("bf16_attention", []) if name not in names]


def float32_layers(plan) -> list[str]:
    """The weights (by name) of the products by constant weights the plan computes in
    float32 with native code."""
    names = []
    for slot in plan.slots:
        source, _, form = slot.name.partition("#")
        if form and FLOAT32_GEMM_FORM.match(form) and source not in names:
            names.append(source)
    return names


def _feeds(infos, opts) -> list[dict]:
    if opts.calibration is None:
        return [random_feeds(infos, seed, dict(opts.dims)) for seed in RANDOM_SEEDS]
    feeds = []
    for path in calibration_files(opts.calibration):
        try:
            with np.load(path, allow_pickle=False) as saved:
                feeds.append({name: saved[name] for name in saved.files})
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the calibration feed {path}: {exc}") from None
    return feeds


def _outputs(plan, feeds) -> list[dict]:
    executor = Executor(plan, loaded=activate_payloads(plan, True))  # native code built just now
    return [executor.run(f) for f in feeds]


def _deviation(want: list[dict], got: list[dict]) -> dict[str, float]:
    """Per output, the largest over the inputs of max |a - b| / max |a| (module docstring)."""
    out: dict[str, float] = {}
    for a_all, b_all in zip(want, got):
        for name, a in a_all.items():
            b = b_all.get(name)
            if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):  # a sequence, an empty optional
                continue
            if a.shape != b.shape or a.dtype.kind not in "fiub":
                out[name] = math.inf if a.shape != b.shape else out.get(name, 0.0)
                continue
            out[name] = max(out.get(name, 0.0), relative(a, b))
    return out


def relative(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |a| over a's finite elements; b must be finite where a is, and
    non-finite where a is not alike (NaN where NaN, the same infinity)."""
    a = a.astype(np.float64, copy=False)
    b = b.astype(np.float64, copy=False)
    finite = np.isfinite(a)
    same_nonfinite = np.array_equal(a[~finite], b[~finite], equal_nan=True)
    if not same_nonfinite or not np.isfinite(b[finite]).all():
        return math.inf
    if not finite.any():
        return 0.0
    diff = float(np.max(np.abs(a[finite] - b[finite])))
    scale = float(np.max(np.abs(a[finite])))
    if diff == 0.0:
        return 0.0
    return math.inf if scale == 0.0 else diff / scale


def _worst(deviation: dict[str, float]) -> float:
    return max(deviation.values(), default=0.0)


def _fall_back(build, opts, plan, reference, feeds, want, tolerance):
    """(plan, deviation) of auto: the module docstring's search."""
    layers = low_layers(plan)
    progress.describe(f"ranking {len(layers)} bfloat16 layers by their deviation")
    alone = {name: _worst(_estimate(reference, feeds, want, [name])) for name in layers}
    ranked = sorted(layers, key=lambda name: (-alone[name], layers.index(name)))

    def estimated(count: int) -> float:
        return _worst(_estimate(reference, feeds, want, ranked[count:]))

    lo, hi = 0, len(ranked)  # the shortest prefix within the tolerance, estimated
    while lo < hi:
        mid = (lo + hi) // 2
        if estimated(mid) <= tolerance:
            hi = mid
        else:
            lo = mid + 1
    count = max(lo, 1)
    while True:
        kept = tuple(ranked[:count])
        progress.describe(f"compiling with {count} of {len(ranked)} layers kept float32")
        plan = build(replace(opts, keep_f32=tuple(opts.keep_f32) + kept))
        deviation = _deviation(want, _outputs(plan, feeds))
        if _worst(deviation) <= tolerance or count >= len(ranked):
            return plan, deviation
        count = min(len(ranked), count * 2)


def _estimate(reference: Executor, feeds, want, rounded: list[str]) -> dict[str, float]:
    """The deviation of the portable program with ``rounded`` weights rounded to bfloat16."""
    plan = reference.plan
    slots = {plan.slots[i].name: i for i in plan.constants}
    constants = dict(plan.constants)
    for name in rounded:
        if name in slots:
            constants[slots[name]] = _rounded(constants[slots[name]])
    trial = Executor(replace(plan, constants=constants))
    return _deviation(want, [trial.run(f) for f in feeds])


def _rounded(value: np.ndarray) -> np.ndarray:
    from nncc.native.gemm_bf16_gen import to_bf16  # lazy: native code generation, for auto only

    if value.dtype != np.float32:
        return value
    return (to_bf16(value).astype(np.uint32) << 16).view(np.float32).reshape(value.shape)


def _record(plan, deviation: dict[str, float], inputs: int, opts, tolerance):
    plan.options[PLAN_KEY] = {
        "measure": "max|a-b|/max|a| against the float32 plan",
        "inputs": inputs,
        "feeds": "calibration" if opts.calibration is not None else "random",
        "deviation": dict(sorted(deviation.items())),
        "tolerance": tolerance,
        "float32_layers": [name for name in plan.options.get("keep_f32", [])],
        "bfloat16_layers": len(low_layers(plan)),
    }
    kept = set(plan.options.get("keep_f32", []))
    widening = [name for name in float32_layers(plan) if name not in kept]
    if widening and plan.options.get("arithmetic") == "bf16w":
        plan.options[PLAN_KEY]["float32_widening"] = {"layers": widening, "why": WIDENING_COSTS}
    return plan
