"""Kernels described as data (nncc/native/kernel.py): a step's declared buffers become the
kernel's typed parameters; integer tables are C structs packed from one Python definition
(nncc/native/c_struct.py); C text written with the emitter (nncc/native/c_emit.py)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnx
from onnx import TensorProto, helper
import pytest

import nncc
from nncc.backends.base import Partition
from nncc.frontend.onnx import parse_model
from nncc.native import kernel
from nncc.native.c_emit import CWriter
from nncc.native.c_struct import Field, Struct
from nncc.native.codegen import generate
from nncc.native.toolchain import find_toolchain
from nncc.passes.pipeline import run_passes
from nncc.passes.shape_inference import infer_shapes

needs_cc = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: generated C cannot be built here")


def _model(nodes, inputs, output_shape, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _unit(model, level: int = 2):
    graph = run_passes(parse_model(model.SerializeToString()), level)
    part = Partition(0, "native", list(graph.nodes), list(graph.inputs), list(graph.outputs))
    return generate(part, graph, infer_shapes(graph), "entry", 8)


def test_a_step_reading_two_buffers_and_writing_one_takes_two_const_pointers_then_one(tmp_path):
    model = _model([helper.make_node("Sub", ["a", "b"], ["y"])], [("a", [3, 5]), ("b", [3, 5])], [3, 5])
    (made,) = _unit(model).kernels
    assert [p.ctype for p in made.params] == ["const float *", "const float *", "float *"]
    assert made.signature == "(const float *p0, const float *p1, float *p2)"
    assert made.scratch == 0 and not made.blas
    assert made.name in made.definition and made.signature in made.declaration
    if find_toolchain() is None:
        pytest.skip("no C compiler: the signature is checked, the kernel cannot run")
    onnx.save(model, tmp_path / "sub.onnx")
    compiled = nncc.compile_model(tmp_path / "sub.onnx")
    assert compiled.native_partitions == 1
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(compiled.run({"a": a, "b": b})["y"], a - b)  # the order of a and b matters


def test_the_name_is_the_hash_of_the_whole_text_signature_included():
    body = "p1[0] = p0[0];"
    reads = kernel.Kernel((kernel.Param("p0", kernel.READ), kernel.Param("p1", kernel.WRITE)), body)
    punned = kernel.Kernel((kernel.Param("p0", kernel.WRITE), kernel.Param("p1", kernel.WRITE)), body)
    assert reads.name != punned.name  # same body, another signature: another object in the cache
    assert reads.name == kernel.Kernel(reads.params, body).name


def test_scratch_and_blas_are_declared_by_the_step(tmp_path):
    """A strided convolution by weights known only at run time goes through im2col (scratch)
    and the BLAS GEMM: its kernel takes the scratch last, says it calls BLAS, and so does the
    unit; an elementwise kernel does neither."""
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2]), helper.make_node("Relu", ["c"], ["y"])],
                   [("x", [1, 3, 9, 9]), ("w", [4, 3, 3, 3])], [1, 4, 4, 4])
    unit = _unit(model, level=0)  # -O0: the Relu stays a step of its own
    conv, relu = unit.kernels
    assert conv.blas and conv.scratch == 3 * 3 * 3 * 4 * 4 * 4  # one column of K = C*kh*kw per output pixel
    assert conv.signature == "(const float *p0, const float *p1, float *p2, char *scratch)"
    assert not relu.blas and relu.scratch == 0 and unit.blas
    if find_toolchain() is None:
        pytest.skip("no C compiler: the declaration is checked, the kernels cannot run")
    onnx.save(model, tmp_path / "conv.onnx")
    compiled = nncc.compile_model(tmp_path / "conv.onnx")
    assert compiled.native_partitions == 1
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 3, 9, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(x[0], (3, 3), axis=(1, 2))[:, ::2, ::2]  # [C, 4, 4, 3, 3]
    expected = np.maximum(np.einsum("chwij,kcij->khw", windows, w), 0)[None]
    np.testing.assert_allclose(compiled.run({"x": x, "w": w})["y"], expected, rtol=1e-5, atol=1e-5)


def test_a_buffer_used_but_not_declared_is_a_generator_bug():
    with pytest.raises(AssertionError, match="does not declare"):
        kernel.bind(f"{kernel.marker(3)}[0] = {kernel.marker(4)}[0];", [(4, kernel.READ)], "Copy")


def test_struct_pointer_parameters_are_declared_to_the_calling_unit():
    table = Struct("nn_t_4", (Field("a", "float"), Field("b", "int32_t", 4)))
    made = kernel.Kernel((kernel.Param("p0", table.pointer), kernel.Param("p1", kernel.WRITE)), "p1[0] = p0->a;")
    assert made.declaration.startswith("struct nn_t_4;\n")


_MIXED = Struct("nn_mixed", (Field("scale", "float"), Field("bytes", "int8_t", 5), Field("ints", "int32_t", 3),
                             Field("big", "int64_t"), Field("zero", "uint8_t"), Field("mult", "float", 2)))


@needs_cc
def test_packed_bytes_read_back_by_c_hold_every_field(tmp_path):
    """A C program with the struct's declaration reads the packed bytes and prints each
    field: the values given in Python, in a struct of the size numpy laid out."""
    values = {"scale": 0.375, "bytes": [-128, 127, -1, 5], "ints": [-(2 ** 31), 7, 2 ** 31 - 1],
              "big": 2 ** 40 + 3, "zero": 200, "mult": [1.5, -2.25]}
    storage = _MIXED.pack(**values)
    assert storage.dtype == np.float32 and storage.nbytes >= _MIXED.dtype.itemsize
    (tmp_path / "table.bin").write_bytes(storage.tobytes())
    c = CWriter()
    c.directive("#include <stdio.h>")
    c.directive("#include <stdint.h>")
    c.raw(_MIXED.declaration)
    with c.function("int main(int argc, char **argv)"):
        c.line("struct nn_mixed t;", "FILE *f = fopen(argv[1], \"rb\");",
               "if (!f || fread(&t, sizeof t, 1, f) != 1) return 1;",
               "printf(\"%zu %.9g %lld %u\\n\", sizeof t, t.scale, (long long)t.big, t.zero);")
        with c.loop("i", 5, ctype="int"):
            c.line("printf(\"%d \", t.bytes[i]);")
        with c.loop("i", 3, ctype="int"):
            c.line("printf(\"%d \", t.ints[i]);")
        c.line("printf(\"%.9g %.9g\\n\", t.mult[0], t.mult[1]);", "return 0;")
    (tmp_path / "read.c").write_text(c.text())
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-std=c11", "-o", str(tmp_path / "read"), str(tmp_path / "read.c")], check=True)
    out = subprocess.run([str(tmp_path / "read"), str(tmp_path / "table.bin")], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0].split() == [str(_MIXED.dtype.itemsize), "0.375", str(2 ** 40 + 3), "200"]
    assert out[1].split() == ["-128", "127", "-1", "5", "0", str(-(2 ** 31)), "7", str(2 ** 31 - 1), "1.5", "-2.25"]


def test_packing_refuses_missing_unknown_and_too_many_values():
    with pytest.raises(ValueError, match="missing or unknown"):
        _MIXED.pack(scale=1.0)
    with pytest.raises(ValueError, match="values for"):
        Struct("nn_s", (Field("v", "int32_t", 2),)).pack(v=[1, 2, 3])
    with pytest.raises(ValueError, match="not one a table holds"):
        Field("d", "double")


def test_the_emitter_nests_and_indents_blocks():
    c = CWriter()
    c.directive("#define N 4")
    with c.function("static void f(float *y, int n)"):
        c.comment("zero, then count")
        with c.loop("i", "N"):
            with c.when("i < n"):
                c.line("y[i] = (float)i;")
            with c.otherwise():
                c.line("y[i] = 0.0f;", "continue;")
        with c.block("", " /* done */"):
            c.raw("int a = 1;\nint b = a;")
    assert c.text() == (
        "#define N 4\n"
        "static void f(float *y, int n) {\n"
        "    /* zero, then count */\n"
        "    for (int64_t i = 0; i < N; i++) {\n"
        "        if (i < n) {\n"
        "            y[i] = (float)i;\n"
        "        } else {\n"
        "            y[i] = 0.0f;\n"
        "            continue;\n"
        "        }\n"
        "    }\n"
        "    {\n"
        "        int a = 1;\n"
        "        int b = a;\n"
        "    } /* done */\n"
        "}\n")


def test_otherwise_needs_an_if_before_it():
    c = CWriter()
    c.line("x = 1;")
    with pytest.raises(ValueError):
        with c.otherwise():
            pass
