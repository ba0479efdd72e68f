"""Saying once why native code is off on this machine (no C compiler, or a CPU without
the ISA the target needs), instead of falling back to the portable plan without a word."""

from __future__ import annotations

from nncc.cli.output import detail
from nncc.compiler import CompileOptions
from nncc.native.toolchain import explicit_compiler_missing, missing_features, why_no_native
from nncc.settings import c_compiler
from nncc.util.notice import warn


def native_off(backends, target: str) -> str | None:
    """Why the native backend builds or runs nothing here, when it is asked for."""
    if "native" not in (backends or CompileOptions.backends):
        return None

    return why_no_native(target or "native", c_compiler())


def say_why_native_is_off(backends, target: str) -> None:
    """A warning when $CC names a compiler that is not there (the user chose it), else a
    line at -v."""
    reason = native_off(backends, target)
    if reason is None:
        return

    if explicit_compiler_missing(c_compiler()):
        warn(f"native code is off: {reason} (unset CC to use cc, gcc or clang)")
    else:
        detail(f"nncc: native code is off: {reason}")


def artifact_native_off(plan) -> str | None:
    """Why an artifact's native code cannot run on this CPU (a compiler is not needed)."""
    info = plan.options.get("native")
    if not plan.carries_code or not isinstance(info, dict):
        return None

    required = [f for f in info.get("features") or [] if isinstance(f, str)]
    missing = missing_features(required)
    if not missing:
        return None
    return f"this CPU lacks {', '.join(missing[:4])}, which its code needs: the portable plan runs here"
