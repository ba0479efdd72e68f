"""The artifact format (nncc/plan/format.py): determinism, layout, and the loader's checks.

Hostile artifacts are made the way an attacker would: edit the PROG JSON, then re-assemble
with *correct* checksums (format internals), so the semantic checks run, not only the
checksum check. Every refusal must be a PlanFormatError with a message saying what is wrong.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nncc
from nncc.errors import PlanFormatError
from nncc.plan import format as F
from nncc.report import describe_plan
from tests.conftest import FIXTURES, ROOT
from tests.oracle import ort_run

FIXTURE_MODELS = ["mlp", "resnet_block", "mobilenet", "transformer", "shape_ops"]


# -- helpers -------------------------------------------------------------------------------


def entries(raw: bytes) -> dict[bytes, tuple[int, int]]:
    """tag -> (offset, length), read with struct straight from the documented grammar."""
    magic, version, count, _ = struct.unpack_from("<8sII16s", raw, 0)
    out = {}
    for i in range(count):
        tag, _flags, offset, length, _digest = struct.unpack_from("<4sIQQ32s", raw, 32 + 56 * i)
        out[tag] = (offset, length)
    return out


def parts(raw: bytes) -> tuple[str, dict, bytes, bytes]:
    producer, sections = F.read_sections(raw)
    program = json.loads(bytes(sections[b"PROG"]))
    return producer, program, bytes(sections.get(b"INLN", b"")), bytes(sections.get(b"DATA", b""))


def code_of(raw: bytes) -> bytes | None:
    code = F.read_sections(raw)[1].get(b"CODE")
    return None if code is None else bytes(code)


def assemble(producer: str, program: dict, inline: bytes, data: bytes, code: bytes | None = None) -> bytes:
    prog = json.dumps(program, sort_keys=True, separators=(",", ":")).encode()
    return F.assemble(producer, [(b"PROG", prog), (b"INLN", inline), (b"DATA", data),
                                  *([(b"CODE", code)] if code is not None else [])])


def hostile(raw: bytes, edit) -> bytes:
    """Apply ``edit(program, sections)`` and re-assemble with valid checksums."""
    producer, program, inline, data = parts(raw)
    sections = {"inline": inline, "data": data, "code": code_of(raw)}
    edit(program, sections)
    bad = assemble(producer, program, sections["inline"], sections["data"], sections["code"])
    F.read_sections(bad)  # checksums and layout are fine: only semantic checks can refuse it
    return bad


def compiled_fixture(name: str, **options):
    return nncc.compile_model(FIXTURES / f"{name}.onnx", **options)


@pytest.fixture(scope="module")
def resnet_raw() -> bytes:
    return compiled_fixture("resnet_block").to_bytes()


@pytest.fixture(scope="module")
def shape_ops_raw() -> bytes:
    return compiled_fixture("shape_ops", opt_level=0).to_bytes()


def make_model(path, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


# -- determinism ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in ("mobilenet", "resnet_block")
                                  else name for name in FIXTURE_MODELS])  # the convnets, compiled six times: slow
def test_same_model_and_options_give_identical_bytes(name):
    for options in ({}, {"opt_level": 0}, {"preference": "sustained-speed"}):
        first = compiled_fixture(name, **options).to_bytes()
        second = compiled_fixture(name, **options).to_bytes()
        assert first == second, options
        # and a load / re-serialize round trip reproduces them (splats stay splats; a
        # signed artifact keeps its own signature)
        assert nncc.load(first).to_bytes() == first


def test_options_change_the_bytes():
    a = compiled_fixture("resnet_block", opt_level=0).to_bytes()
    b = compiled_fixture("resnet_block", opt_level=2).to_bytes()
    assert a != b


def _compile_in_fresh_process(model: pathlib.Path, out: pathlib.Path, hashseed: str, cache: pathlib.Path):
    env = dict(os.environ, PYTHONHASHSEED=hashseed, NNCC_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "nncc", "compile", str(model), "-o", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_identical_bytes_across_fresh_processes(tmp_path):
    jobs = []
    for name in ("resnet_block", "transformer", "shape_ops"):
        for seed in ("0", "4242"):
            jobs.append((FIXTURES / f"{name}.onnx", tmp_path / f"{name}-{seed}.nncc", seed,
                         tmp_path / f"cache-{name}-{seed}"))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: _compile_in_fresh_process(*job), jobs))
    for result in results:
        assert result.returncode == 0, result.stderr
    for name in ("resnet_block", "transformer", "shape_ops"):
        a = (tmp_path / f"{name}-0.nncc").read_bytes()
        b = (tmp_path / f"{name}-4242.nncc").read_bytes()
        assert a == b, name
        assert a == compiled_fixture(name).to_bytes(), f"{name}: CLI and API differ"


# -- layout ----------------------------------------------------------------------------------


def test_header_and_sections_follow_the_grammar(resnet_raw):
    magic, version, count, producer = struct.unpack_from("<8sII16s", resnet_raw, 0)
    assert (magic, version, count) == (b"NNCCPLAN", 2, 5)
    assert producer.rstrip(b"\0").decode() == nncc.__version__
    table = entries(resnet_raw)
    assert list(table) == [b"PROG", b"INLN", b"DATA", b"CODE", b"SIGN"]  # native code is signed
    sign_offset, sign_length = table[b"SIGN"]
    assert sign_length == 44 and resnet_raw[sign_offset:sign_offset + 4] == struct.pack("<I", 1)
    code_offset, code_length = table[b"CODE"]
    assert resnet_raw[code_offset:code_offset + 4] == b"\x7fELF"  # a shared object
    for tag, (offset, length) in table.items():
        assert offset % 64 == 0, tag
        assert offset + length <= len(resnet_raw)
    program = json.loads(resnet_raw[table[b"PROG"][0]:sum(table[b"PROG"])])
    assert resnet_raw[table[b"PROG"][0]:sum(table[b"PROG"])] == json.dumps(
        program, sort_keys=True, separators=(",", ":")).encode()  # keys sorted, no whitespace
    assert set(program) == {"kernels", "slots", "inputs", "outputs", "constants", "instructions",
                            "partitions", "arena_bytes", "options", "fallbacks", "payloads"}
    (backend, section, offset, length, partitions, meta), = program["payloads"]
    assert (backend, section, offset, length, partitions) == ("native", "CODE", 0, code_length, [0])
    (partition, symbol, args, n_inputs, workspace), = meta["calls"]
    assert (partition, symbol) == (0, "nncc_partition_0") and 0 < n_inputs < len(args) and workspace >= 0


@pytest.mark.parametrize("name", ["resnet_block", "transformer", "mobilenet"])
def test_data_constants_are_64_byte_aligned_in_the_file_and_in_memory(name, tmp_path):
    compiled = compiled_fixture(name)
    raw = compiled.to_bytes()
    data_offset, data_length = entries(raw)[b"DATA"]
    _, program, _, _ = parts(raw)
    referenced = [c for c in program["constants"] if c[1] == "data"]
    assert referenced, "every one of these fixtures has large weights"
    for slot, _, offset, length in referenced:
        assert (data_offset + offset) % 64 == 0, program["slots"][slot][0]
        assert offset + length <= data_length
    path = tmp_path / "m.nncc"
    compiled.save(path)
    loaded = nncc.load(path)  # memory-mapped: constants are views of the mapping
    for slot, *_ in referenced:
        array = loaded.plan.constants[slot]
        assert array.ctypes.data % 64 == 0
        assert not array.flags.writeable and not array.flags.owndata
        np.testing.assert_array_equal(array, compiled.plan.constants[slot])


def test_inline_and_referenced_split_by_size(tmp_path):
    """Constants up to INLINE_LIMIT bytes travel inline, larger ones by reference."""
    limit = F.INLINE_LIMIT
    sizes = {"c_small": 1, "c_at_limit": limit // 4, "c_above": limit // 4 + 1, "c_big": 4096}
    inits = [numpy_helper.from_array(np.arange(n, dtype=np.float32) + 1, name) for name, n in sizes.items()]
    nodes, prev = [], "x"
    for k, (name, n) in enumerate(sizes.items()):
        nodes.append(helper.make_node("Slice", [name, "zero", "one"], [f"s{k}"], name=f"slice{k}"))
        nodes.append(helper.make_node("Add", [prev, f"s{k}"], [f"a{k}"], name=f"add{k}"))
        prev = f"a{k}"
    inits += [numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([1], np.int64), "one")]
    path = make_model(tmp_path / "c.onnx", nodes, [("x", TensorProto.FLOAT, [1])],
                      [(prev, TensorProto.FLOAT, [1])], inits)
    compiled = nncc.compile_model(path, opt_level=0)
    raw = compiled.to_bytes()
    _, program, inline, data = parts(raw)
    storage = {program["slots"][c[0]][0]: (c[1], c[3]) for c in program["constants"]}
    assert storage["c_small"] == ("inline", 4)
    assert storage["c_at_limit"] == ("inline", limit)
    assert storage["c_above"] == ("data", limit + 4)
    assert storage["c_big"] == ("data", 4096 * 4)
    assert len(data) >= limit + 4 + 4096 * 4 and len(inline) < 2 * limit
    report = describe_plan(compiled.plan, len(raw))
    assert report["constants"]["referenced"] == {"count": 2, "bytes": (limit + 4) + 4096 * 4}
    assert report["constants"]["inline"]["count"] == 4  # c_small, c_at_limit, zero, one
    want = 1 + sum(1 for _ in sizes)  # x + each constant's first element (1.0)
    assert nncc.load(raw).run({"x": np.ones(1, np.float32)})[prev][0] == want


def test_splat_constants_take_one_element(tmp_path):
    """ConstantOfShape over a big static shape folds into a splat: one element on disk,
    a zero-stride view after loading (no materialized copy)."""
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["w"], name="cos",
                         value=numpy_helper.from_array(np.array([0.25], np.float32))),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ]
    shape = numpy_helper.from_array(np.array([512, 1024], np.int64), "shape")
    path = make_model(tmp_path / "s.onnx", nodes, [("x", TensorProto.FLOAT, [2, 512])],
                      [("y", TensorProto.FLOAT, [2, 1024])], [shape])
    x = np.random.default_rng(0).standard_normal((2, 512)).astype(np.float32)
    want = x @ np.full((512, 1024), 0.25, np.float32)
    compiled = nncc.compile_model(path, opt_level=1, backends=["numpy"])  # no CODE section to count
    raw = compiled.to_bytes()
    assert len(raw) < 8192, "a 2 MiB splat must not be stored element by element"
    _, program, _, _ = parts(raw)
    splats = [c for c in program["constants"] if c[1] == "splat"]
    assert len(splats) == 1 and splats[0][3] == 4
    assert program["slots"][splats[0][0]][1:] == ["<f4", [512, 1024]]
    for path_or_bytes in (raw, _saved(compiled, tmp_path / "s.nncc")):
        loaded = nncc.load(path_or_bytes)
        w = loaded.plan.constants[splats[0][0]]
        assert w.shape == (512, 1024) and w.strides == (0, 0) and float(w[0, 0]) == 0.25
        np.testing.assert_allclose(loaded.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def _saved(compiled, path):
    compiled.save(path)
    return path


def test_tensor_attributes_become_constant_references(shape_ops_raw):
    _, program, _, _ = parts(shape_ops_raw)
    constants = {c[0] for c in program["constants"]}
    refs = [v["$tensor"] for i in program["instructions"] for v in i[3].values() if isinstance(v, dict)]
    assert refs and all(r in constants for r in refs)


# -- the loader's checks ---------------------------------------------------------------------


def refuses(raw, message):
    with pytest.raises(PlanFormatError, match=message):
        nncc.load(raw)


def test_bad_magic(resnet_raw):
    refuses(b"NOTAPLAN" + resnet_raw[8:], r"not an nncc artifact \(bad magic\)")
    refuses(b"\x08\x07" + resnet_raw[2:], "bad magic")  # an ONNX file, say


def test_too_short_and_empty(resnet_raw, tmp_path):
    refuses(resnet_raw[:20], "too short to be an nncc artifact")
    refuses(b"", "too short")
    empty = tmp_path / "empty.nncc"
    empty.write_bytes(b"")
    refuses(empty, "is empty, not an nncc artifact")


def test_other_format_version(resnet_raw):
    raw = bytearray(resnet_raw)
    struct.pack_into("<I", raw, 8, 3)
    refuses(bytes(raw), "artifact format version 3; this nncc reads version 2")
    struct.pack_into("<I", raw, 8, 1)  # an artifact from before backends stored payloads
    refuses(bytes(raw), "artifact format version 1; this nncc reads version 2")
    struct.pack_into("<I", raw, 8, 0)
    refuses(bytes(raw), "format version 0")


def test_bad_section_count(resnet_raw):
    for count in (0, 9, 2**32 - 1):
        raw = bytearray(resnet_raw)
        struct.pack_into("<I", raw, 12, count)
        refuses(bytes(raw), f"bad section count {count}")


def _entry_patch(raw: bytes, index: int, field: str, value) -> bytes:
    raw = bytearray(raw)
    base = 32 + 56 * index
    where = {"tag": (base, "4s"), "offset": (base + 8, "Q"), "length": (base + 16, "Q")}[field]
    struct.pack_into("<" + where[1], raw, where[0], value)
    return bytes(raw)


def test_section_outside_the_file(resnet_raw):
    size = len(resnet_raw)
    refuses(_entry_patch(resnet_raw, 2, "length", size), "section DATA lies outside the file")
    refuses(_entry_patch(resnet_raw, 0, "offset", size + 64), "section PROG lies outside the file")
    refuses(_entry_patch(resnet_raw, 1, "offset", 2**64 - 64), "section INLN lies outside the file")
    refuses(_entry_patch(resnet_raw, 0, "offset", 65), "section PROG lies outside the file")  # unaligned
    refuses(resnet_raw[: entries(resnet_raw)[b"DATA"][0] + 10], "section DATA lies outside the file")


def test_unknown_or_repeated_section(resnet_raw):
    refuses(_entry_patch(resnet_raw, 1, "tag", b"EXEC"), r"unknown or repeated section b'EXEC'")
    refuses(_entry_patch(resnet_raw, 1, "tag", b"PROG"), "unknown or repeated section b'PROG'")


def test_missing_program_section(resnet_raw):
    producer, _, inline, data = parts(resnet_raw)
    raw = F.assemble(producer, [(b"INLN", inline), (b"DATA", data)])
    refuses(raw, "artifact has no program section")


@pytest.mark.parametrize("tag", [b"PROG", b"INLN", b"DATA"])
def test_checksum_mismatch(resnet_raw, tag):
    offset, length = entries(resnet_raw)[tag]
    raw = bytearray(resnet_raw)
    raw[offset + length // 2] ^= 0x01
    refuses(bytes(raw), f"section {tag.decode()} fails its checksum")
    raw = bytearray(resnet_raw)
    raw[32 + 56 * list(entries(resnet_raw)).index(tag) + 24] ^= 0x80  # the stored digest
    refuses(bytes(raw), "fails its checksum")


def test_program_not_json_or_not_an_object(resnet_raw):
    producer, _, inline, data = parts(resnet_raw)
    for prog, message in ((b"\xff\xfe", "not valid JSON"), (b"{'a': 1}", "not valid JSON"),
                          (b"[" * 100000, "not valid JSON"), (b"[1, 2]", "not an object"),
                          (b"{}", "program field 'kernels' is missing")):
        raw = F.assemble(producer, [(b"PROG", prog), (b"INLN", inline), (b"DATA", data)])
        refuses(raw, message)


@pytest.mark.parametrize("key", ["this::hello::1", "antigravity::fly::1", "os::system::1",
                                 "tests.plugins.mulsub_plugin::Mul::1"])
def test_unknown_kernel_key_is_refused_without_importing(resnet_raw, key):
    module = key.split("::")[0]
    was_imported = module in sys.modules

    def edit(program, _):
        program["kernels"][0] = key

    refuses(hostile(resnet_raw, edit), f"plan uses kernel '{key}', which is not registered")
    assert (module in sys.modules) == was_imported, f"loading imported {module}"


@pytest.mark.parametrize("key", ["Conv", "ai.onnx::Conv", "ai.onnx::Conv::x", "ai.onnx::Conv::99",
                                 "a::b::c::d", "", 7, None, ["ai.onnx::Conv::11"]])
def test_malformed_kernel_keys(resnet_raw, key):
    def edit(program, _):
        program["kernels"][0] = key

    refuses(hostile(resnet_raw, edit), "plan uses kernel .* which is not registered")


def _first_with_attrs(program) -> list:
    return next(i for i in program["instructions"] if i[3])


def _make_unaligned(program, sections):
    c = next(c for c in program["constants"] if c[1] == "data")
    sections["data"] = sections["data"] + b"\0" * 64
    c[2] += 4  # still inside the section, but no longer on a 64-byte boundary



SEMANTIC_CASES = {
    # slot indices out of range
    "input slot out of range": (lambda p, s: p["inputs"].__setitem__(0, len(p["slots"])), "input slot .* is out of range"),
    "output slot negative": (lambda p, s: p["outputs"].__setitem__(0, -1), "output slot -1 is out of range"),
    "instruction input out of range": (
        lambda p, s: p["instructions"][0][1].__setitem__(0, len(p["slots"])), "instruction input .* is out of range"),
    "instruction output out of range": (
        lambda p, s: p["instructions"][0][2].__setitem__(0, 10**6), "instruction output 1000000 is out of range"),
    "instruction input -2": (lambda p, s: p["instructions"][0][1].__setitem__(0, -2), "instruction input -2 is out of range"),
    "slot index is a bool": (lambda p, s: p["instructions"][0][1].__setitem__(0, True), "instruction input is not an integer"),
    "slot index is a float": (lambda p, s: p["instructions"][0][1].__setitem__(0, 1.0), "instruction input is not an integer"),
    "kernel id out of range": (lambda p, s: p["instructions"][0].__setitem__(0, len(p["kernels"])), "kernel id .* is out of range"),
    "constant slot out of range": (lambda p, s: p["constants"][0].__setitem__(0, len(p["slots"]) + 5), "constant slot .* is out of range"),
    # data flow
    "read before write": (
        lambda p, s: p["instructions"][0][1].__setitem__(0, p["instructions"][-1][2][0]), "reads slot .* before it is written"),
    "output never written": (
        lambda p, s: p["instructions"].pop(), "output slot .* is never written"),
    "instruction overwrites a constant": (
        lambda p, s: p["instructions"][0][2].__setitem__(0, p["constants"][0][0]), "overwrites constant or input slot"),
    "instruction overwrites an input": (
        lambda p, s: p["instructions"][0][2].__setitem__(0, p["inputs"][0]), "overwrites constant or input slot"),
    # constant byte ranges
    "data constant past the section": (
        lambda p, s: next(c for c in p["constants"] if c[1] == "data").__setitem__(2, len(s["data"])), "has a bad byte range"),
    "inline constant past the section": (
        lambda p, s: next(c for c in p["constants"] if c[1] == "inline").__setitem__(2, len(s["inline"])), "has a bad byte range"),
    "constant length disagrees with its shape": (
        lambda p, s: next(c for c in p["constants"] if c[1] == "data").__setitem__(3, 4), "has a bad byte range"),
    "constant at a huge offset": (
        lambda p, s: next(c for c in p["constants"] if c[1] == "data").__setitem__(2, 2**70), "has a bad byte range"),
    "negative constant offset": (
        lambda p, s: p["constants"][0].__setitem__(2, -64), "has a bad offset or length"),
    "unaligned data constant": (_make_unaligned, "is not 64-byte aligned"),
    "unknown storage": (lambda p, s: p["constants"][0].__setitem__(1, "file:///etc/passwd"), "unknown storage"),
    "storage not a string": (lambda p, s: p["constants"][0].__setitem__(1, ["data"]), "unknown storage"),
    "constant with a symbolic shape": (
        lambda p, s: p["slots"][p["constants"][0][0]].__setitem__(2, ["N"]), "has no static type"),
    "constant listed twice": (lambda p, s: p["constants"].append(list(p["constants"][0])), "is listed twice"),
    "splat of an implausible size": (
        lambda p, s: (p["slots"][p["constants"][0][0]].__setitem__(2, [2**39, 2**39]),
                      p["constants"][0].__setitem__(1, "splat"), p["constants"][0].__setitem__(3, 4)),
        "more than the .* nncc may allocate"),
    # dtypes
    "numeric constant relabelled as strings": (
        lambda p, s: p["slots"][next(c for c in p["constants"] if c[1] == "inline")[0]].__setitem__(1, "|O"),
        "strings need the strings storage"),
    "float constant read as strings": (
        lambda p, s: next(c for c in p["constants"] if c[1] == "inline").__setitem__(1, "strings"),
        "strings need the strings storage"),
    "unicode dtype": (lambda p, s: p["slots"][0].__setitem__(1, "<U8"), "unsupported dtype '<U8'"),
    "void dtype": (lambda p, s: p["slots"][0].__setitem__(1, "|V16"), "unsupported dtype"),
    "big-endian dtype": (lambda p, s: p["slots"][0].__setitem__(1, ">f4"), "unsupported dtype '>f4'"),
    "dtype by name": (lambda p, s: p["slots"][0].__setitem__(1, "float32"), "unsupported dtype 'float32'"),
    "structured dtype": (lambda p, s: p["slots"][0].__setitem__(1, [["a", "<f4"]]), "unsupported dtype"),
    # shapes
    "negative dimension": (lambda p, s: p["slots"][0].__setitem__(2, [1, -3]), "has a bad dimension -3"),
    "rank 33": (lambda p, s: p["slots"][0].__setitem__(2, [1] * 33), "has a bad shape"),
    "boolean dimension": (lambda p, s: p["slots"][0].__setitem__(2, [True]), "has a bad dimension True"),
    "slot not a triple": (lambda p, s: p["slots"].__setitem__(0, ["x", "<f4"]), "bad slot entry"),
    # attributes
    "attribute tensor names an input": (
        lambda p, s: _first_with_attrs(p)[3].__setitem__("evil", {"$tensor": p["inputs"][0]}),
        "attribute tensor does not name a constant"),
    "attribute tensor names an instruction output": (
        lambda p, s: _first_with_attrs(p)[3].__setitem__("evil", {"$tensor": p["instructions"][0][2][0]}),
        "attribute tensor does not name a constant"),
    "attribute tensor index not an int": (
        lambda p, s: _first_with_attrs(p)[3].__setitem__("evil", {"$tensor": [p["constants"][0][0]]}),
        "attribute tensor does not name a constant"),
    "attribute tensor with extra keys": (
        lambda p, s: _first_with_attrs(p)[3].__setitem__("evil", {"$tensor": p["constants"][0][0], "$code": "x"}),
        "attribute tensor does not name a constant"),
    "attribute nested too deeply": (
        lambda p, s: _first_with_attrs(p)[3].__setitem__("evil", [[[[[[1]]]]]]), "nested too deeply"),
    # structure
    "field of the wrong type": (lambda p, s: p.__setitem__("slots", {}), "program field 'slots' is missing or has the wrong type"),
    "arena_bytes a bool": (lambda p, s: p.__setitem__("arena_bytes", True), "program field 'arena_bytes'"),
    "instruction not a 5-list": (lambda p, s: p["instructions"][0].pop(), "bad instruction entry"),
    "partition range out of bounds": (
        lambda p, s: p["partitions"][0].__setitem__(4, len(p["instructions"]) + 1), "partition instruction range is out of bounds"),
    "opsets not a mapping": (lambda p, s: p["options"].__setitem__("opsets", [17]), "options.opsets"),
    "opset not an int": (lambda p, s: p["options"]["opsets"].__setitem__("", "17"), "options.opsets"),
    "backends not names": (lambda p, s: p["options"].__setitem__("backends", "numpy"), "options.backends"),
    "fallback entry malformed": (lambda p, s: p["fallbacks"].append({"node": 1}), "bad fallback entry"),
}


@pytest.mark.parametrize("case", list(SEMANTIC_CASES))
def test_semantic_checks(resnet_raw, case):
    edit, message = SEMANTIC_CASES[case]
    refuses(hostile(resnet_raw, edit), message)


def test_hostile_edits_of_a_plan_with_tensor_attributes(shape_ops_raw):
    def point_at_input(program, _):
        for ins in program["instructions"]:
            for key, value in ins[3].items():
                if isinstance(value, dict):
                    ins[3][key] = {"$tensor": program["inputs"][0]}
                    return
        raise AssertionError("no tensor attribute")

    refuses(hostile(shape_ops_raw, point_at_input), "attribute tensor does not name a constant")


def test_unedited_reassembly_still_loads(resnet_raw):
    """The helper itself changes nothing: re-assembly of an unedited program loads and runs."""
    again = hostile(resnet_raw, lambda p, s: None)
    assert again == F.serialize(F.deserialize(resnet_raw))  # the same artifact, unsigned
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(nncc.load(again).run({"x": x})["logits"],
                                  nncc.load(resnet_raw).run({"x": x})["logits"])


def test_an_arena_layout_from_an_older_artifact_is_not_used(resnet_raw):
    """Older artifacts stored each slot's arena offset; the executor always planned the
    arena again for the program it runs. Such a field, however wrong, changes nothing."""
    def old_layout(program, _):
        program["arena"] = [[slot, 2**40] for slot in range(len(program["slots"]))]

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(nncc.load(hostile(resnet_raw, old_layout)).run({"x": x})["logits"],
                                  nncc.load(resnet_raw).run({"x": x})["logits"])


@pytest.mark.slow
def test_cli_reports_a_hostile_artifact_in_one_line(resnet_raw, tmp_path):
    bad = tmp_path / "bad.nncc"
    bad.write_bytes(hostile(resnet_raw, SEMANTIC_CASES["unicode dtype"][0]))
    for command in (["run", str(bad), "--random-inputs"], ["inspect", str(bad)]):
        result = subprocess.run([sys.executable, "-m", "nncc", *command], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().startswith("nncc: error:") and "unsupported dtype '<U8'" in result.stderr
        assert "Traceback" not in result.stderr


def test_splat_detection_ignores_unit_axes():
    """A broadcast whose length-1 axes keep a non-zero stride is still one element."""
    from nncc.plan.plan import Plan, Slot

    view = np.lib.stride_tricks.as_strided(np.full(1, 0.5, np.float32), (1, 1000), (4, 0), writeable=False)
    assert view.strides[0] != 0  # the unit axis kept its stride
    plan = Plan(nncc.__version__, [], [Slot("c", np.dtype(np.float32), (1, 1000))], [], [0], {0: view}, [], [])
    raw = F.serialize(plan)
    _, program, inline, data = parts(raw)
    assert program["constants"] == [[0, "splat", 0, 4]] and data == b""
    loaded = F.deserialize(raw).constants[0]
    assert loaded.shape == (1, 1000) and float(loaded[0, 999]) == 0.5
    assert F.serialize(F.deserialize(raw)) == raw


# -- string tensors ------------------------------------------------------------------------


def _string_model(path) -> None:
    """String initializer -> StringConcat -> LabelEncoder whose keys are a string tensor
    attribute: both kinds of string constant a plan must carry."""
    suffix = numpy_helper.from_array(np.array(["-x", "\u00e9\u4e2d"], dtype=object), "suffix")
    encoder = helper.make_node(
        "LabelEncoder", ["y"], ["z"], domain="ai.onnx.ml",
        keys_tensor=numpy_helper.from_array(np.array(["a-x", "b\u00e9\u4e2d"], dtype=object), "k"),
        values_tensor=numpy_helper.from_array(np.array([7, 9], dtype=np.int64), "v"),
        default_tensor=numpy_helper.from_array(np.array([-5], dtype=np.int64), "d"))
    graph = helper.make_graph(
        [helper.make_node("StringConcat", ["x", "suffix"], ["y"]), encoder], "strings",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2]),
         helper.make_tensor_value_info("z", TensorProto.INT64, [2])], [suffix])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("ai.onnx.ml", 4)])
    onnx.save(model, path)


@pytest.fixture(scope="module")
def strings_raw(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("strings") / "strings.onnx"
    _string_model(path)
    return nncc.compile_model(path).to_bytes()


def test_string_constants_round_trip(strings_raw):
    _, program, _, _ = parts(strings_raw)
    assert sorted(c[1] for c in program["constants"] if c[1] == "strings") == ["strings", "strings"]
    loaded = nncc.load(strings_raw)
    assert loaded.to_bytes() == strings_raw
    out = loaded.run({"x": np.array(["a", "b"], dtype=object)})
    assert out["y"].tolist() == ["a-x", "b\u00e9\u4e2d"]
    np.testing.assert_array_equal(out["z"], [7, 9])
    out = loaded.run({"x": np.array(["b", "a"], dtype=object)})
    np.testing.assert_array_equal(out["z"], [-5, -5])


def _strings_entry(program):
    return next(c for c in program["constants"] if c[1] == "strings")


def _rewrite_strings(text: bytes):
    def edit(program, sections):
        entry = _strings_entry(program)
        entry[2], entry[3] = len(sections["inline"]), len(text)
        sections["inline"] += text
    return edit


@pytest.mark.parametrize("text, message", [
    (b'["only one"]', "does not hold 2 strings"),
    (b'["a", 3]', "does not hold 2 strings"),
    (b'{"a": "b"}', "does not hold 2 strings"),
    (b'["a", "b"', "holds malformed strings"),
    ("[\"\u00e9\", \"b\"]".encode(), "holds malformed strings"),  # not ASCII
])
def test_hostile_string_constants(strings_raw, text, message):
    refuses(hostile(strings_raw, _rewrite_strings(text)), message)


def test_string_constant_past_the_section(strings_raw):
    edit = lambda p, s: _strings_entry(p).__setitem__(2, len(s["inline"]))  # noqa: E731
    refuses(hostile(strings_raw, edit), "has a bad byte range")


def test_string_constant_as_a_broadcast(strings_raw):
    edit = lambda p, s: _strings_entry(p).append([1])  # noqa: E731
    refuses(hostile(strings_raw, edit), "strings need the strings storage")


# -- one slot codec --------------------------------------------------------------------------


def test_a_bfloat16_subgraph_input_survives_the_artifact(tmp_path):
    """A Loop carrying a bfloat16 value: its body's inputs are written by the same slot
    codec as the program's slots, so the artifact is read back and runs, with
    onnxruntime's results (a dtype written as numpy's str, "<V2", would be refused)."""
    import onnxruntime as ort

    BF16 = TensorProto.BFLOAT16
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Cast", ["v"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["f", "one"], ["g"]),
         helper.make_node("Cast", ["g"], ["v_out"], to=BF16)],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", BF16, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", BF16, [4])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    nodes = [helper.make_node("Cast", ["x"], ["v0"], to=BF16),
             helper.make_node("Loop", ["n", "", "v0"], ["v_final"], body=body),
             helper.make_node("Cast", ["v_final"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bf16_loop",  # float32 outside: onnxruntime's Python takes no bfloat16
                              [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    path = tmp_path / "bf16_loop.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    compiled = nncc.compile_model(path)
    raw = compiled.to_bytes()
    loop_attrs = [i.attrs for i in F.deserialize(raw).instructions if "body" in i.attrs]
    assert loop_attrs[0]["body"]["$graph"]["inputs"][2][:2] == ["v", "bfloat16"]
    feeds = {"n": np.array(3, np.int64), "x": np.array([0.5, -2, 300.5, 1.25], np.float32)}
    want = ort_run(path, feeds)[0]
    np.testing.assert_array_equal(nncc.load(raw).run(feeds)["y"], want)
