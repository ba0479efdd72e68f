"""String kernels (StringConcat, StringSplit, StringNormalizer, RegexFullMatch) against
onnxruntime, by both nncc routes (string values run on the CPU fallback; the compiled
route goes through the artifact's bytes, so string constants cross the plan format).

Where the operator's text and onnxruntime differ, the test says so and follows the text:
StringSplit without a delimiter splits on every whitespace character (onnxruntime only on
spaces), and StringNormalizer changes case by Unicode rules (onnxruntime does too under a
UTF-8 locale, which these tests select; it fails to start without one installed).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

from nncc.errors import NnccError
from tests.one_node_graphs import assert_same, one_node, run_interpreter, run_nncc
from tests.oracle import ort_run


def strings(*values, shape=None) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape if shape is not None else (len(values),))


def check(op, inputs, n_out, attrs, opset=20):
    model, feeds, names = one_node(op, inputs, n_out, attrs, opset)
    expected = ort_run(model, feeds)
    for got in run_nncc(model, feeds, names):
        assert_same(got, expected)


# --------------------------------------------------------------------------- StringConcat


@pytest.mark.parametrize("x, y", [
    (strings("a", "bb", "\u00e9", shape=(3, 1)), strings("x", "yy", "")),
    (strings("cat", shape=()), strings("s", "z", "\U0001f600")),
    (strings(shape=(0, 2)), strings("x", "y")),
])
def test_string_concat_broadcasts(x, y):
    check("StringConcat", [x, y], 1, {})


def test_string_concat_refuses_numbers():
    model, feeds, _ = one_node("StringConcat", [strings("a"), np.ones(1, np.float32)], 1, {}, 20)
    with pytest.raises(NnccError, match="string tensor"):
        run_interpreter(model, feeds)


# --------------------------------------------------------------------------- StringSplit


@pytest.mark.parametrize("attrs", [{"delimiter": ","}, {"delimiter": ",", "maxsplit": 1},
                                   {"delimiter": "<>"}, {"delimiter": ",", "maxsplit": 0}])
def test_string_split_with_delimiter(attrs):
    x = strings("a,b,,c", "x", ",x,", "1<>2<>", "\u4e2d,\u6587", shape=(5,))
    check("StringSplit", [x], 2, attrs)


def test_string_split_on_spaces_2d():
    x = strings(" a  b ", "one", "x y z w", "  lead", shape=(2, 2))
    check("StringSplit", [x], 2, {})
    check("StringSplit", [x], 2, {"maxsplit": 2, "delimiter": ""})


def test_string_split_on_any_whitespace():
    """The operator splits on whitespace characters: tabs and newlines too (onnxruntime
    splits on spaces only, so the oracle here is the definition itself)."""
    model, feeds, names = one_node("StringSplit", [strings("\ta\nb  c", "")], 2, {}, 20)
    for substrings, lengths in run_nncc(model, feeds, names):
        assert substrings.tolist() == [["a", "b", "c"], ["", "", ""]]
        assert lengths.tolist() == [3, 0]


def test_string_split_of_an_empty_string_with_a_delimiter():
    """"" split on "," is one empty substring, as str.split and ONNX's reference give
    (onnxruntime counts zero substrings): the operator text does not single it out."""
    model, feeds, names = one_node("StringSplit", [strings("", "a")], 2, {"delimiter": ","}, 20)
    for substrings, lengths in run_nncc(model, feeds, names):
        assert substrings.tolist() == [[""], ["a"]] and lengths.tolist() == [1, 1]


# --------------------------------------------------------------------------- StringNormalizer


@pytest.mark.parametrize("attrs", [
    {"case_change_action": "LOWER", "stopwords": ["monday"]},
    {"case_change_action": "UPPER", "stopwords": ["Monday", "x"], "is_case_sensitive": 1},
    {"case_change_action": "NONE", "stopwords": ["MONDAY"]},
    {"case_change_action": "UPPER"},
])
@pytest.mark.parametrize("shape", [(5,), (1, 5)])
def test_string_normalizer(attrs, shape):
    x = strings("Monday", "tuesday", "", "MONDAY", "\u00dcn\u00efcode", shape=shape)
    check("StringNormalizer", [x], 1, {**attrs, "locale": "C.UTF-8"}, opset=10)


@pytest.mark.parametrize("shape, expected", [((2,), (1,)), ((1, 2), (1, 1))])
def test_string_normalizer_all_removed(shape, expected):
    x = strings("a", "A", shape=shape)
    check("StringNormalizer", [x], 1, {"stopwords": ["a"], "locale": "C.UTF-8"}, opset=10)
    model, feeds, names = one_node("StringNormalizer", [x], 1, {"stopwords": ["a"]}, 10)
    (y,) = run_nncc(model, feeds, names)[1]
    assert y.shape == expected and y.reshape(-1).tolist() == [""]


def test_string_normalizer_rejects_other_shapes():
    model, feeds, _ = one_node("StringNormalizer", [strings("a", "b", shape=(2, 1))], 1, {}, 10)
    with pytest.raises(NnccError, match=r"\[C\] or \[1, C\]"):
        run_interpreter(model, feeds)


# --------------------------------------------------------------------------- RegexFullMatch


@pytest.mark.parametrize("pattern", [
    r"\w+\d*",          # ASCII classes, as RE2
    r"(?i)ab[c-e]",
    r"ab\z",            # RE2's end of text
    r"[^@\s]+@(gmail|yahoo)\.com",
    r"\bx\b.*",
    r"(\d{2,3})-?(\d{2})?",
])
def test_regex_full_match(pattern):
    x = strings("abc123", "ABC", "abe", "\u00e91", "a_b", "x y", "ab\n", "me@gmail.com",
                "x", "12-12", shape=(2, 5))
    check("RegexFullMatch", [x], 1, {"pattern": pattern})


def test_regex_backreference_accepted():
    """Python's re accepts backreferences (RE2, and so onnxruntime, rejects the pattern):
    a documented difference; the result follows Python's meaning."""
    model, feeds, names = one_node("RegexFullMatch", [strings("aa", "ab")], 1, {"pattern": r"(a)\1"}, 20)
    for (y,) in run_nncc(model, feeds, names):
        assert y.tolist() == [True, False]


def test_regex_bad_pattern_is_a_clear_error():
    model, feeds, _ = one_node("RegexFullMatch", [strings("a")], 1, {"pattern": "(a"}, 20)
    with pytest.raises(NnccError, match="invalid pattern"):
        run_interpreter(model, feeds)


# --------------------------------------------------------------------------- in a graph


def test_string_pipeline_with_string_initializer():
    """Split -> Concat with a string initializer -> RegexFullMatch: string constants and
    intermediates through a compiled artifact."""
    suffix = numpy_helper.from_array(strings("!"), "suffix")
    nodes = [
        helper.make_node("StringSplit", ["x"], ["parts", "n"], delimiter=","),
        helper.make_node("StringConcat", ["parts", "suffix"], ["loud"]),
        helper.make_node("RegexFullMatch", ["loud"], ["ok"], pattern=r"[a-z]+!"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.STRING, [3])],
        [helper.make_tensor_value_info(n, t, None) for n, t in
         (("loud", TensorProto.STRING), ("ok", TensorProto.BOOL), ("n", TensorProto.INT64))],
        [suffix])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    feeds = {"x": strings("ab,c", "D,e,f", "g")}
    expected = ort_run(model, feeds)
    for got in run_nncc(model, feeds, ["loud", "ok", "n"]):
        assert_same(got, expected)


def test_cli_runs_a_string_model_from_and_to_npy_files(cli, tmp_path):
    """String inputs come from plain unicode .npy files (no pickles) and string outputs are
    written as unicode arrays, by `nncc run` on the model and on its compiled artifact."""
    graph = helper.make_graph(
        [helper.make_node("StringConcat", ["x", "suffix"], ["y"]),
         helper.make_node("StringSplit", ["y"], ["parts", "n"], delimiter="-")], "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [3])],
        [helper.make_tensor_value_info("parts", TensorProto.STRING, None),
         helper.make_tensor_value_info("n", TensorProto.INT64, None)],
        [numpy_helper.from_array(strings("-\u00e9"), "suffix")])
    model_path = tmp_path / "strings.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10), model_path)
    x = np.array(["a-b", "", "c\u4e2d"])
    np.save(tmp_path / "x.npy", x)
    expected = ort_run(onnx.load(model_path), {"x": x.astype(object)})
    artifact = tmp_path / "strings.nncc"
    assert cli("compile", model_path, "-o", artifact)[0] == 0
    for source in (model_path, artifact):
        out = tmp_path / f"{source.suffix[1:]}.npz"
        code, _, err = cli("run", source, "--input", f"x={tmp_path / 'x.npy'}", "--output", out)
        assert code == 0, err
        with np.load(out, allow_pickle=False) as got:
            assert got["parts"].dtype.kind == "U"
            assert got["parts"].tolist() == expected[0].tolist()
            np.testing.assert_array_equal(got["n"], expected[1])
