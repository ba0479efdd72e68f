"""String kernels: StringConcat, StringSplit, StringNormalizer and RegexFullMatch.

Strings are numpy object arrays of Python str (what the model reader produces); a numpy
unicode array is accepted too. Their shapes often depend on the contents, so these nodes
run on the CPU fallback.

StringSplit follows str.split: without a delimiter it splits on runs of any whitespace
character, and an empty string split on a delimiter is one empty substring (onnxruntime
splits on spaces only and counts zero substrings there). StringNormalizer compares and
changes case by Unicode rules whatever its `locale` attribute says.

RegexFullMatch uses Python's `re` where ONNX names RE2. The pattern is compiled with
re.ASCII so that \\w, \\d, \\s and \\b mean what they mean in RE2 (ASCII classes), and RE2's
end-of-text escape \\z is read as Python's \\Z. Differences that remain: Python also accepts
constructs RE2 rejects (backreferences, lookaround), so such a pattern runs here instead of
failing, and RE2's Unicode classes (\\pL, \\p{Greek}) are not available.
"""

from __future__ import annotations

import re

import numpy as np

from nncc.errors import KernelError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import broadcast

_STRING = np.dtype(object)


def _strings(op: str, x: np.ndarray) -> np.ndarray:
    """``x`` as an object array of str, or a KernelError for a non-string input."""
    if x.dtype.kind == "U":
        return x.astype(object)
    if x.dtype.kind != "O":
        raise KernelError(f"{op} expects a string tensor, got {x.dtype}")
    return x


# --------------------------------------------------------------------------- StringConcat


def _concat_shape(ctx, x, y):
    return [TensorInfo(_STRING, broadcast(x.shape, y.shape))]


@kernel("StringConcat", 20, shape=_concat_shape)
def string_concat(ctx, x, y):
    x, y = _strings("StringConcat", x), _strings("StringConcat", y)
    try:
        out = np.add(x, y, dtype=object)  # str + str, elementwise with broadcasting
    except ValueError as exc:
        raise KernelError(f"StringConcat: cannot broadcast shapes {x.shape} and {y.shape}") from exc
    return np.asarray(out, dtype=object)


# --------------------------------------------------------------------------- StringSplit


def _split_shape(ctx, x):
    if x.shape is None:
        return [TensorInfo(_STRING, None), TensorInfo(np.dtype(np.int64), None)]
    return [TensorInfo(_STRING, tuple(x.shape) + (None,)), TensorInfo(np.dtype(np.int64), x.shape)]


@kernel("StringSplit", 20, shape=_split_shape)
def string_split(ctx, x):
    x = _strings("StringSplit", x)
    delimiter = ctx.get("delimiter") or None  # empty or absent: runs of whitespace
    maxsplit = ctx.get("maxsplit")
    maxsplit = -1 if maxsplit is None else int(maxsplit)
    if maxsplit < -1:
        maxsplit = -1
    pieces = [s.split(delimiter, maxsplit) for s in x.reshape(-1).tolist()]
    lengths = np.array([len(p) for p in pieces], dtype=np.int64).reshape(x.shape)
    width = int(lengths.max(initial=0))
    out = np.full((len(pieces), width), "", dtype=object)
    for row, parts in enumerate(pieces):
        out[row, : len(parts)] = parts
    return out.reshape(x.shape + (width,)), lengths


# --------------------------------------------------------------------------- StringNormalizer


def _normalizer_shape(ctx, x):
    if x.shape is None:
        return [TensorInfo(_STRING, None)]
    return [TensorInfo(_STRING, tuple(x.shape[:-1]) + (None,))]


@kernel("StringNormalizer", 10, shape=_normalizer_shape)
def string_normalizer(ctx, x):
    x = _strings("StringNormalizer", x)
    if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)):
        raise KernelError(f"StringNormalizer expects shape [C] or [1, C], got {list(x.shape)}")
    action = ctx.get("case_change_action", "NONE") or "NONE"
    if action not in ("NONE", "LOWER", "UPPER"):
        raise KernelError(f"StringNormalizer: unknown case_change_action {action!r}")
    sensitive = bool(ctx.get("is_case_sensitive", 0))
    stopwords = ctx.get("stopwords") or []
    words = x.reshape(-1).tolist()
    if stopwords:
        if sensitive:
            stops = set(stopwords)
            words = [w for w in words if w not in stops]
        else:
            stops = {s.lower() for s in stopwords}
            words = [w for w in words if w.lower() not in stops]
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    if not words:  # everything removed: one empty string, as the operator specifies
        words = [""]
    out = np.empty(len(words), dtype=object)
    out[:] = words
    return out if x.ndim == 1 else out.reshape(1, -1)


# --------------------------------------------------------------------------- RegexFullMatch


def _regex_shape(ctx, x):
    return [TensorInfo(np.dtype(np.bool_), x.shape)]


def _compile(ctx) -> re.Pattern:
    cached = ctx.scratch.get("regex")
    if cached is not None:
        return cached
    pattern = ctx.get("pattern")
    if pattern is None:
        raise KernelError("RegexFullMatch needs the pattern attribute")
    translated = re.sub(r"(?<!\\)((?:\\\\)*)\\z", r"\1\\Z", pattern)
    try:
        compiled = re.compile(translated, re.ASCII)
    except re.error as exc:
        raise KernelError(f"RegexFullMatch: invalid pattern {pattern!r}: {exc}") from None
    ctx.scratch["regex"] = compiled
    return compiled


@kernel("RegexFullMatch", 20, shape=_regex_shape)
def regex_full_match(ctx, x):
    x = _strings("RegexFullMatch", x)
    matcher = _compile(ctx).fullmatch
    flat = [matcher(s) is not None for s in x.reshape(-1).tolist()]
    return np.array(flat, dtype=np.bool_).reshape(x.shape)
