"""The kernels' cached fast paths (per-node plans in ctx.scratch, keyed by input shapes,
dtypes and small operands' contents) against onnxruntime as the oracle.

Each model is compiled once and run several times on the same executor, so the same node
(and its cache) sees: a first call, a repeated call, a change of the symbolic batch size,
and a change back. Static variants exercise the preallocated-output (``out=``) path. A
change of dtype on one node is checked by calling the kernel directly with the same
context. Erf's float32 approximation is checked against math.erf over a dense sweep.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.kernels.registry import Ctx, resolve
from tests.one_node_graphs import one_node
from tests.oracle import ort_run, ort_session

RNG = np.random.default_rng(7)
F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _model(tmp_path, nodes, inputs, outputs, inits=(), opset=17, **options):
    """inputs/outputs: (name, elem_type, shape or None); ``options`` for compile_model."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[_const(n, v) for n, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    sess = ort_session(model)
    return nncc.compile_model(path, **options), sess


def _agree(got, want, rtol, atol):
    for name, e in want.items():
        g = got[name]
        assert g.shape == e.shape and g.dtype == e.dtype, (name, g.shape, e.shape, g.dtype, e.dtype)
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(g, e, err_msg=name)


def check_runs(tmp_path, nodes, inputs, outputs, make_feeds, inits=(), opset=17,
               batches=(1, 1, 3, 1), rtol=1e-5, atol=1e-6):
    """Compile once; run each batch size in turn on the same executor, comparing every
    output with onnxruntime. Also checks results returned earlier stay intact (a kernel
    reusing its buffers must not hand out the same memory twice)."""
    model, sess = _model(tmp_path, nodes, inputs, outputs, inits, opset)
    names = [o[0] for o in outputs]
    kept = []
    for n in batches:
        feeds = make_feeds(n)
        want = dict(zip(names, sess.run(None, feeds)))
        got = model.run(feeds)
        _agree(got, want, rtol, atol)
        kept.append(({k: np.array(v) for k, v in got.items()}, got))
    for copy, got in kept:
        for k in copy:
            np.testing.assert_array_equal(got[k], copy[k])


def _sym(shape, n):
    return tuple(n if d == "N" else d for d in shape)


def unary_case(tmp_path, op, shape, attrs=None, opset=17, elem=F32, dtype=np.float32, extra=(),
               inits=(), outputs=1, static_batch=None, **kw):
    """One node ``op(x, *extra)``; x has symbolic dim 'N' (or a static batch)."""
    attrs = attrs or {}
    shape = tuple(static_batch if d == "N" and static_batch else d for d in shape)
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, ["x"] + list(extra), outs, **attrs)
    check_runs(tmp_path, [node], [("x", elem, shape)], [(o, elem, None) for o in outs],
               lambda n: {"x": rand(*_sym(shape, n), dtype=dtype)}, inits, opset,
               batches=(static_batch,) * 2 if static_batch else (1, 1, 3, 1), **kw)


STATIC = [None, 2]  # symbolic batch (fresh outputs), static batch (preallocated outputs)


# --------------------------------------------------------------------------- Gemm, MatMul


@pytest.mark.parametrize("static", STATIC)
@pytest.mark.parametrize("attrs, w_shape, c_shape", [
    (dict(transB=1), (32, 16), (32,)),
    (dict(), (16, 32), (1, 32)),
    (dict(alpha=0.5, beta=2.0, transB=1), (32, 16), (32,)),
    (dict(beta=0.0), (16, 32), (32,)),
    (dict(alpha=2.0), (16, 32), None),
])
def test_gemm(tmp_path, static, attrs, w_shape, c_shape):
    inits = [("w", rand(*w_shape))] + ([("c", rand(*c_shape))] if c_shape else [])
    unary_case(tmp_path, "Gemm", ("N", 16), attrs, extra=[n for n, _ in inits], inits=inits,
               static_batch=static)


def test_gemm_trans_a_and_runtime_b(tmp_path):
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1)
    check_runs(tmp_path, [node], [("a", F32, (8, "N")), ("b", F32, (5, 8))], [("y", F32, None)],
               lambda n: {"a": rand(8, n), "b": rand(5, 8)}, inits=[("c", rand(5))])


@pytest.mark.parametrize("static", STATIC)
@pytest.mark.parametrize("a_shape, b_shape, const_b", [
    (("N", 16), (16, 8), True),          # 2-D: np.dot
    (("N", 4, 3, 16), (4, 16, 5), True),  # batched, broadcast
    (("N", 16), (16,), True),            # matrix . vector
])
def test_matmul(tmp_path, static, a_shape, b_shape, const_b):
    unary_case(tmp_path, "MatMul", a_shape, extra=["b"], inits=[("b", rand(*b_shape))],
               static_batch=static)


def test_matmul_two_runtime_operands(tmp_path):
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    check_runs(tmp_path, [node], [("a", F32, ("N", 4, 3, 16)), ("b", F32, ("N", 4, 16, 3))],
               [("y", F32, None)], lambda n: {"a": rand(n, 4, 3, 16), "b": rand(n, 4, 16, 3)})


# --------------------------------------------------------------------------- Softmax, LayerNorm, Erf


@pytest.mark.parametrize("static", STATIC)
@pytest.mark.parametrize("op, opset, axis, shape", [
    ("Softmax", 17, -1, ("N", 3, 10)),
    ("Softmax", 17, 1, ("N", 3, 10)),    # not the last axis: general path
    ("Softmax", 11, 1, ("N", 3, 10)),    # opset < 13: 2-D coercion
    ("LogSoftmax", 17, -1, ("N", 7)),
    ("LogSoftmax", 11, -1, ("N", 3, 4)),
])
def test_softmax(tmp_path, static, op, opset, axis, shape):
    unary_case(tmp_path, op, shape, dict(axis=axis), opset=opset, static_batch=static)


@pytest.mark.parametrize("static", STATIC)
@pytest.mark.parametrize("axis, with_b, outputs", [
    (-1, True, 1),
    (-1, False, 1),
    (-2, True, 1),     # several normalized axes: Scale/B reshaped
    (-1, True, 3),     # Mean and InvStdDev too
    (1, True, 2),
])
def test_layer_normalization(tmp_path, static, axis, with_b, outputs):
    shape = ("N", 5, 24)
    trailing = (5, 24)[axis:] if axis < 0 else (5, 24)[axis - 1:]
    inits = [("s", rand(*trailing))] + ([("b", rand(*trailing))] if with_b else [])
    unary_case(tmp_path, "LayerNormalization", shape, dict(axis=axis, epsilon=1e-3),
               extra=[n for n, _ in inits], inits=inits, outputs=outputs, static_batch=static,
               rtol=1e-4, atol=1e-5)


def test_layer_normalization_offset_rows(tmp_path):
    """Rows with a large common offset and a small spread (two-pass variance needed)."""
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)
    check_runs(tmp_path, [node], [("x", F32, ("N", 64))], [("y", F32, None)],
               lambda n: {"x": (100 + 0.01 * rand(n, 64)).astype(np.float32)},
               inits=[("s", rand(64)), ("b", rand(64))], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("static", STATIC)
@pytest.mark.parametrize("shape", [("N", 7), ("N", 5000)])  # 5000: chunks of 4096 plus a tail
def test_erf(tmp_path, static, shape):
    unary_case(tmp_path, "Erf", shape, static_batch=static, rtol=2e-7, atol=1e-7)


def _erf_exact(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(np.float64)


def test_erf_float32_accuracy_against_math_erf():
    # every 2**13-th float32 bit pattern from 0 to +inf, both signs, plus special values
    bits = np.arange(0, 0x7F800000, 1 << 13, dtype=np.uint32)
    pos = bits.view(np.float32)
    specials = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1e-30, 1e-8, 0.5, 0.46875,
                         1.0, 2.0, 3.9, 3.92, 4.0, 4.0000005, 10.0, 1e30,
                         np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
    x = np.concatenate([pos, -pos, specials])
    y = resolve("Erf", "", 13).fn(Ctx({}, 13), x)
    assert y.dtype == np.float32
    exact = _erf_exact(x)
    err = np.abs(y.astype(np.float64) - exact)
    # within 1 ulp of the exact value (0.5 ulp is the best float32 can do) ...
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.all(err <= ulp), x[np.argmax(err / ulp)]
    # ... which is well below 1e-6 relative wherever the result is a normal float32
    normal = np.abs(exact) >= np.finfo(np.float32).tiny
    assert np.max(err[normal] / np.abs(exact[normal])) < 1.5e-7
    assert np.array_equal(np.signbit(y), np.signbit(x))  # odd, erf(-0) = -0
    s = resolve("Erf", "", 13).fn(Ctx({}, 13), np.array([np.inf, -np.inf, np.nan], np.float32))
    assert s[0] == 1 and s[1] == -1 and np.isnan(s[2])


def test_erf_float32_dense_random_and_layouts():
    x = RNG.uniform(-5, 5, 60001).astype(np.float32)
    fn = resolve("Erf", "", 13).fn
    ctx = Ctx({}, 13)
    y = fn(ctx, x)
    np.testing.assert_allclose(y, _erf_exact(x), rtol=1.5e-7, atol=1e-30)
    # a non-contiguous view, then a different size on the same node, then into out=
    xt = x[:40000].reshape(200, 200).T
    np.testing.assert_allclose(fn(ctx, xt), _erf_exact(xt), rtol=1.5e-7, atol=1e-30)
    out = np.empty(5, np.float32)
    r = fn(ctx, x[:5], out=(out,))
    assert r is out
    np.testing.assert_allclose(out, _erf_exact(x[:5]), rtol=1.5e-7)


# --------------------------------------------------------------------------- shape ops


def test_reshape_transpose_split(tmp_path):
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=-1),
        helper.make_node("Reshape", ["a", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Split", ["t"], ["t1", "t2"], axis=1, num_outputs=2),
    ]
    check_runs(tmp_path, nodes, [("x", F32, (1, "N", 24))],
               [("t1", F32, None), ("t2", F32, None), ("b", F32, None), ("c", F32, None)],
               lambda n: {"x": rand(1, n, 24)},
               inits=[("sizes", np.array([8, 8, 8])), ("shape", np.array([1, -1, 2, 4]))],
               opset=18)


def test_reshape_by_computed_shape(tmp_path):
    """The shape operand is computed at run time (and changes with the batch)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=0, end=1),
        helper.make_node("Concat", ["s", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Unsqueeze", ["y", "ax"], ["u"]),
        helper.make_node("Squeeze", ["u", "ax"], ["q"]),
        helper.make_node("Flatten", ["q"], ["f"], axis=1),
    ]
    check_runs(tmp_path, nodes, [("x", F32, ("N", 3, 4))], [("y", F32, None), ("f", F32, None)],
               lambda n: {"x": rand(n, 3, 4)},
               inits=[("tail", np.array([-1])), ("ax", np.array([1]))], opset=17)


def test_operand_contents_change_while_data_shape_stays(tmp_path):
    """Shape-like operands computed at run time from another input: the data's shape is the
    same on every run, only the operands' contents change (the caches key on both)."""
    nodes = [
        helper.make_node("Shape", ["y"], ["n"]),                       # [N]
        helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),            # (N, 12 / N)
        helper.make_node("Slice", ["v", "zero", "n"], ["sl"]),          # v[:N]
        helper.make_node("Expand", ["one", "n"], ["ex"]),               # (N,)
        helper.make_node("Tile", ["v", "n"], ["t"]),                    # v repeated N times
        helper.make_node("Concat", ["n", "n"], ["pads"], axis=0),
        helper.make_node("Pad", ["v", "pads"], ["p"], mode="reflect"),  # N on each side
        helper.make_node("Split", ["v", "sizes"], ["s1", "s2"]),
        helper.make_node("Sub", ["six", "n"], ["rest"]),
        helper.make_node("Concat", ["n", "rest"], ["sizes"], axis=0),  # [N, 6 - N]
    ]
    outs = ["r", "sl", "ex", "t", "p", "s1", "s2"]
    check_runs(tmp_path, nodes, [("x", F32, (2, 6)), ("v", F32, (6,)), ("y", F32, ("N",))],
               [(o, F32, None) for o in outs],
               lambda n: {"x": rand(2, 6), "v": rand(6), "y": rand(n)},
               inits=[("minus1", np.array([-1])), ("zero", np.array([0])),
                      ("one", np.array([1.5], np.float32)), ("six", np.array([6]))],
               batches=(1, 1, 3, 2, 1))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_slice_concat(tmp_path, mode):
    nodes = [
        helper.make_node("Slice", ["x", "st", "en", "axs", "sp"], ["s"]),
        helper.make_node("Pad", ["s", "pads", "cv"], ["p"], mode=mode),
        helper.make_node("Pad", ["s", "crop"], ["c"]),  # negative pads crop
        helper.make_node("Concat", ["p", "p"], ["cat"], axis=1),
    ]
    check_runs(tmp_path, nodes, [("x", F32, ("N", 3, 8, 9))], [("cat", F32, None), ("c", F32, None)],
               lambda n: {"x": rand(n, 3, 8, 9)},
               inits=[("st", np.array([1, 0])), ("en", np.array([8, 100])),
                      ("axs", np.array([2, 3])), ("sp", np.array([2, 1])),
                      ("pads", np.array([0, 0, 1, 2, 0, 0, 2, 1])),
                      ("cv", np.array(1.5, np.float32)),
                      ("crop", np.array([0, -1, 0, 1, 0, 0, 0, -2]))],
               opset=18)


def test_gather_expand_tile(tmp_path):
    nodes = [
        helper.make_node("Gather", ["x", "i0"], ["g0"], axis=1),   # scalar index: a view
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=2),
        helper.make_node("Shape", ["g0"], ["gs"]),
        helper.make_node("Expand", ["e", "gs"], ["ex"]),
        helper.make_node("Tile", ["g", "reps"], ["t"]),
        helper.make_node("Add", ["ex", "g0"], ["sum"]),
    ]
    check_runs(tmp_path, nodes, [("x", F32, ("N", 3, 5))], [("t", F32, None), ("sum", F32, None)],
               lambda n: {"x": rand(n, 3, 5)},
               inits=[("i0", np.array(-1)), ("idx", np.array([[4, 0], [-1, 2]])),
                      ("e", rand(1, 5)), ("reps", np.array([2, 1, 3, 2]))])


# --------------------------------------------------------------------------- elementwise


@pytest.mark.parametrize("static", STATIC)
def test_binary_ops_with_constants(tmp_path, static):
    n0 = static or "N"
    nodes = [
        helper.make_node("Div", ["x", "four"], ["d1"]),     # a divisor that raises nothing
        helper.make_node("Div", ["x", "half"], ["d2"]),     # one that may overflow
        helper.make_node("Pow", ["d1", "three"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["m"]),
        helper.make_node("Add", ["m", "d2"], ["a"]),
        helper.make_node("Sub", ["a", "x"], ["s"]),
        helper.make_node("Div", ["s", "x"], ["q"]),         # runtime divisor
    ]
    check_runs(tmp_path, nodes, [("x", F32, (n0, 6))], [("q", F32, None), ("p", F32, None)],
               lambda n: {"x": rand(n, 6)},
               inits=[("four", np.array(4.0, np.float32)), ("half", np.array(0.5, np.float32)),
                      ("three", np.array(3.0, np.float32))],
               batches=(static, static) if static else (1, 1, 3, 1), rtol=1e-5, atol=1e-5)


def test_float_division_by_zero_and_overflow_is_quiet():
    fn = resolve("Div", "", 14).fn
    x = np.array([1.0, -1.0, 0.0, 3e38], np.float32)
    ctx = Ctx({}, 14)
    for b in (np.zeros(4, np.float32), np.array(1e-3, np.float32), np.array(4.0, np.float32)):
        b.flags.writeable = False
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(2):  # the second call takes the cached path
                got = fn(ctx, x, b)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(got, x / b)


# --------------------------------------------------------------------------- same node, new dtype


def _ort_one(op, inputs, attrs, opset=17, n_out=1):
    model, feeds, _ = one_node(op, inputs, n_out, attrs, opset)
    return ort_run(model, feeds)


@pytest.mark.parametrize("op, attrs, make", [
    ("Gemm", dict(transB=1, alpha=0.5), lambda dt: [rand(3, 8, dtype=dt), rand(4, 8, dtype=dt),
                                                    rand(4, dtype=dt)]),
    ("MatMul", {}, lambda dt: [rand(3, 8, dtype=dt), rand(8, 2, dtype=dt)]),
    ("Softmax", dict(axis=-1), lambda dt: [rand(2, 5, dtype=dt)]),
    ("LayerNormalization", dict(axis=-1), lambda dt: [rand(2, 6, dtype=dt), rand(6, dtype=dt),
                                                      rand(6, dtype=dt)]),
])
def test_same_node_changes_dtype(op, attrs, make):
    fn = resolve(op, "", 17).fn
    ctx = Ctx(dict(attrs), 17)
    for dt in (np.float32, np.float64, np.float32):
        inputs = make(dt)
        for a in inputs[1:]:
            a.flags.writeable = False  # as constants arrive
        want = _ort_one(op, inputs, attrs)[0]
        got = fn(ctx, *inputs)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_erf_same_node_float32_then_float64():
    fn = resolve("Erf", "", 13).fn
    ctx = Ctx({}, 13)
    for dt in (np.float32, np.float64, np.float32):
        x = rand(50, dtype=dt)
        got = fn(ctx, x)
        assert got.dtype == dt
        np.testing.assert_allclose(got, _erf_exact(x), rtol=1.5e-7 if dt == np.float32 else 1e-13)


def test_kernels_do_not_mutate_inputs(tmp_path):
    fns = {op: resolve(op, "", 17).fn for op in ("Gemm", "MatMul", "Softmax", "LayerNormalization")}
    cases = [("Gemm", dict(transB=1), [rand(3, 8), rand(4, 8), rand(4)]),
             ("MatMul", {}, [rand(3, 8), rand(8, 2)]),
             ("Softmax", {}, [rand(2, 5)]),
             ("LayerNormalization", {}, [rand(2, 6), rand(6), rand(6)])]
    for op, attrs, inputs in cases:
        copies = [a.copy() for a in inputs]
        ctx = Ctx(attrs, 17)
        fns[op](ctx, *inputs)
        fns[op](ctx, *inputs)
        for a, c in zip(inputs, copies):
            np.testing.assert_array_equal(a, c)
    erf = resolve("Erf", "", 13).fn
    x = rand(10)
    c = x.copy()
    erf(Ctx({}, 13), x)
    np.testing.assert_array_equal(x, c)


def _frozen(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def test_cached_checks_rerun_for_new_shapes_and_operands():
    """A cache hit must never skip a check that the new inputs would fail, nor reuse a
    value read from a different operand."""
    from nncc.errors import KernelError

    gather = resolve("Gather", "", 13).fn
    ctx = Ctx({"axis": 0}, 13)
    idx = _frozen(np.array([2]))
    np.testing.assert_array_equal(gather(ctx, np.arange(12.0).reshape(3, 4), idx), [[8, 9, 10, 11]])
    with pytest.raises(KernelError):
        gather(ctx, np.arange(4.0).reshape(1, 4), idx)  # the same constant index, now out of range

    concat = resolve("Concat", "", 13).fn
    ctx = Ctx({"axis": 0}, 13)
    assert concat(ctx, np.ones((1, 2)), np.ones((2, 2))).shape == (3, 2)
    with pytest.raises(KernelError):
        concat(ctx, np.ones((1, 2)), np.ones((2, 3)))

    pow_ = resolve("Pow", "", 15).fn
    ctx = Ctx({}, 15)
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_allclose(pow_(ctx, x, _frozen(np.float32(3))), x ** 3)
    np.testing.assert_allclose(pow_(ctx, x, np.array(2, np.float32)), x ** 2)  # a new exponent
    np.testing.assert_allclose(pow_(ctx, x, _frozen(np.float32(0.5)))[0], np.sqrt(np.float32(1.5)))

    div = resolve("Div", "", 14).fn
    ctx = Ctx({}, 14)
    four = _frozen(np.float32(4))
    np.testing.assert_array_equal(div(ctx, x, four), x / 4)
    live = np.array(4.0, np.float32)  # writable: re-checked on every call
    np.testing.assert_array_equal(div(ctx, x, live), x / 4)
    live[...] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(div(ctx, x, live), [np.inf, -np.inf])

    matmul = resolve("MatMul", "", 13).fn
    ctx = Ctx({}, 13)
    assert matmul(ctx, np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)).shape == (2, 4)
    with pytest.raises((KernelError, ValueError)):
        matmul(ctx, np.ones((2, 3), np.float32), np.ones((5, 4), np.float32))


def test_read_only_caller_inputs_whose_contents_change_are_not_cached(tmp_path):
    """Only plan constants are reused by identity. A caller may feed the same read-only
    view on every run while changing the memory behind it (a mapped file, a state buffer):
    Gather's indices and Pow's exponent must then be read again."""
    nodes = [helper.make_node("Gather", ["data", "idx"], ["g"], axis=0),
             helper.make_node("Pow", ["g", "e"], ["y"])]
    model, sess = _model(tmp_path, nodes,
                         [("data", F32, [3, 4]), ("idx", I64, [1]), ("e", F32, [])],
                         [("y", F32, [1, 4])])
    data = np.abs(rand(3, 4)) + 0.5
    idx_memory, e_memory = np.array([2], np.int64), np.array(3.0, np.float32)
    idx, e = idx_memory.view(), e_memory.view()
    idx.flags.writeable = e.flags.writeable = False  # the same read-only views every run
    for index, exponent in [(2, 3.0), (0, 3.0), (0, 0.5), (1, 2.0)]:
        idx_memory[0], e_memory[...] = index, exponent
        feeds = {"data": data, "idx": idx, "e": e}
        want = sess.run(None, feeds)[0]
        np.testing.assert_allclose(model.run(feeds)["y"], want, rtol=1e-6)


def test_executor_marks_plan_constants_for_the_kernels(tmp_path):
    nodes = [helper.make_node("Gather", ["data", "idx"], ["y"], axis=0)]
    # the portable executor's marking (the native backend generates this Gather as C)
    model, _ = _model(tmp_path, nodes, [("data", F32, [3, 4])], [("y", F32, [1, 4])],
                      inits=[("idx", np.array([1], np.int64))], backends=["numpy"])
    (step,) = [s for s in model._executor.steps if s[1].name is not None]
    ctx = step[1]
    assert ctx.is_constant(1) and not ctx.is_constant(0)
