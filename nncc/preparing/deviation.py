"""A plan's recorded deviation from float32 (nncc/preparing/calibration.py measures it):
its key in the plan's options and its one-line summary, cheap to import for the commands
that only show it."""

from __future__ import annotations

import math

PLAN_KEY = "precision_check"


def describe(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"


def summary(check: dict) -> str:
    """One line of a plan's recorded check (``plan.options[PLAN_KEY]``)."""
    deviation = check.get("deviation") or {}
    if not check.get("inputs"):
        line = "deviation from float32: 0 (nothing computed below float32)"
    else:
        name = max(deviation, key=lambda n: deviation[n])
        line = (f"deviation from float32: {describe(deviation[name])} at most (output {name!r}; max |a-b| / max |a| "
                f"over {check['inputs']} {check.get('feeds', 'random')} inputs)")
    if check.get("tolerance") is not None:
        line += f", tolerance {check['tolerance']:g}"
    kept = check.get("float32_layers") or []
    if kept:
        line += f"; {len(kept)} layer(s) kept float32: {', '.join(kept)}"
    line += layer_counts(check)
    return line


def layer_counts(check: dict) -> str:
    """"; N layer(s) with bfloat16 weights, M kept float32 (why)": the layers the CPU rule
    kept float32, with its reason, when the record has them (older records do not)."""
    if "bfloat16_layers" not in check:
        return ""
    widening = check.get("float32_widening") or {}
    line = f"; {check['bfloat16_layers']} layer(s) with bfloat16 weights"
    if widening.get("layers"):
        line += f", {len(widening['layers'])} kept float32 ({widening.get('why', '')})"
    return line
