"""A channel Concat whose inputs are contiguous ranges of its output costs no copy: their
producers write straight into their slice (nncc/native/concat_slices.py). Each model is
checked against onnxruntime, and the plan itself for what was placed and what is still
copied: a dense block's Concats nest into one buffer, an Inception block's branches write
their slices, and every refusal (a partition input, a value joined twice or into two
Concats, a Concat that is the partition's output, a batch of two, partial channel blocks,
an unaligned slice, a buffer written twice, a guarded step) keeps its copy."""

from __future__ import annotations

import numpy as np
import pytest

from nncc.backends.base import Partition
from nncc.frontend.onnx import parse_model
from nncc.ir.graph import TensorInfo
from nncc.native import concat_slices
from nncc.native.codegen import _Step, generate
from nncc.native.kernel import READ, WRITE
from nncc.native.toolchain import find_toolchain
from nncc.passes.pipeline import run_passes
from nncc.passes.shape_inference import infer_shapes
from tests.models import GraphBuilder, assert_one_native_partition_matches

needs_compiler = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


def _unit(m: GraphBuilder, vl: int = 16):
    graph = run_passes(parse_model(m.model().SerializeToString()), 2)
    part = Partition(0, "native", list(graph.nodes), list(graph.inputs), list(graph.outputs))
    return generate(part, graph, infer_shapes(graph), "entry", vl)


def _copies(unit) -> list[str]:
    return [label for label in unit.labels if label.startswith("Concat")]


def _conv(m: GraphBuilder, x: str, cin: int, cout: int, k: int = 3) -> str:
    return m.node("Conv", [x, m.weight([cout, cin, k, k]), m.weight([cout])], pads=[k // 2] * 4)


def _dense_block(n: int = 1, growth: int = 16, layers: int = 3) -> GraphBuilder:
    """DenseNet's block: each layer a Relu and a convolution of everything so far, then
    the Concat of everything so far with the new output (a chain of Concats)."""
    m = GraphBuilder(18, 3, "dense", weight_gain=2 ** 0.5)
    x = m.input([n, 3, 7, 6])
    joined, channels = _conv(m, x, 3, 16), 16
    m.names = {"first": joined, "layers": [], "concats": []}
    for _ in range(layers):
        new = _conv(m, m.node("Relu", [joined]), channels, growth)
        joined = m.node("Concat", [joined, new], axis=1)
        channels += growth
        m.names["layers"].append(new)
        m.names["concats"].append(joined)
    m.output(_conv(m, joined, channels, 8, 1))
    return m


@needs_compiler
@pytest.mark.parametrize("vl", [8, 16])
def test_a_dense_block_joins_in_one_buffer(vl):
    m = _dense_block()
    unit = _unit(m, vl)
    assert _copies(unit) == []
    *inner, outer = [f"{c}#nchw{vl}c" for c in m.names["concats"]]
    pieces = [f"{v}#nchw{vl}c" for v in [m.names["first"], *m.names["layers"]]]
    assert set(unit.placed) == set(pieces) | set(inner)
    channels = 16
    for layer, piece in zip(m.names["layers"], pieces[1:]):  # each layer's output at its channels
        assert concat_slices.top(piece, unit.placed) == (outer, channels * 7 * 6)
        channels += 16
    assert concat_slices.top(pieces[0], unit.placed) == (outer, 0)


@needs_compiler
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_a_dense_block_matches_onnxruntime(tmp_path, precision):
    import nncc
    from nncc.native.precision import why_not_bf16
    from tests.oracle import ort_run

    if precision == "bf16" and why_not_bf16("native"):
        pytest.skip(why_not_bf16("native"))
    m = _dense_block(growth=32)
    m.save(tmp_path / "m.onnx")
    compiled = nncc.compile_model(tmp_path / "m.onnx", precision=precision)
    assert compiled.native_partitions == 1 and compiled.plan.fallbacks == []
    name = m.outputs[0].name
    (want,) = ort_run(tmp_path / "m.onnx", m.feeds, [name])
    got = compiled.run(m.feeds)[name]
    # bfloat16 products: 8 bits of mantissa through four layers
    tol = 1e-4 if precision == "f32" else 0.05
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))


@needs_compiler
def test_an_inception_block_writes_its_branches_in_place(tmp_path):
    m = GraphBuilder(18, 4, "inception", weight_gain=2 ** 0.5)
    x = m.input([1, 8, 9, 9])
    stem = m.node("Relu", [_conv(m, x, 8, 16)])
    branches = [_conv(m, stem, 16, 16, 1), _conv(m, m.node("Relu", [_conv(m, stem, 16, 16, 1)]), 16, 32),
                _conv(m, m.node("MaxPool", [stem], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), 16, 16, 1)]
    joined = m.node("Concat", branches, axis=1)
    m.output(_conv(m, m.node("Relu", [joined]), 64, 8, 1))
    unit = _unit(m)
    assert _copies(unit) == []
    assert {b + "#nchw16c" for b in branches} == set(unit.placed)
    assert_one_native_partition_matches(tmp_path, m, rtol=1e-4)


@needs_compiler
def test_a_batch_of_two_copies(tmp_path):
    """[2, C/16, H, W, 16]: an input's blocks for each image are apart."""
    m = _dense_block(n=2, layers=2)
    unit = _unit(m)
    assert len(_copies(unit)) == 2 and unit.placed == {}
    assert_one_native_partition_matches(tmp_path, m, rtol=1e-4)


@needs_compiler
def test_partial_channel_blocks_copy(tmp_path):
    """Layers of 8 channels in 16-channel blocks: the first Concat [16 | 8] is placed (its
    last input ends mid-block, as the output does); in the second, [24 | 8], the new layer
    starts mid-block, and the first Concat's 24 channels end there: copied."""
    m = _dense_block(growth=8, layers=2)
    unit = _unit(m)
    first, concat = m.names["first"] + "#nchw16c", m.names["concats"][0] + "#nchw16c"
    assert unit.placed == {first: (concat, 0), m.names["layers"][0] + "#nchw16c": (concat, 16 * 7 * 6)}
    assert len(_copies(unit)) == 1
    assert_one_native_partition_matches(tmp_path, m, rtol=1e-4)


@needs_compiler
def test_a_value_joined_twice_or_into_two_concats_is_placed_once(tmp_path):
    m = GraphBuilder(18, 5, "twice", weight_gain=2 ** 0.5)
    x = m.input([1, 4, 5, 5])
    a, b = _conv(m, x, 4, 16), _conv(m, x, 4, 16)
    first = m.node("Concat", [a, b, a], axis=1)  # a twice: one slice is a, the other a copy
    second = m.node("Concat", [b, a], axis=1)  # both already placed: copied
    m.output(_conv(m, first, 48, 4, 1))
    m.output(_conv(m, second, 32, 4, 1))
    unit = _unit(m)
    assert unit.placed == {f"{a}#nchw16c": (f"{first}#nchw16c", 0), f"{b}#nchw16c": (f"{first}#nchw16c", 16 * 25)}
    assert len(_copies(unit)) == 2  # a's second slice of the first, and the second Concat
    assert_one_native_partition_matches(tmp_path, m, rtol=1e-4)


def _plain_join(first: int, second: int, then_relu: bool = True, join_input: bool = False,
                side: int = 4) -> GraphBuilder:
    """An NCHW Concat (of Sigmoids, which stay in NCHW) on the channel axis."""
    m = GraphBuilder(18, 6, "plain")
    x, y = m.input([1, first, side, side]), m.input([1, second, side, side])
    parts = [m.node("Sigmoid", [x]), y if join_input else m.node("Sigmoid", [y])]
    joined = m.node("Concat", parts, axis=1)
    m.output(m.node("Relu", [joined]) if then_relu else joined)
    m.names = {"parts": parts, "joined": joined}
    return m


@needs_compiler
def test_an_nchw_concat_is_placed(tmp_path):
    m = _plain_join(2, 3)
    unit = _unit(m)
    parts, joined = m.names["parts"], m.names["joined"]
    assert unit.placed == {parts[0]: (joined, 0), parts[1]: (joined, 32)} and _copies(unit) == []
    assert_one_native_partition_matches(tmp_path, m)


@needs_compiler
@pytest.mark.parametrize("case", ["partition input", "partition output", "unaligned"])
def test_nchw_refusals_copy(tmp_path, case):
    m = {"partition input": lambda: _plain_join(2, 3, join_input=True),
         "partition output": lambda: _plain_join(2, 3, then_relu=False),
         "unaligned": lambda: _plain_join(2, 3, side=3)}[case]()  # the second slice at 72 bytes
    unit = _unit(m)
    parts, joined = m.names["parts"], m.names["joined"]
    expect = {"partition input": {parts[0]: (joined, 0)}, "partition output": {},
              "unaligned": {parts[0]: (joined, 0)}}[case]
    assert unit.placed == expect and len(_copies(unit)) == 1
    assert_one_native_partition_matches(tmp_path, m)


@needs_compiler
def test_an_nchw_concat_off_the_outer_axis_copies(tmp_path):
    m = GraphBuilder(18, 7, "rows")
    parts = [m.node("Sigmoid", [m.input([2, 16, 4])]), m.node("Sigmoid", [m.input([2, 16, 4])])]
    m.output(m.node("Relu", [m.node("Concat", parts, axis=1)]))
    unit = _unit(m)
    assert unit.placed == {} and len(_copies(unit)) == 1
    assert_one_native_partition_matches(tmp_path, m)


# -- the placement rules on steps made by hand ------------------------------------------------


def _plan(producer_writes=1, guard=None, target_writer=False, source_type=np.float32, offset=16):
    """Steps: ``a`` written by ``producer_writes`` steps, ``b`` written once, then a copy of
    both into ``y`` (``a`` at 0, ``b`` at ``offset``); ``target_writer``: a later step
    writes ``y`` too."""
    infos = {"a": TensorInfo(np.dtype(source_type), (16,)), "b": TensorInfo(np.dtype(np.float32), (16,)),
             "y": TensorInfo(np.dtype(np.float32), (16 + offset,))}
    steps = [_Step("", [], ["a"], [("a", WRITE)], guard=guard) for _ in range(producer_writes)]
    steps.append(_Step("", [], ["b"], [("b", WRITE)]))
    steps.append(_Step("", ["a", "b"], ["y"], [("a", READ), ("b", READ), ("y", WRITE)],
                       slices=(concat_slices.Slice("a", "y", 0, 16), concat_slices.Slice("b", "y", offset, 16))))
    if target_writer:
        steps.append(_Step("", ["y"], ["y"], [("y", WRITE)]))
    return steps, infos


def _place(steps, infos, args=()):
    return concat_slices.place(steps, lambda name: name, set(args), infos)


def test_the_rules_place_both_inputs():
    assert _place(*_plan()) == {"a": ("y", 0), "b": ("y", 16)}


@pytest.mark.parametrize("case, placed", [
    ("written twice", {"b": ("y", 16)}),  # a step writing ``a`` again (in place) would change y
    ("guarded producer", {"b": ("y", 16)}),  # an If's branch
    ("target written after", {}),  # a step writing y over its inputs' slices
    ("not float32", {"b": ("y", 16)}),
    ("unaligned", {"a": ("y", 0)}),  # b at 8 floats: 32 bytes
    ("source an argument", {"b": ("y", 16)}),
    ("target an argument", {}),
])
def test_each_rule_refuses(case, placed):
    steps, infos = _plan(producer_writes=2 if case == "written twice" else 1,
                         guard=("c", True) if case == "guarded producer" else None,
                         target_writer=case == "target written after",
                         source_type=np.int32 if case == "not float32" else np.float32,
                         offset=8 if case == "unaligned" else 16)
    args = {"source an argument": ["a"], "target an argument": ["y"]}.get(case, [])
    assert _place(steps, infos, args) == placed


def test_a_chain_nests_and_its_offsets_add():
    steps, infos = _plan()
    infos["c"], infos["z"] = TensorInfo(np.dtype(np.float32), (16,)), TensorInfo(np.dtype(np.float32), (48,))
    steps.append(_Step("", [], ["c"], [("c", WRITE)]))
    steps.append(_Step("", ["c", "y"], ["z"], [("c", READ), ("y", READ), ("z", WRITE)],
                       slices=(concat_slices.Slice("c", "z", 0, 16), concat_slices.Slice("y", "z", 16, 32))))
    placed = _place(steps, infos)
    assert placed == {"a": ("y", 0), "b": ("y", 16), "c": ("z", 0), "y": ("z", 16)}
    assert concat_slices.top("b", placed) == ("z", 32)


@needs_compiler
@pytest.mark.parametrize("vl", [8, 16])
def test_a_dense_block_joining_every_layer_again_becomes_a_chain(tmp_path, vl):
    """torchvision's DenseNet: each layer joins every output so far anew, Concat(x0, x1),
    then Concat(x0, x1, x2): the later one's leading inputs are the earlier Concat's, so it
    joins that Concat's output and the new layer, nested into one buffer."""
    m = GraphBuilder(18, 8, "torchvision_dense", weight_gain=2 ** 0.5)
    x = m.input([1, 3, 6, 6])
    features, channels = [_conv(m, x, 3, 16)], 16
    for _ in range(3):
        joined = m.node("Concat", features, axis=1) if len(features) > 1 else features[0]
        features.append(_conv(m, m.node("Relu", [joined]), channels, 16))
        channels += 16
    last = m.node("Concat", features, axis=1)
    m.output(_conv(m, last, channels, 8, 1))
    unit = _unit(m, vl)
    assert _copies(unit) == []
    assert {concat_slices.top(f + f"#nchw{vl}c", unit.placed)[0] for f in features} == {last + f"#nchw{vl}c"}
    assert_one_native_partition_matches(tmp_path, m, rtol=1e-4)
