"""nncc.runtime.random_inputs: seeded feeds for --random-inputs, without numpy.random."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from nncc.errors import InputError
from nncc.ir.graph import TensorInfo
from nncc.runtime.random_inputs import random_feeds, standard_normal

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _declared():
    return {
        "x": TensorInfo(np.dtype(np.float32), (1, "batch", 3)),
        "ids": TensorInfo(np.dtype(np.int64), (4, 5)),
        "mask": TensorInfo(np.dtype(np.bool_), (64,)),
        "h": TensorInfo(np.dtype(np.float16), (2, 2)),
    }


def test_feeds_have_the_declared_dtypes_and_shapes():
    feeds = random_feeds(_declared(), seed=0, dims={"batch": 7})
    assert {k: (v.dtype, v.shape) for k, v in feeds.items()} == {
        "x": (np.float32, (1, 7, 3)), "ids": (np.int64, (4, 5)), "mask": (np.bool_, (64,)),
        "h": (np.float16, (2, 2))}
    assert random_feeds(_declared(), seed=0)["x"].shape == (1, 1, 3)  # symbolic dims default to 1
    assert set(np.unique(feeds["ids"])) <= set(range(10))
    assert feeds["mask"].any() and not feeds["mask"].all()


def test_same_seed_same_values_other_seed_other_values():
    a, b, c = (random_feeds(_declared(), seed=s) for s in (3, 3, 4))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["x"], c["x"]) and not np.array_equal(a["ids"], c["ids"])


def test_an_inputs_values_depend_only_on_seed_and_name():
    declared = _declared()
    alone = random_feeds({"ids": declared["ids"]}, seed=1)
    together = random_feeds(dict(reversed(list(declared.items()))), seed=1)
    np.testing.assert_array_equal(alone["ids"], together["ids"])
    renamed = random_feeds({"other": declared["ids"]}, seed=1)
    assert not np.array_equal(alone["ids"], renamed["other"])


def test_floats_are_standard_normal():
    values = standard_normal(seed=0, name="x", count=200_001)
    assert values.shape == (200_001,) and np.isfinite(values).all()
    assert abs(values.mean()) < 0.01 and abs(values.std() - 1) < 0.01
    # the fraction within one standard deviation of a normal distribution: 68.27 %
    assert abs(np.mean(np.abs(values) < 1) - 0.6827) < 0.005


def test_inputs_without_a_type_or_of_an_unsupported_dtype_are_refused():
    with pytest.raises(InputError, match="declares no tensor type"):
        random_feeds({"x": TensorInfo(None, None)})
    with pytest.raises(InputError, match="cannot make random values"):
        random_feeds({"s": TensorInfo(np.dtype(object), (2,))})


def test_nncc_run_random_inputs_does_not_import_numpy_random(tmp_path):
    """The point of the module: a scripted `nncc run --random-inputs` skips that import."""
    probe = ("import sys, runpy; sys.argv = ['nncc'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('nncc', run_name='__main__')\n"
             "finally:\n    print(json.dumps('numpy.random' in sys.modules), file=sys.stderr)\n")
    env = dict(os.environ, NNCC_CACHE_DIR=str(tmp_path), NNCC_DEBUG="1")
    done = subprocess.run([sys.executable, "-c", "import json\n" + probe, "run",
                           str(ROOT / "fixtures" / "mlp.onnx"), "--random-inputs", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"]
    assert done.stderr.strip().splitlines()[-1] == "false"


def _one_input_model(path, dtype, count) -> str:
    """One input of ``count`` elements and an output too small to count (its shape): what
    the run holds at its peak is the random input itself."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["y"])], "one_input",
                              [helper.make_tensor_value_info("x", dtype, [count])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return str(path)


# elements of the large input: big enough that it, not the interpreter or the chunks it is
# made in, is what the run holds at its peak
LARGE = 60_000_000


# the quick tier takes bfloat16, the type whose input once took three times its size
@pytest.mark.slow
@pytest.mark.parametrize("dtype_name, itemsize", [pytest.param("FLOAT", 4, marks=pytest.mark.slow), ("BFLOAT16", 2)])
def test_a_large_random_input_is_made_in_place(tmp_path, dtype_name, itemsize):
    """`nncc run --random-inputs` of a model declaring one large input peaks near that
    input's size above what a tiny model takes, whatever the element type (a bfloat16 input
    once took three times its size, rounded from one whole float32 array)."""
    from onnx import TensorProto

    from tests.peak_rss import run_measured

    dtype = getattr(TensorProto, dtype_name)
    env = dict(os.environ, NNCC_CACHE_DIR=str(tmp_path / "cache"))
    peaks = {}
    for label, count in (("tiny", 16), ("large", LARGE)):
        model = _one_input_model(tmp_path / f"{label}.onnx", dtype, count)
        done, peaks[label] = run_measured([sys.executable, "-m", "nncc", "run", model, "--random-inputs"], env=env)
        assert done.returncode == 0, done.stderr
    size = LARGE * itemsize
    assert peaks["large"] - peaks["tiny"] < 1.4 * size, \
        f"peak {peaks['large'] / 1e6:.0f} MB for a {size / 1e6:.0f} MB input (a tiny model: {peaks['tiny'] / 1e6:.0f} MB)"
