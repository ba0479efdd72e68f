"""onnxruntime as the tests' oracle, opened one way everywhere: the CPU provider, one
intra-op thread (the same summation order on every machine, and no thread pool to share
the cores of a test run with), its log quiet below errors (its output-shape warnings
would drown a failure), its integer products by constant weights exact on every CPU.

Sessions of models given in memory are cached by their bytes, so a model fed many times is
loaded once; a model given by its path is opened each time (its external data may change
beside it)."""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict

import numpy as np
import onnx
import onnxruntime as ort

SESSIONS_KEPT = 16  # a light model's session holds its weights: keep only the recent few

_sessions: OrderedDict[tuple[bytes, bool], ort.InferenceSession] = OrderedDict()


def ort_session(model, *, optimized: bool = True) -> ort.InferenceSession:
    """A session for ``model`` (a ModelProto, its bytes or a path). ``optimized=False``
    runs the model's own ops, without onnxruntime's graph rewrites (some of which, such as
    its MatMulNBits for int4 weights, compute with less precision than the model states)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    # Exact integer products on x86 CPUs without VNNI: there its u8s8 kernels add byte
    # products in saturating int16 pairs (vpmaddubsw) and are tens of units off on
    # full-range int8 weights, unless told to take its exact, slower path (which it has for
    # constant weights only: a test feeding int8 weights at run time needs another oracle).
    options.add_session_config_entry("session.x64quantprecision", "1")
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if isinstance(model, (str, os.PathLike)):
        # from its path, so external data next to the model is found
        return ort.InferenceSession(os.fspath(model), options, providers=["CPUExecutionProvider"])
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else bytes(model)
    key = (hashlib.blake2b(data, digest_size=16).digest(), optimized)
    if key in _sessions:
        _sessions.move_to_end(key)
        return _sessions[key]
    _sessions[key] = session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    while len(_sessions) > SESSIONS_KEPT:
        _sessions.popitem(last=False)
    return session


def ort_run(model, feeds: dict, names: list[str] | None = None, *, optimized: bool = True) -> list[np.ndarray]:
    """onnxruntime's outputs of ``model`` for ``feeds``: all of them, or those ``names``."""
    return ort_session(model, optimized=optimized).run(names, feeds)


def ort_outputs(model, feeds: dict, *, optimized: bool = True) -> dict[str, np.ndarray]:
    """onnxruntime's outputs of ``model`` for ``feeds``, by name, in the model's order."""
    session = ort_session(model, optimized=optimized)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
