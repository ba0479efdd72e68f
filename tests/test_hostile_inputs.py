"""Hostile sizes and graphs: a few bytes of ONNX or artifact that declare terabytes, cycles,
mistyped attributes. Each is bad input, reported in one line with exit code 2 before
anything is allocated; never a MemoryError, an OverflowError or a kernel's TypeError.

Real processes, each with its address space capped (RLIMIT_AS), so an allocation the
checks miss fails the test; the timeout only guards against a hang.
"""

from __future__ import annotations

import json
import pathlib
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nncc as nncc_api
from nncc.plan import format as F
from tests.conftest import FIXTURES
from tests.oracle import ort_run
from tests.test_cli_errors import assert_error
from tests.test_hostile_files import MEMORY_CAP, nncc as run_nncc

GIB = 1 << 30


def nncc(*args, cwd, env=None):
    return run_nncc(*args, cwd=cwd, extra_env=env)


# -- artifacts whose program declares impossible sizes ---------------------------------------


def _mlp_program():
    raw = nncc_api.compile_model(FIXTURES / "mlp.onnx").to_bytes()
    producer, sections = F.read_sections(raw)
    return producer, json.loads(bytes(sections[b"PROG"])), bytes(sections[b"INLN"]), bytes(sections[b"DATA"])


def _artifact(path: pathlib.Path, edit) -> pathlib.Path:
    """The mlp fixture's artifact with its program edited and its checksums made to match,
    so only the loader's own checks stand between the edit and the executor."""
    producer, program, inline, data = _mlp_program()
    edit(program)
    prog = json.dumps(program, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(F.assemble(producer, [(b"PROG", prog), (b"INLN", inline), (b"DATA", data)]))
    return path


def _slot(program, name):
    return next(i for i, s in enumerate(program["slots"]) if s[0] == name)


def _splat_of_3_gib(program):
    """Bias b_0 becomes a splat (one stored float) of 3 * 2**28 elements: 3 GiB expanded."""
    slot = _slot(program, "b_0")
    program["slots"][slot][2] = [3 * 2**28]
    entry = next(c for c in program["constants"] if c[0] == slot)
    entry[1:] = ["splat", 0, 4]


def test_inspect_describes_a_huge_splat_without_expanding_it(tmp_path):
    path = _artifact(tmp_path / "splat.nncc", _splat_of_3_gib)
    assert path.stat().st_size < 100_000
    result = nncc("inspect", path, "--json", cwd=tmp_path, env={"NNCC_MAX_MEMORY": "1T"})
    assert result.returncode == 0, result.stderr
    splat = json.loads(result.stdout)["constants"]["splat"]
    assert splat["expanded_bytes"] == 3 * GIB and splat["count"] == 1


def test_running_a_huge_splat_is_refused_before_allocating(tmp_path):
    path = _artifact(tmp_path / "splat.nncc", _splat_of_3_gib)
    assert MEMORY_CAP < 3 * GIB  # the default bound follows the address-space limit
    assert_error(nncc("run", path, "--random-inputs", cwd=tmp_path), "b_0", "nncc may allocate")
    assert_error(nncc("run", path, "--random-inputs", cwd=tmp_path, env={"NNCC_MAX_MEMORY": "1G"}),
                 "nncc may allocate", "NNCC_MAX_MEMORY")


@pytest.mark.parametrize("command", [["inspect"], ["run", "--random-inputs"]])
def test_static_shapes_with_a_huge_product_are_refused(tmp_path, command):
    def edit(program):  # every dim under the per-dimension cap, the product 2**50
        program["slots"][_slot(program, "relu_0")][2] = [2**20, 2**20, 2**10]

    path = _artifact(tmp_path / "huge.nncc", edit)
    assert_error(nncc(command[0], path, *command[1:], cwd=tmp_path), "relu_0", "nncc may allocate")


def test_a_huge_arena_is_refused(tmp_path):
    path = _artifact(tmp_path / "arena.nncc", lambda p: p.__setitem__("arena_bytes", 2**45))
    assert_error(nncc("inspect", path, cwd=tmp_path), "arena", "nncc may allocate")


def test_a_bad_memory_bound_is_a_usage_error(tmp_path):
    path = _artifact(tmp_path / "mlp.nncc", lambda p: None)
    assert_error(nncc("run", path, "--random-inputs", cwd=tmp_path, env={"NNCC_MAX_MEMORY": "lots"}),
                 "bad size 'lots' in NNCC_MAX_MEMORY", "use a number")


# -- ONNX models --------------------------------------------------------------------------------


def _save(path: pathlib.Path, nodes, inputs, outputs, inits=(), opset=17) -> pathlib.Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(inits))
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString())
    return path


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _attr_node(op, inputs, name, attr, value):
    node = helper.make_node(op, inputs, ["y"], name=name)
    node.attribute.append(helper.make_attribute(attr, value))
    return node


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _f32(name, values):
    return numpy_helper.from_array(np.array(values, np.float32), name)


BAD_MODELS = {
    "cycle": (lambda p: _save(p, [helper.make_node("Relu", ["b"], ["a"], name="r1"),
                                  helper.make_node("Relu", ["a"], ["b"], name="r2"),
                                  helper.make_node("Add", ["x", "a"], ["y"], name="add")],
                              [_f("x", [2])], [_f("y", [2])]),
              ["cycle", "Relu", "'r1'"]),
    "self-consuming node": (lambda p: _save(p, [helper.make_node("Add", ["x", "y"], ["y"], name="self")],
                                            [_f("x", [2])], [_f("y", [2])]),
                            ["Add", "'self'", "its own output"]),
    "required input left empty": (lambda p: _save(p, [helper.make_node("Add", ["x", ""], ["y"], name="add")],
                                                  [_f("x", [2])], [_f("y", [2])]),
                                  ["Add", "'add'", "required", "empty name"]),
    "variadic input left empty": (lambda p: _save(p, [helper.make_node("Max", ["x", ""], ["y"], name="mx")],
                                                  [_f("x", [2])], [_f("y", [2])]),
                                  ["Max", "'mx'", "input 1", "empty name"]),
    "float for an int attribute": (lambda p: _save(p, [_attr_node("Softmax", ["x"], "sm", "axis", 1.5)],
                                                   [_f("x", [2, 3])], [_f("y", [2, 3])]),
                                   ["Softmax", "'sm'", "'axis'", "an int", "float"]),
    "string for a list attribute": (lambda p: _save(p, [_attr_node("Transpose", ["x"], "tr", "perm", "10")],
                                                    [_f("x", [2, 3])], [_f("y", [3, 2])]),
                                    ["Transpose", "'tr'", "'perm'", "a list of ints", "str"]),
    "list for an int attribute": (lambda p: _save(p, [_attr_node("Concat", ["x", "x"], "cc", "axis", [0, 1])],
                                                  [_f("x", [2, 3])], [_f("y", [4, 3])]),
                                  ["Concat", "'cc'", "'axis'", "an int"]),
    "ConstantOfShape to 2**40": (
        lambda p: _save(p, [helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos"),
                            helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                        [_f("x", [1])], [_f("y", None)], [_i64("s", [2**40])]),
        ["nncc may allocate"]),
    "Range to 2**40": (
        lambda p: _save(p, [helper.make_node("Range", ["a", "b", "d"], ["c"], name="rng"),
                            helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                        [_f("x", [1])], [_f("y", None)],
                        [_f32("a", 0), _f32("b", float(2**40)), _f32("d", 1)]),
        ["rng", "Range", "nncc may allocate"]),
    "Expand to 2**40": (
        lambda p: _save(p, [helper.make_node("Expand", ["v", "s"], ["c"], name="exp"),
                            helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                        [_f("x", [1])], [_f("y", None)], [_f32("v", [1.5]), _i64("s", [2**20, 2**20])]),
        ["nncc may allocate"]),
    "Tile to 2**40": (
        lambda p: _save(p, [helper.make_node("Tile", ["v", "s"], ["c"], name="tile"),
                            helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                        [_f("x", [1])], [_f("y", None)], [_f32("v", [[1.5, 2.5]]), _i64("s", [2**20, 2**19])]),
        ["tile", "Tile", "nncc may allocate"]),
    "input dims of 2**62": (lambda p: _save(p, [helper.make_node("Relu", ["x"], ["y"], name="r")],
                                            [_f("x", [2**62, 2])], [_f("y", [2**62, 2])]),
                            ["random input 'x'", "nncc may allocate"]),
    "rank 65": (lambda p: _save(p, [helper.make_node("Relu", ["x"], ["y"], name="r")],
                                [_f("x", [1] * 65)], [_f("y", [1] * 65)]),
                ["more than 32 dimensions"]),
    "rank 33 by Unsqueeze": (lambda p: _save(p, [helper.make_node("Unsqueeze", ["x", "a"], ["y"], name="u")],
                                             [_f("x", [1] * 32)], [_f("y", None)], [_i64("a", [0])]),
                             ["Unsqueeze", "'u'", "rank 33"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_MODELS))
@pytest.mark.parametrize("cache", ["--no-cache", "cache"])
def test_hostile_onnx_models_are_bad_input(tmp_path, case, cache):
    make, fragments = BAD_MODELS[case]
    path = make(tmp_path / "model.onnx")
    args = ["run", path, "--random-inputs"] + ([cache] if cache == "--no-cache" else [])
    assert_error(nncc(*args, cwd=tmp_path), *fragments)


# -- what random inputs and the output summary allocate ---------------------------------------


def _peak(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_random_inputs_peak_near_their_own_size():
    from nncc.ir.graph import TensorInfo
    from nncc.runtime.random_inputs import random_feeds

    count = 2**25  # 128 MiB of float32
    feeds, peak = _peak(lambda: random_feeds({"x": TensorInfo(np.dtype(np.float32), (count,))}))
    assert feeds["x"].shape == (count,) and np.isfinite(feeds["x"][-1000:]).all()
    assert peak < 4 * count + 96 * 2**20, f"peak {peak / 2**20:.0f} MiB for a 128 MiB input"


@pytest.mark.slow
def test_the_output_summary_peaks_near_nothing():
    from nncc.cli.run import summarize

    value = np.linspace(-3, 5, 2**25, dtype=np.float32)
    value[7] = np.nan
    (row,), peak = _peak(lambda: summarize({"y": value}))
    finite = np.delete(value, 7).astype(np.float64)  # the independent computation
    assert row["nonfinite"] == 1
    assert (row["min"], row["max"]) == (-3.0, 5.0)
    np.testing.assert_allclose([row["mean"], row["std"]], [finite.mean(), finite.std()], rtol=1e-9)
    assert peak < 48 * 2**20, f"peak {peak / 2**20:.0f} MiB to summarize a 128 MiB output"


# -- found by fuzzing (tests/test_hostile_fuzz.py) -----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("op", ["Elu", "HardSigmoid", "HardSwish", "LeakyRelu", "Selu", "Sigmoid", "Softplus"])
def test_activations_of_a_scalar_match_onnxruntime(op):
    """0-d inputs: numpy returns scalars for 0-d operations, which these kernels then tried
    to write into (a TypeError, "return arrays must be of ArrayType")."""
    import onnxruntime as ort

    from nncc.compiler import CompileOptions, compile_graph
    from nncc.frontend.onnx import parse_model
    from nncc.model import CompiledModel

    alone = [helper.make_node(op, ["x"], ["y"])]  # its result is a graph output
    chained = [helper.make_node(op, ["x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]  # written in place
    for nodes, value in ((alone, -0.7), (chained, -0.7), (alone, 0.3)):
        graph = helper.make_graph(nodes, op, [_f("x", [])], [_f("y", [])])
        data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()
        x = np.array(value, np.float32)
        want = ort_run(data, {"x": x})[0]
        for level in (0, 2):
            got = CompiledModel(compile_graph(parse_model(data), CompileOptions(opt_level=level))).run({"x": x})["y"]
            assert got.shape == () and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{op}({value}) -O{level}")


def test_a_value_written_twice_is_bad_input(tmp_path):
    path = _save(tmp_path / "twice.onnx", [helper.make_node("Relu", ["x"], ["y"], name="a"),
                                           helper.make_node("Neg", ["x"], ["y"], name="b")],
                 [_f("x", [2])], [_f("y", [2])])
    assert_error(nncc("run", path, "--random-inputs", cwd=tmp_path), "Neg", "'b'", "'y'", "already defined")


@pytest.mark.parametrize("group", [1, pytest.param(2, marks=pytest.mark.slow)],  # depthwise: slow
                         ids=["dense", "depthwise"])
def test_strides_past_the_input_compute_what_onnxruntime_does(tmp_path, group):
    """A Conv whose stride is far larger than its input: the stride-phase layout made one
    Python step per phase (2**26 here: hours for one node; the subprocess's timeout is the
    safety net that turns such a hang into a failure)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                            strides=[2, 2**26], group=group)
    graph = helper.make_graph([node], "conv", [_f("x", [1, 2, 9, 9])], [_f("y", None)],
                              [numpy_helper.from_array(rng.standard_normal((4, 2 // group, 3, 3)).astype(np.float32), "w")])
    path = tmp_path / "conv.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    x = rng.standard_normal((1, 2, 9, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = ort_run(path, {"x": x})[0]
    result = nncc("run", path, "--input", "x=x.npy", "-o", "out.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], want, rtol=1e-5, atol=1e-5)


def _edited_mlp(tmp_path, edit):
    return _artifact(tmp_path / "edited.nncc", edit)


def test_a_mistyped_attribute_in_an_artifact_is_refused(tmp_path):
    """Found by fuzzing: a list where the arena planner reads Concat's int axis was a TypeError."""
    raw = nncc_api.compile_model(FIXTURES / "shape_ops.onnx").to_bytes()
    producer, sections = F.read_sections(raw)
    program = json.loads(bytes(sections[b"PROG"]))
    concat = next(i for i, key in enumerate(program["kernels"]) if "::Concat::" in key)
    ins = next(i for i in program["instructions"] if i[0] == concat)
    ins[3]["axis"] = [0, 1]
    prog = json.dumps(program, sort_keys=True, separators=(",", ":")).encode()
    path = tmp_path / "edited.nncc"
    path.write_bytes(F.assemble(producer, [(b"PROG", prog), (b"INLN", bytes(sections[b"INLN"])),
                                            (b"DATA", bytes(sections[b"DATA"]))]))
    assert_error(nncc("run", path, "--random-inputs", cwd=tmp_path), "Concat", "'axis'", "an int")


def test_a_mistyped_attribute_of_a_fused_kernel_is_refused(tmp_path):
    """Found by fuzzing: a list as FusedGemm's transB reached int() inside the Gemm kernel
    (a TypeError, which the executor rightly lets through as a bug)."""
    def edit(program):
        fused = next(i for i, key in enumerate(program["kernels"]) if "FusedGemm" in key)
        next(i for i in program["instructions"] if i[0] == fused)[3]["transB"] = [1]

    assert_error(nncc("run", _edited_mlp(tmp_path, edit), "--random-inputs", cwd=tmp_path),
                 "FusedGemm", "'transB'", "an int")


def test_an_omitted_required_operand_of_a_fused_kernel_is_refused(tmp_path):
    """Found by fuzzing: a FusedGemm instruction reading slot -1 (omitted) for its A operand."""
    def edit(program):
        fused = next(i for i, key in enumerate(program["kernels"]) if "Fused" in key or "Gemm" in key)
        next(i for i in program["instructions"] if i[0] == fused)[1][0] = -1

    assert_error(nncc("run", _edited_mlp(tmp_path, edit), "--random-inputs", cwd=tmp_path),
                 "required", "empty name")


def test_constants_that_contradict_an_op_are_a_shape_error(tmp_path):
    """Found by fuzzing: LayerNormalization evaluated at compile time on constants of
    mismatched shapes raised numpy's ValueError from shape inference."""
    rng = np.random.default_rng(0)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="ln", axis=-1)
    graph = helper.make_graph([node], "ln", [], [_f("y", None)],
                              [_f32("x", rng.standard_normal((2, 64))), _f32("s", np.ones(3)), _f32("b", np.zeros(3))])
    path = tmp_path / "ln.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert_error(nncc("run", path, cwd=tmp_path), "LayerNormalization", "'ln'")


def test_a_kernel_swapped_for_another_is_bad_input_not_a_crash(tmp_path):
    """Found by fuzzing: an artifact naming another registered kernel (Shape -> LogSoftmax)
    made the executor copy a float result into the int64 buffer planned for it (TypeError).
    The loaded plan's shapes are checked against its kernels first: the swap is bad input."""
    def edit(program):
        program["kernels"][program["kernels"].index("ai.onnx::Shape::1")] = "ai.onnx::LogSoftmax::13"

    raw = nncc_api.compile_model(FIXTURES / "shape_ops.onnx").to_bytes()
    producer, sections = F.read_sections(raw)
    program = json.loads(bytes(sections[b"PROG"]))
    edit(program)
    prog = json.dumps(program, sort_keys=True, separators=(",", ":")).encode()
    path = tmp_path / "swapped.nncc"
    path.write_bytes(F.assemble(producer, [(b"PROG", prog), (b"INLN", bytes(sections[b"INLN"])),
                                            (b"DATA", bytes(sections[b"DATA"]))]))
    assert_error(nncc("run", path, "--random-inputs", cwd=tmp_path), "LogSoftmax node 'n_Shape_0'",
                 "output 'shape_0' is declared int64, the operator makes float32")


def test_external_data_declaring_more_than_memory_is_refused_before_reading(tmp_path):
    """A sparse external-data file costs nothing to make and can back a tensor of 64 GiB."""
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**34],
                         data_location=TensorProto.EXTERNAL)
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    graph = helper.make_graph([helper.make_node("ReduceSum", ["w"], ["y"], name="sum", keepdims=0)], "ext", [],
                              [_f("y", [])], [tensor])
    (tmp_path / "m.onnx").write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
                                      .SerializeToString())
    with open(tmp_path / "weights.bin", "wb") as f:
        f.truncate(4 * 2**34)
    assert_error(nncc("run", "m.onnx", "--no-cache", cwd=tmp_path), "'w'", "external data", "nncc may allocate")


def test_an_allocation_within_the_bound_but_beyond_the_machine_is_bad_input(tmp_path):
    """NNCC_MAX_MEMORY raised past what the process can get: the arena's MemoryError is
    still reported as a limit (exit 2), not an internal error. The batch dimension is
    written down as 2**36 in every slot, so the shapes still agree with the operators."""
    def edit(program):
        for slot in program["slots"]:
            slot[2] = [2**36 if d == "N" else d for d in slot[2]]

    path = _artifact(tmp_path / "huge.nncc", edit)
    assert_error(nncc("run", path, "--random-inputs", cwd=tmp_path, env={"NNCC_MAX_MEMORY": "100000T"}),
                 "more than is available")


@pytest.mark.parametrize("mode", ["constant", pytest.param("edge", marks=pytest.mark.slow)])  # edge: slow
def test_pads_given_at_run_time_are_checked_before_allocating(tmp_path, mode):
    """Found by fuzzing: Pad's output (and, for edge/reflect, its index tables) was
    allocated at whatever size the pads asked for."""
    node = helper.make_node("Pad", ["x", "pads"], ["y"], name="pad", mode=mode)
    graph = helper.make_graph([node], "pad", [_f("x", [2, 3]), helper.make_tensor_value_info("pads", TensorProto.INT64, [4])],
                              [_f("y", None)])
    path = tmp_path / "pad.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    np.save(tmp_path / "pads.npy", np.array([0, 2**31, 0, 2**31], np.int64))
    assert_error(nncc("run", path, "--input", "x=x.npy", "--input", "pads=pads.npy", cwd=tmp_path),
                 "pad", "Pad output", "nncc may allocate")


def test_resize_sizes_given_at_run_time_are_checked_before_allocating(tmp_path):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="rs", mode="nearest")
    graph = helper.make_graph([node], "rs", [_f("x", [1, 1, 2, 2]),
                                             helper.make_tensor_value_info("sizes", TensorProto.INT64, [4])],
                              [_f("y", None)])
    path = tmp_path / "rs.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString())
    np.save(tmp_path / "x.npy", np.ones((1, 1, 2, 2), np.float32))
    np.save(tmp_path / "sizes.npy", np.array([1, 1, 2**20, 2**20], np.int64))
    assert_error(nncc("run", path, "--input", "x=x.npy", "--input", "sizes=sizes.npy", cwd=tmp_path),
                 "rs", "Resize output", "nncc may allocate")
