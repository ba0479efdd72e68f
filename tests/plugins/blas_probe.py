"""A plugin op that reports the BLAS thread count while a model runs.

``test.probe::BlasThreads`` passes its input through and appends the BLAS library's
thread count at that moment (nncc.util.threads.blas_threads) as one line to the file
named by $NNCC_TEST_BLAS_PROBE: what a run actually used, observed from inside it.
"""

from __future__ import annotations

import os

import numpy as np

from nncc.kernels.registry import Ctx, kernel
from nncc.util.threads import blas_threads

DOMAIN = "test.probe"


@kernel("BlasThreads", since=1, domain=DOMAIN, shape=lambda ctx, x: [x])
def probe(ctx: Ctx, x: np.ndarray) -> np.ndarray:
    with open(os.environ["NNCC_TEST_BLAS_PROBE"], "a", encoding="utf-8") as out:
        out.write(f"{blas_threads()}\n")
    return x.copy()
