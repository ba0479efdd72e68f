"""Fuzzing the artifact loader with damaged copies of real artifacts (compiled fixtures).

Whatever the bytes, ``nncc.load`` either raises PlanFormatError or loads; when it loads
(bytes appended, padding or unused header fields changed: the checksums still match by
construction) the model must compute exactly what the original computes. Nothing else may
escape, and no load may take long.
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import nncc
from nncc.errors import PlanFormatError
from nncc.plan import format as F
from tests.conftest import FIXTURES

pytestmark = pytest.mark.slow  # fuzzing

FUZZ = settings(derandomize=True, deadline=None, max_examples=120, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEEDS = {
    "resnet_block": {"x": (1, 3, 32, 32)},
    "shape_ops": {"x": (2, 3, 8, 8)},
    "mlp": {"x": (3, 64)},
}


def _artifact(name: str):
    """The artifact (with native code where the model is static) and the outputs its
    loaded, untrusted form computes: the portable plan, which is what nncc.load runs."""
    raw = F.serialize(nncc.compile_model(FIXTURES / f"{name}.onnx").plan)  # unsigned: loads portable
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in FEEDS[name].items()}
    return raw, feeds, nncc.load(raw).run(feeds)


ARTIFACTS = {name: _artifact(name) for name in FEEDS}
NAMES = sorted(ARTIFACTS)


def load_or_refuse(data: bytes):
    """nncc.load(data): the model, or None when refused with PlanFormatError."""
    try:
        model = nncc.load(data)
    except PlanFormatError as exc:
        assert str(exc), "a refusal must say why"
        event(f"refused: {str(exc)[:40]}")
        model = None
    else:
        event("loaded")
    return model


def assert_same_outputs(model, name: str):
    _, feeds, want = ARTIFACTS[name]
    got = model.run({k: v.copy() for k, v in feeds.items()})
    assert list(got) == list(want)
    for out in want:
        np.testing.assert_array_equal(got[out], want[out], err_msg=out)


def check(data: bytes, name: str, must_load: bool = False):
    model = load_or_refuse(data)
    if must_load:
        assert model is not None, "checksums match by construction: this must load"
    if model is not None:
        assert_same_outputs(model, name)


# -- byte-level damage ---------------------------------------------------------------------

positions = st.one_of(st.integers(0, 255), st.integers(0, 2**20))  # header-heavy


@FUZZ
@given(name=st.sampled_from(NAMES),
       flips=st.lists(st.tuples(positions, st.integers(1, 255)), min_size=1, max_size=8))
def test_flipped_bytes(name, flips):
    raw = bytearray(ARTIFACTS[name][0])
    for position, mask in flips:
        raw[position % len(raw)] ^= mask
    check(bytes(raw), name)


@FUZZ
@given(name=st.sampled_from(NAMES), fraction=st.floats(0, 1, exclude_max=True), small=st.integers(0, 300))
def test_truncated(name, fraction, small):
    raw = ARTIFACTS[name][0]
    for length in (int(len(raw) * fraction), min(small, len(raw) - 1)):
        with pytest.raises(PlanFormatError):
            nncc.load(raw[:length])


@FUZZ
@given(name=st.sampled_from(NAMES), donor=st.sampled_from(NAMES),
       at=positions, src=positions, size=st.integers(1, 4096), insert=st.booleans())
def test_spliced(name, donor, at, src, size, insert):
    raw = ARTIFACTS[name][0]
    other = ARTIFACTS[donor][0]
    at %= len(raw)
    src %= len(other)
    chunk = other[src:src + size]
    if insert:
        damaged = raw[:at] + chunk + raw[at:]
    else:
        damaged = raw[:at] + chunk + raw[at + len(chunk):]
    check(damaged, name)


@FUZZ
@given(name=st.sampled_from(NAMES), tail=st.binary(min_size=1, max_size=512), copies=st.integers(0, 2))
def test_extended(name, tail, copies):
    raw = ARTIFACTS[name][0]
    # appended bytes (even a whole second artifact) lie outside every section
    check(raw + tail + raw * copies, name, must_load=True)


@FUZZ
@given(name=st.sampled_from(NAMES), data=st.data())
def test_unchecked_bytes_do_not_matter(name, data):
    """Padding between sections and the header's flags are not covered by checksums: any
    value there loads, and computes the same."""
    raw = bytearray(ARTIFACTS[name][0])
    count = int.from_bytes(raw[12:16], "little")
    free = []
    for i in range(count):
        base = 32 + 56 * i
        free += range(base + 4, base + 8)  # flags
    ends = []
    for i in range(count):
        base = 32 + 56 * i
        offset = int.from_bytes(raw[base + 8:base + 16], "little")
        length = int.from_bytes(raw[base + 16:base + 24], "little")
        ends.append((offset, length))
    head_end = 32 + 56 * count
    free += range(head_end, min(offset for offset, _ in ends))
    for offset, length in ends:
        end = offset + length
        free += range(end, min([o for o, _ in ends if o >= end] + [len(raw)]))
    picks = data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=16))
    for p in picks:
        raw[p] = data.draw(st.integers(0, 255))
    check(bytes(raw), name, must_load=True)


# -- program-level damage with repaired checksums ---------------------------------------------


def _leaves(value, path=()):
    yield path
    if isinstance(value, dict):
        for k in sorted(value):
            yield from _leaves(value[k], path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, path + (i,))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 300),
              st.floats(allow_nan=False), st.text(max_size=8),
              st.sampled_from(["|O", "<f4", "<i8", ">f8", "splat", "data", "inline", "ai.onnx::Relu::14",
                               "N", "$tensor"])),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.sampled_from(["$tensor", "node", "op", "reason", "x"]),
                                               children, max_size=3)),
    max_leaves=6,
)

PROGRAMS = {}
for _name in NAMES:
    _producer, _sections = F.read_sections(ARTIFACTS[_name][0])
    PROGRAMS[_name] = (_producer, json.loads(bytes(_sections[b"PROG"])), bytes(_sections[b"INLN"]),
                       bytes(_sections[b"DATA"]), list(_leaves(json.loads(bytes(_sections[b"PROG"])))))


@settings(FUZZ, max_examples=300)
@given(name=st.sampled_from(NAMES), data=st.data())
def test_program_edits_with_valid_checksums(name, data):
    """Replace, delete or add one value anywhere in the program; the checksums are made to
    match, so only the loader's semantic checks stand between the edit and the executor."""
    producer, program, inline, blob, paths = PROGRAMS[name]
    program = json.loads(json.dumps(program))
    path = data.draw(st.sampled_from(paths[1:]))
    parent = program
    for key in path[:-1]:
        parent = parent[key]
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[path[-1]] = data.draw(json_values)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, list):
        parent.insert(path[-1], data.draw(json_values))
    else:
        parent[data.draw(st.text(max_size=6))] = data.draw(json_values)
    prog = json.dumps(program, sort_keys=True, separators=(",", ":")).encode()
    damaged = F.assemble(producer, [(b"PROG", prog), (b"INLN", inline), (b"DATA", blob)])
    load_or_refuse(damaged)  # PlanFormatError or a model: nothing else


def test_fuzz_inputs_are_real_artifacts():
    """The seeds: whole, checked artifacts with all their sections (native code too, for the
    static models), which load and compute what the in-process portable compile computes."""
    with_code = 0
    for name in NAMES:
        raw = ARTIFACTS[name][0]
        sections = set(F.read_sections(raw)[1])
        assert sections in ({b"PROG", b"INLN", b"DATA"}, {b"PROG", b"INLN", b"DATA", b"CODE"})
        with_code += b"CODE" in sections
        assert_same_outputs(nncc.load(raw), name)
        portable = nncc.compile_model(FIXTURES / f"{name}.onnx", backends=["numpy"])
        for out, want in portable.run(ARTIFACTS[name][1]).items():
            np.testing.assert_array_equal(nncc.load(raw).run(ARTIFACTS[name][1])[out], want)
    assert with_code >= 1, "no seed carries a CODE section to fuzz"
