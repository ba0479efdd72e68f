"""Indexing, data movement and the pooling/upsampling kernels added with them, against
onnxruntime.

Each case builds a one-node ONNX model, runs it in onnxruntime (the oracle) and in nncc by
two routes: the kernel called directly (its shape function checked with the inputs'
contents known and unknown) and the whole model compiled at -O2 (shape inference, plan,
executor), with the inputs listed in ``consts`` stored as initializers so that shapes which
depend on contents are known at compile time.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
import pytest

from nncc.compiler import CompileOptions, compile_graph
from nncc.errors import KernelError, ShapeInferenceError
from nncc.frontend.onnx import parse_model
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from nncc.model import CompiledModel
from tests.oracle import ort_session

RNG = np.random.default_rng(7)
I64 = np.int64


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ints(*values):
    return np.array(values, dtype=I64)


def model_bytes(op, inputs, attrs, opset, n_out, consts=()):
    names = ["" if a is None else f"in{i}" for i, a in enumerate(inputs)]
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, [f"out{i}" for i in range(n_out)], **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for i, (n, a) in enumerate(zip(names, inputs)) if n and i not in consts]
    inits = [numpy_helper.from_array(inputs[i], names[i]) for i in consts]
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(f"out{i}") for i in range(n_out)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return model.SerializeToString()


def feeds(inputs, consts):
    return {f"in{i}": a for i, a in enumerate(inputs) if a is not None and i not in consts}


def run_ort(data, inputs, consts):
    session = ort_session(data)
    return session.run(None, feeds(inputs, consts))


def assert_same(got, expected, what):
    got = np.asarray(got)
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != onnxruntime {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != onnxruntime {expected.shape}"
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


def check(op, inputs, attrs=None, opset=18, n_out=1, consts=()):
    """Compare nncc's kernel, shape function and compiled model with onnxruntime."""
    attrs = attrs or {}
    data = model_bytes(op, inputs, attrs, opset, n_out, consts)
    expected = run_ort(data, inputs, consts)
    k = resolve(op, "", opset)
    ctx = Ctx(dict(attrs), opset, n_out)
    got = k.fn(ctx, *inputs)
    got = got if isinstance(got, tuple) else (got,)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_same(g, e, f"kernel output {i}")
    for keep in (True, False):
        infos = [None if a is None else TensorInfo.of(a, keep_value=keep) for a in inputs]
        predicted = k.shape(Ctx(dict(attrs), opset, n_out), *infos)
        for i, (p, e) in enumerate(zip(predicted, expected)):
            assert p.dtype == e.dtype, f"shape function output {i}: dtype {p.dtype} != {e.dtype}"
            assert p.shape is None or (len(p.shape) == e.ndim and all(
                d is None or d == s for d, s in zip(p.shape, e.shape))), f"output {i}: {p.shape} vs {e.shape}"
            if keep:  # every input known: every dim must be known
                assert p.shape == e.shape
    graph = parse_model(data)
    compiled = CompiledModel(compile_graph(graph, CompileOptions(opt_level=2)))
    for _ in range(2):  # a second run reuses the plan's buffers
        res = compiled.run(feeds(inputs, consts))
        for i, e in enumerate(expected):
            assert_same(res[f"out{i}"], e, f"compiled output {i}")
    return expected


def run(op, *inputs, opset=18, n_out=1, **attrs):
    return resolve(op, "", opset).fn(Ctx(attrs, opset, n_out), *inputs)


# ---------------------------------------------------------------------------------------
# Trilu


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -7, 9])
def test_trilu_batched(upper, k):
    inputs = [rand(2, 3, 4, 6)] + ([] if k is None else [ints(k)])
    check("Trilu", inputs, dict(upper=upper), opset=14)


def test_trilu_integers_and_tall_matrix():
    check("Trilu", [RNG.integers(-9, 9, (7, 3)).astype(np.int32), ints(1)], dict(upper=0), opset=14)


# ---------------------------------------------------------------------------------------
# Scatter, ScatterElements, ScatterND


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_reductions_with_duplicates(reduction):
    data = rand(4, 5)
    # duplicates (row 1 twice in column 0) only where a reduction combines them
    idx = ints(1, 3, 0, 2, 2, 1, 0, 3, 2, 0).reshape(2, 5) if reduction == "none" else \
        ints(1, 3, 0, -2, 2, 1, 3, 0, 2, 0).reshape(2, 5)
    check("ScatterElements", [data, idx, rand(2, 5)], dict(axis=0, reduction=reduction), opset=18)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_scatter_elements_axes_and_negative_indices(axis):
    data = rand(3, 4, 5)
    n = data.shape[axis]
    shape = [2, 3, 4]
    # along the axis each line of indices holds distinct positions (no duplicates), about
    # half of them written as negative indices
    lines = np.moveaxis(np.empty(shape), axis, -1).shape
    count = int(np.prod(lines[:-1]))
    perm = np.stack([RNG.permutation(n)[:lines[-1]] for _ in range(count)])
    perm = np.where(RNG.random(perm.shape) < 0.5, perm - n, perm).astype(I64)
    idx = np.ascontiguousarray(np.moveaxis(perm.reshape(lines), -1, axis))
    check("ScatterElements", [data, idx, rand(*idx.shape)], dict(axis=axis), opset=13)


def test_scatter_elements_integers_add_at_opset_16():
    data = RNG.integers(-5, 5, (6,)).astype(np.int32)
    check("ScatterElements", [data, ints(0, 0, 5, -1, 0), np.ones(5, np.int32) * 3],
          dict(reduction="add"), opset=16)


@pytest.mark.parametrize("opset", [9, 10])
def test_scatter_deprecated(opset):
    check("Scatter", [rand(3, 4), ints(2, 0, 1, 3, 1, 2).reshape(2, 3), rand(2, 3)], dict(axis=1), opset=opset)


def test_scatter_elements_rejects_out_of_range_and_unknown_reduction():
    with pytest.raises(KernelError, match="out of range"):
        run("ScatterElements", rand(3), ints(3), rand(1))
    with pytest.raises(KernelError, match="out of range"):
        run("ScatterElements", rand(3), ints(-4), rand(1))
    with pytest.raises(KernelError, match="reduction 'max'"):
        run("ScatterElements", rand(3), ints(1), rand(1), opset=16, reduction="max")


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_slices_with_duplicates(reduction):
    data = rand(4, 3, 2)
    idx = ints(1, 2, 0) if reduction == "none" else ints(1, -3, 3, 1)
    idx = idx.reshape(-1, 1)
    check("ScatterND", [data, idx, rand(idx.shape[0], 3, 2)], dict(reduction=reduction), opset=18)


def test_scatter_nd_elements_and_negative_indices():
    data = rand(3, 4, 5)
    idx = ints(0, 1, 2, -1, -1, -1, 2, 0, 4, 1, 3, 0).reshape(2, 2, 3)
    check("ScatterND", [data, idx, rand(2, 2)], opset=13)
    check("ScatterND", [data, idx, rand(2, 2)], dict(reduction="mul"), opset=16)


def test_scatter_nd_rejects_bad_updates():
    with pytest.raises(KernelError, match="updates"):
        run("ScatterND", rand(3, 4), ints(0, 1).reshape(2, 1), rand(2, 3))
    with pytest.raises(KernelError, match="out of range"):
        run("ScatterND", rand(3, 4), ints(0, 4).reshape(1, 2), rand(1))


# ---------------------------------------------------------------------------------------
# GatherND


@pytest.mark.parametrize("batch_dims,idx_shape", [(0, (4, 1)), (0, (2, 3, 2)), (0, (5, 3)),
                                                  (1, (3, 2, 1)), (1, (3, 2)), (2, (3, 4, 1))])
def test_gather_nd(batch_dims, idx_shape):
    data = rand(3, 4, 5)
    k = idx_shape[-1]
    dims = np.array(data.shape[batch_dims:batch_dims + k])
    idx = (RNG.integers(0, 1 << 20, idx_shape) % dims).astype(I64)
    idx = np.where(RNG.random(idx_shape) < 0.3, idx - dims, idx)  # some negative
    check("GatherND", [data, idx], dict(batch_dims=batch_dims), opset=13)


def test_gather_nd_int_data_opset_11():
    data = RNG.integers(0, 100, (2, 2, 3)).astype(np.int32)
    check("GatherND", [data, ints(1, 0, 0, 1).reshape(2, 2)], opset=11)


# ---------------------------------------------------------------------------------------
# OneHot


@pytest.mark.parametrize("axis", [-1, 0, 1, -3])
def test_onehot_axes_negative_and_out_of_range(axis):
    indices = ints(0, 3, -1, 7, -5, 2).reshape(2, 3)
    check("OneHot", [indices, np.array(5, dtype=np.float32), np.array([-2, 9], dtype=np.int32)],
          dict(axis=axis), opset=11)


def test_onehot_float_indices_and_constant_depth():
    indices = np.array([[1.0, 2.9], [0.0, 3.0]], dtype=np.float32)
    check("OneHot", [indices, np.array([4.0], np.float32), np.array([0.0, 1.0], np.float32)], opset=11, consts=(1,))


# ---------------------------------------------------------------------------------------
# Compress, NonZero, Unique: shapes that depend on contents


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = rand(3, 4)
    n = x.size if axis is None else x.shape[axis]
    cond = np.arange(n - 1) % 3 != 1  # shorter than the axis: the rest is dropped
    attrs = {} if axis is None else dict(axis=axis)
    check("Compress", [x, cond], attrs, opset=11)
    check("Compress", [x, cond], attrs, opset=11, consts=(1,))


def test_compress_selecting_nothing():
    check("Compress", [rand(2, 3), np.zeros(3, bool)], dict(axis=1), opset=11)


@pytest.mark.parametrize("x", [
    np.array([[1, 0, 3], [0, 0, 5]], np.int32),
    np.zeros((2, 3, 4), np.float32),
    (RNG.random((3, 4, 2)) > 0.5),
    np.array([0.0, -0.0, 2.5, np.nan], np.float32),
    np.array(3.0, np.float32),  # a scalar counts as one element of a vector
    np.array(0, np.int64),
])
def test_nonzero(x):
    check("NonZero", [x], opset=13)
    check("NonZero", [x], opset=13, consts=(0,))


def test_nonzero_shape_function_leaves_the_count_unknown():
    (info,) = resolve("NonZero", "", 13).shape(Ctx({}, 13), TensorInfo(np.dtype(np.float32), (2, None, 3)))
    assert info.dtype == np.int64 and info.shape == (3, None)


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("x,axis", [
    (np.array([2.0, 1.0, 1.0, 3.0, 4.0, 3.0, -1.0], np.float32), None),
    (np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4], [1, 0, 0]], np.int64), 0),
    (np.array([[1, 0, 1, 0], [7, 3, 7, 3], [2, 2, 2, 2]], np.int64), 1),
    (np.array([[[1, 1], [0, 1]], [[1, 1], [0, 1]], [[0, 0], [0, 0]]], np.float32), -3),
    (np.array([[5, 5], [4, 5]], np.int64), None),
])
def test_unique_all_outputs(x, axis, sorted_):
    attrs = dict(sorted=sorted_) if axis is None else dict(sorted=sorted_, axis=axis)
    check("Unique", [x], attrs, opset=11, n_out=4)
    check("Unique", [x], attrs, opset=11, n_out=4, consts=(0,))


def test_unique_single_output():
    check("Unique", [np.array([3, 1, 3, 2], np.int64)], dict(sorted=0), opset=11, n_out=1)


# ---------------------------------------------------------------------------------------
# ReverseSequence, TensorScatter, CenterCropPad, BitCast


@pytest.mark.parametrize("batch_axis,time_axis,shape", [(1, 0, (5, 3, 2)), (0, 1, (4, 6)), (0, 1, (3, 4, 2, 2))])
def test_reverse_sequence(batch_axis, time_axis, shape):
    x = rand(*shape)
    steps, batch = shape[time_axis], shape[batch_axis]
    lengths = RNG.integers(1, steps + 1, batch).astype(I64)
    check("ReverseSequence", [x, lengths], dict(batch_axis=batch_axis, time_axis=time_axis), opset=10)


def test_reverse_sequence_rejects_long_sequences():
    with pytest.raises(KernelError, match="sequence lengths"):
        run("ReverseSequence", rand(3, 2), ints(1, 4), opset=10)


@pytest.mark.parametrize("mode,axis,shape,update_len,starts", [
    ("linear", -2, (2, 3, 6, 4), 2, (4, 1)),
    ("circular", -2, (2, 3, 6, 4), 3, (5, 2)),
    ("linear", 1, (3, 5, 2), 5, None),
    ("circular", 2, (2, 2, 4), 4, (3, 0)),
])
def test_tensor_scatter(mode, axis, shape, update_len, starts):
    cache = rand(*shape)
    update_shape = list(shape)
    update_shape[axis] = update_len
    inputs = [cache, rand(*update_shape)] + ([] if starts is None else [ints(*starts)])
    check("TensorScatter", inputs, dict(mode=mode, axis=axis), opset=24)


def test_tensor_scatter_linear_overflow_is_an_error():
    with pytest.raises(KernelError, match="sequence axis"):
        run("TensorScatter", rand(1, 4, 2), rand(1, 2, 2), ints(3), opset=24, axis=1)


@pytest.mark.parametrize("shape,target,axes", [
    ((5, 7, 3), (2, 10), [0, 1]),   # odd crop, odd pad
    ((4, 6, 3), (7, 3), [-3, 1]),   # pad then crop
    ((3, 4), (3, 4), None),         # unchanged
    ((2, 8, 9), (1, 5, 12), None),
])
def test_center_crop_pad(shape, target, axes):
    attrs = {} if axes is None else dict(axes=axes)
    check("CenterCropPad", [rand(*shape), ints(*target)], attrs, opset=18)
    check("CenterCropPad", [rand(*shape), ints(*target)], attrs, opset=18, consts=(1,))


@pytest.mark.parametrize("x,to", [
    (np.array([[1.5, -2.0], [np.inf, 0.0]], np.float32), onnx.TensorProto.INT32),
    (np.array([-1, 2, -300], np.int16), onnx.TensorProto.UINT16),
    (np.array([1.0, -0.0], np.float64), onnx.TensorProto.UINT64),
    (np.array([0x3C00, 0xFBFF], np.uint16), onnx.TensorProto.FLOAT16),
])
def test_bitcast_reinterprets_bits(x, to):
    # onnxruntime has no BitCast yet: the oracle is numpy's own reinterpretation
    expected = x.view(helper.tensor_dtype_to_np_dtype(to))
    got = run("BitCast", x, opset=26, to=to)
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))
    assert got.dtype == expected.dtype and got.shape == x.shape


def test_bitcast_rejects_a_width_change():
    with pytest.raises(ShapeInferenceError, match="element width"):
        resolve("BitCast", "", 26).shape(Ctx({"to": onnx.TensorProto.INT64}, 26),
                                         TensorInfo(np.dtype(np.float32), (2,)))


# ---------------------------------------------------------------------------------------
# Col2Im


@pytest.mark.parametrize("image,block,attrs", [
    ((5, 5), (2, 2), {}),
    ((6, 7), (3, 2), dict(strides=[2, 1], pads=[1, 0, 1, 2])),
    ((8, 6), (2, 3), dict(dilations=[2, 1], strides=[1, 2], pads=[0, 1, 1, 0])),
    ((4, 5, 6), (2, 2, 3), dict(strides=[2, 1, 3])),
])
def test_col2im(image, block, attrs):
    nd = len(image)
    d = attrs.get("dilations", [1] * nd)
    s = attrs.get("strides", [1] * nd)
    p = attrs.get("pads", [0] * 2 * nd)
    blocks = [(image[i] + p[i] + p[nd + i] - d[i] * (block[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    x = rand(2, 3 * int(np.prod(block)), int(np.prod(blocks)))
    check("Col2Im", [x, ints(*image), ints(*block)], attrs, opset=18)
    check("Col2Im", [x, ints(*image), ints(*block)], attrs, opset=18, consts=(1, 2))


# ---------------------------------------------------------------------------------------
# LpPool, MaxUnpool, Upsample


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape,attrs,opset", [
    ((2, 3, 9), dict(kernel_shape=[3], strides=[2]), 11),
    ((1, 2, 7, 8), dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1]), 11),
    ((1, 2, 7, 8), dict(kernel_shape=[3, 3], auto_pad="SAME_LOWER", strides=[2, 2]), 11),
    ((1, 2, 8, 8), dict(kernel_shape=[2, 3], dilations=[2, 1], ceil_mode=1, strides=[2, 2]), 18),
    ((1, 1, 5, 4, 6), dict(kernel_shape=[2, 2, 3], strides=[1, 2, 2]), 22),
    ((1, 2, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2]), 2),
])
def test_lp_pool(p, shape, attrs, opset):
    check("LpPool", [rand(*shape)], dict(attrs, p=p), opset=opset)


def _max_pool_with_indices(x, attrs):
    data = model_bytes("MaxPool", [x], attrs, 12, 2)
    return run_ort(data, [x], ())


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 2, 7, 5), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 9), dict(kernel_shape=[3], strides=[3])),
])
def test_max_unpool_inverts_max_pool(shape, attrs):
    y, idx = _max_pool_with_indices(rand(*shape), attrs)
    check("MaxUnpool", [y, idx], attrs, opset=22)


def test_max_unpool_output_shape_takes_indices_in_its_own_layout():
    # a 5x5 map pooled 2x2/2: the default unpooled shape would be 4x4, output_shape restores 5x5
    x = rand(1, 2, 5, 5)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    y, idx = _max_pool_with_indices(x, attrs)
    check("MaxUnpool", [y, idx, ints(1, 2, 5, 5)], attrs, opset=11)
    check("MaxUnpool", [y, idx, ints(1, 2, 5, 5)], attrs, opset=11, consts=(2,))


def test_max_unpool_rejects_indices_outside_the_output():
    with pytest.raises(KernelError, match="outside"):
        run("MaxUnpool", rand(1, 1, 1, 1), ints(4).reshape(1, 1, 1, 1), opset=11, kernel_shape=[2, 2])


@pytest.mark.parametrize("mode,scales", [
    ("nearest", (1, 1, 2, 3)), ("nearest", (1, 1, 1.5, 2.5)), ("nearest", (2, 1, 1, 3)),
    ("linear", (1, 1, 2, 3)), ("linear", (1, 1, 1.5, 2.5)),  # onnxruntime: linear on the last two axes only
])
def test_upsample(mode, scales):
    x = rand(2, 2, 3, 4)
    check("Upsample", [x, np.array(scales, np.float32)], dict(mode=mode), opset=9)
    check("Upsample", [x, np.array(scales, np.float32)], dict(mode=mode), opset=9, consts=(1,))


def test_upsample_7_scales_attribute():
    check("Upsample", [rand(1, 3, 2, 5)], dict(mode="nearest", scales=[1.0, 1.0, 3.0, 2.0]), opset=7)


def test_contents_dependent_shapes_report_bad_constants_at_compile_time():
    compress = resolve("Compress", "", 11)
    with pytest.raises(ShapeInferenceError, match="condition"):
        compress.shape(Ctx({"axis": 0}, 11), TensorInfo.of(rand(2, 3)), TensorInfo.of(np.ones(3, bool)))


def test_mask_selection_chain_compiles_with_dynamic_shapes():
    """NonZero -> Transpose -> GatherND: the count of selected elements is known only at
    run time, so the compiled model runs those nodes with dynamic shapes."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["where"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "where"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4])],
                              [helper.make_empty_tensor_value_info("y")],
                              initializer=[numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10).SerializeToString()
    compiled = CompiledModel(compile_graph(parse_model(data), CompileOptions(opt_level=2)))
    session = ort_session(data)
    for _ in range(3):  # a different number of positives each run
        x = rand(3, 4)
        assert_same(compiled.run({"x": x})["y"], session.run(None, {"x": x})[0], "y")
