"""`nncc export`: each form of an exported library (shared, static, embedded weights),
linked into a C program built here with the system compiler, computes what onnxruntime
computes; the files are byte-identical from one export to the next and not rewritten when
unchanged; the depfile, the pkg-config file and the README's example program work; a model
that cannot stand alone is refused."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import onnx
import pytest

import nncc
from tests.export_build import block, compiler, convnet, driver, export, have, run_driver
from tests.models import GraphBuilder
from tests.oracle import ort_outputs

pytestmark = [pytest.mark.skipif(compiler() is None, reason="no C compiler: nothing can be exported or linked"),
              pytest.mark.slow]  # every test builds, links or runs a C library


MODELS = {"convnet": convnet, "block": block}
API = ["open", "run", "run_batch", "close", "last_error", "batch_name", "input_count", "output_count"] + [
    f"{kind}_{what}" for kind in ("input", "output") for what in ("name", "type", "rank", "shape", "size", "batch_axis")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """model name -> (model, feeds, folder, folder with embedded weights)."""
    root = tmp_path_factory.mktemp("export")
    out = {}
    for name, make in MODELS.items():
        model, feeds = make(root / f"{name}.onnx")
        folder, embedded = root / name, root / f"{name}-embedded"
        export(root / f"{name}.onnx", folder, cache=root / "cache")
        export(root / f"{name}.onnx", embedded, "--embed-weights", cache=root / "cache")
        out[name] = (model, feeds, folder, embedded)
    return out


def expected(model, feeds) -> list[np.ndarray]:
    want = ort_outputs(model, feeds)
    return [want[o.name] for o in model.graph.output]


@pytest.mark.parametrize("form", ["shared", "static", "embedded-shared", "embedded-static"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_form_matches_onnxruntime(exported, name, form, tmp_path):
    model, feeds, folder, embedded = exported[name]
    where = embedded if form.startswith("embedded") else folder
    exe = driver(where, name, form.split("-")[-1])
    weights = "-" if form.startswith("embedded") else str(where / f"{name}.weights")
    want = expected(model, feeds)
    got = run_driver(exe, weights, [feeds[i.name] for i in model.graph.input], [w.size for w in want], tmp_path)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(w).max()))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_load_library_runs_it_from_python(exported, name):
    model, feeds, folder, embedded = exported[name]
    want = ort_outputs(model, feeds)
    for where in (folder, embedded):
        with nncc.load_library(where) as library:
            assert library.inputs == [(i.name, feeds[i.name].shape) for i in model.graph.input]
            assert [n for n, _ in library.outputs] == [o.name for o in model.graph.output]
            got = library.run(feeds)
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(value).max()))


@pytest.mark.skipif(not have("readelf"), reason="readelf (binutils) lists a library's dependencies")
def test_library_needs_only_libc_libm_and_pthread(exported):
    for name, (_, _, folder, _) in exported.items():
        dynamic = subprocess.run(["readelf", "-d", str(folder / f"lib{name}.so")], capture_output=True,
                                 text=True, check=True).stdout
        needed = {line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line}
        # glibc's own parts: the dynamic loader is where thread-local storage comes from
        assert needed and needed <= {"libc.so.6", "libm.so.6", "libpthread.so.0", "ld-linux-x86-64.so.2"}, needed
        symbols = subprocess.run(["nm", "-D", "--defined-only", "--format=posix", str(folder / f"lib{name}.so")],
                                 capture_output=True, text=True, check=True).stdout.splitlines()
        names = {line.split()[0] for line in symbols}
        assert names == {f"{name}_{api}" for api in API}, names


def test_same_model_gives_the_same_files_and_unchanged_ones_are_not_rewritten(exported, tmp_path):
    model, _, folder, _ = exported["convnet"]
    source = folder.parent / "convnet.onnx"
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}
    done = export(source, folder, "--json", cache=folder.parent / "cache")
    assert json.loads(done.stdout)["written"] == []
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()} == before
    again = tmp_path / "again"
    export(source, again, "--no-cache", cache=None)  # built without the cache: the same bytes still
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {k: v[0] for k, v in before.items()}
    embedded = exported["convnet"][3]
    export(source, tmp_path / "embedded", "--embed-weights", cache=folder.parent / "cache")
    assert {p.name: p.read_bytes() for p in (tmp_path / "embedded").iterdir()} == \
        {p.name: p.read_bytes() for p in embedded.iterdir()}


def test_depfile_names_the_model_and_its_external_data(tmp_path):
    b = GraphBuilder(name="ext", seed=3)
    x = b.input([2, 64])
    b.output(b.node("Relu", [b.node("MatMul", [x, b.weight([64, 64])])]))
    proto = b.save(tmp_path / "ext.onnx")
    onnx.save(proto, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.data", size_threshold=0)
    out, dep = tmp_path / "lib", tmp_path / "ext.d"
    export(tmp_path / "ext.onnx", out, "--depfile", dep, cache=tmp_path / "cache")
    text = dep.read_text()
    targets, _, rest = text.partition(":")
    assert set(targets.split()) == {str(p) for p in out.iterdir()}
    assert str(tmp_path / "ext.onnx") in rest and str(tmp_path / "ext.data") in rest


@pytest.mark.skipif(not have("pkg-config"), reason="pkg-config is not installed")
def test_pkg_config_file_builds_a_program(exported, tmp_path):
    _, _, folder, _ = exported["block"]
    env = dict(os.environ, PKG_CONFIG_PATH=str(folder))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "block"], capture_output=True, text=True,
                           env=env, check=True).stdout.split()
    assert f"-I{folder}" in flags and "-lblock" in flags
    program = tmp_path / "example.c"
    program.write_text(_readme_example(folder))
    subprocess.run([compiler(), str(program), "-o", str(tmp_path / "example"), *flags, f"-Wl,-rpath,{folder}"],
                   check=True)
    done = subprocess.run([str(tmp_path / "example"), str(folder / "block.weights")], capture_output=True,
                          text=True, check=True)
    assert done.stdout.startswith("y")


def test_readme_example_builds_against_the_static_library(exported, tmp_path):
    model, _, folder, _ = exported["convnet"]
    program = tmp_path / "example.c"
    program.write_text(_readme_example(folder))
    subprocess.run([compiler(), str(program), "-o", str(tmp_path / "example"), f"-I{folder}",
                    str(folder / "libconvnet.a"), "-lm", "-lpthread"], check=True)
    done = subprocess.run([str(tmp_path / "example"), str(folder / "convnet.weights")], capture_output=True,
                          text=True, check=True)
    zeros = {i.name: np.zeros(tuple(d.dim_value for d in i.type.tensor_type.shape.dim), np.float32)
             for i in model.graph.input}
    first = expected(model, zeros)[0].ravel()[:4]
    printed = np.array(done.stdout.split(":")[1].split(), np.float32)
    np.testing.assert_allclose(printed, first, rtol=1e-4, atol=1e-6)


def _readme_example(folder) -> str:
    return (folder / "README").read_text().split("---- example.c ----\n", 1)[1]


def test_model_that_is_not_one_native_partition_is_refused(tmp_path):
    b = GraphBuilder(name="topk", seed=4)
    x = b.input([1, 32])
    y = b.node("Relu", [b.node("MatMul", [x, b.weight([32, 32])])])
    top = b.node("TopK", [y, b.const([4], np.int64)], axis=-1)
    b.nodes[-1].output.append("indices")
    b.output(top)
    b.save(tmp_path / "topk.onnx")
    done = export(tmp_path / "topk.onnx", tmp_path / "out", cache=tmp_path / "cache", check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "not one native partition" in lines[0] and "Traceback" not in done.stderr
    assert any("TopK" in line for line in lines[1:]), lines
    assert not (tmp_path / "out").exists()


def test_a_batch_fixed_with_dim_is_a_fixed_size(tmp_path):
    """--dim fixes a batch that could stay open (tests/test_export_batch.py): the library
    then takes that size only."""
    b = GraphBuilder(name="dyn", seed=5)
    x = b.input([1, 16])
    b.inputs[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    b.output(b.node("Relu", [b.node("MatMul", [x, b.weight([16, 8])])]))
    model = b.save(tmp_path / "dyn.onnx")
    export(tmp_path / "dyn.onnx", tmp_path / "out", "--dim", "batch=3", cache=tmp_path / "cache")
    feeds = {"x0": np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)}
    with nncc.load_library(tmp_path / "out") as library:
        assert library.inputs == [("x0", (3, 16))]
        got = library.run(feeds)
    np.testing.assert_allclose(got[model.graph.output[0].name], ort_outputs(model, feeds)[model.graph.output[0].name],
                               rtol=1e-5, atol=1e-6)


def test_a_name_that_is_not_a_c_identifier_is_a_usage_error(exported, tmp_path):
    _, _, folder, _ = exported["convnet"]
    done = export(folder.parent / "convnet.onnx", tmp_path / "out", "--name", "3d-model",
                  cache=folder.parent / "cache", check=False)
    assert done.returncode == 2 and "C identifier" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = export(folder.parent / "convnet.onnx", tmp_path / "out", "--name", "nncc", cache=folder.parent / "cache",
                  check=False)
    assert done.returncode == 2 and "taken by nncc" in done.stderr and not (tmp_path / "out").exists()


def test_int8_convnet_exports_and_matches(tmp_path):
    """A statically quantized convnet (onnxruntime's quantizer, QOperator format) is one
    native partition of int8 steps: the exported library gives nncc's own in-process answer
    bit for bit, and onnxruntime's within two steps of the output's quantization."""
    from onnxruntime import quantization

    b = GraphBuilder(name="int8", seed=6)
    x = b.input([2, 3, 16, 16])
    y = b.node("Relu", [b.node("Conv", [x, b.weight([8, 3, 3, 3]), b.const(np.full(8, 0.1))], pads=[1, 1, 1, 1])])
    y = b.node("Relu", [b.node("Conv", [y, b.weight([16, 8, 3, 3]), b.const(np.zeros(16))], pads=[1, 1, 1, 1],
                               strides=[2, 2])])
    y = b.node("Flatten", [b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])])
    b.output(b.node("Gemm", [y, b.weight([10, 256]), b.const(np.zeros(10))], transB=1))
    b.save(tmp_path / "float.onnx")
    rng = np.random.default_rng(11)

    class Calibration(quantization.CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x0": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantization.quantize_static(tmp_path / "float.onnx", tmp_path / "int8.onnx", Calibration(),
                                 quant_format=quantization.QuantFormat.QOperator)
    model = onnx.load(tmp_path / "int8.onnx")
    export(tmp_path / "int8.onnx", tmp_path / "lib", cache=tmp_path / "cache")
    feeds = {"x0": b.feeds["x0"]}
    output = model.graph.output[0].name
    with nncc.load_library(tmp_path / "lib") as library:
        got = library.run(feeds)[output]
    np.testing.assert_array_equal(got, nncc.compile_model(tmp_path / "int8.onnx").run(feeds)[output])
    last = next(n for n in model.graph.node if output in n.output)
    scale = next(float(onnx.numpy_helper.to_array(i)) for i in model.graph.initializer if i.name == last.input[1])
    np.testing.assert_allclose(got, ort_outputs(model, feeds)[output], rtol=0, atol=2 * scale + 1e-6)


def test_an_output_folder_that_cannot_be_written_is_refused_first(exported, tmp_path):
    (tmp_path / "a-file").write_text("")
    done = export(exported["convnet"][2].parent / "convnet.onnx", tmp_path / "a-file" / "lib",
                  cache=tmp_path / "cache", check=False)
    assert done.returncode == 2 and "not a folder" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "cache").exists()  # refused before any compile


def test_without_a_c_compiler_the_export_is_refused(tmp_path):
    b = GraphBuilder(name="nocc", seed=8)
    b.output(b.node("Relu", [b.input([1, 8])]))
    b.save(tmp_path / "nocc.onnx")
    done = export(tmp_path / "nocc.onnx", tmp_path / "out", cache=tmp_path / "cache", check=False,
                  env={"CC": str(tmp_path / "no-such-compiler")})
    assert done.returncode == 2 and "no C compiler" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_runs_from_several_threads_at_once_each_get_their_answer(exported):
    """The header's promise: any thread may run any model; runs of a library take turns on its
    one thread pool. Four threads, two models of the library, different inputs each."""
    from concurrent.futures import ThreadPoolExecutor

    model, feeds, folder, _ = exported["block"]
    rng = np.random.default_rng(9)
    batches = [{"x0": rng.standard_normal(feeds["x0"].shape).astype(np.float32)} for _ in range(8)]
    want = [ort_outputs(model, f) for f in batches]
    with nncc.load_library(folder, threads=2) as first, nncc.load_library(folder, threads=2) as second:
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda i: (first if i % 2 else second).run(batches[i]), range(len(batches))))
    for g, w in zip(got, want):
        for key, value in w.items():
            np.testing.assert_allclose(g[key], value, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(value).max()))


@pytest.mark.skipif(not have("c++"), reason="no C++ compiler to build the C++ program with")
def test_odd_tensor_names_survive_and_a_cpp_program_links(tmp_path):
    """Names are the model's: a comment end, quotes, backslashes and non-ASCII come through
    the header (compiled as C++ here) and the API exactly."""
    b = GraphBuilder(name="odd", seed=10)
    x = b.input([1, 8])
    y = b.node("Relu", [b.node("MatMul", [x, b.weight([8, 4])])])
    b.output(y)
    proto = b.save(tmp_path / "odd.onnx")
    odd_in, odd_out = 'in */ "q" \\ ü', "out?\u00e9"
    for node in proto.graph.node:
        node.input[:] = [odd_in if n == x else n for n in node.input]
        node.output[:] = [odd_out if n == y else n for n in node.output]
    proto.graph.input[0].name, proto.graph.output[0].name = odd_in, odd_out
    onnx.save(proto, tmp_path / "odd.onnx")
    export(tmp_path / "odd.onnx", tmp_path / "lib", cache=tmp_path / "cache")
    program = tmp_path / "main.cpp"
    program.write_text('#include "odd.h"\n#include <cstdio>\n#include <vector>\nint main() {\n'
                       '  odd_model *m;\n  if (odd_open("' + str(tmp_path / "lib" / "odd.weights") + '", 1, &m)) return 1;\n'
                       '  std::vector<float> x(odd_input_size(0), 1.0f), y(odd_output_size(0));\n'
                       '  const float *in[] = {x.data()};\n  float *out[] = {y.data()};\n'
                       '  int r = odd_run(m, in, out);\n  std::printf("%s|%g\\n", odd_input_name(0), y[0]);\n'
                       '  odd_close(m);\n  return r;\n}\n')
    subprocess.run(["c++", str(program), "-o", str(tmp_path / "main"), f"-I{tmp_path / 'lib'}",
                    str(tmp_path / "lib" / "libodd.a"), "-lm", "-lpthread"], check=True)
    done = subprocess.run([str(tmp_path / "main")], capture_output=True, check=True)
    name, value = done.stdout.decode().strip().rsplit("|", 1)
    feeds = {odd_in: np.ones((1, 8), np.float32)}
    assert name == odd_in
    assert float(value) == pytest.approx(float(ort_outputs(proto, feeds)[odd_out].ravel()[0]), rel=1e-5, abs=1e-6)
    with nncc.load_library(tmp_path / "lib") as library:
        assert library.inputs == [(odd_in, (1, 8))] and library.outputs == [(odd_out, (1, 4))]
