"""Tensor manipulation and generator kernels: shape functions (values, symbolic dims,
unknown contents), error handling, and onnxruntime as an oracle on realistic shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from tests.one_node_graphs import one_node
from tests.oracle import ort_run

from onnx import helper

I64 = np.int64
INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


# ---------------------------------------------------------------------------------------
# helpers


def infer(op, *infos, opset=18, outputs=1, **attrs):
    """Run op's shape function; returns the list of output TensorInfos."""
    return resolve(op, "", opset).shape(Ctx(attrs, opset, outputs), *infos)


def one(op, *infos, opset=18, **attrs) -> TensorInfo:
    return infer(op, *infos, opset=opset, **attrs)[0]


def run(op, *inputs, opset=18, outputs=1, **attrs):
    return resolve(op, "", opset).fn(Ctx(attrs, opset, outputs), *inputs)


def const(array, dtype=I64) -> TensorInfo:
    return TensorInfo.of(np.asarray(array, dtype=dtype))


def sym(dtype, *shape) -> TensorInfo:
    return TensorInfo(np.dtype(dtype), tuple(shape))


def ort_one_node(op, inputs, opset=18, outputs=1, **attrs):
    """Single-node model evaluated by onnxruntime (the oracle). None inputs are omitted."""
    model, feeds, _ = one_node(op, inputs, outputs, attrs, opset)
    return ort_run(model, feeds)


def check_against_ort(op, inputs, opset=18, outputs=1, **attrs):
    expected = ort_one_node(op, inputs, opset, outputs, **attrs)
    got = run(op, *inputs, opset=opset, outputs=outputs, **attrs)
    got = got if isinstance(got, tuple) else (got,)
    infos = [None if x is None else TensorInfo(x.dtype, tuple(x.shape)) for x in inputs]
    predicted = infer(op, *infos, opset=opset, outputs=outputs, **attrs)
    assert len(got) == len(expected)
    for g, e, p in zip(got, expected, predicted):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g, e)
        assert p.dtype == e.dtype
        assert p.shape is None or all(d is None or d == s for d, s in zip(p.shape, e.shape))
    return got


# ---------------------------------------------------------------------------------------
# Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains


def test_static_shape_chain_gives_exact_reshape_shape():
    x = sym(np.float32, 2, 3, 4)
    s = one("Shape", x)
    assert s.value.tolist() == [2, 3, 4] and s.value.dtype == I64
    g = one("Gather", s, const(0), axis=0)
    assert g.shape == () and int(g.value) == 2
    u = one("Unsqueeze", g, const([0]), opset=13)
    assert u.shape == (1,) and u.value.tolist() == [2]
    c = one("Concat", u, const([-1]), axis=0)
    assert c.shape == (2,) and c.value.tolist() == [2, -1]
    r = one("Reshape", x, c)
    assert r.shape == (2, 12) and r.dtype == np.float32


def test_static_shape_chain_matches_onnxruntime():
    """The same chain as a real model: onnxruntime's output shape is the oracle."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["i"], value=helper.make_tensor("i", 7, [], [1])),
        helper.make_node("Gather", ["s", "i"], ["g"]),
        helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", 7, [1], [0])),
        helper.make_node("Unsqueeze", ["g", "ax"], ["u"]),
        helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", 7, [1], [-1])),
        helper.make_node("Concat", ["m", "u"], ["c"], axis=0),
        helper.make_node("Reshape", ["x", "c"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3, 4])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    (expected,) = ort_run(model, {"x": x})

    info = {"x": TensorInfo(np.dtype(np.float32), (2, 3, 4))}
    arrays = {"x": x}
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Constant":
            attrs["value"] = onnx.numpy_helper.to_array(attrs["value"])
        k = resolve(node.op_type, "", 13)
        ctx = Ctx(attrs, 13, 1)
        info[node.output[0]] = k.shape(ctx, *(info[n] for n in node.input))[0]
        arrays[node.output[0]] = k.fn(ctx, *(arrays[n] for n in node.input))
    assert info["y"].shape == expected.shape == (8, 3)
    np.testing.assert_array_equal(arrays["y"], expected)


def test_symbolic_batch_flows_through_shape_chain():
    x = sym(np.float32, "N", 3, 4)
    s = one("Shape", x)
    assert s.shape == (3,) and s.value is None
    batch = one("Gather", s, const(0))
    assert batch.value is None and batch.shape == ()
    channels = one("Gather", s, const(1))
    assert int(channels.value) == 3  # static entries of a partly symbolic shape are known
    tail = one("Slice", s, const([1]), const([INT64_MAX]))
    assert tail.value.tolist() == [3, 4]
    u = one("Unsqueeze", batch, const([0]))
    c = one("Concat", u, const([-1]), axis=0)
    assert c.shape == (2,) and c.value is None
    assert one("Reshape", x, c).shape == ("N", 12)
    cast = one("Cast", c, to=7)
    assert one("Reshape", x, cast).shape == ("N", 12)


def test_partly_symbolic_contents_are_a_field_copies_keep():
    """Shape's partly symbolic contents are TensorInfo.symbolic, a dataclass field: a copy
    (as passes and dimension binding make with dataclasses.replace) still carries them."""
    x = sym(np.float32, "N", 3, 4)
    s = one("Shape", x)
    assert s.value is None and s.symbolic.tolist() == ["N", 3, 4]
    copied = dataclasses.replace(s)
    batch = one("Slice", copied, const([0]), const([1]))
    assert batch.symbolic.tolist() == ["N"]
    assert one("Reshape", x, one("Concat", batch, const([-1]), axis=0)).shape == ("N", 12)


def test_symbolic_dims_through_reshape_flatten_transpose_concat():
    x = sym(np.float32, "N", 3, 4)
    assert one("Reshape", x, const([0, -1])).shape == ("N", 12)
    assert one("Reshape", x, const([-1, 12])).shape == ("N", 12)
    assert one("Reshape", x, const([-1, 4])).shape == (None, 4)  # 3N is not a dim name
    assert one("Reshape", x, const([0, 2, 6])).shape == ("N", 2, 6)
    assert one("Reshape", x, const([0, 0, -1, 2])).shape == ("N", 3, 2, 2)
    assert one("Flatten", x, axis=1).shape == ("N", 12)
    assert one("Flatten", x, axis=-1).shape == (None, 4)
    assert one("Flatten", x, axis=0).shape == (1, None)
    assert one("Transpose", x).shape == (4, 3, "N")
    assert one("Transpose", x, perm=[0, 2, 1]).shape == ("N", 4, 3)
    y = sym(np.float32, "N", 5, 4)
    assert one("Concat", x, y, axis=1).shape == ("N", 8, 4)
    assert one("Concat", x, sym(np.float32, 2, 3, 4), axis=0).shape == (None, 3, 4)
    assert one("Concat", x, sym(np.float32, 0, 3, 4), axis=0).shape == ("N", 3, 4)
    assert one("Concat", x, sym(np.float32, "N", 3, None), axis=-1).shape == ("N", 3, None)


def test_symbolic_shapes_feed_generators_and_expand():
    x = sym(np.float32, "B", "S")
    s = one("Shape", x)
    seq = one("Gather", s, const(1))
    r = one("Range", const(0), seq, const(1))
    assert r.shape == ("S",) and r.dtype == I64
    assert one("ConstantOfShape", s).shape == ("B", "S")
    assert one("Expand", sym(np.float32, 1, "S"), s).shape == ("B", "S")
    assert one("Shape", x, start=-1, opset=15).shape == (1,)
    assert one("Shape", sym(np.float32, "B", 7), start=-1, opset=15).value.tolist() == [7]


def test_unknown_contents_keep_rank():
    x = sym(np.float32, 2, 3, 4)
    unknown3 = TensorInfo(np.dtype(I64), (3,))
    assert one("Reshape", x, unknown3).shape == (None, None, None)
    assert one("Reshape", x, TensorInfo(np.dtype(I64), (None,))).shape is None
    assert one("Slice", x, TensorInfo(np.dtype(I64), (1,)), TensorInfo(np.dtype(I64), (1,)),
               const([2])).shape == (2, 3, None)
    assert one("Slice", x, unknown3, unknown3).shape == (None, None, None)
    assert one("Squeeze", x, TensorInfo(np.dtype(I64), (1,))).shape is None
    assert one("Unsqueeze", x, TensorInfo(np.dtype(I64), (2,))).shape == (None,) * 5
    assert one("Expand", sym(np.float32, 3, 1), unknown3).shape == (None, 3, None)
    assert one("Tile", x, unknown3).shape == (None, None, None)
    assert one("Pad", x, TensorInfo(np.dtype(I64), (6,))).shape == (None, None, None)
    assert one("Pad", x, TensorInfo(np.dtype(I64), (2,)), None, const([1])).shape == (2, None, 4)
    assert one("ConstantOfShape", unknown3).shape == (None, None, None)
    assert one("Range", const(0), TensorInfo(np.dtype(I64), ()), const(1)).shape == (None,)
    outs = infer("Split", x, TensorInfo(np.dtype(I64), (2,)), outputs=2, axis=1)
    assert [o.shape for o in outs] == [(2, None, 4)] * 2


def test_values_fold_for_small_known_inputs_only():
    data = const(np.arange(12).reshape(3, 4))
    assert one("Transpose", data).value.tolist() == np.arange(12).reshape(3, 4).T.tolist()
    assert one("Slice", data, const([-1]), const([INT64_MIN]), const([1]), const([-1])
               ).value.tolist() == [[3, 2, 1, 0], [7, 6, 5, 4], [11, 10, 9, 8]]
    assert one("Cast", const([1.7, -2.2], np.float32), to=6).value.tolist() == [1, -2]
    assert one("Range", const(1.0, np.float32), const(2.0, np.float32),
               const(0.25, np.float32)).value.tolist() == [1.0, 1.25, 1.5, 1.75]
    assert one("ConstantOfShape", const([2, 2]),
               value=np.array([7], np.int32)).value.tolist() == [[7, 7], [7, 7]]
    outs = infer("Split", const([1, 2, 3, 4, 5]), outputs=3, num_outputs=3)
    assert [o.value.tolist() for o in outs] == [[1, 2], [3, 4], [5]]
    big = TensorInfo.of(np.zeros((64, 64), np.float32))
    assert one("Transpose", big).value is None  # too large to fold
    assert one("Transpose", sym(np.float32, 2, 2)).value is None
    value = one("Concat", const([1]), const([2]), axis=0).value
    with pytest.raises(ValueError):
        value[0] = 5  # folded values are read-only


def test_shape_inference_errors():
    x = sym(np.float32, 2, 3, 4)
    with pytest.raises(ShapeInferenceError, match="-1"):
        one("Reshape", x, const([-1, -1]))
    with pytest.raises(ShapeInferenceError, match="cannot reshape"):
        one("Reshape", x, const([5, -1]))
    with pytest.raises(ShapeInferenceError, match="cannot reshape"):
        one("Reshape", x, const([5, 5]))
    with pytest.raises(ShapeInferenceError, match="0 and -1"):
        one("Reshape", x, const([0, -1]), allowzero=1)
    with pytest.raises(ShapeInferenceError, match="out of range"):
        one("Gather", x, const(0), axis=3)
    with pytest.raises(ShapeInferenceError, match="not 1"):
        one("Squeeze", x, const([0]))
    with pytest.raises(ShapeInferenceError, match="add up"):
        infer("Split", x, const([1, 1]), outputs=2, axis=1)
    with pytest.raises(ShapeInferenceError, match="equal parts"):
        infer("Split", x, outputs=2, axis=1, opset=13)
    with pytest.raises(ShapeInferenceError, match="duplicates"):
        one("Unsqueeze", x, const([1, -4]))
    with pytest.raises(ShapeInferenceError, match="permutation"):
        one("Transpose", x, perm=[0, 0, 1])
    with pytest.raises(ShapeInferenceError, match="mode"):
        one("Pad", x, const([0] * 6), mode="wrap", opset=18)
    with pytest.raises(ShapeInferenceError, match="float6e2m3"):
        one("Cast", x, to=27)
    with pytest.raises(ShapeInferenceError, match="out of range"):
        one("Gather", const([1, 2, 3]), const(3))  # folding reports a bad constant index
    with pytest.raises(ShapeInferenceError, match="broadcast"):
        one("Expand", sym(np.float32, 3), const([2]))


def test_kernel_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(KernelError, match="out of range"):
        run("Gather", x, np.array([0, -3]))
    with pytest.raises(KernelError, match="out of range"):
        run("GatherElements", x, np.array([[0, 2, 0]]), axis=0)
    with pytest.raises(KernelError, match="not 1"):
        run("Squeeze", x, np.array([1]))
    with pytest.raises(KernelError, match="delta"):
        run("Range", np.array(0), np.array(5), np.array(0))
    with pytest.raises(KernelError, match="cannot reshape"):
        run("Reshape", x, np.array([4, -1]))


def test_views_and_no_mutation():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    before = x.copy()
    for op, args, attrs in [
        ("Reshape", (np.array([6, 4]),), {}),
        ("Flatten", (), {"axis": 2}),
        ("Transpose", (), {"perm": [2, 0, 1]}),
        ("Unsqueeze", (np.array([0]),), {}),
        ("Slice", (np.array([1]), np.array([3]), np.array([1])), {}),
        ("Identity", (), {}),
        ("Expand", (np.array([3, 2, 3, 4]),), {}),
        ("Gather", (np.array(1),), {"axis": 1}),
    ]:
        out = run(op, x, *args, **attrs)
        assert np.shares_memory(out, x), op
    run("Pad", x, np.array([1, 0, 0, 1, 0, 0]))
    run("Split", x, np.array([1, 2]), outputs=2, axis=1)
    np.testing.assert_array_equal(x, before)


def test_legacy_attribute_forms():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert run("Slice", x, opset=1, starts=[1, 0], ends=[100, -1], axes=[1, 2]).shape == (2, 2, 3)
    assert run("Reshape", x, opset=1, shape=[0, -1]).shape == (2, 12)
    assert run("Squeeze", x[:1], opset=11, axes=[0]).shape == (3, 4)
    assert run("Unsqueeze", x, opset=11, axes=[-1]).shape == (2, 3, 4, 1)
    parts = run("Split", x, opset=11, outputs=2, axis=2, split=[1, 3])
    assert [p.shape for p in parts] == [(2, 3, 1), (2, 3, 3)]
    padded = run("Pad", x, opset=2, pads=[0, 0, 1, 0, 0, 1], value=5.0)
    assert padded.shape == (2, 3, 6) and padded[0, 0, 0] == 5.0
    assert run("Cast", x, opset=1, to="INT32").dtype == np.int32
    assert one("Concat", sym(np.float32, 1, 2), sym(np.float32, 1, 3), opset=1).shape == (1, 5)


# ---------------------------------------------------------------------------------------
# onnxruntime comparisons on realistic shapes


RNG = np.random.default_rng(42)
FEATURES = RNG.standard_normal((2, 16, 28, 28)).astype(np.float32)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0, 2], [INT64_MAX, -2], [2, 3], [1, 1]),
    ([-1], [INT64_MIN], [1], [-1]),
    ([INT64_MAX], [-100], [2], [-3]),
    ([100, -100], [200, 5], [3, 2], [1, 2]),
    ([1, 0, 3], [-1, 16, 27], [0, 1, -1], [1, 4, 5]),
    ([-5], [-1], [-2], [1]),
])
def test_slice_matches_onnxruntime(starts, ends, axes, steps):
    check_against_ort("Slice", [FEATURES, np.array(starts, I64), np.array(ends, I64),
                                np.array(axes, I64), np.array(steps, I64)], opset=13)


def test_slice_default_axes_and_steps_matches_onnxruntime():
    check_against_ort("Slice", [FEATURES, np.array([0, 1], I64), np.array([1, -1], I64)],
                      opset=13)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 0, 1, 2, 0, 0, 3, 1], [0, 0, -1, 2, 0, 0, 1, -3]])
def test_pad_matches_onnxruntime(mode, pads):
    cv = np.array(1.5, np.float32) if mode == "constant" else None
    check_against_ort("Pad", [FEATURES, np.array(pads, I64), cv], opset=19, mode=mode)


def test_pad_axes_input_matches_onnxruntime():
    check_against_ort("Pad", [FEATURES, np.array([1, 1, 2, 2], I64), np.array(0.0, np.float32),
                              np.array([-1, 2], I64)], opset=18)


def test_pad_int_constant_matches_onnxruntime():
    x = RNG.integers(-50, 50, (3, 7)).astype(np.int32)
    check_against_ort("Pad", [x, np.array([2, 0, 0, 3], I64), np.array(-7, np.int32)],
                      opset=13)


@pytest.mark.parametrize("axis,indices", [
    (0, np.array([1, -1, 0])),
    (1, np.array([[0, -16], [15, 3]])),
    (3, np.array(-1)),
    (-2, np.array([], I64)),
])
def test_gather_matches_onnxruntime(axis, indices):
    check_against_ort("Gather", [FEATURES, indices.astype(I64)], opset=13, axis=axis)


def test_gather_embedding_lookup_matches_onnxruntime():
    table = RNG.standard_normal((1000, 64)).astype(np.float32)
    ids = RNG.integers(-1000, 1000, (4, 32)).astype(np.int32)
    check_against_ort("Gather", [table, ids], opset=13)


def test_gather_elements_matches_onnxruntime():
    x = RNG.standard_normal((4, 10, 6)).astype(np.float32)
    idx = RNG.integers(-10, 10, (4, 3, 6)).astype(I64)
    check_against_ort("GatherElements", [x, idx], opset=13, axis=1)


@pytest.mark.parametrize("size,num", [(7, 4), (28, 3), (16, 4)])
def test_split_num_outputs_matches_onnxruntime(size, num):
    x = RNG.standard_normal((2, size, 5)).astype(np.float32)
    check_against_ort("Split", [x], opset=18, outputs=num, axis=1, num_outputs=num)


def test_split_sizes_input_matches_onnxruntime():
    check_against_ort("Split", [FEATURES, np.array([4, 0, 12], I64)], opset=13, outputs=3,
                      axis=1)


@pytest.mark.parametrize("shape,allowzero", [
    ([0, -1], 0), ([2, 0, 28, 28], 0), ([-1, 784], 0), ([2, 16, 0], 1), ([32, 7, 4, 28], 1),
])
def test_reshape_matches_onnxruntime(shape, allowzero):
    x = FEATURES if allowzero == 0 or 0 not in shape else np.zeros((2, 16, 0), np.float32)
    check_against_ort("Reshape", [x, np.array(shape, I64)], opset=14, allowzero=allowzero)


def test_expand_tile_transpose_flatten_match_onnxruntime():
    x = RNG.standard_normal((3, 1, 5)).astype(np.float32)
    check_against_ort("Expand", [x, np.array([2, 1, 4, 1], I64)], opset=13)
    check_against_ort("Tile", [x, np.array([2, 3, 1], I64)], opset=13)
    check_against_ort("Transpose", [FEATURES], opset=13, perm=[0, 2, 3, 1])
    check_against_ort("Flatten", [FEATURES], opset=13, axis=-2)
    check_against_ort("DepthToSpace", [FEATURES], opset=13, blocksize=2, mode="CRD")
    check_against_ort("SpaceToDepth", [FEATURES], opset=13, blocksize=4)


@pytest.mark.parametrize("src,to", [
    (np.float32, 6), (np.float32, 10), (np.float32, 9), (np.int64, 1), (np.float16, 11),
    (np.int32, 3), (np.bool_, 1), (np.float64, 7),
])
def test_cast_matches_onnxruntime(src, to):
    values = np.array([0, 1.5, -2.75, 100.25, -128, 127, 3e4], dtype=np.float64)
    check_against_ort("Cast", [values.astype(src)], opset=13, to=to)


@pytest.mark.parametrize("start,limit,delta,dtype", [
    (0, 10, 3, np.int64), (10, 4, -2, np.int32), (1.0, 2.0, 0.1, np.float32),
    (-3.5, 7.25, 0.75, np.float64), (5, 5, 1, np.int64), (0, 10, -1, np.int32),
])
def test_range_matches_onnxruntime(start, limit, delta, dtype):
    inputs = [np.array(v, dtype) for v in (start, limit, delta)]
    expected = ort_one_node("Range", inputs, opset=11)[0]
    got = run("Range", *inputs, opset=11)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    info = one("Range", *(TensorInfo.of(v) for v in inputs), opset=11)
    assert info.shape == expected.shape


def test_constant_forms():
    assert one("Constant", opset=13, value_ints=[1, 2]).value.tolist() == [1, 2]
    v = one("Constant", opset=13, value_float=2.5)
    assert v.shape == () and v.dtype == np.float32 and float(v.value) == 2.5
    assert run("Constant", opset=13, value_strings=["a", "b"]).tolist() == ["a", "b"]
    assert run("Constant", opset=13, value=np.eye(2, dtype=np.float16)).dtype == np.float16


def test_dropout_inference_is_identity_with_true_mask():
    x = FEATURES[0, 0]
    out, mask = run("Dropout", x, np.array(0.3, np.float32), np.array(False), outputs=2,
                    opset=13)
    np.testing.assert_array_equal(out, x)
    assert mask.dtype == np.bool_ and mask.all()
    expected = ort_one_node("Dropout", [x, np.array(0.3, np.float32)], opset=13, outputs=2)
    np.testing.assert_array_equal(out, expected[0])
    np.testing.assert_array_equal(mask, expected[1])


@pytest.mark.parametrize("values", [
    np.array([0.1, np.inf, -np.inf, np.nan, -2, 1e10, 3.0, 1e-5, 2**24 + 2, 1 / 3], np.float32),
    np.array([[1.5, -0.25]], np.float64),
    np.array([True, False]),
    np.array([-3, 2**40], I64),
])
def test_cast_to_string_matches_onnxruntime(values):
    expected = ort_one_node("Cast", [values], opset=13, to=8)[0]
    got = run("Cast", values, opset=13, to=8)
    assert got.dtype == object and got.shape == expected.shape
    assert got.tolist() == expected.tolist()


def test_cast_from_string_matches_onnxruntime():
    values = np.array(["0.5", "+INF", "-INF", "NaN", "-2e3", "17"], dtype=object)
    expected = ort_one_node("Cast", [values], opset=13, to=1)[0]
    np.testing.assert_array_equal(run("Cast", values, opset=13, to=1), expected)


def test_squeeze_empty_axes_squeezes_all_like_onnxruntime():
    x = np.zeros((1, 3, 1), np.float32)
    check_against_ort("Squeeze", [x, np.array([], I64)], opset=13)
    assert one("Squeeze", sym(np.float32, 1, 3, 1), const([], I64)).shape == (3,)
    assert one("Squeeze", sym(np.float32, 1, "N", 1)).shape is None  # 'N' might be 1
