"""nncc's own ONNX reader against the onnx package's parse of the same bytes.

Models are built with onnx.helper; the oracle for every value is onnx itself
(numpy_helper.to_array, helper.get_attribute_value, the protos' fields).
"""

from __future__ import annotations

from dataclasses import replace
import os
import pathlib

import google.protobuf.message
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from nncc.errors import FileAccessError, ModelFormatError
from nncc.frontend.onnx import MAX_GRAPH_DEPTH, MAX_RANK, load_model, parse_model
from nncc.ir.graph import CAPTURES, Graph, TensorInfo
from tests.conftest import light_models_dir

# -- a minimal, independent protobuf writer (for hand-made and corrupted messages) --------


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def f_varint(number: int, value: int) -> bytes:
    return key(number, 0) + varint(value)


def f_len(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


def f_fixed32(number: int, value: int) -> bytes:
    return key(number, 5) + value.to_bytes(4, "little")


def f_fixed64(number: int, value: int) -> bytes:
    return key(number, 1) + value.to_bytes(8, "little")


def model_bytes(graph: bytes, opsets: dict[str, int] | None = None, ir_version: int = 8) -> bytes:
    """ModelProto bytes around GraphProto bytes."""
    out = f_varint(1, ir_version) + f_len(7, graph)
    for domain, version in (opsets or {"": 13}).items():
        out += f_len(8, f_len(1, domain.encode()) + f_varint(2, version))
    return out


# Unknown fields of every wire type, with numbers no ONNX message uses.
UNKNOWN = (
    f_varint(1000, 12345)
    + f_fixed64(1001, 2**63 + 5)
    + f_len(1002, b"\x00\xffjunk")
    + f_fixed32(1003, 7)
    + f_len(1004, b"")
)

# -- oracle comparisons ---------------------------------------------------------------------

ALL_DTYPES = [
    np.float16, np.float32, np.float64,
    np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64,
    np.bool_, np.complex64, np.complex128,
]


def onnx_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype == object:
        assert got.tolist() == want.tolist()
    else:
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc")
        # bit-exact, so NaN payloads and -0.0 survive too
        assert got.tobytes() == want.tobytes()


def expected_info(vi: onnx.ValueInfoProto) -> TensorInfo:
    return expected_type(vi.type)


def expected_type(tp: onnx.TypeProto) -> TensorInfo:
    """What nncc should read from a TypeProto: a sequence or an optional keeps only its
    element dtype and its kind."""
    which = tp.WhichOneof("value")
    if which in ("sequence_type", "optional_type"):
        element = expected_type(getattr(tp, which).elem_type)
        if which == "sequence_type":
            kind = "sequence"
        else:
            kind = "optional_sequence" if element.kind == "sequence" else "optional_tensor"
        return TensorInfo(element.dtype, None, kind=kind)
    if which != "tensor_type":
        return TensorInfo(None, None)
    tt = tp.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else None
    except (KeyError, ValueError):
        dtype = None
    if dtype is not None and dtype.kind in "SU":
        dtype = np.dtype(object)
    if dtype is not None and dtype not in [np.dtype(d) for d in ALL_DTYPES + [object]]:
        # bfloat16, float8, int4...: ml_dtypes types; only float6 is not represented
        dtype = None if tt.elem_type >= TensorProto.FLOAT6E2M3 else dtype
    if not tt.HasField("shape"):
        return TensorInfo(dtype, None)
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value if d.dim_value >= 0 else None)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param or None)
        else:
            dims.append(None)
    return TensorInfo(dtype, tuple(dims))


def assert_same_info(got: TensorInfo, want: TensorInfo) -> None:
    assert got.kind == want.kind
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.value is None


def assert_same_attr(got, attr: onnx.AttributeProto) -> None:
    want = helper.get_attribute_value(attr)
    kind = attr.type
    A = onnx.AttributeProto
    if kind == A.FLOAT:
        assert isinstance(got, float)
        assert np.float32(got).tobytes() == np.float32(want).tobytes()
    elif kind == A.INT:
        assert got == want and isinstance(got, int)
    elif kind == A.STRING:
        assert got == want.decode("utf-8", "surrogateescape")
    elif kind == A.TENSOR:
        assert_same_array(got, numpy_helper.to_array(want))
    elif kind == A.GRAPH:
        assert_same_graph(got, want, top=False)
    elif kind == A.FLOATS:
        assert np.array(got, np.float32).tobytes() == np.array(want, np.float32).tobytes()
    elif kind == A.INTS:
        assert got == list(want) and all(isinstance(x, int) for x in got)
    elif kind == A.STRINGS:
        assert got == [s.decode("utf-8", "surrogateescape") for s in want]
    elif kind == A.TENSORS:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_array(g, numpy_helper.to_array(w))
    elif kind == A.GRAPHS:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_graph(g, w, top=False)
    else:  # pragma: no cover - the test only builds the kinds above
        raise AssertionError(kind)


def assert_same_graph(got: Graph, want: onnx.GraphProto, base_dir: str | None = None, top: bool = True) -> None:
    """``top``: the model's own graph, whose inputs' unnamed axes are named INPUT:AXIS (a
    subgraph's inputs are sized by their operator and stay unknown)."""
    assert got.name == want.name
    init_names = [t.name for t in want.initializer]
    feeds = [vi.name for vi in want.input if vi.name not in init_names]
    assert got.inputs == feeds
    assert got.outputs == [vi.name for vi in want.output]
    for vi in list(want.value_info) + list(want.input) + list(want.output):
        if vi.name not in init_names:
            want_info = expected_info(vi)
            if top and vi.name in feeds and want_info.shape is not None:
                want_info = replace(want_info, shape=tuple(f"{vi.name}:{axis}" if d is None else d
                                                           for axis, d in enumerate(want_info.shape)))
            assert_same_info(got.values[vi.name], want_info)
    assert list(got.initializers) == list(dict.fromkeys(init_names))
    for t in want.initializer:
        want_array = numpy_helper.to_array(t, base_dir or "")
        assert_same_array(got.initializers[t.name], want_array)
        assert got.values[t.name].dtype == want_array.dtype
        assert got.values[t.name].shape == want_array.shape
    assert len(got.nodes) == len(want.node)
    for node, proto in zip(got.nodes, want.node):
        assert node.op_type == proto.op_type
        assert node.domain == ("" if proto.domain == "ai.onnx" else proto.domain)
        # outer values read by the node's subgraphs become trailing inputs (checked by
        # test_subgraph_captures_become_inputs)
        captures = node.attrs.get(CAPTURES, [])
        assert node.inputs == list(proto.input) + captures
        assert node.outputs == list(proto.output)
        assert node.name == proto.name
        assert list(node.attrs) == [a.name for a in proto.attribute] + ([CAPTURES] if captures else [])
        for attr in proto.attribute:
            assert_same_attr(node.attrs[attr.name], attr)


def check_model(model: onnx.ModelProto) -> Graph:
    """Parse the serialized model with nncc and compare everything against onnx."""
    graph = parse_model(model.SerializeToString())
    assert_same_graph(graph, model.graph)
    want_opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    want_opsets.setdefault("", 1)
    assert graph.opsets == want_opsets
    return graph


def make_model(nodes=(), inputs=(), outputs=None, initializers=(), value_info=(), opsets=None,
               name="g") -> onnx.ModelProto:
    if outputs is None:
        outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])]
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers),
                              value_info=list(value_info))
    opsets = opsets if opsets is not None else [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=opsets)


def sample(dtype, shape=(2, 3), seed=0) -> np.ndarray:
    """Values including each dtype's extremes (and NaN/inf/-0.0 for floats)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        values = rng.random(size) < 0.5
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)
        specials = np.array([info.min, info.max, 0, 1], dtype=dtype)[:size]
        values[: len(specials)] = specials
    elif dtype.kind == "f":
        values = rng.standard_normal(size).astype(dtype) * 1000
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(dtype).max,
                             np.finfo(dtype).tiny], dtype=dtype)[:size]
        values[: len(specials)] = specials
    else:
        real = rng.standard_normal(size) * 100
        values = (real + 1j * rng.standard_normal(size)).astype(dtype)
        if size:
            values[0] = complex(np.nan, -0.0)
    return values.reshape(shape)


# -- graph inputs, outputs and value_info -----------------------------------------------------


def test_graph_io_and_value_info_shapes():
    inputs = [
        helper.make_tensor_value_info("static", TensorProto.FLOAT, [1, 3, 224, 224]),
        helper.make_tensor_value_info("symbolic", TensorProto.INT64, ["batch", "seq", 7]),
        helper.make_tensor_value_info("unknown_dims", TensorProto.DOUBLE, [None, 2, None]),
        helper.make_tensor_value_info("unknown_rank", TensorProto.FLOAT16, None),
        helper.make_tensor_value_info("scalar", TensorProto.BOOL, []),
        helper.make_tensor_value_info("zero_dim", TensorProto.UINT8, [0, 4]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]),  # also an initializer
    ]
    # Empty dim_param and negative dim_value are read as unknown.
    odd = helper.make_tensor_value_info("odd", TensorProto.INT32, [1, 1])
    odd.type.tensor_type.shape.dim[0].dim_param = ""
    odd.type.tensor_type.shape.dim[1].dim_value = -1
    inputs.append(odd)
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1000]),
        helper.make_tensor_value_info("z", TensorProto.STRING, [3]),
        helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, [2]),
    ]
    value_info = [
        helper.make_tensor_value_info("mid", TensorProto.COMPLEX128, ["n", None]),
        helper.make_tensor_value_info("bf", TensorProto.BFLOAT16, [2]),  # an ml_dtypes dtype
        helper.make_tensor_value_info("f6", TensorProto.FLOAT6E2M3, [2]),  # not represented
        helper.make_value_info("notype", onnx.TypeProto()),
    ]
    init = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")
    model = make_model([helper.make_node("Relu", ["static"], ["y"])], inputs, outputs, [init],
                       value_info)
    graph = check_model(model)
    assert graph.inputs == ["static", "symbolic", "unknown_dims", "unknown_rank", "scalar",
                            "zero_dim", "odd"]
    assert graph.values["symbolic"] == TensorInfo(np.dtype(np.int64), ("batch", "seq", 7))
    # an input's axis without a name is a dimension of its own, named INPUT:AXIS
    assert graph.values["unknown_dims"].shape == ("unknown_dims:0", 2, "unknown_dims:2")
    assert graph.values["unknown_rank"] == TensorInfo(np.dtype(np.float16), None)
    assert graph.values["scalar"].shape == ()
    assert graph.values["odd"].shape == ("odd:0", "odd:1")
    assert graph.values["z"].dtype == np.dtype(object)
    assert graph.values["seq_out"] == TensorInfo(np.dtype(np.float32), None, kind="sequence")
    assert graph.values["bf"] == TensorInfo(np.dtype(ml_dtypes.bfloat16), (2,))
    assert graph.values["f6"] == TensorInfo(None, (2,))
    assert graph.values["notype"] == TensorInfo(None, None)
    assert graph.values["w"] == TensorInfo(np.dtype(np.float32), (2,))


@pytest.mark.parametrize("dtype", ALL_DTYPES + [np.str_], ids=lambda d: np.dtype(d).name)
def test_value_info_every_dtype(dtype):
    code = TensorProto.STRING if dtype is np.str_ else onnx_type(dtype)
    vi = helper.make_tensor_value_info("x", code, [2, "n"])
    graph = check_model(make_model([], [vi], [vi]))
    want = np.dtype(object) if dtype is np.str_ else np.dtype(dtype)
    assert graph.values["x"] == TensorInfo(want, (2, "n"))


# -- nodes ---------------------------------------------------------------------------------------


def test_nodes_fields_and_domains():
    nodes = [
        helper.make_node("Conv", ["x", "w", ""], ["c"], name="conv0"),  # omitted optional bias
        helper.make_node("Resize", ["c", "", "scales"], ["r"], name=""),
        helper.make_node("Relu", ["r"], ["y"], domain="ai.onnx", name="relu ünïcode"),
        helper.make_node("FusedThing", ["y"], ["a", "", "b"], domain="com.microsoft", name="f"),
        helper.make_node("Split", [], [""], name="no inputs"),
    ]
    model = make_model(nodes, opsets=[helper.make_opsetid("", 18),
                                      helper.make_opsetid("com.microsoft", 1)])
    graph = check_model(model)
    assert graph.nodes[0].inputs == ["x", "w", ""]
    assert graph.nodes[1].inputs == ["c", "", "scales"]
    assert graph.nodes[2].domain == ""
    assert graph.nodes[3].domain == "com.microsoft" and graph.nodes[3].outputs == ["a", "", "b"]
    assert graph.nodes[2].name == "relu ünïcode"


def test_node_without_op_type_is_rejected():
    node = f_len(1, b"x") + f_len(2, b"y")
    with pytest.raises(ModelFormatError, match="op_type"):
        parse_model(model_bytes(f_len(1, node)))


def test_opset_imports_several_domains():
    opsets = [
        helper.make_opsetid("", 19),
        helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid("ai.onnx.ml", 3),
        helper.make_opsetid("org.example.custom", 42),
    ]
    graph = check_model(make_model(opsets=opsets))
    assert graph.opset("") == 19 and graph.opset("ai.onnx") == 19
    assert graph.opset("com.microsoft") == 1
    assert graph.opset("ai.onnx.ml") == 3
    assert graph.opset("org.example.custom") == 42


def test_opset_domain_ai_onnx_is_default():
    graph = parse_model(model_bytes(b"", {"ai.onnx": 11, "x.y": 2}))
    assert graph.opsets == {"": 11, "x.y": 2}


def test_missing_default_opset_means_version_1():
    graph = parse_model(model_bytes(b"", {"com.x": 2}))
    assert graph.opsets == {"com.x": 2, "": 1}


# -- attributes ---------------------------------------------------------------------------------


def _subgraph(name: str, op: str = "Relu") -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node(op, ["sx"], ["sy"], name=f"{name}_n")],
        name,
        [helper.make_tensor_value_info("sx", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("sy", TensorProto.FLOAT, ["n"])],
        [numpy_helper.from_array(np.array([3, 4], np.int64), f"{name}_init")],
    )


def test_every_attribute_kind():
    A = onnx.AttributeProto
    t = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "t")
    attrs = dict(
        f=1.25,
        f_nan=float("nan"),
        f_neg_zero=-0.0,
        i=-7,
        i_big=2**63 - 1,
        i_small=-(2**63),
        s=b"hello",
        s_utf8="héllo ✓".encode(),
        s_binary=b"\xff\xfe\x00",
        t=t,
        t_scalar=numpy_helper.from_array(np.array(5, np.int32)),
        g=_subgraph("then"),
        floats=[1.0, -2.5, 3e38, float("inf")],
        ints=[1, -1, 0, 2**40, -(2**63)],
        strings=[b"a", b"", "ü".encode()],
        tensors=[t, numpy_helper.from_array(np.array([True, False])),
                 helper.make_tensor("st", TensorProto.STRING, [2], [b"x", b"yz"])],
        graphs=[_subgraph("a"), _subgraph("b", "Sigmoid")],
    )
    node = helper.make_node("Custom", ["x"], ["y"], domain="my.domain", **attrs)
    node.attribute.extend([
        helper.make_attribute("empty_floats", [], attr_type=A.FLOATS),
        helper.make_attribute("empty_ints", [], attr_type=A.INTS),
        helper.make_attribute("empty_strings", [], attr_type=A.STRINGS),
        helper.make_attribute("empty_tensors", [], attr_type=A.TENSORS),
        helper.make_attribute("empty_graphs", [], attr_type=A.GRAPHS),
    ])
    kinds = {a.type for a in node.attribute}
    assert kinds == {A.FLOAT, A.INT, A.STRING, A.TENSOR, A.GRAPH, A.FLOATS, A.INTS, A.STRINGS,
                     A.TENSORS, A.GRAPHS}
    graph = check_model(make_model([node], opsets=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("my.domain", 1)]))
    got = graph.nodes[0].attrs
    assert got["i_small"] == -(2**63)
    assert got["s_binary"].encode("utf-8", "surrogateescape") == b"\xff\xfe\x00"
    assert isinstance(got["g"], Graph) and got["g"].nodes[0].op_type == "Relu"
    assert got["g"].opsets == graph.opsets  # subgraphs see the model's opsets
    assert [g.name for g in got["graphs"]] == ["a", "b"]
    assert got["empty_ints"] == [] and got["empty_graphs"] == []


def test_sequence_and_optional_types_keep_their_element_dtype():
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.INT64, [2])
    opt = helper.make_value_info("opt", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.DOUBLE, [3])))
    opt_seq = helper.make_value_info("opt_seq", helper.make_optional_type_proto(
        helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))))
    graph = check_model(make_model([], [seq, opt, opt_seq], [opt_seq]))
    assert graph.values["seq"] == TensorInfo(np.dtype(np.int64), None, kind="sequence")
    assert graph.values["opt"] == TensorInfo(np.dtype(np.float64), None, kind="optional_tensor")
    assert graph.values["opt_seq"] == TensorInfo(np.dtype(np.float32), None, kind="optional_sequence")


def test_subgraph_captures_become_inputs():
    """A subgraph reading outer values (also through a nested subgraph) makes them explicit
    trailing inputs of its node, in first-use order, named by the __captures__ attribute."""
    inner = helper.make_graph(
        [helper.make_node("Add", ["a", "outer2"], ["s"])], "inner", [],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)])
    body = helper.make_graph(
        [helper.make_node("Mul", ["outer1", "local"], ["a"]),
         helper.make_node("If", ["c"], ["r"], then_branch=inner, else_branch=inner)],
        "body", [helper.make_tensor_value_info("local", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("outer1", TensorProto.FLOAT, None)])
    node = helper.make_node("Custom", ["x"], ["y"], domain="my.domain", body=body)
    graph = parse_model(make_model([node], opsets=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("my.domain", 1)])
                        .SerializeToString())
    got = graph.nodes[0]
    assert got.inputs == ["x", "outer1", "c", "outer2"]
    assert got.attrs[CAPTURES] == ["outer1", "c", "outer2"]
    nested = got.attrs["body"].nodes[1]
    assert nested.inputs == ["c", "a", "outer2"] and nested.attrs[CAPTURES] == ["a", "outer2"]


def test_reserved_captures_attribute_is_rejected():
    node = helper.make_node("Relu", ["x"], ["y"], **{CAPTURES: [1]})
    with pytest.raises(ModelFormatError, match="reserved"):
        parse_model(make_model([node]).SerializeToString())


def test_attribute_packed_ints_and_floats():
    """onnx writes repeated attribute scalars unpacked; other writers may pack them."""
    packed_ints = b"".join(varint(v) for v in [1, -1, 300, 2**63 - 1])
    packed_floats = np.array([1.5, -2.0, np.inf], "<f4").tobytes()
    attr_i = f_len(1, b"ints") + f_varint(20, 7) + f_len(8, packed_ints) + f_varint(8, 5)
    attr_f = f_len(1, b"floats") + f_varint(20, 6) + f_len(7, packed_floats) + \
        f_fixed32(7, int.from_bytes(np.float32(0.5).tobytes(), "little"))
    node = f_len(4, b"Custom") + f_len(5, attr_i) + f_len(5, attr_f)
    attrs = parse_model(model_bytes(f_len(1, node))).nodes[0].attrs
    assert attrs["ints"] == [1, -1, 300, 2**63 - 1, 5]
    assert attrs["floats"] == [1.5, -2.0, float("inf"), 0.5]


def test_attribute_without_type_is_inferred():
    """Very old writers leave AttributeProto.type out."""
    cases = {
        b"f": (f_fixed32(2, int.from_bytes(np.float32(2.5).tobytes(), "little")), 2.5),
        b"i": (f_varint(3, 9), 9),
        b"s": (f_len(4, b"txt"), "txt"),
        b"ints": (f_varint(8, 1) + f_varint(8, 2), [1, 2]),
        b"strings": (f_len(9, b"a") + f_len(9, b"b"), ["a", "b"]),
    }
    node = f_len(4, b"Custom") + b"".join(f_len(5, f_len(1, n) + body) for n, (body, _) in cases.items())
    attrs = parse_model(model_bytes(f_len(1, node))).nodes[0].attrs
    assert attrs == {n.decode(): want for n, (_, want) in cases.items()}


def test_attribute_errors():
    def parse_attr(body: bytes):
        return parse_model(model_bytes(f_len(1, f_len(4, b"Op") + f_len(5, body))))

    with pytest.raises(ModelFormatError, match="no name"):
        parse_attr(f_varint(3, 1) + f_varint(20, 2))
    with pytest.raises(ModelFormatError, match="unknown type"):
        parse_attr(f_len(1, b"a") + f_varint(20, 99))
    with pytest.raises(ModelFormatError, match="does not carry"):
        parse_attr(f_len(1, b"a") + f_varint(20, 4))  # TENSOR without t
    with pytest.raises(ModelFormatError, match="function attribute"):
        parse_attr(f_len(1, b"a") + f_varint(20, 2) + f_len(21, b"outer"))
    with pytest.raises(ModelFormatError):
        parse_attr(f_len(1, b"a") + f_varint(20, 1) + f_varint(2, 1))  # f as a varint


def test_attribute_sparse_and_type_protos_are_skipped():
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], np.float32), "v"),
        numpy_helper.from_array(np.array([0], np.int64), "i"), [3])
    node = helper.make_node("Custom", [], ["y"], sp=sparse, keep=3)
    graph = parse_model(make_model([node]).SerializeToString())
    assert graph.nodes[0].attrs == {"keep": 3}


# -- initializers ---------------------------------------------------------------------------------


TYPED_FIELD = {
    np.float32: "float_data", np.complex64: "float_data",
    np.float64: "double_data", np.complex128: "double_data",
    np.int64: "int64_data",
    np.uint32: "uint64_data", np.uint64: "uint64_data",
}


@pytest.mark.parametrize("shape", [(2, 3), (), (0,), (2, 0, 3), (7,)], ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_initializer_raw_data(dtype, shape):
    array = sample(dtype, shape)
    t = numpy_helper.from_array(array, "w")
    assert t.HasField("raw_data") or array.size == 0
    graph = check_model(make_model(initializers=[t]))
    assert_same_array(graph.initializers["w"], array)


@pytest.mark.parametrize("shape", [(2, 3), (), (0,), (2, 0, 3), (7,)], ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_initializer_typed_fields(dtype, shape):
    array = sample(dtype, shape, seed=1)
    t = helper.make_tensor("w", onnx_type(dtype), shape, array.flatten(), raw=False)
    assert not t.HasField("raw_data")
    field = TYPED_FIELD.get(dtype, "int32_data")
    if array.size:
        assert len(getattr(t, field)) == array.size * (2 if np.dtype(dtype).kind == "c" else 1)
    graph = check_model(make_model(initializers=[t]))
    assert_same_array(graph.initializers["w"], array)


@pytest.mark.parametrize("shape", [(3,), (), (0,), (2, 2)], ids=str)
def test_initializer_string_data(shape):
    values = [b"abc", b"", "ünï".encode(), b"\x00\xff"][: int(np.prod(shape))]
    t = helper.make_tensor("s", TensorProto.STRING, shape, values)
    graph = parse_model(make_model(initializers=[t]).SerializeToString())
    got = graph.initializers["s"]
    assert got.dtype == object and got.shape == shape
    # str like onnx's to_array gives; bytes that are not UTF-8 survive as surrogates
    assert got.flatten().tolist() == [v.decode("utf-8", "surrogateescape") for v in values]
    assert all(type(v) is str for v in got.flatten())
    if b"\x00\xff" not in values:
        assert_same_array(got, numpy_helper.to_array(t))


def test_initializer_typed_packed_and_unpacked_mix():
    """float_data packed in several chunks plus unpacked values concatenate in order."""
    chunk1 = np.arange(100, dtype="<f4")  # large chunk: kept as its own array
    chunk2 = np.array([7.5], "<f4")  # small chunk: merged with unpacked scalars
    single = int.from_bytes(np.float32(-1.0).tobytes(), "little")
    tensor = (f_varint(1, 102) + f_varint(2, TensorProto.FLOAT) + f_len(8, b"w")
              + f_len(4, chunk1.tobytes()) + f_fixed32(4, single) + f_len(4, chunk2.tobytes()))
    graph = parse_model(model_bytes(f_len(5, tensor)))
    want = np.concatenate([chunk1, [-1.0], chunk2]).astype(np.float32)
    assert_same_array(graph.initializers["w"], want)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint64, np.uint32,
                                   np.float32, np.float64, np.float16, np.bool_, np.complex64],
                         ids=lambda d: np.dtype(d).name)
def test_initializer_large_typed_arrays(dtype):
    """Large packed fields take the vectorized path (small ones are decoded one by one)."""
    array = sample(dtype, (40, 25), seed=3)
    t = helper.make_tensor("w", onnx_type(dtype), array.shape, array.flatten(), raw=False)
    graph = check_model(make_model(initializers=[t]))
    assert_same_array(graph.initializers["w"], array)


def test_initializer_dims_unpacked_and_packed():
    data = np.arange(6, dtype="<i4").tobytes()
    for dims in (f_varint(1, 2) + f_varint(1, 3), f_len(1, varint(2) + varint(3))):
        tensor = dims + f_varint(2, TensorProto.INT32) + f_len(8, b"w") + f_len(9, data)
        graph = parse_model(model_bytes(f_len(5, tensor)))
        assert graph.initializers["w"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_initializer_is_not_a_graph_input():
    t = numpy_helper.from_array(np.ones(2, np.float32), "w")
    vi = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = check_model(make_model(inputs=[x, vi], initializers=[t]))
    assert graph.inputs == ["x"]
    assert graph.values["w"].value is None


def test_constant_node_tensor_attribute():
    node = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        np.array([[1, 2], [3, 4]], np.int64)))
    graph = check_model(make_model([node]))
    assert graph.nodes[0].attrs["value"].tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("bad, match", [
    (dict(data_type=TensorProto.FLOAT6E2M3), "float6e2m3"),
    (dict(data_type=TensorProto.FLOAT6E3M2), "float6e3m2"),
    (dict(data_type=0), "undefined"),
    (dict(data_type=12345), "12345"),
])
def test_initializer_unrepresentable_dtype(bad, match):
    t = TensorProto(name="w", dims=[2], **bad)
    t.raw_data = b"\0" * 4
    with pytest.raises(ModelFormatError, match=match):
        parse_model(make_model(initializers=[t]).SerializeToString())


def test_initializer_errors():
    def parse_tensor(body: bytes):
        return parse_model(model_bytes(f_len(5, body)))

    f32 = f_varint(2, TensorProto.FLOAT)
    with pytest.raises(ModelFormatError, match="raw data"):
        parse_tensor(f_varint(1, 3) + f32 + f_len(8, b"w") + f_len(9, b"\0" * 8))
    with pytest.raises(ModelFormatError, match="values for"):
        parse_tensor(f_varint(1, 3) + f32 + f_len(8, b"w") + f_len(4, b"\0" * 8))
    with pytest.raises(ModelFormatError, match="negative"):
        parse_tensor(f_varint(1, -2) + f32 + f_len(8, b"w"))
    with pytest.raises(ModelFormatError, match="no name"):
        parse_tensor(f_varint(1, 1) + f32 + f_len(9, b"\0" * 4))
    with pytest.raises(ModelFormatError, match="segment"):
        parse_tensor(f32 + f_len(8, b"w") + f_len(3, f_varint(1, 0) + f_varint(2, 1)))
    with pytest.raises(ModelFormatError, match="multiple of 4"):
        parse_tensor(f_varint(1, 1) + f32 + f_len(8, b"w") + f_len(4, b"\0" * 5))
    with pytest.raises(ModelFormatError, match="wire type"):
        parse_tensor(f_fixed32(1, 1) + f32 + f_len(8, b"w"))
    with pytest.raises(ModelFormatError, match="strings"):
        parse_tensor(f_varint(1, 2) + f_varint(2, TensorProto.STRING) + f_len(8, b"s")
                     + f_len(6, b"only one"))
    with pytest.raises(ModelFormatError, match="raw_data"):
        parse_tensor(f_varint(1, 1) + f_varint(2, TensorProto.STRING) + f_len(8, b"s")
                     + f_len(9, b"abcd"))


def test_sparse_initializer_is_rejected():
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], np.float32), "v"),
        numpy_helper.from_array(np.array([0], np.int64), "i"), [3])
    model = make_model()
    model.graph.sparse_initializer.append(sparse)
    with pytest.raises(ModelFormatError, match="sparse"):
        parse_model(model.SerializeToString())


@pytest.mark.parametrize("dims", [[2**40, 2**40], [0, 2**62, 2**62], [2**62, 2**62, 0]], ids=str)
@pytest.mark.parametrize("storage", ["none", "raw", "typed"])
def test_huge_dims_fail_fast(dims, storage):
    body = b"".join(f_varint(1, d) for d in dims) + f_varint(2, TensorProto.FLOAT) + f_len(8, b"w")
    if storage == "raw":
        body += f_len(9, b"\0" * 16)
    elif storage == "typed":
        body += f_len(4, b"\0" * 16)
    with pytest.raises(ModelFormatError):
        parse_model(model_bytes(f_len(5, body)))


def test_too_many_dims():
    ok = b"".join(f_varint(1, 1) for _ in range(MAX_RANK)) + f_varint(2, 1) + f_len(8, b"w") + \
        f_len(9, b"\0" * 4)
    assert parse_model(model_bytes(f_len(5, ok))).initializers["w"].ndim == MAX_RANK
    for extra, data in ((b"", b"\0" * 4), (b"", b""), (b"", None)):
        dims = b"".join(f_varint(1, 1) for _ in range(MAX_RANK + 1))
        body = dims + f_varint(2, 1) + f_len(8, b"w") + (f_len(9, data) if data is not None else b"")
        with pytest.raises(ModelFormatError, match="dimensions"):
            parse_model(model_bytes(f_len(5, body)))
    zero = b"".join(f_varint(1, 0) for _ in range(70)) + f_varint(2, 1) + f_len(8, b"w")
    with pytest.raises(ModelFormatError, match="dimensions"):
        parse_model(model_bytes(f_len(5, zero)))


# -- external data ---------------------------------------------------------------------------------


def _external_model(tmp_path: pathlib.Path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    arrays = {f"w_{np.dtype(d).name}": sample(d, (3, 5), seed=i) for i, d in enumerate(ALL_DTYPES)}
    arrays["scalar"] = np.array(3.5, np.float64)
    arrays["empty"] = np.zeros((0, 4), np.float32)
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        np.arange(12, dtype=np.int32).reshape(3, 4), "cval"))
    return make_model([const], initializers=inits), arrays


def test_external_data_roundtrip(tmp_path):
    model, arrays = _external_model(tmp_path)
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    stored = onnx.load_model(str(path), load_external_data=False)
    locations = [t for t in stored.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert len(locations) >= len(arrays) - 1  # everything non-empty went out of the file
    keys = {e.key for t in locations for e in t.external_data}
    assert {"location", "offset", "length"} <= keys
    assert any(int(e.value) > 0 for t in locations for e in t.external_data if e.key == "offset")

    graph = load_model(path)
    for name, array in arrays.items():
        assert_same_array(graph.initializers[name], array)
    # and against onnx's own loader, including the Constant's tensor attribute
    full = onnx.load_model(str(path))
    assert_same_graph(graph, full.graph, base_dir=str(tmp_path))
    # a path given as str, and relative to the working directory, work too
    assert set(load_model(str(path)).initializers) == set(arrays)
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert set(load_model("model.onnx").initializers) == set(arrays)
    finally:
        os.chdir(cwd)


def test_external_data_in_subfolder_and_without_length(tmp_path):
    (tmp_path / "data").mkdir()
    array = np.arange(10, dtype=np.float32)
    (tmp_path / "data" / "w.bin").write_bytes(b"PAD!" + array.tobytes())
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "data/w.bin"), ("offset", "4")):
        e = t.external_data.add()
        e.key, e.value = k, v
    (tmp_path / "m.onnx").write_bytes(make_model(initializers=[t]).SerializeToString())
    assert_same_array(load_model(tmp_path / "m.onnx").initializers["w"], array)


def _external_tensor(location: str, offset: int | None = 0, length: int | None = 16, dims=(4,)):
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims))
    t.data_location = TensorProto.EXTERNAL
    entries = [("location", location)]
    if offset is not None:
        entries.append(("offset", str(offset)))
    if length is not None:
        entries.append(("length", str(length)))
    for k, v in entries:
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _write_external(tmp_path, tensor, name="m.onnx") -> pathlib.Path:
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    path = tmp_path / name
    path.write_bytes(make_model(initializers=[tensor]).SerializeToString())
    return path


def test_external_data_ok_baseline(tmp_path):
    path = _write_external(tmp_path, _external_tensor("w.bin"))
    assert load_model(path).initializers["w"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("location", [
    "../w.bin", "../../etc/passwd", "sub/../../w.bin", "..\\w.bin", "/etc/passwd", "/tmp/w.bin",
])
def test_external_data_cannot_leave_model_folder(tmp_path, location):
    (tmp_path / "sub").mkdir()
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    path = _write_external(tmp_path / "sub", _external_tensor(location))
    with pytest.raises(ModelFormatError, match="leaves the model folder"):
        load_model(path)


def test_external_data_symlink_out_of_folder(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 16)
    (tmp_path / "m").mkdir()
    try:
        os.symlink(outside, tmp_path / "m" / "link.bin")
    except (OSError, NotImplementedError):
        pytest.skip("symlinks unavailable")
    path = _write_external(tmp_path / "m", _external_tensor("link.bin"))
    with pytest.raises(ModelFormatError, match="leaves the model folder"):
        load_model(path)


def test_external_data_missing_file(tmp_path):
    path = _write_external(tmp_path, _external_tensor("nope.bin"))
    with pytest.raises(FileAccessError, match="nope.bin"):
        load_model(path)


@pytest.mark.parametrize("offset, length", [
    (0, 20), (4, 16), (17, 0), (-4, 16), (0, -1), (2**70, 16), (16, None), (20, None),
])
def test_external_data_range_outside_file(tmp_path, offset, length):
    path = _write_external(tmp_path, _external_tensor("w.bin", offset, length))
    with pytest.raises(ModelFormatError):
        load_model(path)


@pytest.mark.parametrize("entries, match", [
    (dict(location="w.bin", length="12"), "expected 16"),  # fits the file, not the dims
    (dict(location="w.bin", offset="zero"), "not a number"),
    (dict(location="w.bin", length="9" * 5000), "not a number"),
    (dict(offset="0"), "no location"),
    (dict(location=""), "no location"),
    (dict(location="w\0.bin"), "NUL"),
    (dict(location="."), "not a regular file"),
    (dict(location="sub"), "not a regular file"),
])
def test_external_data_bad_entries(tmp_path, entries, match):
    (tmp_path / "sub").mkdir()
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in entries.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    path = _write_external(tmp_path, t)
    with pytest.raises(ModelFormatError, match=match):
        load_model(path)


def test_external_data_needs_a_folder():
    model = make_model(initializers=[_external_tensor("w.bin")])
    with pytest.raises(ModelFormatError, match="no folder"):
        parse_model(model.SerializeToString())


# -- unknown fields ------------------------------------------------------------------------------------


def _rich_model() -> onnx.ModelProto:
    """One model touching every message type the reader looks into."""
    then = _subgraph("then")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=_subgraph("else"),
                         name="if"),
        helper.make_node("Custom", ["r", ""], ["z"], domain="my.domain", f=0.5, ints=[1, 2],
                         s=b"s", strings=[b"a"], t=numpy_helper.from_array(np.ones(2, np.float16)),
                         tensors=[numpy_helper.from_array(np.ones(1, np.int8))],
                         graphs=[_subgraph("g0")], i=4, floats=[1.0]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]),
               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)]
    inits = [numpy_helper.from_array(np.arange(4, dtype=np.int64), "raw_i64"),
             helper.make_tensor("typed_f32", TensorProto.FLOAT, [2], [1.0, 2.0]),
             helper.make_tensor("typed_str", TensorProto.STRING, [1], [b"q"])]
    value_info = [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", 3])]
    model = make_model(nodes, inputs, outputs, inits, value_info,
                       opsets=[helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 2)])
    model.doc_string = "doc"
    model.producer_name = "test"
    helper.set_model_props(model, {"k": "v"})
    return model


def _all_messages(message):
    """Every sub-message of an onnx proto, depth first."""
    yield message
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        items = [value] if isinstance(value, google.protobuf.message.Message) else value
        for item in items:
            yield from _all_messages(item)


def test_unknown_fields_appended_to_model_bytes():
    model = _rich_model()
    data = model.SerializeToString()
    for junk in (UNKNOWN, f_varint(999, 1), f_len(7777, b"x" * 100)):
        graph = parse_model(data + junk)
        assert_same_graph(graph, model.graph)


def test_unknown_fields_in_every_nested_message():
    model = _rich_model()
    count = 0
    for message in reversed(list(_all_messages(model))):  # children first
        message.ParseFromString(message.SerializeToString() + UNKNOWN)
        count += 1
    data = model.SerializeToString()
    assert data.count(UNKNOWN[:4]) >= count > 30  # protobuf kept them all
    graph = check_model(model)
    assert graph.nodes[2].attrs["ints"] == [1, 2]


@pytest.mark.parametrize("message_kind", ["graph", "node", "attribute", "tensor", "value_info",
                                          "type", "shape", "dim", "opset", "external"])
def test_unknown_field_numbers_reusing_wire_types(message_kind, tmp_path):
    """A field number ONNX may add later, in each wire type, inside each message kind."""
    model = _rich_model()
    targets = {
        "graph": model.graph,
        "node": model.graph.node[2],
        "attribute": model.graph.node[2].attribute[0],
        "tensor": model.graph.initializer[1],
        "value_info": model.graph.input[0],
        "type": model.graph.input[0].type,
        "shape": model.graph.input[0].type.tensor_type.shape,
        "dim": model.graph.input[0].type.tensor_type.shape.dim[0],
        "opset": model.opset_import[0],
    }
    if message_kind == "external":
        t = _external_tensor("w.bin")
        for e in t.external_data:
            e.ParseFromString(e.SerializeToString() + UNKNOWN)
        model.graph.initializer.append(t)
        (tmp_path / "w.bin").write_bytes(np.zeros(4, np.float32).tobytes())
    else:
        target = targets[message_kind]
        target.ParseFromString(target.SerializeToString() + UNKNOWN)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    graph = load_model(tmp_path / "m.onnx")
    assert_same_graph(graph, onnx.load_model(str(tmp_path / "m.onnx")).graph, str(tmp_path))


# -- whole models and files ---------------------------------------------------------------------------


LIGHT_MODELS = sorted(light_models_dir().glob("*.onnx"))


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.stem)
def test_light_models_match_onnx(path):
    graph = load_model(path)
    model = onnx.load_model(str(path))
    assert_same_graph(graph, model.graph, str(path.parent))
    want_opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    assert graph.opsets == {"": 1, **want_opsets}


def test_light_models_found():
    assert len(LIGHT_MODELS) >= 5


def test_parse_accepts_bytes_bytearray_memoryview():
    data = _rich_model().SerializeToString()
    for form in (data, bytearray(data), memoryview(data)):
        assert len(parse_model(form).nodes) == 3


@pytest.mark.parametrize("data, match", [
    (b"", "empty"),
    (b"hello world\n", None),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 16, None),
    (f_varint(1, 8), "no graph"),  # IR version only
    (f_len(7, b""), "no graph or IR version"),  # graph only
    (f_varint(1, 8) + f_varint(7, 3), "length-delimited"),  # graph as a varint
    (f_varint(1, 8) + key(7, 2) + varint(2**62) + b"x", "claims"),
    (f_varint(1, 8) + key(7, 3), "wire type"),  # groups
    (b"\x08" + b"\xff" * 11, "varint"),
    (b"\x08", "truncated"),
    (b"\x0d\x01", "fixed32"),
    (b"\x09\x01", "fixed64"),
    (b"\x00\x01", "field number 0"),
])
def test_not_a_model(data, match):
    with pytest.raises(ModelFormatError, match=match):
        parse_model(data)


def test_load_model_file_errors(tmp_path):
    with pytest.raises(FileAccessError, match="missing.onnx"):
        load_model(tmp_path / "missing.onnx")
    with pytest.raises(FileAccessError, match="directory"):
        load_model(tmp_path)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelFormatError, match="bad.onnx"):
        load_model(bad)


def test_subgraph_nesting_limit():
    def nested(levels: int) -> bytes:
        graph = f_len(1, f_len(4, b"Relu") + f_len(1, b"x") + f_len(2, b"y"))
        for _ in range(levels):
            attr = f_len(1, b"body") + f_varint(20, 5) + f_len(6, graph)
            graph = f_len(1, f_len(4, b"Loop") + f_len(5, attr))
        return model_bytes(graph)

    graph = parse_model(nested(MAX_GRAPH_DEPTH))
    depth = 0
    while graph.nodes[0].op_type == "Loop":
        graph = graph.nodes[0].attrs["body"]
        depth += 1
    assert depth == MAX_GRAPH_DEPTH
    with pytest.raises(ModelFormatError, match="nested deeper"):
        parse_model(nested(MAX_GRAPH_DEPTH + 1))
