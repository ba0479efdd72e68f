"""`nncc export` of a model whose batch is a symbolic dimension that separates the samples:
the library is compiled for one sample and its C API runs any batch size. A transformer
(reshapes computed from the run-time shape, as an export with dynamic axes writes them)
exported without --dim for its batch runs 1, 3 and 5 samples from a C program, plain and
under AddressSanitizer and UBSan, through load_library and `nncc run DIR`, against
onnxruntime; an
unbatched input goes whole to every sample and an unbatched output is the first sample's;
a batch size of 0, a negative one or one too large for memory is an error code and a
message; a symbolic dimension that is not a batch is refused, naming it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

import nncc
from nncc.errors import InputError
from nncc.export.ctypes_library import LibraryError
from tests.conftest import ROOT
from tests.export_build import compiler, driver, export, refused_batches, run_driver
from tests.models import GraphBuilder, benchmark_model
from tests.oracle import ort_outputs

pytestmark = [pytest.mark.skipif(compiler() is None, reason="no C compiler: nothing can be exported or linked"),
              pytest.mark.slow]  # every test builds, links or runs a C library

SANITIZED = {"NNCC_NATIVE_SANITIZE": "1"}
ARGUMENT = 1  # NAME_ERR_ARGUMENT (nncc/export/c_api.py's ERRORS)
SIZES = (1, 3, 5)
TRANSFORMER = "_transformer('xf', 7, causal=False, seq=8, d=32, heads=2, ff=64, layers=1, dynamic=True)"


def symbolic(builder: GraphBuilder, index: int, axis: int, name: str) -> None:
    """Input ``index``'s ``axis`` becomes the symbolic dimension ``name``."""
    builder.inputs[index].type.tensor_type.shape.dim[axis].dim_param = name


def mixed(path):
    """A batched input and an unbatched one; a batched output and one computed from the
    unbatched input alone (the same for every sample)."""
    b = GraphBuilder(name="mixed", seed=12)
    x, w = b.input([1, 4, 16]), b.input([16])
    symbolic(b, 0, 0, "n")
    b.output(b.node("Relu", [b.node("Add", [b.node("MatMul", [x, b.weight([16, 16])]), w])]))
    b.output(b.node("Sigmoid", [b.node("Mul", [w, b.const(np.full(16, 0.5))])]))
    return b.save(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(name, kind) -> (model, folder): the transformer (its sequence fixed at 8, its batch
    left open) and the mixed model, plain or sanitized, each exported the first time a test
    asks for it (so the quick tier, which runs no sanitized test, builds no sanitized one)."""
    root = tmp_path_factory.mktemp("export-batch")
    models = {"xf": onnx.load(_transformer_file(root)), "mixed": mixed(root / "mixed.onnx")}
    dims = {"xf": ["--dim", "seq=8"], "mixed": []}

    class Exports(dict):
        def __missing__(self, key):
            name, kind = key
            folder = root / f"{name}-{kind}"
            export(root / f"{name}.onnx", folder, *dims[name], cache=root / f"cache-{kind}",
                   env=SANITIZED if kind == "sanitized" else None)
            self[key] = (models[name], folder)
            return self[key]

    return Exports()


def _transformer_file(root):
    onnx.save(benchmark_model(TRANSFORMER, root), root / "xf.onnx")
    return root / "xf.onnx"


def batch_feeds(model, n: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded normal inputs of ``n`` samples (the transformer's sequence at 8, as exported)."""
    rng = np.random.default_rng(seed)
    sizes = {"batch": n, "n": n, "seq": 8}
    return {i.name: rng.standard_normal([sizes[d.dim_param] if d.dim_param else d.dim_value
                                         for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_header_and_introspection_name_the_batch(exported):
    _, folder = exported["xf", "plain"]
    header = (folder / "xf.h").read_text()
    assert "input 0: hidden_in float32 [batch, 8, 32]" in header and "xf_run_batch(" in header
    with nncc.load_library(folder) as library:
        assert library.inputs == [("hidden_in", (None, 8, 32))]
        assert library.outputs == [("hidden_out", (None, 8, 32))]
        assert library.api("input_batch_axis")(0) == 0 and library.api("output_batch_axis")(0) == 0
        assert library.api("input_size")(0) == 8 * 32  # one sample's elements
        assert library.batch == "batch"
    _, folder = exported["mixed", "plain"]
    with nncc.load_library(folder) as library:
        assert [library.api("input_batch_axis")(i) for i in range(2)] == [0, -1]
        assert [library.api("output_batch_axis")(j) for j in range(2)] == [0, -1]
        assert library.batch == "n"


# sanitized: slow (test_export_hostile keeps a sanitized export in the quick tier)
@pytest.mark.parametrize("kind", ["plain", pytest.param("sanitized", marks=pytest.mark.slow)])
def test_c_program_runs_any_batch_size(exported, kind, tmp_path):
    """The driver (sanitized with the sanitized library) at 1, 3 and 5 samples (and run, one
    sample), and the sizes run_batch refuses before touching a buffer."""
    sanitize = kind == "sanitized"
    model, folder = exported["xf", kind]
    exe = driver(folder, "xf", "shared", sanitize=sanitize)
    for n in SIZES:
        feeds = batch_feeds(model, n, seed=n)
        want = ort_outputs(model, feeds)["hidden_out"]
        (got,) = run_driver(exe, str(folder / "xf.weights"), [feeds["hidden_in"]], [want.size], tmp_path,
                            sanitize=sanitize, batch=n)
        close(got.reshape(want.shape), want)
        if n == 1:  # NAME_run: one sample
            (got,) = run_driver(exe, str(folder / "xf.weights"), [feeds["hidden_in"]], [want.size], tmp_path,
                                sanitize=sanitize)
            close(got.reshape(want.shape), want)
    refused = refused_batches(exe, str(folder / "xf.weights"), [0, -1, -(2 ** 63), 2 ** 62, 2 ** 63 - 1],
                              sanitize=sanitize)
    assert [code for code, _ in refused] == [ARGUMENT] * 5
    assert all("must be 1 or more" in message for _, message in refused[:3]), refused
    assert all("too large" in message for _, message in refused[3:]), refused


# sanitized: slow (test_export_hostile keeps a sanitized export in the quick tier)
@pytest.mark.parametrize("kind", ["plain", pytest.param("sanitized", marks=pytest.mark.slow)])
def test_unbatched_input_goes_whole_to_each_sample_and_unbatched_output_is_written(exported, kind, tmp_path):
    sanitize = kind == "sanitized"
    model, folder = exported["mixed", kind]
    exe = driver(folder, "mixed", "static", sanitize=sanitize)
    feeds = batch_feeds(model, 3, seed=4)
    want = ort_outputs(model, feeds)
    names = [o.name for o in model.graph.output]
    got = run_driver(exe, str(folder / "mixed.weights"), [feeds["x0"], feeds["x1"]],
                     [want[name].size for name in names], tmp_path, sanitize=sanitize, batch=3)
    for g, name in zip(got, names):
        close(g.reshape(want[name].shape), want[name])


def test_load_library_runs_any_batch_size(exported):
    for name in ("xf", "mixed"):
        model, folder = exported[name, "plain"]
        with nncc.load_library(folder) as library:
            for n in SIZES:
                feeds = batch_feeds(model, n, seed=10 + n)
                got = library.run(feeds)
                for key, value in ort_outputs(model, feeds).items():
                    assert got[key].shape == value.shape
                    close(got[key], value)


def test_nncc_run_runs_the_folder_at_any_batch_size(exported, tmp_path):
    """`nncc run DIR` runs the exported library on the inputs given, any batch size."""
    model, folder = exported["xf", "plain"]
    for n in (2, 4):
        feeds = batch_feeds(model, n, seed=20 + n)
        np.savez(tmp_path / "in.npz", **feeds)
        done = subprocess.run([sys.executable, "-m", "nncc", "run", str(folder), "--inputs", str(tmp_path / "in.npz"),
                               "-o", str(tmp_path / "out.npz")], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        close(np.load(tmp_path / "out.npz")["hidden_out"], ort_outputs(model, feeds)["hidden_out"])
    done = subprocess.run([sys.executable, "-m", "nncc", "run", str(tmp_path), "--random-inputs"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "holding no exported library" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_load_library_refuses_what_the_library_cannot_take(exported):
    model, folder = exported["xf", "plain"]
    with nncc.load_library(folder) as library:
        with pytest.raises(LibraryError, match="must be 1 or more, not 0") as caught:
            library.run({"hidden_in": np.zeros((0, 8, 32), np.float32)})
        assert caught.value.code == ARGUMENT
        with pytest.raises(InputError, match=r"takes \[N, 8, 32\]"):
            library.run({"hidden_in": np.zeros((2, 9, 32), np.float32)})


def test_a_library_with_every_size_fixed_runs_one_sample_only(tmp_path):
    """The same API without a batch: run_batch takes 1, and refuses another count."""
    b = GraphBuilder(name="fixed", seed=13)
    b.output(b.node("Relu", [b.node("MatMul", [b.input([2, 16]), b.weight([16, 8])])]))
    model = b.save(tmp_path / "fixed.onnx")
    export(tmp_path / "fixed.onnx", tmp_path / "fixed", cache=tmp_path / "cache")
    exe = driver(tmp_path / "fixed", "fixed", "static")
    (got,) = run_driver(exe, str(tmp_path / "fixed" / "fixed.weights"), [b.feeds["x0"]], [16], tmp_path, batch=1)
    close(got.reshape(2, 8), ort_outputs(model, b.feeds)[model.graph.output[0].name])
    ((code, message),) = refused_batches(exe, str(tmp_path / "fixed" / "fixed.weights"), [2])
    assert code == ARGUMENT and "no batch axis" in message
    with nncc.load_library(tmp_path / "fixed") as library:
        assert library.batch is None


def test_a_symbolic_dimension_that_is_not_a_batch_is_refused(tmp_path):
    """n is the second axis of [3, n]: a sample's part would not be one contiguous chunk.
    Refused with one line naming it; fixed with --dim, it exports."""
    b = GraphBuilder(name="rows", seed=14)
    b.input([3, 4])
    symbolic(b, 0, 1, "n")
    b.output(b.node("Relu", ["x0"]))
    model = b.save(tmp_path / "rows.onnx")
    done = export(tmp_path / "rows.onnx", tmp_path / "out", cache=tmp_path / "cache", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "symbolic dimension n is not a batch" in line and "--dim n=SIZE" in line
    assert not (tmp_path / "out").exists()
    export(tmp_path / "rows.onnx", tmp_path / "out", "--dim", "n=4", cache=tmp_path / "cache")
    with nncc.load_library(tmp_path / "out") as library:
        close(library.run(b.feeds)[model.graph.output[0].name], ort_outputs(model, b.feeds)[model.graph.output[0].name])


def test_a_second_symbolic_dimension_is_refused_naming_it(exported, tmp_path):
    """The transformer without --dim for its sequence: the line names seq, and says the
    batch may stay."""
    root = exported["xf", "plain"][1].parent
    done = export(root / "xf.onnx", tmp_path / "out", cache=root / "cache-plain", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "symbolic dimension(s) seq must be fixed" in line and "batch may stay" in line
