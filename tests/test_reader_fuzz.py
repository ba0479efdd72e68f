"""Fuzzing nncc's ONNX reader: whatever the bytes, parse_model either returns a Graph or
raises ModelFormatError, quickly and without allocating much more than the input's size.

Deterministic for CI: derandomized, no example database. The whole file runs in well
under a minute.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from nncc.errors import ModelFormatError
from nncc.frontend.onnx import MAX_GRAPH_DEPTH, parse_model
from nncc.ir.graph import Graph
from tests.conftest import light_models_dir
from tests.test_reader import (
    ALL_DTYPES,
    _rich_model,
    f_fixed32,
    f_fixed64,
    f_len,
    f_varint,
    key,
    make_model,
    model_bytes,
    sample,
    varint,
)

pytestmark = pytest.mark.slow  # fuzzing, and every truncation of the light models

HANG_SECONDS = 20.0  # a parse still running after this is reported as a hang
MEMORY_SLACK = 16 * 2**20


def fuzz_settings(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,  # timing is asserted per parse below, with a CI-friendly bound
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much, HealthCheck.large_base_example],
    )


class ParseHang(BaseException):
    """Raised by the alarm when a parse runs far beyond its budget."""


@contextlib.contextmanager
def hang_guard(seconds: float):
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise ParseHang(f"parse still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def parse_checked(data: bytes, memory_limit: int | None = None) -> Graph | None:
    """parse_model(data) may succeed or raise ModelFormatError, nothing else; bounded
    in time and in peak traced allocation (4x the input + 16 MB unless told)."""
    limit = memory_limit if memory_limit is not None else 4 * len(data) + MEMORY_SLACK
    was_tracing = tracemalloc.is_tracing()
    if was_tracing:
        tracemalloc.reset_peak()
        baseline = tracemalloc.get_traced_memory()[0]
    else:
        tracemalloc.start()
        baseline = 0
    graph = None
    try:
        with hang_guard(HANG_SECONDS):
            try:
                graph = parse_model(data)
            except ModelFormatError as exc:
                assert str(exc), "a ModelFormatError needs a message"
    finally:
        peak = tracemalloc.get_traced_memory()[1] - baseline
        if not was_tracing:
            tracemalloc.stop()
    assert peak < limit, f"parse of {len(data)} bytes peaked at {peak} bytes (limit {limit})"
    if graph is not None:
        assert isinstance(graph, Graph)
    return graph


# -- corpus -----------------------------------------------------------------------------------


def _built_models() -> list[bytes]:
    inits = []
    for i, dtype in enumerate(ALL_DTYPES):
        array = sample(dtype, (2, 3), seed=i)
        inits.append(numpy_helper.from_array(array, f"raw_{i}"))
        inits.append(helper.make_tensor(f"typed_{i}", helper.np_dtype_to_tensor_dtype(array.dtype),
                                        array.shape, array.flatten(), raw=False))
    for dtype in (np.int64, np.int32, np.uint64, np.float32, np.float64):  # big packed fields
        array = sample(dtype, (10, 12), seed=7)
        inits.append(helper.make_tensor(f"big_{array.dtype.name}", helper.np_dtype_to_tensor_dtype(
            array.dtype), array.shape, array.flatten(), raw=False))
    inits.append(helper.make_tensor("str", TensorProto.STRING, [2], [b"a", b"bc"]))
    inits.append(numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty"))
    inits.append(numpy_helper.from_array(np.array(1.5, np.float64), "scalar"))
    relu = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    return [
        _rich_model().SerializeToString(),
        make_model(initializers=inits).SerializeToString(),
        relu.SerializeToString(),
    ]


LIGHT = {p.stem: p.read_bytes() for p in sorted(light_models_dir().glob("*.onnx"))}
BUILT = _built_models()
# Mutation corpus: everything but the biggest light models, so each example stays cheap.
CORPUS = BUILT + [data for data in LIGHT.values() if len(data) <= 80_000]


def test_corpus_parses_cleanly():
    assert len(CORPUS) >= 8
    for data in list(LIGHT.values()) + BUILT:
        assert parse_checked(data) is not None


# -- an independent wire-format splitter, to mutate nested messages and fix lengths -------------


def split(buf: bytes):
    """[(number, wire, payload)] where payload is the raw value bytes (LEN: the contents),
    or None when buf is not a sequence of well-formed fields."""
    fields = []
    pos = 0
    try:
        while pos < len(buf):
            k, pos = _read_varint(buf, pos)
            number, wire = k >> 3, k & 7
            if number == 0:
                return None
            if wire == 0:
                _, end = _read_varint(buf, pos)
            elif wire == 1:
                end = pos + 8
            elif wire == 5:
                end = pos + 4
            elif wire == 2:
                length, pos = _read_varint(buf, pos)
                end = pos + length
            else:
                return None
            if end > len(buf):
                return None
            fields.append((number, wire, buf[pos:end]))
            pos = end
    except IndexError:
        return None
    return fields


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError


def join(fields) -> bytes:
    out = bytearray()
    for number, wire, payload in fields:
        out += key(number, wire)
        if wire == 2:
            out += varint(len(payload))
        out += payload
    return bytes(out)


def test_splitter_roundtrips_corpus():
    for data in CORPUS:
        assert join(split(data)) == data


# -- mutations ------------------------------------------------------------------------------------

MUTATIONS = ["flip", "truncate", "delete", "insert", "overwrite", "splice", "extend", "duplicate",
             "big_varint", "zero"]


def mutate_flat(data: st.DataObject, buf: bytes) -> bytes:
    op = data.draw(st.sampled_from(MUTATIONS), label="op")
    n = len(buf)
    pos = st.integers(0, n)
    if op == "flip" and n:
        out = bytearray(buf)
        for _ in range(data.draw(st.integers(1, 8), label="flips")):
            i = data.draw(st.integers(0, n - 1))
            out[i] ^= 1 << data.draw(st.integers(0, 7))
        return bytes(out)
    if op == "truncate":
        return buf[: data.draw(pos, label="cut")]
    if op == "delete":
        i = data.draw(pos)
        return buf[:i] + buf[i + data.draw(st.integers(1, 64)):]
    if op == "insert":
        i = data.draw(pos)
        return buf[:i] + data.draw(st.binary(min_size=1, max_size=64), label="ins") + buf[i:]
    if op == "overwrite" and n:
        i = data.draw(st.integers(0, n - 1))
        patch = data.draw(st.binary(min_size=1, max_size=16), label="patch")
        return buf[:i] + patch + buf[i + len(patch):]
    if op == "splice":
        other = data.draw(st.sampled_from(CORPUS), label="other")
        return buf[: data.draw(pos)] + other[data.draw(st.integers(0, len(other))):]
    if op == "extend":
        tail = data.draw(st.one_of(st.binary(min_size=1, max_size=256), st.sampled_from(CORPUS)))
        return buf + tail
    if op == "duplicate" and n:
        i = data.draw(st.integers(0, n - 1))
        j = data.draw(st.integers(i, min(n, i + 256)))
        return buf[:j] + buf[i:j] + buf[j:]
    if op == "big_varint":  # a maximal 10-byte varint where a length or value used to be
        i = data.draw(pos)
        return buf[:i] + b"\xff" * 9 + b"\x01" + buf[i + data.draw(st.integers(0, 3)):]
    if op == "zero":
        return b"\x00" * data.draw(st.integers(0, 16))
    return buf


def mutate_nested(data: st.DataObject, buf: bytes, depth: int = 0) -> bytes:
    """Descend into a random chain of length-delimited fields, mutate the innermost one,
    then re-encode every enclosing length so the damage is seen deep inside the model."""
    fields = split(buf) if depth < 8 else None
    if not fields:
        return mutate_flat(data, buf)
    nested = [i for i, (_, wire, _) in enumerate(fields) if wire == 2]
    if not nested or (depth and data.draw(st.integers(0, 3), label="stop") == 0):
        return mutate_flat(data, buf)
    i = data.draw(st.sampled_from(nested), label=f"field@{depth}")
    number, wire, payload = fields[i]
    fields[i] = (number, wire, mutate_nested(data, payload, depth + 1))
    return join(fields)


@fuzz_settings(400)
@given(st.binary(max_size=4096))
def test_random_bytes(data):
    parse_checked(data)


@fuzz_settings(250)
@given(st.data())
def test_mutated_models(data):
    buf = data.draw(st.sampled_from(CORPUS), label="seed")
    for _ in range(data.draw(st.integers(1, 3), label="rounds")):
        buf = mutate_flat(data, buf)
    parse_checked(buf)


@fuzz_settings(350)
@given(st.data())
def test_mutated_nested_messages(data):
    buf = data.draw(st.sampled_from(CORPUS), label="seed")
    parse_checked(mutate_nested(data, buf))


# Random payloads put where the reader will interpret them as a given message type.
WRAPPERS = {
    "model": lambda b: b,
    "graph": lambda b: model_bytes(b),
    "node": lambda b: model_bytes(f_len(1, b)),
    "attribute": lambda b: model_bytes(f_len(1, f_len(4, b"Op") + f_len(5, b))),
    "subgraph": lambda b: model_bytes(f_len(1, f_len(4, b"If") + f_len(
        5, f_len(1, b"g") + f_varint(20, 5) + f_len(6, b)))),
    "tensor": lambda b: model_bytes(f_len(5, b)),
    "attr_tensor": lambda b: model_bytes(f_len(1, f_len(4, b"Op") + f_len(
        5, f_len(1, b"t") + f_varint(20, 4) + f_len(5, b)))),
    "value_info": lambda b: model_bytes(f_len(11, b)),
    "type": lambda b: model_bytes(f_len(11, f_len(1, b"x") + f_len(2, b))),
    "tensor_type": lambda b: model_bytes(f_len(12, f_len(1, b"x") + f_len(2, f_len(1, b)))),
    "shape": lambda b: model_bytes(f_len(13, f_len(1, b"x") + f_len(2, f_len(1, f_len(2, b))))),
    "opset": lambda b: f_varint(1, 8) + f_len(7, b"") + f_len(8, b),
    "external": lambda b: model_bytes(f_len(5, f_varint(1, 1) + f_varint(2, 1) + f_len(8, b"w")
                                             + f_varint(14, 1) + f_len(13, b))),
}

# Fields with the numbers ONNX messages use, in any wire type, nested a few levels.
_leaf = st.one_of(
    st.builds(f_varint, st.integers(1, 21), st.integers(0, 2**64 - 1)),
    st.builds(f_fixed32, st.integers(1, 21), st.integers(0, 2**32 - 1)),
    st.builds(f_fixed64, st.integers(1, 21), st.integers(0, 2**64 - 1)),
    st.builds(f_len, st.integers(1, 21), st.binary(max_size=24)),
    st.builds(f_varint, st.sampled_from([1, 2, 20]), st.integers(0, 16)),  # plausible types
)
messages = st.recursive(
    st.lists(_leaf, max_size=6).map(b"".join),
    lambda inner: st.lists(
        st.one_of(_leaf, st.builds(f_len, st.integers(1, 21), inner)), max_size=6
    ).map(b"".join),
    max_leaves=40,
)


@fuzz_settings(400)
@given(st.sampled_from(sorted(WRAPPERS)), st.one_of(st.binary(max_size=512), messages))
def test_random_messages_in_every_position(where, payload):
    parse_checked(WRAPPERS[where](payload))


@pytest.mark.parametrize("name", sorted(LIGHT))
def test_every_truncation_of_a_nested_graph_field(name):
    """Cut one node/initializer of each light model at several points, lengths fixed up."""
    fields = split(LIGHT[name])
    g = next(i for i, f in enumerate(fields) if f[0] == 7)
    graph_fields = split(fields[g][2])
    rng = np.random.default_rng(0)
    for _ in range(12 if len(LIGHT[name]) <= 80_000 else 3):
        i = int(rng.integers(len(graph_fields)))
        number, wire, payload = graph_fields[i]
        for cut in sorted({0, 1, len(payload) // 2, max(len(payload) - 1, 0)}):
            mutated = list(graph_fields)
            mutated[i] = (number, wire, payload[:cut])
            model = list(fields)
            model[g] = (7, 2, join(mutated))
            parse_checked(join(model))


# -- crafted hostile inputs --------------------------------------------------------------------------

SMALL_PEAK = 2**20  # these must be refused without allocating anything sizeable


@pytest.mark.parametrize("where", sorted(WRAPPERS))
@pytest.mark.parametrize("length", [2**31, 2**40, 2**63 - 1, 2**64 - 1])
def test_huge_length_prefix_fails_fast(where, length):
    payload = key(9, 2) + varint(length) + b"abc"  # as raw_data, or just "field 9"
    buf = WRAPPERS[where](payload)
    with pytest.raises(ModelFormatError):
        parse_model(buf)
    parse_checked(buf, memory_limit=SMALL_PEAK)
    top = f_varint(1, 8) + key(7, 2) + varint(length) + b"\x0a\x00"
    with pytest.raises(ModelFormatError, match="claims"):
        parse_model(top)


@pytest.mark.parametrize("dims", [[2**40, 2**40], [2**31, 2**31, 2**31], [2**63 - 1],
                                  [0, 2**40, 2**40], [2**62, 4]])
@pytest.mark.parametrize("storage", ["none", "raw", "float_data", "int64_data", "string_data",
                                     "external"])
def test_tensor_claiming_huge_dims_fails_without_allocating(dims, storage):
    body = b"".join(f_varint(1, d) for d in dims) + f_len(8, b"w")
    code = {"int64_data": 7, "string_data": 8}.get(storage, 1)
    body += f_varint(2, code)
    body += {
        "none": b"",
        "raw": f_len(9, b"\0" * 16),
        "float_data": f_len(4, b"\0" * 16),
        "int64_data": f_len(7, b"\x01" * 16),
        "string_data": f_len(6, b"s") * 4,
        "external": f_varint(14, 1) + f_len(13, f_len(1, b"location") + f_len(2, b"w.bin")),
    }[storage]
    for buf in (model_bytes(f_len(5, body)),  # initializer
                model_bytes(f_len(1, f_len(4, b"Constant") + f_len(
                    5, f_len(1, b"value") + f_varint(20, 4) + f_len(5, body))))):
        with pytest.raises(ModelFormatError):
            parse_model(buf)
        parse_checked(buf, memory_limit=SMALL_PEAK)


def _nested_subgraphs(levels: int, field: int) -> bytes:
    graph = b""
    for level in range(levels):
        if field == 6:
            attr = f_len(1, b"body") + f_varint(20, 5) + f_len(6, graph)
        else:
            attr = f_len(1, b"branches") + f_varint(20, 10) + f_len(11, graph) + f_len(11, b"")
        graph = f_len(1, f_len(4, b"Loop") + f_len(5, attr))
    return model_bytes(graph)


@pytest.mark.parametrize("field", [6, 11], ids=["g", "graphs"])
@pytest.mark.parametrize("levels", [MAX_GRAPH_DEPTH + 1, 200, 3000])
def test_deep_subgraph_nesting_is_a_format_error(levels, field):
    buf = _nested_subgraphs(levels, field)
    with pytest.raises(ModelFormatError, match="nested deeper"):
        parse_model(buf)
    parse_checked(buf)


def test_deep_nesting_within_limit_parses_even_with_a_small_recursion_limit():
    import sys

    buf = _nested_subgraphs(MAX_GRAPH_DEPTH, 6)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400)  # MAX_GRAPH_DEPTH levels must not need Python's full stack
    try:
        graph = parse_model(buf)
    finally:
        sys.setrecursionlimit(old)
    assert graph.nodes[0].op_type == "Loop"


def test_deep_nesting_of_non_graph_messages():
    """Nested LEN fields the reader does not descend into (type protos, unknown fields)."""
    inner = b""
    for _ in range(5000):
        inner = f_len(4, inner)  # TypeProto.sequence_type -> elem_type -> ...
    parse_checked(model_bytes(f_len(11, f_len(1, b"x") + f_len(2, inner))))
    junk = b""
    for _ in range(5000):
        junk = f_len(1000, junk)
    parse_checked(model_bytes(f_len(1, f_len(4, b"Relu") + junk)))


@pytest.mark.parametrize("field, body", [
    ("int64_data (unpacked)", lambda n: f_varint(2, 7) + f_varint(7, 1) * n),
    ("int32_data (unpacked)", lambda n: f_varint(2, 6) + f_varint(5, 1) * n),
    ("float_data (unpacked)", lambda n: f_varint(2, 1) + f_fixed32(4, 0) * n),
    ("double_data (unpacked)", lambda n: f_varint(2, 11) + f_fixed64(10, 0) * n),
    ("int64_data (tiny packed chunks)", lambda n: f_varint(2, 7) + f_len(7, b"\x01") * n),
    ("float_data (tiny packed chunks)", lambda n: f_varint(2, 1) + f_len(4, b"\0" * 4) * n),
    ("dims (unpacked)", lambda n: f_varint(2, 1) + f_varint(1, 1) * n),
])
def test_many_tiny_repeated_fields_stay_within_memory_bound(field, body):
    """Regression: each unpacked scalar used to become its own numpy array (~100 bytes
    for 2 input bytes), so a few MB of file could take hundreds of MB to parse."""
    n = 50_000
    tensor = f_len(8, b"w") + f_varint(1, n) + body(n)
    # 8 bytes per value, twice (buffer + final array), plus slack; the old code took 8-13 MB
    # here (and 3 s for tiny packed varint chunks).
    parse_checked(model_bytes(f_len(5, tensor)), memory_limit=16 * n + 4 * 2**20)


def test_large_valid_models_stay_within_bounds():
    for name, data in LIGHT.items():
        parse_checked(data)
    big = make_model(initializers=[numpy_helper.from_array(
        np.arange(2_000_000, dtype=np.float32), "big")]).SerializeToString()
    graph = parse_checked(big)
    assert graph.initializers["big"].shape == (2_000_000,)
