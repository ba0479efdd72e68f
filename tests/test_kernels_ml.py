"""ai.onnx.ml kernels (TreeEnsemble, LabelEncoder, ArrayFeatureExtractor, Binarizer) and
TfIdfVectorizer against onnxruntime, by both nncc routes.

Tree ensembles are random forests of every node mode (set membership and missing-value
routing included), with each aggregate function and post transform. onnxruntime has no
Binarizer kernel; its oracle is the definition (x > threshold), written out in the test.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import onnx
from onnx import numpy_helper
import pytest

from nncc.errors import NnccError
from tests.one_node_graphs import assert_same, one_node, run_interpreter, run_nncc
from tests.oracle import ort_run

ML = "ai.onnx.ml"


def check(op, inputs, attrs, ml_opset, domain=ML, opset=20, rtol=1e-5, atol=1e-6):
    model, feeds, names = one_node(op, inputs, 1, attrs, {"": opset, ML: ml_opset}, domain=domain)
    expected = ort_run(model, feeds)
    for got in run_nncc(model, feeds, names):
        assert_same(got, expected, rtol=rtol, atol=atol)


def strings(*values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# --------------------------------------------------------------------------- TreeEnsemble


def random_forest(rng, trees: int, features: int, targets: int, dtype) -> dict:
    """TreeEnsemble attributes of random trees up to depth 5 over every node mode."""
    nodes = {k: [] for k in ("featureids", "modes", "splits", "truenodeids", "falsenodeids",
                             "trueleafs", "falseleafs", "missing")}
    leaves_w, leaves_t, members, roots = [], [], [], []

    def leaf() -> int:
        leaves_w.append(float(rng.normal()))
        leaves_t.append(int(rng.integers(targets)))
        return len(leaves_w) - 1

    def grow(depth: int) -> int:
        index = len(nodes["modes"])
        mode = int(rng.integers(7))
        for key in nodes:
            nodes[key].append(0)
        nodes["featureids"][index] = int(rng.integers(features))
        nodes["modes"][index] = mode
        nodes["splits"][index] = float(np.round(rng.normal() * 2) / 2) if mode != 6 else 0.0
        nodes["missing"][index] = int(rng.integers(2))
        if mode == 6:  # set membership: a few values, ended by NaN (onnxruntime: integers only)
            members.extend(float(v) for v in rng.choice(np.arange(-2, 3), size=3, replace=False))
            members.append(float("nan"))
        for side in ("true", "false"):
            if depth >= 5 or rng.random() < 0.3:
                nodes[f"{side}leafs"][index] = 1
                nodes[f"{side}nodeids"][index] = leaf()
            else:
                nodes[f"{side}nodeids"][index] = grow(depth + 1)
        return index

    for _ in range(trees):
        roots.append(grow(0))
    attrs = {f"nodes_{k}": v for k, v in nodes.items() if k != "missing"}
    attrs["nodes_missing_value_tracks_true"] = nodes["missing"]
    attrs["nodes_modes"] = numpy_helper.from_array(np.array(nodes["modes"], np.uint8), "modes")
    attrs["nodes_splits"] = numpy_helper.from_array(np.array(nodes["splits"], dtype), "splits")
    attrs["leaf_weights"] = numpy_helper.from_array(np.array(leaves_w, dtype), "weights")
    attrs.update(leaf_targetids=leaves_t, tree_roots=roots, n_targets=targets)
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.array(members, dtype), "members")
    return attrs


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tree_ensemble_random_forest(aggregate, dtype):
    rng = np.random.default_rng(aggregate)
    attrs = random_forest(rng, trees=12, features=5, targets=3, dtype=dtype)
    # integers: they hit EQ splits and set members (onnxruntime compares members as integers)
    x = np.round(rng.normal(size=(200, 5)) * 1.5).astype(dtype)
    x[rng.random(x.shape) < 0.1] = np.nan
    check("TreeEnsemble", [x], {**attrs, "aggregate_function": aggregate}, 5)


@pytest.mark.parametrize("post", [1, 2, 3, 4])
def test_tree_ensemble_post_transforms(post):
    """post_transform 1 is SOFTMAX and 2 LOGISTIC in the operator's table; onnxruntime reads
    them the other way round, so its oracle run swaps the two codes. PROBIT needs scores in
    (0, 1) (leaf weights there, averaged); onnxruntime approximates it to about 1e-3, so its
    oracle is onnxruntime's raw scores through the exact inverse normal CDF."""
    rng = np.random.default_rng(10 + post)
    attrs = random_forest(rng, trees=6, features=4, targets=4, dtype=np.float32)
    if post == 4:
        weights = rng.uniform(0.05, 0.95, len(attrs["leaf_targetids"])).astype(np.float32)
        attrs.update(leaf_weights=numpy_helper.from_array(weights, "weights"), aggregate_function=0)
    x = np.round(rng.normal(size=(64, 4)) * 1.5).astype(np.float32)
    opsets = {"": 20, ML: 5}
    model, feeds, names = one_node("TreeEnsemble", [x], 1, {**attrs, "post_transform": post}, opsets,
                                   domain=ML)
    ort_code = {1: 2, 2: 1, 4: 0}.get(post, post)
    oracle, _, _ = one_node("TreeEnsemble", [x], 1, {**attrs, "post_transform": ort_code}, opsets, domain=ML)
    expected = ort_run(oracle, feeds)
    if post == 4:
        def probit(p):
            return NormalDist().inv_cdf(p) if 0 < p < 1 else -np.inf if p == 0 else np.nan
        probit = np.vectorize(probit)
        expected = [probit(expected[0].astype(np.float64)).astype(np.float32)]
    for got in run_nncc(model, feeds, names):
        assert_same(got, expected, rtol=1e-5, atol=1e-6)


def test_tree_ensemble_single_leaf_tree():
    attrs = dict(nodes_featureids=[0], nodes_modes=numpy_helper.from_array(np.zeros(1, np.uint8), "m"),
                 nodes_splits=numpy_helper.from_array(np.zeros(1, np.float32), "s"),
                 nodes_truenodeids=[0], nodes_falsenodeids=[0], nodes_trueleafs=[1],
                 nodes_falseleafs=[1], leaf_targetids=[1],
                 leaf_weights=numpy_helper.from_array(np.array([2.5], np.float32), "w"),
                 tree_roots=[0], n_targets=2)
    check("TreeEnsemble", [np.ones((3, 1), np.float32)], attrs, 5)


def test_tree_ensemble_branch_out_of_range_is_a_clear_error():
    rng = np.random.default_rng(0)
    attrs = random_forest(rng, trees=1, features=2, targets=1, dtype=np.float32)
    attrs["nodes_truenodeids"] = [99] * len(attrs["nodes_truenodeids"])
    model, feeds, _ = one_node("TreeEnsemble", [np.zeros((1, 2), np.float32)], 1, attrs,
                               {"": 20, ML: 5}, domain=ML)
    with pytest.raises(NnccError, match="outside"):
        run_interpreter(model, feeds)


# --------------------------------------------------------------------------- LabelEncoder


def test_label_encoder_float_keys_with_nan_to_strings():
    x = np.array([[1.5, np.nan], [3.0, -0.0]], np.float32)
    check("LabelEncoder", [x], {"keys_floats": [1.5, float("nan"), 0.0],
                                "values_strings": ["a", "nan", "zero"], "default_string": "?"}, 4)


def test_label_encoder_int_keys_to_floats_default():
    x = np.array([[3, 7, 8], [1, 9, -4]], np.int64)
    check("LabelEncoder", [x], {"keys_int64s": [7, 1, 3, -4], "values_floats": [0.5, 1.5, 2.5, 9.0]}, 2)


def test_label_encoder_tensor_attributes():
    keys = numpy_helper.from_array(np.array([7, 3, 11], np.int64), "keys")
    values = numpy_helper.from_array(np.array([1.5, 2.5, -1.0], np.float64), "values")
    default = numpy_helper.from_array(np.array([42.0], np.float64), "default")
    check("LabelEncoder", [np.array([3, 7, 5, 11], np.int64)],
          {"keys_tensor": keys, "values_tensor": values, "default_tensor": default}, 4)


def test_label_encoder_strings_to_strings():
    check("LabelEncoder", [strings("b", "zz", "\u00e9", "")],
          {"keys_strings": ["\u00e9", "b", ""], "values_strings": ["E", "B", "empty"]}, 2)


@pytest.mark.parametrize("x", [strings("a", "c", "q"), np.array([2, 0, 5], np.int64)])
def test_label_encoder_opset1_classes(x):
    check("LabelEncoder", [x], {"classes_strings": ["a", "b", "c"], "default_string": "?"}, 1)


def test_label_encoder_key_dtype_mismatch_is_a_clear_error():
    model, feeds, _ = one_node("LabelEncoder", [np.array([1.0], np.float32)], 1,
                               {"keys_strings": ["a"], "values_int64s": [1]}, {"": 20, ML: 2}, domain=ML)
    with pytest.raises(NnccError, match="does not match keys"):
        run_interpreter(model, feeds)


# --------------------------------------------------------------------------- ArrayFeatureExtractor, Binarizer


@pytest.mark.parametrize("x, indices", [
    (np.arange(5, dtype=np.float32), np.array([4, 0, 4], np.int64)),
    (np.arange(24, dtype=np.int64).reshape(2, 3, 4), np.array([[3, 1]], np.int64)),
    (strings("a", "b", "c").reshape(1, 3), np.array([2], np.int64)),
    (np.arange(12, dtype=np.int32).reshape(3, 4), np.array([0, 1, 2, 3], np.int64)),
])
def test_array_feature_extractor(x, indices):
    check("ArrayFeatureExtractor", [x, indices], {}, 1)


def test_array_feature_extractor_index_out_of_range():
    inputs = [np.ones((2, 3), np.float32), np.array([3], np.int64)]
    model, feeds, _ = one_node("ArrayFeatureExtractor", inputs, 1, {}, {"": 20, ML: 1}, domain=ML)
    with pytest.raises(NnccError, match="out of range"):
        run_interpreter(model, feeds)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_binarizer(dtype):
    x = np.array([[-1, 0.5, 2, 0.49], [3, 0, 0.51, 7]]).astype(dtype)
    model, feeds, names = one_node("Binarizer", [x], 1, {"threshold": 0.5}, {"": 20, ML: 1}, domain=ML)
    expected = np.where(x > dtype(0.5) if dtype != np.int64 else x > 0, 1, 0).astype(dtype)
    for (y,) in run_nncc(model, feeds, names):
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(y, expected)


# --------------------------------------------------------------------------- TfIdfVectorizer


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("skip", [0, 2])
def test_tfidf_strings_permuted_indexes_and_weights(mode, skip):
    x = strings("a", "b", "a", "c", "b", "a", "d", "b").reshape(2, 4)
    attrs = {"mode": mode, "min_gram_length": 1, "max_gram_length": 3, "max_skip_count": skip,
             "ngram_counts": [0, 3, 7], "ngram_indexes": [2, 0, 5, 1, 4, 3, 6],
             "pool_strings": ["a", "b", "c", "a", "b", "b", "a", "a", "b", "a"],
             "weights": [0.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]}
    check("TfIdfVectorizer", [x], attrs, 1, domain="", opset=20)


@pytest.mark.parametrize("x", [np.array([1, 2, 1, 3, 2, 2, 1, 2], np.int32),
                               np.array([[1, 2, 1, 3], [2, 2, 2, 2]], np.int64)])
def test_tfidf_int_bigrams_only(x):
    attrs = {"mode": "TF", "min_gram_length": 2, "max_gram_length": 2, "max_skip_count": 3,
             "ngram_counts": [0, 2], "ngram_indexes": [4, 0, 1, 2, 3],
             "pool_int64s": [1, 2, 1, 2, 2, 2, 3, 2]}
    check("TfIdfVectorizer", [x], attrs, 1, domain="", opset=20)
