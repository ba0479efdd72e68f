"""Control flow (If, Loop, Scan), sequences and optionals beyond ONNX's node suite: models
built with onnx.helper, run by onnxruntime (the oracle) and by nncc through compile_model,
a saved and reloaded artifact, and the `nncc run` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.errors import InputError, PlanFormatError
from tests.conftest import ROOT
from tests.oracle import ort_session
from tests.test_plan_format import hostile


F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name, elem, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, array):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array)))


def save(tmp_path, name, nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def oracle(path, feeds):
    session = ort_session(path)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def assert_same(got, want):
    assert set(got) == set(want)
    for name, expected in want.items():
        actual = got[name]
        if isinstance(expected, list):
            assert isinstance(actual, list) and len(actual) == len(expected), name
            assert_same({str(i): a for i, a in enumerate(actual)}, {str(i): e for i, e in enumerate(expected)})
            continue
        assert actual.dtype == expected.dtype, name
        assert actual.shape == expected.shape, name
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5, err_msg=name)


def check_routes(path, tmp_path, feed_sets):
    """compile_model and save + nncc.load against onnxruntime for every feed set, and the
    CLI (on the .onnx through the cache and on the artifact) for the first: its processes
    run the same plan as nncc.load."""
    compiled = nncc.compile_model(path)
    artifact = tmp_path / (path.stem + ".nncc")
    compiled.save(artifact)
    loaded = nncc.load(artifact)
    assert loaded.to_bytes() == compiled.to_bytes()  # the subgraphs round-trip exactly (and its signature)
    for index, feeds in enumerate(feed_sets):
        want = oracle(path, feeds)
        assert_same(compiled.run(feeds), want)
        assert_same(loaded.run(feeds), want)
        if index == 0 and all(isinstance(v, np.ndarray) for v in want.values()):
            for source in (path, artifact):
                assert_same(run_cli(source, feeds, tmp_path / f"run{index}"), want)


def run_cli(model, feeds, folder):
    folder.mkdir(exist_ok=True)
    args = [sys.executable, "-m", "nncc", "run", str(model), "--cache-dir", str(folder / "cache"),
            "--output", str(folder / "out.npz"), "--json"]
    for name, value in feeds.items():
        np.save(folder / f"{name}.npy", value)
        args += ["--input", f"{name}={folder / f'{name}.npy'}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=folder)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    with np.load(folder / "out.npz") as data:
        got = {name: data[name] for name in data.files}
    assert sorted(row["name"] for row in summary["outputs"]) == sorted(got)
    return got


# -- models ------------------------------------------------------------------------------------


def nested_loop_in_if(tmp_path):
    """If(flag) whose then-branch runs a Loop whose body reads `bias` and `x` from two
    scopes out; the branches give outputs of different shapes."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "bias"], ["s_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["s_out", "x"], ["scan_out"])],
        "body",
        [vi("i", I64, []), vi("cond_in", B, []), vi("s_in", F, [2, 3])],
        [vi("cond_out", B, []), vi("s_out", F, [2, 3]), vi("scan_out", F, [2, 3])])
    then = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["final", "stacked"], body=body)],
        "then", [], [vi("final", F, None), vi("stacked", F, None)])
    other = helper.make_graph(
        [helper.make_node("Neg", ["bias"], ["negated"]),
         const("axes", np.array([0], np.int64)),
         helper.make_node("Unsqueeze", ["x", "axes"], ["lifted"])],
        "else", [], [vi("negated", F, None), vi("lifted", F, None)])
    nodes = [
        const("one", np.float32(1.0)),
        helper.make_node("Add", ["x", "one"], ["bias"]),
        helper.make_node("If", ["flag"], ["y1", "y2"], then_branch=then, else_branch=other),
    ]
    return save(tmp_path, "nested", nodes, [vi("x", F, [2, 3]), vi("n", I64, []), vi("flag", B, [])],
                [vi("y1", F, None), vi("y2", F, None)])


@pytest.mark.slow
def test_nested_loop_in_if_with_outer_scope_values(tmp_path):
    path = nested_loop_in_if(tmp_path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    check_routes(path, tmp_path, [
        {"x": x, "n": np.array(3, np.int64), "flag": np.array(True)},
        {"x": x, "n": np.array(1, np.int64), "flag": np.array(True)},
        {"x": -x, "n": np.array(5, np.int64), "flag": np.array(False)},
    ])


def scan_model(tmp_path, name, **attrs):
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [vi("s_in", F, [3]), vi("x_t", F, [3])], [vi("s_out", F, [3]), vi("y_t", F, [3])])
    node = helper.make_node("Scan", ["init", "xs"], ["total", "ys"], body=body, num_scan_inputs=1,
                            **attrs)
    xs_shape = [3, 5] if attrs.get("scan_input_axes") == [1] else [5, 3]
    return save(tmp_path, name, [node], [vi("init", F, [3]), vi("xs", F, xs_shape)],
                [vi("total", F, None), vi("ys", F, None)])


def test_scan_cumulative_sum(tmp_path):
    path = scan_model(tmp_path, "cumsum")
    xs = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    check_routes(path, tmp_path, [{"init": np.zeros(3, np.float32), "xs": xs},
                                  {"init": np.ones(3, np.float32), "xs": xs[::-1].copy()}])
    # an independent check of what a cumulative sum is, too
    got = nncc.compile_model(path).run({"init": np.zeros(3, np.float32), "xs": xs})
    np.testing.assert_allclose(got["ys"], np.cumsum(xs, axis=0), rtol=1e-5)


@pytest.mark.slow  # another scan axis and direction of the cumulative sum
def test_scan_reversed_along_axis_1(tmp_path):
    path = scan_model(tmp_path, "cumsum_rev", scan_input_axes=[1], scan_input_directions=[1],
                      scan_output_axes=[1], scan_output_directions=[1])
    xs = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    check_routes(path, tmp_path, [{"init": np.zeros(3, np.float32), "xs": xs}])


@pytest.mark.slow
def test_loop_whose_body_has_a_conv(tmp_path):
    rng = np.random.default_rng(2)
    weight = numpy_helper.from_array((rng.standard_normal((2, 2, 3, 3)) / 4).astype(np.float32), "w")
    bias = numpy_helper.from_array(np.array([0.1, -0.2], np.float32), "b")  # the body's own
    body = helper.make_graph(
        [helper.make_node("Conv", ["c_in", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["conv"], ["c_out"]),
         helper.make_node("ReduceSum", ["c_out"], ["total"], keepdims=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", I64, []), vi("cond_in", B, []), vi("c_in", F, [1, 2, 6, 6])],
        [vi("cond_out", B, []), vi("c_out", F, [1, 2, 6, 6]), vi("total", F, [])],
        initializer=[bias])
    node = helper.make_node("Loop", ["n", "", "x"], ["final", "totals"], body=body)
    path = save(tmp_path, "conv_loop", [node], [vi("x", F, [1, 2, 6, 6]), vi("n", I64, [])],
                [vi("final", F, [1, 2, 6, 6]), vi("totals", F, None)], [weight])
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    check_routes(path, tmp_path, [{"x": x, "n": np.array(4, np.int64)},
                                  {"x": x, "n": np.array(0, np.int64)}])


@pytest.mark.slow
def test_loop_with_a_condition_builds_a_sequence_of_dynamic_length(tmp_path):
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["sum"], keepdims=0),
         helper.make_node("Less", ["sum", "limit"], ["cond_out"]),
         helper.make_node("SequenceInsert", ["seq_in", "acc_out"], ["seq_out"])],
        "body", [vi("i", I64, []), vi("cond_in", B, []), vi("acc_in", F, [4]),
                 helper.make_tensor_sequence_value_info("seq_in", F, None)],
        [vi("cond_out", B, []), vi("acc_out", F, [4]),
         helper.make_tensor_sequence_value_info("seq_out", F, None), vi("scan", F, [4])])
    body.node.append(helper.make_node("Identity", ["acc_out"], ["scan"]))
    nodes = [
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
        helper.make_node("Loop", ["", "go", "zeros", "empty"], ["acc", "seq", "scans"], body=body),
        helper.make_node("ConcatFromSequence", ["seq"], ["stacked"], axis=0, new_axis=1),
        helper.make_node("SequenceLength", ["seq"], ["count"]),
        helper.make_node("SequenceAt", ["seq", "minus_one"], ["last"]),
    ]
    path = save(tmp_path, "seq_loop", nodes,
                [vi("x", F, [4]), vi("limit", F, []), vi("go", B, []), vi("zeros", F, [4]),
                 vi("minus_one", I64, [])],
                [vi("acc", F, None), vi("scans", F, None), vi("stacked", F, None),
                 vi("count", I64, None), vi("last", F, None)])
    feeds = {"x": np.array([0.5, 1, 1.5, 2], np.float32), "limit": np.array(21, np.float32),
             "go": np.array(True), "zeros": np.zeros(4, np.float32),
             "minus_one": np.array(-1, np.int64)}
    check_routes(path, tmp_path, [feeds, dict(feeds, limit=np.array(3, np.float32))])


def test_split_map_concat_and_optionals(tmp_path):
    double = helper.make_graph(
        [helper.make_node("Mul", ["item", "factor"], ["doubled"])],
        "double", [vi("item", F, None), vi("factor", F, [])], [vi("doubled", F, None)])
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
        helper.make_node("SequenceMap", ["parts", "factor"], ["mapped"], body=double),
        helper.make_node("SequenceErase", ["mapped", "zero"], ["rest"]),
        helper.make_node("ConcatFromSequence", ["rest"], ["joined"], axis=1),
        helper.make_node("Optional", ["joined"], ["maybe"]),
        helper.make_node("OptionalHasElement", ["maybe"], ["present"]),
        helper.make_node("OptionalGetElement", ["maybe"], ["got"]),
    ]
    path = save(tmp_path, "seq_map", nodes,
                [vi("x", F, [2, 6]), vi("sizes", I64, [3]), vi("factor", F, []), vi("zero", I64, [])],
                [vi("got", F, None), vi("present", B, None),
                 helper.make_tensor_sequence_value_info("mapped", F, None)], opset=18)
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(2, 6),
             "sizes": np.array([1, 2, 3], np.int64), "factor": np.array(2, np.float32),
             "zero": np.array(0, np.int64)}
    check_routes(path, tmp_path, [feeds])


@pytest.mark.slow
def test_sequence_output_in_the_cli_summary_and_refused_as_a_file(tmp_path):
    path = save(tmp_path, "split", [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0)],
                [vi("x", F, [3, 2])], [helper.make_tensor_sequence_value_info("parts", F, None)])
    np.save(tmp_path / "x.npy", np.ones((3, 2), np.float32))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    base = [sys.executable, "-m", "nncc", "run", str(path), "--no-cache", "--input",
            f"x={tmp_path / 'x.npy'}"]
    done = subprocess.run(base + ["--json"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["outputs"]
    assert row["shape"] == [3] and row["dtype"] == "sequence of float32" and row["mean"] == 1.0
    done = subprocess.run(base + ["--output", str(tmp_path / "o.npz")], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("nncc: error: output 'parts' is a sequence")


def optional_model(tmp_path):
    """If(OptionalHasElement(opt)) adds one to the element, else gives a default."""
    then = helper.make_graph(
        [helper.make_node("OptionalGetElement", ["opt"], ["element"]),
         helper.make_node("Add", ["element", "one"], ["bumped"])],
        "then", [], [vi("bumped", F, None)])
    other = helper.make_graph([helper.make_node("Identity", ["fallback"], ["plain"])],
                              "else", [], [vi("plain", F, None)])
    nodes = [const("one", np.float32(1)),
             helper.make_node("OptionalHasElement", ["opt"], ["has"]),
             helper.make_node("If", ["has"], ["y"], then_branch=then, else_branch=other)]
    optional = helper.make_value_info(
        "opt", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2])))
    return save(tmp_path, "optional", nodes, [optional, vi("fallback", F, [2])],
                [vi("y", F, None), vi("has", B, [])], opset=18)


def test_optional_input_given_left_out_or_empty(tmp_path):
    path = optional_model(tmp_path)
    value, fallback = np.array([1, 2], np.float32), np.array([7, 8], np.float32)
    want = oracle(path, {"opt": value, "fallback": fallback})
    np.testing.assert_array_equal(want["y"], value + 1)  # the oracle agrees with the spec
    compiled = nncc.compile_model(path)
    loaded = nncc.load(compiled.to_bytes())
    for model in (compiled, loaded):
        assert_same(model.run({"opt": value, "fallback": fallback}), want)
        for feeds in ({"opt": None, "fallback": fallback}, {"fallback": fallback}):
            got = model.run(feeds)
            assert not got["has"] and got["has"].dtype == np.bool_
            np.testing.assert_array_equal(got["y"], fallback)


# -- the plan's subgraph descriptions are checked on load -----------------------------------------


def _subgraph_instruction(program):
    for ins in program["instructions"]:
        for value in ins[3].values():
            if isinstance(value, dict) and "$graph" in value:
                return ins, value["$graph"]
    raise AssertionError("no subgraph attribute")


@pytest.fixture(scope="module")
def nested_raw(tmp_path_factory):
    return nncc.compile_model(nested_loop_in_if(tmp_path_factory.mktemp("nested"))).to_bytes()


def _refuses(raw, edit, message):
    with pytest.raises(PlanFormatError, match=message):
        nncc.load(hostile(raw, edit))


def test_subgraph_reading_an_undefined_name_is_refused(nested_raw):
    def edit(program, sections):
        _, graph = _subgraph_instruction(program)
        graph["nodes"][0][2][0] = "nowhere"
    _refuses(nested_raw, edit, "reads 'nowhere' before it is defined")


def test_subgraph_with_an_unregistered_op_is_refused(nested_raw):
    def edit(program, sections):
        _, graph = _subgraph_instruction(program)
        graph["nodes"][0][0] = "os.system"
    _refuses(nested_raw, edit, "no registered kernel")


def test_subgraph_output_never_defined_is_refused(nested_raw):
    def edit(program, sections):
        _, graph = _subgraph_instruction(program)
        graph["outputs"][0][0] = "ghost"
    _refuses(nested_raw, edit, "never defined")


def test_captures_longer_than_the_inputs_are_refused(nested_raw):
    def edit(program, sections):
        ins, _ = _subgraph_instruction(program)
        ins[3]["__captures__"] = ins[3]["__captures__"] + ["a"] * (len(ins[1]) + 1)
    _refuses(nested_raw, edit, "captured-value list")


def test_subgraph_initializer_must_name_a_constant(nested_raw):
    def edit(program, sections):
        _, graph = _subgraph_instruction(program)
        graph["initializers"].append(["w", {"$tensor": 10**6}])
    _refuses(nested_raw, edit, "does not name a constant")


def test_subgraph_description_with_extra_fields_is_refused(nested_raw):
    def edit(program, sections):
        _, graph = _subgraph_instruction(program)
        graph["code"] = "print(1)"
    _refuses(nested_raw, edit, "bad subgraph description")


def test_non_tensor_slot_kinds_are_checked(nested_raw):
    def edit(program, sections):
        program["slots"][0] = program["slots"][0][:3] + ["dict"]
    _refuses(nested_raw, edit, "bad kind")


def test_subgraphs_nested_too_deeply_are_refused(nested_raw):
    def edit(program, sections):
        ins, _ = _subgraph_instruction(program)
        deep = {"$graph": {"name": "", "inputs": [], "outputs": [], "initializers": [], "nodes": []}}
        for _ in range(40):
            deep = {"$graph": {"name": "", "inputs": [], "outputs": [], "initializers": [],
                               "nodes": [["Identity", "", [], [], {"g": deep}, ""]]}}
        ins[3]["then_branch"] = deep
    _refuses(nested_raw, edit, "nested deeper than 32")


# -- sequence ops beyond the node suite ------------------------------------------------------------

SEQ = helper.make_tensor_sequence_value_info


def _construct(*names):
    return helper.make_node("SequenceConstruct", list(names), ["seq"])


SEQUENCE_CASES = {
    "insert_at_minus_one": ([_construct("a", "b", "c"),
                             helper.make_node("SequenceInsert", ["seq", "d", "pos"], ["out"])],
                            [SEQ("out", F, None)]),
    "erase_default_last": ([_construct("a", "b", "c"), helper.make_node("SequenceErase", ["seq"], ["out"])],
                           [SEQ("out", F, None)]),
    "erase_at_minus_two": ([_construct("a", "b", "c"),
                            helper.make_node("SequenceErase", ["seq", "pos2"], ["out"])],
                           [SEQ("out", F, None)]),
    "at_minus_three": ([_construct("a", "b", "c"), helper.make_node("SequenceAt", ["seq", "pos3"], ["out"])],
                       [vi("out", F, None)]),
    "concat_new_axis_last": ([_construct("a", "b", "c"),
                              helper.make_node("ConcatFromSequence", ["seq"], ["out"], axis=-1, new_axis=1)],
                             [vi("out", F, None)]),
    "concat_axis_1_and_length": ([_construct("a", "b", "d"),
                                  helper.make_node("ConcatFromSequence", ["seq"], ["out"], axis=1),
                                  helper.make_node("SequenceLength", ["seq"], ["n"])],
                                 [vi("out", F, None), vi("n", I64, None)]),
    "split_scalar_with_remainder": ([helper.make_node("SplitToSequence", ["d", "two"], ["out"], axis=1)],
                                    [SEQ("out", F, None)]),
    "split_each_without_keepdims": ([helper.make_node("SplitToSequence", ["d"], ["out"], axis=-1,
                                                      keepdims=0)],
                                    [SEQ("out", F, None)]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SEQUENCE_CASES))
def test_sequence_ops_against_onnxruntime(case, tmp_path):
    nodes, outputs = SEQUENCE_CASES[case]
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((2, 3)).astype(np.float32),
             "b": rng.standard_normal((2, 3)).astype(np.float32),
             "c": rng.standard_normal((2, 3)).astype(np.float32),
             "d": rng.standard_normal((2, 5)).astype(np.float32),
             "pos": np.array(-1, np.int64), "pos2": np.array(-2, np.int32),
             "pos3": np.array(-3, np.int64), "two": np.array(2, np.int64)}
    inputs = [vi(n, F, list(v.shape)) if v.dtype == np.float32 else vi(n, I64 if v.dtype == np.int64
              else TensorProto.INT32, []) for n, v in feeds.items()]
    used = {name for node in nodes for name in node.input}
    feeds = {n: v for n, v in feeds.items() if n in used}
    inputs = [i for i in inputs if i.name in used]
    path = save(tmp_path, case, nodes, inputs, outputs)
    check_routes(path, tmp_path, [feeds])
    graph = nncc_interpreter(path)
    assert_same(graph.run(feeds), oracle(path, feeds))


def nncc_interpreter(path):
    from nncc.frontend.onnx import load_model
    from nncc.runtime.interpreter import Interpreter

    return Interpreter(load_model(path))


@pytest.mark.slow  # Scan's opset-8 form; the current form stays quick
def test_scan_opset_8_with_batch_and_sequence_lengths(tmp_path):
    """Opset 8's Scan runs each batch entry apart, up to its sequence length (the rest of
    its scan output is zeros), here in reverse."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [vi("s_in", F, [3]), vi("x_t", F, [3])], [vi("s_out", F, [3]), vi("y_t", F, [3])])
    node = helper.make_node("Scan", ["lens", "init", "xs"], ["total", "ys"], body=body,
                            num_scan_inputs=1, directions=[1])
    path = save(tmp_path, "scan8", [node],
                [vi("lens", I64, [2]), vi("init", F, [2, 3]), vi("xs", F, [2, 4, 3])],
                [vi("total", F, None), vi("ys", F, None)], opset=8)
    xs = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    check_routes(path, tmp_path, [
        {"lens": np.array([4, 2], np.int64), "init": np.zeros((2, 3), np.float32), "xs": xs},
        {"lens": np.array([1, 3], np.int64), "init": np.ones((2, 3), np.float32), "xs": -xs},
    ])


def test_sequence_inputs_are_checked(tmp_path):
    path = save(tmp_path, "seq_in", [helper.make_node("SequenceLength", ["seq"], ["n"])],
                [SEQ("seq", F, None)], [vi("n", I64, [])])
    model = nncc.compile_model(path)
    parts = [np.ones((2, 2), np.float32), np.zeros(3, np.float32)]
    assert model.run({"seq": parts})["n"] == oracle(path, {"seq": parts})["n"] == 2
    with pytest.raises(InputError, match="must be a sequence"):
        model.run({"seq": np.ones(2, np.float32)})
    with pytest.raises(InputError, match="holds an array of dtype int64, expected float32"):
        model.run({"seq": [np.ones(2, np.int64)]})


def test_subgraph_reading_a_value_nobody_produces_is_a_model_error(tmp_path):
    branch = helper.make_graph([helper.make_node("Neg", ["ghost"], ["y"])], "b", [], [vi("y", F, None)])
    path = save(tmp_path, "ghost", [helper.make_node("If", ["c"], ["out"], then_branch=branch,
                                                     else_branch=branch)],
                [vi("c", B, [])], [vi("out", F, None)])
    from nncc.errors import ModelFormatError

    with pytest.raises(ModelFormatError, match="ghost.*(produces|nobody)|nobody produces: ghost"):
        nncc.compile_model(path)
    with pytest.raises(ModelFormatError, match="ghost.*(produces|nobody)|nobody produces: ghost"):
        nncc_interpreter(path)


def test_a_branch_node_with_too_many_inputs_is_a_model_error(tmp_path):
    """A node inside an If's branch gets the arity check every top-level node gets: a
    Relu given two inputs is refused at compile, as onnxruntime refuses the model, and
    the command line says so in one line with exit 2 (it used to compile natively,
    the extra input silently ignored)."""
    bad = helper.make_graph([helper.make_node("Relu", ["x", "x"], ["t"])], "then", [], [vi("t", F, [4])])
    good = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, [4])])
    path = save(tmp_path, "arity", [helper.make_node("If", ["c"], ["y"], then_branch=bad, else_branch=good)],
                [vi("c", B, []), vi("x", F, [4])], [vi("y", F, [4])])
    from nncc.errors import ModelFormatError

    with pytest.raises(Exception):
        ort_session(path)
    with pytest.raises(ModelFormatError, match="Relu node has 2 inputs; Relu takes at most 1"):
        nncc.compile_model(path)
    done = subprocess.run([sys.executable, "-m", "nncc", "inspect", path], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "NNCC_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["nncc: error: Relu node has 2 inputs; Relu takes at most 1"]
