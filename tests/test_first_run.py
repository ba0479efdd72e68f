"""A fresh process's first run of a model the cache holds: a dynamic model's second
process runs the native plan of the shape its first process ran (the first process exiting
as a script does, its background builds finishing in the exit), loaded ahead by its prepare;
and the pages faulted in ahead of a run (nncc.util.prefault) change no output. Outputs are
checked against onnxruntime."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys

import numpy as np
import pytest

from nncc.model import compile_model, prepare
from nncc.native.toolchain import find_toolchain
from nncc.util.prefault import populate
from tests.conftest import ROOT
from tests.models import mlp
from tests.oracle import ort_outputs

needs_cc = pytest.mark.skipif(find_toolchain() is None,
                              reason="no C compiler on this machine: no native plan can be built")

TRANSFORMER = ROOT / "fixtures" / "transformer.onnx"  # tokens [1, S, 64] -> hidden

# A user's script: prepare, one run, and the end of the script (no wait of its own for anything)
FIRST_PROCESS = """
import sys
import numpy as np
from nncc.model import prepare
model, outcome = prepare(sys.argv[1], cache_dir=sys.argv[2])
model.run({"tokens": np.load(sys.argv[3])})
print(outcome.outcome, outcome.stage)
"""

SECOND_PROCESS = """
import json, sys
import numpy as np
from nncc.model import prepare
model, outcome = prepare(sys.argv[1], cache_dir=sys.argv[2])
out = model.run({"tokens": np.load(sys.argv[3])})
np.save(sys.argv[4], out["hidden"])
print(json.dumps({"outcome": outcome.outcome, "stage": outcome.stage, "native": model.last_run_native_partitions,
                  "partitions": model.last_run_partitions, "shapes": model.shape_plans}))
"""


def _env() -> dict:
    env = dict(os.environ)
    env.pop("NNCC_UPGRADE_AFTER", None)  # the default: the miss starts the upgrade
    return env


def _tokens(tmp_path, length: int):
    tokens = np.random.default_rng(length).standard_normal((1, length, 64)).astype(np.float32)
    np.save(tmp_path / "tokens.npy", tokens)
    return tokens, tmp_path / "tokens.npy"


def _first_process(tmp_path, cache, tokens_file) -> None:
    first = subprocess.run([sys.executable, "-c", FIRST_PROCESS, str(TRANSFORMER), str(cache), str(tokens_file)],
                           capture_output=True, text=True, env=_env())
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["miss", "quick"]
    assert "Traceback" not in first.stderr, first.stderr  # its background builds ended well in the exit


@pytest.mark.slow
@needs_cc
def test_the_second_process_runs_the_native_plan_of_the_shape_the_first_process_ran(tmp_path):
    cache = tmp_path / "cache"
    tokens, tokens_file = _tokens(tmp_path, 9)
    _first_process(tmp_path, cache, tokens_file)

    second = subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(TRANSFORMER), str(cache), str(tokens_file),
                             str(tmp_path / "hidden.npy")], capture_output=True, text=True, env=_env())
    assert second.returncode == 0, second.stderr
    ran = json.loads(second.stdout.splitlines()[-1])
    assert (ran["outcome"], ran["stage"]) == ("hit", "optimized")
    assert ran["native"] >= 1 and ran["native"] == ran["partitions"]  # its first run: all native
    assert ran["shapes"] == [[[1, 9, 64]]]  # the shape kept its plan
    want = ort_outputs(TRANSFORMER, {"tokens": tokens})["hidden"]
    np.testing.assert_allclose(np.load(tmp_path / "hidden.npy"), want, rtol=1e-4, atol=1e-5)


# A later process: its prepare loads the seen shape's plan ahead, and returns once it is
# loaded (nothing of the load is left to the first run); with the cache folder then gone, a
# lookup finds nothing, so only the plan loaded ahead can run natively. A process of its own,
# as a user's is: the test process's own state (plugins, settings other tests left) would
# make another token.
LOADED_AHEAD_PROCESS = """
import json, shutil, sys, threading
import numpy as np
from nncc.model import prepare
model, outcome = prepare(sys.argv[1], cache_dir=sys.argv[2])
assert "nncc-load-ahead" not in [thread.name for thread in threading.enumerate()], "still loading"
shutil.rmtree(sys.argv[2])
out = model.run({"tokens": np.load(sys.argv[3])})
np.save(sys.argv[4], out["hidden"])
print(json.dumps({"outcome": outcome.outcome, "native": model.last_run_native_partitions}))
"""


@pytest.mark.slow
@needs_cc
def test_a_prepare_returns_with_the_seen_shapes_plan_loaded_so_the_run_needs_no_lookup(tmp_path):
    cache = tmp_path / "cache"
    tokens, tokens_file = _tokens(tmp_path, 7)
    _first_process(tmp_path, cache, tokens_file)

    later = subprocess.run([sys.executable, "-c", LOADED_AHEAD_PROCESS, str(TRANSFORMER), str(cache),
                            str(tokens_file), str(tmp_path / "hidden.npy")], capture_output=True, text=True, env=_env())
    assert later.returncode == 0, later.stderr
    ran = json.loads(later.stdout.splitlines()[-1])
    assert ran["outcome"] == "hit"
    assert not cache.exists() and ran["native"] >= 1
    want = ort_outputs(TRANSFORMER, {"tokens": tokens})["hidden"]
    np.testing.assert_allclose(np.load(tmp_path / "hidden.npy"), want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@needs_cc
def test_a_prepare_keeps_the_plan_of_a_shape_the_cache_holds_so_its_first_run_looks_nothing_up(tmp_path):
    """The plan of a shape the cache holds (an earlier process ran it; here stored for S=13
    as ``nncc compile --dim`` does) is loaded by the prepare and kept as that shape's plan
    before any run, with its memory faulted in: with the cache folder gone, only the kept
    plan can run natively, and its first run matches onnxruntime."""
    import shutil

    cache = tmp_path / "cache"
    fixed, _ = prepare(TRANSFORMER, cache_dir=cache, stage="optimized", dims={"S": 13})
    assert fixed.native_partitions >= 1
    model, _ = prepare(TRANSFORMER, cache_dir=cache)  # the general plan: a miss, portable (dynamic)
    assert model.shape_plans == [((1, 13, 64),)]  # kept before any run
    kept = model._shape_plans._plans[((1, 13, 64),)]
    assert kept.first_outputs is not None  # the one native call's outputs, made ahead
    assert model.warmed_up >= 1  # the kept plan run on zeros (the general plan has dynamic inputs: not run)
    shutil.rmtree(cache)
    tokens = np.random.default_rng(13).standard_normal((1, 13, 64)).astype(np.float32)
    got = model.run({"tokens": tokens})["hidden"]
    assert model._last is kept and model.last_run_native_partitions == fixed.native_partitions
    np.testing.assert_allclose(got, ort_outputs(TRANSFORMER, {"tokens": tokens})["hidden"], rtol=1e-4, atol=1e-5)


@needs_cc
def test_a_model_prepared_from_a_hit_with_its_memory_faulted_in_ahead_matches_onnxruntime(tmp_path):
    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp([4, 48], 96, 10, seed=3, second_bias=True).SerializeToString())
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 48)).astype(np.float32)}
    prepare(path, cache_dir=tmp_path / "cache", stage="optimized")
    model, outcome = prepare(path, cache_dir=tmp_path / "cache", stage="optimized")
    assert outcome.outcome == "hit" and model.native_partitions >= 1
    assert model.prefaulting is not None  # the mapped constants and the arena
    model.prefaulting.join()
    np.testing.assert_allclose(model.run(feeds)["y"], ort_outputs(path, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_populating_a_file_mapping_and_scratch_memory_changes_no_byte(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 3 * mmap.PAGESIZE + 100, dtype=np.uint8)
    (tmp_path / "data").write_bytes(data.tobytes())
    with open(tmp_path / "data", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
        populated = populate(mapping)
        assert bytes(mapping) == data.tobytes()
    scratch = data[5:].copy()  # not page-aligned at either end: whole pages around it are populated
    assert populate(scratch, write=True) == populated  # the kernel has MADV_POPULATE_* or not, for both
    np.testing.assert_array_equal(scratch, data[5:])
    assert populate(b"") is False and populate(np.empty(0, np.uint8)) is False


SHUTDOWN_BUILD = """
import threading
import numpy as np
from nncc.model import compile_model
main = threading.main_thread()

def build():
    main.join()  # the interpreter has begun to exit: a concurrent.futures pool refuses work now
    model = compile_model(__import__("sys").argv[1])
    print(model.native_partitions, flush=True)

threading.Thread(target=build).start()
"""


@pytest.mark.slow
@needs_cc
def test_a_native_build_in_a_thread_still_builds_while_the_interpreter_exits(tmp_path):
    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp([2, 16], 24, 5, seed=4).SerializeToString())
    done = subprocess.run([sys.executable, "-c", SHUTDOWN_BUILD, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert int(done.stdout.split()[-1]) >= 1
    assert compile_model(path).native_partitions >= 1  # what the same compile gives in a running interpreter
