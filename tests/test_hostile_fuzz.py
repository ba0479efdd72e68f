"""Fuzzing the promise "hostile files never crash, hang or exhaust nncc": mutated fixture
models (structural edits of attributes, dims, inputs, ops, initializers and nodes; flipped,
truncated and duplicated bytes) and mutated artifacts (numbers in the program changed with
its checksum fixed, so the edit reaches the parser and the executor; flipped and truncated
bytes), each loaded, compiled and run in process.

The only exceptions allowed are nncc's own (NnccError subclasses: one line at the CLI).
Memory is bounded twice: NNCC_MAX_MEMORY is set low, and tracemalloc's peak for each
example must stay under a bound well above it and far below what a runaway allocation
takes. A SIGALRM handler turns a hang into a failure (a safety net, not a timing check).
Seeded and deterministic; the short run takes a few seconds, the slow-marked one longer.
"""

from __future__ import annotations

import json
import random
import signal
import tracemalloc
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import nncc
from nncc.compiler import CompileOptions, compile_graph
from nncc.errors import NnccError
from nncc.frontend.onnx import parse_model
from nncc.kernels.registry import registered_ops
from nncc.model import CompiledModel
from nncc.plan import format as F
from nncc.runtime.random_inputs import random_feeds
from tests.conftest import FIXTURES

MAX_MEMORY = 64 << 20  # NNCC_MAX_MEMORY during the fuzzing
PEAK_BOUND = 512 << 20  # what one example may allocate in all (tracemalloc)
HANG_SECONDS = 120  # an example still running after this is a hang
INTERESTING = [-2**63, -2**62, -2**31, -1, 0, 1, 2, 3, 7, 64, 2**20, 2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1]
QUICK = ["mlp", "resnet_block", "shape_ops", "gru_cell"]
ALL = QUICK + ["transformer", "mobilenet"]


@pytest.fixture(autouse=True)
def _bounded(monkeypatch):
    from nncc.util.limits import set_memory_limit

    monkeypatch.setenv("NNCC_MAX_MEMORY", str(MAX_MEMORY))  # for the entry points (nncc.load), which resolve it
    set_memory_limit(MAX_MEMORY)  # and for the floors called directly here (parse_model, compile_graph)

    def hang(*_):
        raise AssertionError(f"an example ran for more than {HANG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, hang)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
    set_memory_limit(None)


# -- what each example does ---------------------------------------------------------------------


def run(model: CompiledModel) -> None:
    model.run(random_feeds(model.input_infos, seed=0))


def compile_and_run(data: bytes, opt_level: int) -> None:
    model = CompiledModel(compile_graph(parse_model(data), CompileOptions(opt_level=opt_level)))
    run(model)
    run(nncc.load(model.to_bytes()))  # and through the artifact format


def load_and_run(data: bytes) -> None:
    run(nncc.load(data))


def survives(label: str, fn) -> str:
    """Run one example: 'ok' or 'refused' (an NnccError). Anything else, a hang or a peak
    above PEAK_BOUND fails the test, naming the example."""
    tracemalloc.start()
    signal.alarm(HANG_SECONDS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # overflow in a kernel is a value, not an error
            fn()
        outcome = "ok"
    except NnccError as exc:
        assert str(exc), label
        outcome = "refused"
    except Exception as exc:  # noqa: BLE001 - the point of the test
        raise AssertionError(f"{label}: {type(exc).__name__}: {exc}") from exc
    finally:
        signal.alarm(0)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_BOUND, f"{label}: allocated {peak >> 20} MiB"
    return outcome


# -- mutations -----------------------------------------------------------------------------------

OPS = sorted({op for domain, op, _ in registered_ops() if domain == ""})


def mutate_model(rng: random.Random, proto: onnx.ModelProto) -> tuple[str, bytes]:
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    g = m.graph
    kind = rng.choice(["attr", "dim", "input", "op", "init", "delete node", "repeat node", "output"])
    names = [""] + [o for n in g.node for o in n.output] + [i.name for i in g.input] + [t.name for t in g.initializer]
    if kind == "attr" and any(n.attribute for n in g.node):
        attr = rng.choice(rng.choice([n for n in g.node if n.attribute]).attribute)
        if attr.type == onnx.AttributeProto.INT:
            attr.i = rng.choice(INTERESTING)
        elif attr.type == onnx.AttributeProto.INTS and attr.ints:
            attr.ints[rng.randrange(len(attr.ints))] = rng.choice(INTERESTING)
        elif attr.type == onnx.AttributeProto.FLOAT:
            attr.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e30])
    elif kind == "dim":
        info = rng.choice(list(g.input) + list(g.output) + list(g.value_info))
        dims = info.type.tensor_type.shape.dim
        if dims:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 2, 3, 2**31, 2**40, 2**62])
    elif kind == "input":
        node = rng.choice(g.node)
        if node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(names)
        else:
            node.input.append(rng.choice(names))
    elif kind == "op":
        rng.choice(g.node).op_type = rng.choice(OPS)
    elif kind == "init" and g.initializer:
        tensor = rng.choice(g.initializer)
        try:
            array = numpy_helper.to_array(tensor).copy()
        except ValueError:  # dims an earlier edit made inconsistent with the data
            array = np.zeros(0)
        if array.dtype == np.int64 and array.size:
            array.flat[rng.randrange(array.size)] = rng.choice(INTERESTING)
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
        elif tensor.dims:
            tensor.dims[rng.randrange(len(tensor.dims))] = rng.choice([0, 1, 2**20])
    elif kind == "delete node":
        del g.node[rng.randrange(len(g.node))]
    elif kind == "repeat node":
        g.node.append(rng.choice(g.node))
    elif kind == "output":
        g.output[0].name = rng.choice(names)
    return kind, m.SerializeToString()


def mutate_bytes(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    data = bytearray(data)
    kind = rng.choice(["flip", "truncate", "repeat"])
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        data = data[:rng.randrange(len(data))]
    else:
        i = rng.randrange(len(data))
        data[i:i] = data[i:i + rng.randint(1, 64)]
    return kind, bytes(data)


def _numbers(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, path + (i,))
    elif type(value) is int:
        yield path, value


KERNEL_KEYS = sorted({f"{domain or 'ai.onnx'}::{op}::{since}" for domain, op, since in registered_ops()})
ODD_VALUES = [[], [0], [2**40], "x", 1.5, None, [1, 2, 3, 4, 5, 6, 7, 8], -1, 2**40]


def mutate_program(rng: random.Random, raw: bytes) -> tuple[str, bytes]:
    """Edit the PROG section (one to three integers anywhere, a kernel key, an instruction
    operand or an attribute value) and fix its checksum."""
    producer, sections = F.read_sections(raw)
    program = json.loads(bytes(sections[b"PROG"]))
    kind = rng.choice(["numbers", "numbers", "kernel", "operand", "attribute"])
    changed = [kind]
    instruction = rng.choice(program["instructions"])
    if kind == "kernel":
        program["kernels"][rng.randrange(len(program["kernels"]))] = rng.choice(KERNEL_KEYS)
    elif kind == "operand" and instruction[1]:
        instruction[1][rng.randrange(len(instruction[1]))] = rng.randrange(-1, len(program["slots"]))
    elif kind == "attribute" and instruction[3]:
        instruction[3][rng.choice(sorted(instruction[3]))] = rng.choice(ODD_VALUES)
    else:
        numbers = list(_numbers(program))
        for _ in range(rng.randint(1, 3)):
            path, old = rng.choice(numbers)
            parent = program
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = rng.choice(INTERESTING + [old + 1, old - 1, 2 * old])
            changed.append("/".join(map(str, path)))
    prog = json.dumps(program, sort_keys=True, separators=(",", ":")).encode()
    return " ".join(changed), F.assemble(producer, [(b"PROG", prog), (b"INLN", bytes(sections[b"INLN"])),
                                                      (b"DATA", bytes(sections[b"DATA"]))])


# -- the runs --------------------------------------------------------------------------------------


def fuzz(seed: int, names: list[str], rounds: int) -> dict[str, int]:
    rng = random.Random(seed)
    protos = {n: onnx.load(str(FIXTURES / f"{n}.onnx")) for n in names}
    artifacts = {n: nncc.compile_model(FIXTURES / f"{n}.onnx").to_bytes() for n in names}
    outcomes: dict[str, int] = {}

    def count(outcome):
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    for i in range(rounds):
        name = rng.choice(names)
        kind, data = mutate_model(rng, protos[name])
        level = rng.choice([0, 1, 2])
        count(survives(f"#{i} {name}.onnx, {kind}, -O{level}", lambda: compile_and_run(data, level)))
        kind, data = mutate_bytes(rng, protos[name].SerializeToString())
        count(survives(f"#{i} {name}.onnx bytes, {kind}", lambda: compile_and_run(data, 2)))
        kind, data = mutate_program(rng, artifacts[name])
        count(survives(f"#{i} {name}.nncc program, {kind}", lambda: load_and_run(data)))
        kind, data = mutate_bytes(rng, artifacts[name])
        count(survives(f"#{i} {name}.nncc bytes, {kind}", lambda: load_and_run(data)))
    return outcomes


@pytest.mark.slow
def test_mutated_models_and_artifacts_meet_only_nnccs_errors():
    outcomes = fuzz(seed=0, names=QUICK, rounds=12)
    assert outcomes.get("refused", 0) and outcomes.get("ok", 0), outcomes  # both paths were reached


@pytest.mark.slow  # longer fuzzing
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mutated_models_and_artifacts_meet_only_nnccs_errors_longer(seed):
    fuzz(seed=seed, names=ALL, rounds=100)


@pytest.mark.slow
def test_the_fuzzing_bounds_catch_what_they_guard():
    """The harness itself: a foreign exception, a runaway allocation and a hang each fail."""
    with pytest.raises(AssertionError, match="KeyError"):
        survives("bug", lambda: {}["x"])
    with pytest.raises(AssertionError, match="allocated"):
        survives("big", lambda: np.ones(PEAK_BOUND // 8 + 1))
    assert survives("refusal", lambda: nncc.load(b"not an artifact")) == "refused"
