"""The arithmetic of native products by constant weights: what a target can do of what the
compile options ask. bfloat16 needs AVX-512 BF16 (``vdpbf16ps``); where the target lacks it
the products stay float32, the exact arithmetic rather than none, and the user is told
once per process."""

from __future__ import annotations

from nncc.native.toolchain import required_features
from nncc.util.notice import warn_once

FEATURE = "avx512_bf16"  # as /proc/cpuinfo names it


def why_not_bf16(target: str) -> str | None:
    """Why code for ``target`` cannot compute in bfloat16 (one clause), or None."""
    if FEATURE in required_features(target):
        return None
    if target == "native":
        return f"this CPU lacks {FEATURE}"
    return f"--target {target} does not include {FEATURE}"


def effective(precision: str, target: str) -> str:
    """The precision code for ``target`` computes in when ``precision`` is asked for."""
    return precision if precision == "f32" or why_not_bf16(target) is None else "f32"


def say_if_unavailable(precision: str, target: str) -> None:
    """One warning per process and (precision, target) when the target cannot honour it."""
    reason = None if precision == "f32" else why_not_bf16(target)
    if reason is not None:
        warn_once(("precision", precision, target),
                  f"precision {precision} ignored: {reason}; the products stay float32")
