"""ModelProto bytes -> nncc Graph, read straight from the protobuf wire format.

Field numbers follow onnx.proto. Fields nncc does not use are skipped, so models from
newer ONNX releases still load. Everything read from the file is validated before use.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import numpy as np

from nncc.errors import FileAccessError, ModelFormatError
from nncc.frontend.dim_names import name_placeholders
from nncc.frontend.protobuf import (
    FIXED32,
    VARINT,
    Repeated,
    as_float32,
    as_int64,
    decode_string,
    iter_fields,
)
from nncc.ir import low_precision
from nncc.ir.dtypes import onnx_type_name, to_numpy
from nncc.ir.graph import (
    CAPTURES,
    MAX_GRAPH_DEPTH,
    OPTIONAL_SEQUENCE,
    OPTIONAL_TENSOR,
    SEQUENCE,
    Graph,
    Node,
    TensorInfo,
    free_names,
    normalize_domain,
)
from nncc.util.files import external_data_path, open_file, read_at_most, read_model_file
from nncc.util.limits import MAX_RANK, check_bytes
MAX_BYTES = np.iinfo(np.intp).max  # numpy refuses arrays whose byte size overflows this


def load_model(path: str | os.PathLike, data: bytes | None = None) -> Graph:
    """Read and parse an ONNX model file (external data is resolved next to it); ``data``:
    its bytes, when the caller has read them already."""
    if data is None:
        data = read_model_file(path)
    try:
        return parse_model(data, base_dir=os.path.dirname(os.path.abspath(path)))
    except ModelFormatError as exc:  # say which file: the bare wire-format detail is cryptic
        raise ModelFormatError(f"{os.fspath(path)} is not a valid ONNX model: {exc}") from None


def parse_model(data: bytes | memoryview, base_dir: str | None = None) -> Graph:
    buf = memoryview(data)
    if len(buf) == 0:
        raise ModelFormatError("the file is empty, not an ONNX model")
    graph_bytes = None
    opsets: dict[str, int] = {}
    ir_version = None
    for number, wire, value in iter_fields(buf):
        if number == 1 and wire == VARINT:
            ir_version = as_int64(value)
        elif number == 7:
            graph_bytes = _expect_len(value, "ModelProto.graph")
        elif number == 8:
            domain, version = _parse_opset(_expect_len(value, "ModelProto.opset_import"))
            opsets[domain] = version
    if graph_bytes is None or ir_version is None:
        raise ModelFormatError("not an ONNX model (no graph or IR version found)")
    opsets.setdefault("", 1)
    reader = _Reader(base_dir, opsets)
    return reader.graph(graph_bytes, depth=0)


def _expect_len(value: object, what: str) -> memoryview:
    if not isinstance(value, memoryview):
        raise ModelFormatError(f"{what} must be a length-delimited field")
    return value


def _expect_int(value: object, wire: int, what: str) -> int:
    if wire != VARINT:
        raise ModelFormatError(f"{what} must be a varint")
    return as_int64(value)  # type: ignore[arg-type]


def _parse_opset(buf: memoryview) -> tuple[str, int]:
    domain, version = "", 1
    for number, wire, value in iter_fields(buf):
        if number == 1:
            domain = decode_string(value, "OperatorSetIdProto.domain")
        elif number == 2:
            version = _expect_int(value, wire, "OperatorSetIdProto.version")
    return normalize_domain(domain), version


class _Reader:
    def __init__(self, base_dir: str | None, opsets: dict[str, int]):
        self.base_dir = base_dir
        self.opsets = opsets

    # -- graph ---------------------------------------------------------------------

    def graph(self, buf: memoryview, depth: int) -> Graph:
        if depth > MAX_GRAPH_DEPTH:
            raise ModelFormatError(f"subgraphs nested deeper than {MAX_GRAPH_DEPTH} levels")
        nodes: list[Node] = []
        initializers: dict[str, np.ndarray] = {}
        declared_inputs: list[tuple[str, TensorInfo]] = []
        outputs: list[tuple[str, TensorInfo]] = []
        value_info: list[tuple[str, TensorInfo]] = []
        name = ""
        for number, wire, value in iter_fields(buf):
            if number == 1:
                nodes.append(self.node(_expect_len(value, "GraphProto.node"), depth))
            elif number == 2:
                name = decode_string(value, "GraphProto.name")
            elif number == 5:
                tensor_name, array = self.tensor(_expect_len(value, "GraphProto.initializer"))
                if not tensor_name:
                    raise ModelFormatError("an initializer has no name")
                initializers[tensor_name] = array
            elif number == 15:
                raise ModelFormatError("sparse initializers are not supported")
            elif number in (11, 12, 13):
                entry = self.value_info(_expect_len(value, "GraphProto value info"))
                (declared_inputs, outputs, value_info)[number - 11].append(entry)
        values: dict[str, TensorInfo] = {}
        for value_name, info in value_info + declared_inputs + outputs:
            values[value_name] = info
        for init_name, array in initializers.items():
            values[init_name] = TensorInfo.of(array, keep_value=False)
        inputs = [n for n, _ in declared_inputs if n not in initializers]
        # "?" on two axes: two unknown sizes, not one; a model input's unnamed axis gets a name
        values = name_placeholders(values, inputs, unnamed=depth == 0)
        return Graph(
            nodes=nodes,
            inputs=inputs,
            outputs=[n for n, _ in outputs],
            initializers=initializers,
            values=values,
            opsets=dict(self.opsets),
            name=name,
        )

    def node(self, buf: memoryview, depth: int) -> Node:
        inputs: list[str] = []
        outputs: list[str] = []
        attrs: dict[str, Any] = {}
        op_type = name = domain = ""
        for number, wire, value in iter_fields(buf):
            if number == 1:
                inputs.append(decode_string(value, "NodeProto.input"))
            elif number == 2:
                outputs.append(decode_string(value, "NodeProto.output"))
            elif number == 3:
                name = decode_string(value, "NodeProto.name")
            elif number == 4:
                op_type = decode_string(value, "NodeProto.op_type")
            elif number == 7:
                domain = decode_string(value, "NodeProto.domain")
            elif number == 5:
                attr_name, attr_value = self.attribute(_expect_len(value, "attribute"), depth)
                if attr_name is not None:
                    attrs[attr_name] = attr_value
        if not op_type:
            raise ModelFormatError(f"node {name!r} has no op_type")
        if CAPTURES in attrs:
            raise ModelFormatError(f"node {name!r} has a reserved attribute name {CAPTURES!r}")
        captures: dict[str, None] = {}
        for value in attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, Graph):
                    captures.update(dict.fromkeys(free_names(sub)))
        if captures:  # outer values the subgraphs read become explicit trailing inputs
            inputs += list(captures)
            attrs[CAPTURES] = list(captures)
        return Node(op_type, inputs, outputs, attrs, normalize_domain(domain), name)

    # -- attributes ------------------------------------------------------------------

    def attribute(self, buf: memoryview, depth: int) -> tuple[str | None, Any]:
        name = ""
        kind = 0
        f = None
        i = None
        s = None
        t = None
        g = None
        floats = Repeated("f32")
        ints = Repeated("varint")
        strings: list[str] = []
        tensors: list[np.ndarray] = []
        graphs: list[Graph] = []
        ref = None
        for number, wire, value in iter_fields(buf):
            if number == 1:
                name = decode_string(value, "AttributeProto.name")
            elif number == 20:
                kind = _expect_int(value, wire, "AttributeProto.type")
            elif number == 2:
                if wire != FIXED32:
                    raise ModelFormatError("AttributeProto.f must be a 32-bit float")
                f = as_float32(value)  # type: ignore[arg-type]
            elif number == 3:
                i = _expect_int(value, wire, "AttributeProto.i")
            elif number == 4:
                s = self._attr_string(value)
            elif number == 5:
                t = self.tensor(_expect_len(value, "AttributeProto.t"))[1]
            elif number == 6:
                g = self.graph(_expect_len(value, "AttributeProto.g"), depth + 1)
            elif number == 7:
                floats.add(wire, value, "AttributeProto.floats")
            elif number == 8:
                ints.add(wire, value, "AttributeProto.ints")
            elif number == 9:
                strings.append(self._attr_string(value))
            elif number == 10:
                tensors.append(self.tensor(_expect_len(value, "AttributeProto.tensors"))[1])
            elif number == 11:
                graphs.append(self.graph(_expect_len(value, "AttributeProto.graphs"), depth + 1))
            elif number == 21:
                ref = decode_string(value, "AttributeProto.ref_attr_name")
        if not name:
            raise ModelFormatError("an attribute has no name")
        if ref:
            raise ModelFormatError(f"attribute {name!r} refers to a function attribute")
        by_kind = {
            1: lambda: f,
            2: lambda: i,
            3: lambda: s,
            4: lambda: t,
            5: lambda: g,
            6: lambda: [float(x) for x in floats.array()],
            7: lambda: [int(x) for x in ints.array().view(np.int64)],
            8: lambda: strings,
            9: lambda: tensors,
            10: lambda: graphs,
        }
        if kind == 0:  # very old writers leave the type out: infer it from what is set
            kind = next(
                (k for k, present in (
                    (1, f is not None), (2, i is not None), (3, s is not None),
                    (4, t is not None), (5, g is not None), (6, len(floats) > 0),
                    (7, len(ints) > 0), (8, bool(strings)), (9, bool(tensors)),
                    (10, bool(graphs)),
                ) if present),
                0,
            )
        if kind in (11, 12, 13, 14):
            return None, None  # sparse tensors and type protos: no built-in op uses them
        if kind not in by_kind:
            raise ModelFormatError(f"attribute {name!r} has unknown type {kind}")
        result = by_kind[kind]()
        if result is None:
            result = {1: 0.0, 2: 0, 3: ""}.get(kind)
            if result is None:
                raise ModelFormatError(f"attribute {name!r} declares a value it does not carry")
        return name, result

    @staticmethod
    def _attr_string(value: object) -> str:
        raw = bytes(_expect_len(value, "string attribute"))
        return raw.decode("utf-8", errors="surrogateescape")

    # -- types -------------------------------------------------------------------------

    def value_info(self, buf: memoryview) -> tuple[str, TensorInfo]:
        name = ""
        info = TensorInfo(None, None)
        for number, _, value in iter_fields(buf):
            if number == 1:
                name = decode_string(value, "ValueInfoProto.name")
            elif number == 2:
                info = self.type_proto(_expect_len(value, "ValueInfoProto.type"))
        return name, info

    def type_proto(self, buf: memoryview, depth: int = 0) -> TensorInfo:
        if depth > MAX_GRAPH_DEPTH:
            raise ModelFormatError(f"types nested deeper than {MAX_GRAPH_DEPTH} levels")
        for number, _, value in iter_fields(buf):
            if number == 1:  # tensor_type
                return self.tensor_type(_expect_len(value, "TypeProto.tensor_type"))
            if number in (4, 9):  # sequence_type, optional_type: elem_type is field 1
                element = TensorInfo(None, None)
                for enumber, _, evalue in iter_fields(_expect_len(value, "TypeProto element")):
                    if enumber == 1:
                        element = self.type_proto(_expect_len(evalue, "elem_type"), depth + 1)
                if number == 4:
                    kind = SEQUENCE
                else:
                    kind = OPTIONAL_SEQUENCE if element.kind == SEQUENCE else OPTIONAL_TENSOR
                return TensorInfo(element.dtype, None, kind=kind)
        return TensorInfo(None, None)  # maps and opaque types: not tensors

    def tensor_type(self, buf: memoryview) -> TensorInfo:
        dtype = None
        shape = None
        for number, wire, value in iter_fields(buf):
            if number == 1:
                dtype = to_numpy(_expect_int(value, wire, "TypeProto.Tensor.elem_type"))
            elif number == 2:
                shape = self.shape(_expect_len(value, "TypeProto.Tensor.shape"))
        return TensorInfo(dtype, shape)

    def shape(self, buf: memoryview) -> tuple:
        dims: list = []
        for number, _, value in iter_fields(buf):
            if number != 1:
                continue
            dim: int | str | None = None
            for dnum, dwire, dvalue in iter_fields(_expect_len(value, "dimension")):
                if dnum == 1:
                    size = _expect_int(dvalue, dwire, "dim_value")
                    dim = size if size >= 0 else None
                elif dnum == 2:
                    dim = decode_string(dvalue, "dim_param") or None
            dims.append(dim)
            if len(dims) > MAX_RANK:
                raise ModelFormatError(f"a tensor type has more than {MAX_RANK} dimensions")
        return tuple(dims)

    # -- tensors -----------------------------------------------------------------------

    def tensor(self, buf: memoryview) -> tuple[str, np.ndarray]:
        dims = Repeated("varint")
        data_type = 0
        name = ""
        raw: memoryview | None = None
        floats = Repeated("f32")
        doubles = Repeated("f64")
        int32s = Repeated("varint")
        int64s = Repeated("varint")
        uint64s = Repeated("varint")
        strings: list[bytes] = []
        external: dict[str, str] = {}
        location = 0
        for number, wire, value in iter_fields(buf):
            if number == 1:
                dims.add(wire, value, "TensorProto.dims")
            elif number == 2:
                data_type = _expect_int(value, wire, "TensorProto.data_type")
            elif number == 8:
                name = decode_string(value, "TensorProto.name")
            elif number == 9:
                raw = _expect_len(value, "TensorProto.raw_data")
            elif number == 4:
                floats.add(wire, value, "TensorProto.float_data")
            elif number == 10:
                doubles.add(wire, value, "TensorProto.double_data")
            elif number == 5:
                int32s.add(wire, value, "TensorProto.int32_data")
            elif number == 7:
                int64s.add(wire, value, "TensorProto.int64_data")
            elif number == 11:
                uint64s.add(wire, value, "TensorProto.uint64_data")
            elif number == 6:
                strings.append(bytes(_expect_len(value, "TensorProto.string_data")))
            elif number == 13:
                key, val = _string_pair(_expect_len(value, "TensorProto.external_data"))
                external[key] = val
            elif number == 14:
                location = _expect_int(value, wire, "TensorProto.data_location")
            elif number == 3:
                raise ModelFormatError(f"tensor {name!r} is segmented, which is not supported")
        label = f"tensor {name!r}" if name else "a tensor"
        if len(dims) > MAX_RANK:
            raise ModelFormatError(f"{label} has {len(dims)} dimensions; at most {MAX_RANK} are supported")
        shape = tuple(int(d) for d in dims.array().view(np.int64))
        if any(d < 0 for d in shape):
            raise ModelFormatError(f"{label} has a negative dimension {shape}")
        count = 1
        nonzero = 1  # numpy checks the size of empty arrays without their zero dims too
        for d in shape:
            count *= d
            nonzero *= max(d, 1)
        dtype = to_numpy(data_type)
        if dtype is None:
            raise ModelFormatError(
                f"{label} has element type {onnx_type_name(data_type)}, "
                "which nncc cannot represent"
            )
        if nonzero * dtype.itemsize > MAX_BYTES:
            raise ModelFormatError(f"{label} has impossibly large dimensions {shape}")
        low = low_precision.code_of(dtype)
        stored = count * dtype.itemsize if low is None else low_precision.packed_size(low, count)
        if location == 1:  # read into memory: a sparse file can declare terabytes cheaply
            check_bytes(stored, f"{label} (external data)")
            raw = memoryview(self._external(external, label, stored))
        if low is not None:
            return name, _low_precision_array(label, low, shape, count, stored, raw, int32s)
        array = _tensor_array(label, dtype, shape, count, raw, floats, doubles, int32s, int64s,
                              uint64s, strings)
        return name, array

    def _external(self, entries: dict[str, str], label: str, expected: int) -> bytes:
        location = entries.get("location")
        if not location:
            raise ModelFormatError(f"{label} is stored externally but names no location")
        if self.base_dir is None:
            raise ModelFormatError(f"{label} is stored externally but the model has no folder")
        try:
            path = external_data_path(self.base_dir, location)
        except ValueError as exc:
            raise ModelFormatError(f"{label}: external data path {location!r} {exc}") from None
        try:
            offset = int(entries.get("offset", "0"))
            length = int(entries["length"]) if "length" in entries else None
        except ValueError:
            raise ModelFormatError(f"{label}: external data offset/length is not a number") from None
        try:
            fd, info = open_file(path)  # never blocks, even on a FIFO
        except FileNotFoundError:
            raise FileAccessError(
                f"{label}: its external data file {path} does not exist",
                hint=f"external data is looked up relative to the model's folder, not the working "
                     f"directory: put {location} in {self.base_dir}") from None
        except OSError as exc:
            raise FileAccessError(f"{label}: cannot read external data {path}: {exc.strerror}") from None
        try:
            if not stat.S_ISREG(info.st_mode):  # a directory, FIFO or device: never read it
                raise ModelFormatError(f"{label}: external data {location!r} is not a regular file")
            size = info.st_size
            if length is None:
                length = size - offset
            if offset < 0 or length < 0 or offset + length > size:
                raise ModelFormatError(
                    f"{label}: external data range {offset}+{length} is outside {location} ({size} bytes)"
                )
            if length != expected:
                raise ModelFormatError(f"{label}: external data has {length} bytes, expected {expected}")
            os.lseek(fd, offset, os.SEEK_SET)
            data = read_at_most(fd, length)
        except OSError as exc:
            raise FileAccessError(f"{label}: cannot read external data {path}: {exc.strerror}") from None
        finally:
            os.close(fd)
        if len(data) != length:
            raise ModelFormatError(f"{label}: external data {location!r} ended early")
        return data


def _string_pair(buf: memoryview) -> tuple[str, str]:
    key = val = ""
    for number, _, value in iter_fields(buf):
        if number == 1:
            key = decode_string(value, "StringStringEntryProto.key")
        elif number == 2:
            val = decode_string(value, "StringStringEntryProto.value")
    return key, val


def _tensor_array(label, dtype, shape, count, raw, floats, doubles, int32s, int64s, uint64s,
                  strings) -> np.ndarray:
    if dtype.kind == "O":
        if raw is not None and len(raw):
            raise ModelFormatError(f"{label}: string tensors cannot use raw_data")
        if len(strings) != count:
            raise ModelFormatError(f"{label} has {len(strings)} strings for {count} elements")
        # str, as onnx's numpy_helper and string attributes give; undecodable bytes survive
        values = np.empty(count, dtype=object)
        values[:] = [s.decode("utf-8", errors="surrogateescape") for s in strings]
        return values.reshape(shape)
    if raw is not None:
        expected = count * dtype.itemsize
        if len(raw) != expected:
            raise ModelFormatError(f"{label} has {len(raw)} bytes of raw data, expected {expected}")
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
    kind = dtype.kind
    if dtype == np.float32 or dtype == np.complex64:
        source = floats.array()
    elif dtype == np.float64 or dtype == np.complex128:
        source = doubles.array()
    elif dtype == np.int64:
        source = int64s.array().view(np.int64)
    elif dtype in (np.uint32, np.uint64):
        source = uint64s.array()
    else:  # int32, int16, int8, uint16, uint8, bool, float16 travel in int32_data
        source = int32s.array().view(np.int64)
    per_element = 2 if kind == "c" else 1
    if len(source) == 0 and count == 0:
        return np.zeros(shape, dtype=dtype)
    if len(source) != count * per_element:
        raise ModelFormatError(f"{label} has {len(source)} values for {count} elements")
    if kind == "c":
        return source.view(dtype).reshape(shape).copy()
    if dtype == np.float16:
        return source.astype(np.uint16).view(np.float16).reshape(shape)
    if dtype == np.bool_:
        return (source != 0).reshape(shape)
    return source.astype(dtype).reshape(shape)


def _low_precision_array(label, code, shape, count, stored, raw, int32s) -> np.ndarray:
    """bfloat16, float8, float4 and 4-/2-bit integer tensors. raw_data holds the bytes
    (bfloat16 little-endian; 4- and 2-bit types packed, first element in the low bits);
    int32_data holds one bfloat16 or float8 bit pattern, or one packed byte, per entry."""
    dtype = low_precision.dtype_of(code)
    if raw is not None:
        if len(raw) != stored:
            raise ModelFormatError(f"{label} has {len(raw)} bytes of raw data, expected {stored}")
        bits = np.frombuffer(raw, dtype="<u2" if dtype.itemsize == 2 else np.uint8)
    else:
        source = int32s.array().view(np.int64)
        if len(source) == 0 and count == 0:
            return np.zeros(shape, dtype=dtype)
        entries = count if code not in low_precision.PACKED_BITS else stored
        if len(source) != entries:
            raise ModelFormatError(f"{label} has {len(source)} values for {count} elements")
        bits = source.astype(np.uint16 if dtype.itemsize == 2 else np.uint8)
    if code in low_precision.PACKED_BITS:
        return low_precision.unpack(bits, code, count).reshape(shape)
    return bits.astype(np.uint16 if dtype.itemsize == 2 else np.uint8).view(dtype).reshape(shape)
