"""The arithmetic of native products by constant weights: what a target can do of what the
compile options ask.

``precision="bf16"`` has two arithmetics. Where the target has AVX-512 BF16 both inputs of
a product are rounded to bfloat16 and ``vdpbf16ps`` multiplies them ("bf16": half the
instructions and half the weight bytes). Everywhere else only the weights are stored as
bfloat16 and widened to float32 in registers ("bf16w": half the weight bytes the
micro-kernel streams, float32 products and sums). Only a plan without native code (no C
compiler) computes everything in float32, and the user is told so once per process."""

from __future__ import annotations

from nncc.native.toolchain import required_features
from nncc.util.notice import warn_once

FEATURE = "avx512_bf16"  # as /proc/cpuinfo names it
# the arithmetic of each kind, as the native backend's identity names it
ARITHMETICS = {"f32": "float32", "bf16": "bfloat16 products (vdpbf16ps)",
               "bf16w": "bfloat16 weights widened to float32"}


def why_not_bf16(target: str) -> str | None:
    """Why code for ``target`` cannot multiply in bfloat16 (one clause), or None: it then
    keeps its weights in bfloat16 and multiplies in float32 (``arithmetic``)."""
    if FEATURE in required_features(target):
        return None
    if target == "native":
        return f"this CPU lacks {FEATURE}"
    return f"--target {target} does not include {FEATURE}"


def arithmetic(precision: str, target: str) -> str:
    """The arithmetic (an ARITHMETICS key) native code for ``target`` computes products by
    constant weights in when ``precision`` is asked for."""
    if precision == "f32":
        return "f32"  # auto is bf16 with some layers kept float32 (CompileOptions.keep_f32)
    return "bf16" if why_not_bf16(target) is None else "bf16w"


def say_if_unavailable(precision: str, has_compiler: bool) -> None:
    """One warning per process and precision when no native code can honour it."""
    if precision != "f32" and not has_compiler:
        warn_once(("precision", precision),
                  f"precision {precision} ignored: no C compiler, so no native code; the portable plan computes "
                  "in float32")
