"""Classical machine-learning kernels: the ai.onnx.ml ops ArrayFeatureExtractor, Binarizer,
LabelEncoder and TreeEnsemble, and TfIdfVectorizer (which lives in the default domain).

Tree ensembles are evaluated level by level for all rows and trees at once (one vectorized
step per tree depth), n-grams by matching every window of the input against the pool at
once, and label lookups by a sorted search; no kernel loops over rows in Python.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel

ML = "ai.onnx.ml"
_STRING = np.dtype(object)


# --------------------------------------------------------------------------- ArrayFeatureExtractor


def _feature_shape(ctx, x, indices):
    count = None
    if indices.shape is not None and all(isinstance(d, int) for d in indices.shape):
        count = math.prod(indices.shape)
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    lead = (1,) if len(x.shape) == 1 else tuple(x.shape[:-1])
    return [TensorInfo(x.dtype, lead + (count,))]


@kernel("ArrayFeatureExtractor", 1, ML, shape=_feature_shape)
def array_feature_extractor(ctx, x, indices):
    """x[..., indices] over the last axis; a 1-D x gives one row (as onnxruntime does)."""
    index = np.asarray(indices).reshape(-1).astype(np.int64, copy=False)
    width = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or np.any(index < 0) or np.any(index >= width):
        raise KernelError(f"ArrayFeatureExtractor: indices {index.tolist()} out of range for shape {x.shape}")
    out = np.take(x, index, axis=-1)
    return out.reshape(1, -1) if x.ndim == 1 else out


# --------------------------------------------------------------------------- Binarizer


def _same_shape(ctx, x):
    return [TensorInfo(x.dtype, x.shape)]


@kernel("Binarizer", 1, ML, shape=_same_shape)
def binarizer(ctx, x):
    threshold = x.dtype.type(ctx.get("threshold", 0.0))
    return (x > threshold).astype(x.dtype)


# --------------------------------------------------------------------------- LabelEncoder

_KINDS = (("floats", np.float32), ("int64s", np.int64), ("strings", _STRING))
_DEFAULTS = {np.dtype(np.float32): -0.0, np.dtype(np.int64): -1, _STRING: "_Unused"}


def _as_array(values, dtype) -> np.ndarray:
    if dtype == _STRING:
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)
        return out
    return np.asarray(values, dtype=dtype)


def _label_table(ctx, what: str) -> np.ndarray:
    """keys or values from whichever of the `{what}_*` attributes is set."""
    found = []
    tensor = ctx.get(f"{what}_tensor")
    if tensor is not None:
        found.append(np.asarray(tensor).reshape(-1))
    for suffix, dtype in _KINDS:
        values = ctx.get(f"{what}_{suffix}")
        if values is not None:
            found.append(_as_array(values, dtype))
    if len(found) != 1:
        raise KernelError(f"LabelEncoder needs exactly one {what}_* attribute, got {len(found)}")
    return found[0]


def _label_default(ctx, values: np.ndarray):
    tensor = ctx.get("default_tensor")
    if tensor is not None:
        return np.asarray(tensor).reshape(-1)[0]
    if values.dtype == _STRING:
        return ctx.get("default_string", "_Unused")
    if values.dtype.kind in "iu":
        return ctx.get("default_int64", -1)
    return ctx.get("default_float", -0.0)


def _label_encoder_v1_tables(ctx, x_dtype):
    classes = ctx.get("classes_strings") or []
    strings = _as_array(classes, _STRING)
    ids = np.arange(len(classes), dtype=np.int64)
    if x_dtype == _STRING or x_dtype.kind == "U":
        return strings, ids, ctx.get("default_int64", -1)
    return ids, strings, ctx.get("default_string", "_Unused")


def _label_shape(ctx, x):
    if ctx.opset < 2:
        dtype = np.dtype(np.int64) if x.dtype in (_STRING, None) else _STRING
    else:
        try:
            dtype = _label_table(ctx, "values").dtype
        except KernelError as exc:
            raise ShapeInferenceError(str(exc)) from None
    return [TensorInfo(dtype, x.shape)]


def _label_encoder(ctx, x):
    if ctx.opset < 2:
        keys, values, default = _label_encoder_v1_tables(ctx, x.dtype)
    else:
        keys, values = _label_table(ctx, "keys"), _label_table(ctx, "values")
        default = _label_default(ctx, values)
    if len(keys) != len(values):
        raise KernelError(f"LabelEncoder has {len(keys)} keys but {len(values)} values")
    if (keys.dtype == _STRING) != (x.dtype.kind in "OU"):
        raise KernelError(f"LabelEncoder: input of dtype {x.dtype} does not match keys of {keys.dtype}")
    if keys.dtype == _STRING:
        table = dict(zip(keys.tolist(), range(len(keys))))
        flat = x.reshape(-1).tolist()
        position = np.fromiter((table.get(s, -1) for s in flat), np.int64, len(flat))
    else:
        x_num = x.astype(keys.dtype, copy=False) if keys.dtype.kind == "f" else x
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        flat = x_num.reshape(-1)
        at = np.searchsorted(ordered, flat).clip(0, max(len(ordered) - 1, 0))
        hit = ordered[at] == flat if len(ordered) else np.zeros(flat.shape, bool)
        if keys.dtype.kind == "f" and np.isnan(keys).any():  # a NaN key matches NaN inputs
            hit |= np.isnan(flat) & np.isnan(ordered[at])
        position = np.where(hit, order[at] if len(order) else 0, -1)
    out = np.empty(position.shape, dtype=values.dtype)
    found = position >= 0
    out[found] = values[position[found]]
    out[~found] = default
    return out.reshape(x.shape)


for _since in (1, 2, 4):
    kernel("LabelEncoder", _since, ML, shape=_label_shape)(_label_encoder)


# --------------------------------------------------------------------------- TreeEnsemble

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


class _Forest:
    """The TreeEnsemble attributes as flat arrays, checked once per node."""

    def __init__(self, ctx):
        def ints(name, default=None):
            value = ctx.get(name, default)
            if value is None:
                raise KernelError(f"TreeEnsemble needs the {name} attribute")
            return np.asarray(value, dtype=np.int64).reshape(-1)

        def floats(name):
            value = ctx.get(name)
            return None if value is None else np.asarray(value, dtype=np.float64).reshape(-1)

        self.features = ints("nodes_featureids")
        count = len(self.features)
        self.modes = ints("nodes_modes")
        self.splits = floats("nodes_splits")
        if self.splits is None:
            self.splits = np.zeros(count)
        self.true_ids, self.false_ids = ints("nodes_truenodeids"), ints("nodes_falsenodeids")
        self.true_leaf = ints("nodes_trueleafs").astype(bool)
        self.false_leaf = ints("nodes_falseleafs").astype(bool)
        self.missing_true = ints("nodes_missing_value_tracks_true", [0] * count).astype(bool)
        self.targets = ints("leaf_targetids")
        self.weights = floats("leaf_weights")
        self.roots = ints("tree_roots")
        self.n_targets = int(ctx.get("n_targets", 0) or 0)
        if self.weights is None or len(self.weights) != len(self.targets):
            raise KernelError("TreeEnsemble: leaf_weights and leaf_targetids must be parallel")
        lengths = {len(a) for a in (self.modes, self.splits, self.true_ids, self.false_ids,
                                    self.true_leaf, self.false_leaf, self.missing_true)}
        if lengths != {count}:
            raise KernelError("TreeEnsemble: the nodes_* attributes must all have one entry per node")
        for ids, leaf in ((self.true_ids, self.true_leaf), (self.false_ids, self.false_leaf)):
            limit = np.where(leaf, len(self.targets), count)
            if np.any(ids < 0) or np.any(ids >= limit):
                raise KernelError("TreeEnsemble: a branch points outside the nodes or leaves")
        if np.any(self.roots < 0) or np.any(self.roots >= count) or np.any(self.modes < 0) \
                or np.any(self.modes > _MEMBER):
            raise KernelError("TreeEnsemble: bad tree_roots or nodes_modes")
        if np.any(self.targets < 0) or np.any(self.targets >= self.n_targets):
            raise KernelError("TreeEnsemble: a leaf target is outside [0, n_targets)")
        self.members = self._members(ctx, count)

    def _members(self, ctx, count: int) -> np.ndarray:
        """Per node, its set members padded with NaN (set membership nodes only)."""
        member_nodes = np.flatnonzero(self.modes == _MEMBER)
        values = ctx.get("membership_values")
        if not len(member_nodes):
            return np.full((count, 0), np.nan)
        if values is None:
            raise KernelError("TreeEnsemble: set membership nodes need membership_values")
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        groups = np.split(values, np.flatnonzero(np.isnan(values)))
        groups = [g[~np.isnan(g)] for g in groups]  # NaN ends each node's set
        if len(groups) < len(member_nodes):
            raise KernelError("TreeEnsemble: membership_values has too few sets")
        width = max((len(g) for g in groups), default=0)
        table = np.full((count, max(width, 1)), np.nan)
        for node, group in zip(member_nodes, groups):
            table[node, : len(group)] = group
        return table


def _tree_shape(ctx, x):
    n = ctx.get("n_targets")
    rows = None if x.shape is None or not x.shape else x.shape[0]
    return [TensorInfo(x.dtype, (rows, n))]


@kernel("TreeEnsemble", 5, ML, shape=_tree_shape)
def tree_ensemble(ctx, x):
    forest = ctx.scratch.get("forest")
    if forest is None:
        forest = ctx.scratch["forest"] = _Forest(ctx)
    if x.ndim != 2:
        raise KernelError(f"TreeEnsemble expects a 2-D input, got shape {x.shape}")
    if len(forest.features) and forest.features.max() >= x.shape[1]:
        raise KernelError(f"TreeEnsemble: a node reads feature {forest.features.max()} of {x.shape[1]}")
    rows, trees = x.shape[0], len(forest.roots)
    data = x.astype(np.float64, copy=False)
    node = np.broadcast_to(forest.roots, (rows, trees)).copy()
    # a single-leaf tree: root with both branches leaves pointing at the same leaf
    at_leaf = np.broadcast_to(
        forest.true_leaf[forest.roots] & forest.false_leaf[forest.roots]
        & (forest.true_ids[forest.roots] == forest.false_ids[forest.roots]), (rows, trees)).copy()
    leaf = np.where(at_leaf, forest.true_ids[node], 0)
    row_index = np.arange(rows)[:, None]
    for _ in range(len(forest.features) + 1):
        active = ~at_leaf
        if not active.any():
            break
        value = data[row_index, forest.features[node]]
        go_true = _compare(forest, node, value)
        nxt = np.where(go_true, forest.true_ids[node], forest.false_ids[node])
        lands = np.where(go_true, forest.true_leaf[node], forest.false_leaf[node])
        leaf = np.where(active & lands, nxt, leaf)
        node = np.where(active & ~lands, nxt, node)
        at_leaf = at_leaf | lands
    else:
        raise KernelError("TreeEnsemble: the trees contain a cycle")
    scores = _aggregate(ctx, forest, leaf, rows, trees)
    return _post_transform(int(ctx.get("post_transform", 0)), scores).astype(x.dtype)


def _compare(forest: _Forest, node: np.ndarray, value: np.ndarray) -> np.ndarray:
    mode, split = forest.modes[node], forest.splits[node]
    with np.errstate(invalid="ignore"):
        result = np.select(
            [mode == _LEQ, mode == _LT, mode == _GTE, mode == _GT, mode == _EQ, mode == _NEQ],
            [value <= split, value < split, value >= split, value > split, value == split,
             value != split],
            default=False)
    if forest.members.shape[1]:
        member = (forest.members[node] == value[..., None]).any(axis=-1)
        result = np.where(mode == _MEMBER, member, result)
    return result | (np.isnan(value) & forest.missing_true[node])


def _aggregate(ctx, forest: _Forest, leaf: np.ndarray, rows: int, trees: int) -> np.ndarray:
    how = int(ctx.get("aggregate_function", 1))
    weights, targets = forest.weights[leaf], forest.targets[leaf]  # (rows, trees)
    flat = (np.arange(rows)[:, None] * forest.n_targets + targets).reshape(-1)
    size = rows * forest.n_targets
    if how in (0, 1):
        out = np.bincount(flat, weights.reshape(-1), minlength=size)
        if how == 0 and trees:
            out = out / trees
    elif how in (2, 3):
        out = np.full(size, np.inf if how == 2 else -np.inf)
        (np.minimum if how == 2 else np.maximum).at(out, flat, weights.reshape(-1))
        out[np.isinf(out)] = 0.0  # a target no tree reaches scores 0
    else:
        raise KernelError(f"TreeEnsemble: unknown aggregate_function {how}")
    return out.reshape(rows, forest.n_targets)


def _post_transform(how: int, scores: np.ndarray) -> np.ndarray:
    if how == 0:
        return scores
    if how == 1:  # (onnxruntime reads 1 as LOGISTIC and 2 as SOFTMAX, against the spec)
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if how == 2:
        return 1.0 / (1.0 + np.exp(-scores))
    if how == 3:  # softmax where exact zeros stay zero
        e = np.where(scores == 0, 0.0, np.exp(scores - scores.max(axis=1, keepdims=True)))
        total = e.sum(axis=1, keepdims=True)
        return np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    if how == 4:
        return math.sqrt(2.0) * _erfinv(2.0 * scores - 1.0)
    raise KernelError(f"TreeEnsemble: unknown post_transform {how}")


def _erfinv(y: np.ndarray) -> np.ndarray:
    """Inverse error function: an initial estimate refined by Newton steps on math.erf
    (+-inf at +-1, NaN outside [-1, 1])."""
    a = 0.147
    with np.errstate(invalid="ignore", divide="ignore"):
        ln = np.log1p(-y * y)
        first = 2.0 / (np.pi * a) + ln / 2.0
        x = np.sign(y) * np.sqrt(np.sqrt(first * first - ln / a) - first)
        erf = np.vectorize(math.erf, otypes=[np.float64])
        for _ in range(3):
            step = (erf(x) - y) / (2.0 / np.sqrt(np.pi) * np.exp(-x * x))
            x = np.where(np.isfinite(step), x - step, x)
    return x


# --------------------------------------------------------------------------- TfIdfVectorizer


class _Pool:
    """The n-gram pool: per gram length, the grams as token-id rows and their columns."""

    def __init__(self, ctx):
        ints, strings = ctx.get("pool_int64s"), ctx.get("pool_strings")
        if (ints is None) == (strings is None):
            raise KernelError("TfIdfVectorizer needs exactly one of pool_int64s and pool_strings")
        self.strings = strings is not None
        pool = list(strings) if self.strings else np.asarray(ints, dtype=np.int64)
        counts = [int(c) for c in ctx.get("ngram_counts", [])]
        indexes = np.asarray(ctx.get("ngram_indexes", []), dtype=np.int64)
        self.min_n = int(ctx.get("min_gram_length", 1))
        self.max_n = int(ctx.get("max_gram_length", 1))
        self.skip = int(ctx.get("max_skip_count", 0))
        self.mode = ctx.get("mode", "TF")
        if self.mode not in ("TF", "IDF", "TFIDF"):
            raise KernelError(f"TfIdfVectorizer: unknown mode {self.mode!r}")
        if not len(indexes) or indexes.min() < 0:
            raise KernelError("TfIdfVectorizer needs nonnegative ngram_indexes")
        self.width = int(indexes.max()) + 1
        # weights[i] belongs to the i-th pool n-gram, so it goes to that n-gram's column
        # (as onnxruntime does; ONNX's Python reference indexes weights by column instead)
        weights = ctx.get("weights")
        self.weights = None
        if weights:
            if len(weights) != len(indexes):
                raise KernelError("TfIdfVectorizer: weights and ngram_indexes differ in length")
            self.weights = np.zeros(self.width, np.float32)
            self.weights[indexes] = np.asarray(weights, dtype=np.float32)
        # every distinct pool token gets an id; input tokens outside the pool get -1
        if self.strings:
            self.vocab = {t: i for i, t in enumerate(dict.fromkeys(pool))}
            ids = np.array([self.vocab[t] for t in pool], dtype=np.int64)
        else:
            self.vocab = np.unique(pool)
            ids = np.searchsorted(self.vocab, pool).astype(np.int64)
        self.grams: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        gram = 0
        for n, start in enumerate(counts, start=1):
            end = counts[n] if n < len(counts) else len(pool)
            rows = max(end - start, 0) // n
            if self.min_n <= n <= self.max_n and rows:
                if gram + rows > len(indexes):
                    raise KernelError("TfIdfVectorizer: ngram_indexes is shorter than the pool")
                self.grams[n] = (ids[start:start + rows * n].reshape(rows, n),
                                 indexes[gram:gram + rows])
            gram += rows

    def token_ids(self, x: np.ndarray) -> np.ndarray:
        if self.strings:
            if x.dtype.kind not in "OU":
                raise KernelError(f"TfIdfVectorizer: pool_strings needs a string input, got {x.dtype}")
            flat = x.reshape(-1).tolist()
            return np.fromiter((self.vocab.get(t, -1) for t in flat), np.int64, len(flat)).reshape(x.shape)
        if x.dtype.kind not in "iu":
            raise KernelError(f"TfIdfVectorizer: pool_int64s needs an integer input, got {x.dtype}")
        x = x.astype(np.int64, copy=False)
        if not len(self.vocab):
            return np.full(x.shape, -1, np.int64)
        at = np.searchsorted(self.vocab, x).clip(0, len(self.vocab) - 1)
        return np.where(self.vocab[at] == x, at, -1)


def _tfidf_shape(ctx, x):
    width = max(ctx.get("ngram_indexes") or [-1]) + 1
    if x.shape is None:
        return [TensorInfo(np.dtype(np.float32), None)]
    if len(x.shape) == 2:
        return [TensorInfo(np.dtype(np.float32), (x.shape[0], width))]
    return [TensorInfo(np.dtype(np.float32), (width,))]


@kernel("TfIdfVectorizer", 9, shape=_tfidf_shape)
def tfidf_vectorizer(ctx, x):
    pool = ctx.scratch.get("pool")
    if pool is None:
        pool = ctx.scratch["pool"] = _Pool(ctx)
    if x.ndim > 2 or (x.ndim == 2 and x.shape[0] < 1):
        raise KernelError(f"TfIdfVectorizer expects shape [C] or [B, C] with B > 0, got {list(x.shape)}")
    tokens = pool.token_ids(x).reshape(x.shape[0] if x.ndim == 2 else 1, -1)
    batch, length = tokens.shape
    counts = np.zeros((batch, pool.width), dtype=np.int64)
    for n, (grams, columns) in pool.grams.items():
        # unigrams are counted once; longer grams once per skip distance
        for stride in range(1, (pool.skip + 2) if n > 1 else 2):
            starts = np.arange(max(length - (n - 1) * stride, 0))
            if not len(starts):
                continue
            windows = tokens[:, starts[:, None] + stride * np.arange(n)]  # (batch, W, n)
            flat = windows.reshape(-1, n)
            every = np.concatenate([grams, flat])
            _, inverse = np.unique(every, axis=0, return_inverse=True)
            inverse = inverse.reshape(-1)
            column_of = np.full(inverse.max() + 1, -1, np.int64)
            column_of[inverse[: len(grams)]] = columns
            found = column_of[inverse[len(grams):]].reshape(batch, -1)
            rows, cols = np.nonzero(found >= 0)
            np.add.at(counts, (rows, found[rows, cols]), 1)
    if pool.mode == "TF":
        out = counts.astype(np.float32)
    elif pool.mode == "IDF":
        out = (counts > 0).astype(np.float32)
        if pool.weights is not None:
            out *= pool.weights
    else:
        out = counts.astype(np.float32)
        if pool.weights is not None:
            out *= pool.weights
    return out if x.ndim == 2 else out.reshape(pool.width)
