"""Whether a plan's native code runs here, and loading it when it does.

Native code is executable: it runs only when it was verified and comes from someone the
user trusts (decided for every code payload alike by nncc.backends.payloads). Code built
for CPU features this machine lacks is never loaded.
Whenever native code does not run, the plan's portable instructions do, after one
warning line that says why.
"""

from __future__ import annotations

import ctypes
import os

from nncc.errors import NnccError
from nncc.native.blas import sgemm
from nncc.native.loader import Library, NativeLoadError
from nncc.native.toolchain import is_sanitized, missing_features, sanitizer_loaded, sanitizer_preload
from nncc.plan.plan import Plan
from nncc.util.notice import warn
from nncc.util.threads import blas_threads


def load_native(plan: Plan, payload, calls: dict, origin: str = "the artifact"):
    """A loaded nncc.native.loader.Library of the payload's code, its checked ``calls``
    (partition -> nncc.backends.native.NativeCall) attached, or None (run the portable
    plan). The caller has decided the code may run (nncc.backends.payloads)."""
    info = plan.options.get("native")
    required = info.get("features", []) if isinstance(info, dict) else []
    missing = missing_features([f for f in required if isinstance(f, str)]) if isinstance(required, list) else []
    if missing:
        warn(f"{origin}'s native code needs CPU features this machine lacks ({', '.join(missing[:4])}); "
             "running its portable plan")
        return None

    sanitized = is_sanitized(info)
    if sanitized:
        require_sanitizer_runtime(origin)

    try:
        library = Library(payload.data)
        # sanitized code keeps its own GEMM loops: BLAS is not instrumented, so an
        # overrun inside it would go unseen
        blas = None if sanitized else sgemm()
        if blas is not None:
            setter = library.handle.nncc_set_blas
            setter.argtypes = [ctypes.c_void_p, ctypes.c_int]
            setter(blas[0], int(blas[1]))
        set_threads = library.handle.nncc_set_threads
        set_threads.argtypes = [ctypes.c_int]
        library.threads = set_threads(_threads(plan))
        for call in calls.values():
            library.function(call.symbol)  # every entry point resolves, or none runs
    except (NativeLoadError, AttributeError) as exc:
        warn(f"{origin}'s native code cannot be loaded ({exc}); running its portable plan")
        return None
    library.sanitized = sanitized
    # code that never calls BLAS runs without BLAS's thread count being touched (plans
    # from before this was recorded are taken to call it)
    library.blas = not isinstance(info, dict) or info.get("blas") is not False
    library.calls = calls
    return library


class SanitizerRuntimeMissing(NnccError):
    """Sanitized native code, in a process started without the sanitizer runtime."""

    exit_code = 2


def require_sanitizer_runtime(origin: str) -> None:
    """Sanitized code loaded into a process without the ASan runtime aborts the process, so
    it is refused first: the sanitize mode is asked for to check the code, and running the
    portable plan instead would check nothing."""
    if sanitizer_loaded():
        return
    raise SanitizerRuntimeMissing(
        f"{origin}'s native code was built in the sanitize mode (NNCC_NATIVE_SANITIZE) and loads only into "
        "a process started with the sanitizer runtime",
        hint=f"run with LD_PRELOAD=\"{sanitizer_preload()}\" ASAN_OPTIONS=detect_leaks=0, or without "
             "NNCC_NATIVE_SANITIZE")




def _threads(plan: Plan) -> int:
    """The pool size for the code's own loops: the plan's setting (low-power: 1), else as
    many as BLAS uses, so the two pools take the same cores."""
    return plan.recorded_threads or blas_threads() or len(os.sched_getaffinity(0))
