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

NO_KERNEL = ort.capi.onnxruntime_pybind11_state.NotImplemented  # no kernel for a node's types
SESSIONS_KEPT = 16  # a light model's session holds its weights: keep only the recent few

_sessions: OrderedDict[tuple[bytes, bool], ort.InferenceSession] = OrderedDict()


def ort_session(model, *, optimized: bool = True) -> ort.InferenceSession:
    """A session for ``model`` (a ModelProto, its bytes or a path). ``optimized=False``
    runs the model's own ops, without onnxruntime's graph rewrites (some of which, such as
    its MatMulNBits for int4 weights, compute with less precision than the model states)."""
    if isinstance(model, (str, os.PathLike)):
        # from its path, so external data next to the model is found
        return _open(os.fspath(model), optimized)
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else bytes(model)
    key = (hashlib.blake2b(data, digest_size=16).digest(), optimized)
    if key in _sessions:
        _sessions.move_to_end(key)
        return _sessions[key]
    _sessions[key] = session = _open(data, optimized)
    while len(_sessions) > SESSIONS_KEPT:
        _sessions.popitem(last=False)
    return session


def _options(optimized: bool, exact_integers: bool) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    if exact_integers:
        options.add_session_config_entry("session.x64quantprecision", "1")
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def exact_integer_session(model) -> ort.InferenceSession:
    """A session on onnxruntime's exact integer path (see ``_open``), uncached; NO_KERNEL
    when that path has no kernel for one of the model's nodes."""
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, _options(True, True), providers=["CPUExecutionProvider"])


def _open(model, optimized: bool) -> ort.InferenceSession:
    """Exact integer products on x86 CPUs without VNNI: there onnxruntime's uint8 x int8
    kernels add byte products in saturating int16 pairs (vpmaddubsw) and are tens of units
    off on full-range int8 weights, unless told to take its exact path (which it has for
    constant weights only: a test feeding int8 weights at run time needs another oracle).
    That path has no kernels for int8 activations, whose products it computes exactly
    anyway: a model it cannot open so is opened as onnxruntime opens it by default."""
    try:
        return ort.InferenceSession(model, _options(optimized, True), providers=["CPUExecutionProvider"])
    except NO_KERNEL:
        return ort.InferenceSession(model, _options(optimized, False), providers=["CPUExecutionProvider"])


def ort_run(model, feeds: dict, names: list[str] | None = None, *, optimized: bool = True) -> list[np.ndarray]:
    """onnxruntime's outputs of ``model`` for ``feeds``: all of them, or those ``names``."""
    return ort_session(model, optimized=optimized).run(names, feeds)


def ort_outputs(model, feeds: dict, *, optimized: bool = True) -> dict[str, np.ndarray]:
    """onnxruntime's outputs of ``model`` for ``feeds``, by name, in the model's order."""
    session = ort_session(model, optimized=optimized)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
