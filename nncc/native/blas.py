"""The address of sgemm in the BLAS numpy has loaded, for generated code to call.

Generated partitions do their matrix products through the same OpenBLAS numpy uses
(scipy-openblas in numpy 2 wheels, 64-bit integers), so native and portable plans share
one thread pool and one set of tuned kernels. Without a known BLAS the prelude's plain
loops are used: slower, never wrong.
"""

from __future__ import annotations

import ctypes
import functools

from nncc.util.threads import blas_library_paths

# (symbol, takes 64-bit integers), most specific first
_SGEMM = (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("scipy_cblas_sgemm", False),
          ("cblas_sgemm", False))


@functools.lru_cache(maxsize=1)
def sgemm() -> tuple[int, bool] | None:
    """(function address, ILP64) of cblas_sgemm, or None."""
    for path in blas_library_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name, ilp64 in _SGEMM:
            fn = getattr(lib, name, None)
            if fn is not None:
                return ctypes.cast(fn, ctypes.c_void_p).value, ilp64
    return None
