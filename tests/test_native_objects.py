"""The kernel object cache: a translation unit is compiled once per cache, whatever model,
partition or compile it comes from.

Every compile here is a real `nncc run` process whose $CC is a wrapper script that logs each
call, then execs the system compiler: the log counts compiler invocations. Outputs are
checked against onnxruntime.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

from blake3 import blake3

from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_run

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler on this machine: the native "
                                "backend, and so the object cache, needs one")


def _conv_model(path: pathlib.Path, seed: int, tail: str) -> pathlib.Path:
    """Conv 3->8 (3x3, pad 1) and Relu, the layer both models share (their weights differ),
    then a tail of the model's own: another Conv 8->8 (3x3), or a 1x1 Conv 8->4 and Sigmoid."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"])]
    if tail == "conv3x3":
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w2"))
        nodes.append(helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1]))
        out_shape = [1, 8, 16, 16]
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32), "w2"))
        nodes += [helper.make_node("Conv", ["r1", "w2"], ["c2"]), helper.make_node("Sigmoid", ["c2"], ["y"])]
        out_shape = [1, 4, 16, 16]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


class Setup:
    def __init__(self, tmp_path: pathlib.Path):
        self.tmp = tmp_path
        self.cache = tmp_path / "cache"
        self.log = tmp_path / "cc.log"
        real = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc") or shutil.which("clang")
        self.cc = tmp_path / "cc-wrapper"
        self.cc.write_text(f'#!/bin/sh\necho "$*" >> "{self.log}"\nexec "{real}" "$@"\n')
        self.cc.chmod(0o755)
        self.x = tmp_path / "x.npy"
        np.save(self.x, np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32))
        self.a = _conv_model(tmp_path / "a.onnx", 1, "conv3x3")
        self.b = _conv_model(tmp_path / "b.onnx", 2, "conv1x1")

    def nncc(self, *args, cache=None, expect: int = 0):
        env = dict(os.environ, CC=str(self.cc), PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(cache or self.cache))
        done = subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], capture_output=True, text=True,
                              env=env, timeout=600)
        assert done.returncode == expect, done.stderr
        return done

    def run(self, model, cache=None) -> tuple[list[str], str]:
        """Run ``model`` through the cache, check its output against onnxruntime, and return
        the compiler calls it made (a version query is no compile) and its stderr."""
        self.log.write_text("")
        out = self.tmp / "out.npz"
        # the optimized stage: a first run alone stores the portable plan and builds nothing
        done = self.nncc("run", model, "--stage", "optimized", "--input", f"x={self.x}", "--output", out,
                         cache=cache)
        x = np.load(self.x)
        want = ort_run(model, {"x": x})[0]
        got = np.load(out)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        calls = [line for line in self.log.read_text().splitlines() if line.strip() != "--version"]
        return calls, done.stderr

    def entries(self, cache=None) -> dict[str, dict]:
        listing = json.loads(self.nncc("cache", "ls", "--json", cache=cache).stdout)
        return {pathlib.Path(e["source_path"]).name: e for e in listing["entries"]}

    def object_rows(self, cache=None) -> dict[str, dict]:
        return {o["key"]: o for o in json.loads(self.nncc("cache", "ls", "--json", cache=cache).stdout)["objects"]}

    def object_path(self, key: str) -> pathlib.Path:
        return self.cache / "objects" / key[:2] / f"{key}.o"


@pytest.fixture
def setup(tmp_path):
    return Setup(tmp_path)


def _links(calls):
    return [c for c in calls if "-shared" in c.split()]


@pytest.mark.slow
def test_a_shared_layer_is_compiled_once(setup):
    cold_b, _ = setup.run(setup.b, cache=setup.tmp / "other-cache")  # B alone, into an empty cache
    setup.run(setup.a)
    warm_b, _ = setup.run(setup.b)  # B after A, into A's cache
    entries = setup.entries()
    shared = set(entries["a.onnx"]["objects"]) & set(entries["b.onnx"]["objects"])
    # the runtime and the first Conv+Relu kernel are the same units in both models
    assert len(shared) >= 2
    assert len(warm_b) == len(cold_b) - len(shared)
    assert len(_links(warm_b)) == 1 and len(_links(cold_b)) == 1


@pytest.mark.slow
def test_recompile_with_warm_objects_only_links(setup):
    setup.run(setup.a)
    token = setup.entries()["a.onnx"]["token"]
    objects = setup.entries()["a.onnx"]["objects"]
    setup.nncc("cache", "rm", token)
    calls, _ = setup.run(setup.a)
    assert len(calls) == 1 and _links(calls) == calls
    assert setup.entries()["a.onnx"]["objects"] == objects


@pytest.mark.slow
def test_a_tampered_object_is_rebuilt_never_linked(setup):
    setup.run(setup.a)
    entry = setup.entries()["a.onnx"]
    rows = setup.object_rows()
    # an object of one of the model's own kernels (the runtime's symbols are needed to link)
    kernel_keys = [k for k in entry["objects"] if b"nnk_" in setup.object_path(k).read_bytes()
                   and b"nncc_set_threads" not in setup.object_path(k).read_bytes()
                   and b"nncc_partition_" not in setup.object_path(k).read_bytes()]
    key = max(kernel_keys, key=lambda k: rows[k]["size"])
    path = setup.object_path(key)
    original = path.read_bytes()
    # a valid object that defines the same kernel doing nothing, padded to the same size:
    # if it were linked, the model's output would be wrong
    symbol = next(s for s in original.split(b"\0") if s.startswith(b"nnk_")).decode()
    stub_c = setup.tmp / "stub.c"
    stub_c.write_text(f"void {symbol}(void) {{}}\n")
    stub_o = setup.tmp / "stub.o"
    subprocess.run([str(setup.cc), "-c", "-fPIC", "-fvisibility=hidden", str(stub_c), "-o", str(stub_o)], check=True)
    stub = stub_o.read_bytes()
    assert len(stub) <= len(original)
    path.write_bytes(stub + b"\0" * (len(original) - len(stub)))
    setup.nncc("cache", "rm", entry["token"])
    calls, err = setup.run(setup.a)  # outputs checked against onnxruntime
    assert f"kernel object {key[:12]} rejected" in err
    assert len(calls) == 2 and len(_links(calls)) == 1  # that object again, and the link
    assert path.read_bytes() == original
    assert blake3(path.read_bytes()).hexdigest() == setup.object_rows()[key]["hash"]


@pytest.mark.slow
def test_gc_keeps_the_objects_live_entries_need(setup):
    setup.run(setup.a)
    setup.run(setup.b)
    entries = setup.entries()
    objects_a, objects_b = set(entries["a.onnx"]["objects"]), set(entries["b.onnx"]["objects"])
    assert objects_a - objects_b and objects_a & objects_b
    setup.nncc("cache", "rm", entries["a.onnx"]["token"])
    report = json.loads(setup.nncc("cache", "gc", "--json").stdout)
    removed = {r["token"] for r in report["removed"] if r["reason"] == "object"}
    assert removed == objects_a - objects_b
    assert set(setup.object_rows()) == objects_b
    on_disk = {p.stem for p in (setup.cache / "objects").rglob("*.o")}
    assert on_disk == objects_b
    info = json.loads(setup.nncc("cache", "info", "--json").stdout)
    assert info["objects"] == len(objects_b) and info["unused_objects"] == 0
    # what is left is what B needs: its recompile only links
    setup.nncc("cache", "rm", entries["b.onnx"]["token"])
    calls, _ = setup.run(setup.b)
    assert len(calls) == 1 and _links(calls) == calls


@pytest.mark.slow
def test_verify_reports_and_fixes_a_corrupt_object(setup):
    setup.run(setup.a)
    entry = setup.entries()["a.onnx"]
    assert json.loads(setup.nncc("cache", "verify", "--json").stdout)["ok"]
    key = entry["objects"][0]
    path = setup.object_path(key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    report = json.loads(setup.nncc("cache", "verify", "--json", expect=1).stdout)
    assert [(f["status"], f["token"]) for f in report["findings"] if f["status"] != "OK"] == [("CORRUPT", key)]
    fixed = json.loads(setup.nncc("cache", "verify", "--fix", "--json").stdout)
    assert [f["fixed"] for f in fixed["findings"] if f["status"] == "CORRUPT"] == [True]
    assert not path.exists() and key not in setup.object_rows()
    assert json.loads(setup.nncc("cache", "verify", "--json").stdout)["ok"]
    setup.nncc("cache", "rm", entry["token"])
    calls, _ = setup.run(setup.a)  # that object again, and the link
    assert len(calls) == 2 and len(_links(calls)) == 1


@pytest.mark.slow
def test_two_processes_filling_one_object_cache_at_once(setup):
    """Both build the runtime and the shared kernel at the same time: each writes its
    objects atomically, and whichever row lands last matches the file that is there."""
    env = dict(os.environ, CC=str(setup.cc), PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(setup.cache))
    outs = {m: setup.tmp / f"{m.stem}-out.npz" for m in (setup.a, setup.b)}
    procs = [subprocess.Popen([sys.executable, "-m", "nncc", "run", str(m), "--input", f"x={setup.x}",
                               "--output", str(out)], env=env, stderr=subprocess.PIPE, text=True)
             for m, out in outs.items()]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    x = np.load(setup.x)
    for model, out in outs.items():
        want = ort_run(model, {"x": x})[0]
        np.testing.assert_allclose(np.load(out)["y"], want, rtol=1e-4, atol=1e-4)
    assert json.loads(setup.nncc("cache", "verify", "--json").stdout)["ok"]
    entries = setup.entries()
    rows = setup.object_rows()
    for key in set(entries["a.onnx"]["objects"]) | set(entries["b.onnx"]["objects"]):
        assert blake3(setup.object_path(key).read_bytes()).hexdigest() == rows[key]["hash"]


@pytest.mark.slow
def test_one_process_filling_two_caches_compiles_each_unit_once(setup):
    """A process that prepares a model into one cache, then into another (a build script, a
    test suite), compiles each unit once: the second cache gets the same objects, stored
    and listed as its own, and its compile only links."""
    script = ("import sys, numpy as np, nncc\n"
              "model, cache_a, cache_b, x, log = sys.argv[1:]\n"
              "nncc.prepare(model, cache_dir=cache_a, stage='optimized')\n"
              "first = open(log).read(); open(log, 'w').close()\n"
              "b, _ = nncc.prepare(model, cache_dir=cache_b, stage='optimized')\n"
              "assert b.native_partitions == 1\n"
              "np.save(x + '.out.npy', b.run({'x': np.load(x)})['y'])\n")
    setup.log.write_text("")
    cache_b = setup.tmp / "cache-b"
    env = dict(os.environ, CC=str(setup.cc), PYTHONPATH=str(ROOT))
    env.pop("NNCC_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", script, str(setup.a), str(setup.cache), str(cache_b), str(setup.x),
                           str(setup.log)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    calls = [line for line in setup.log.read_text().splitlines() if line.strip() != "--version"]
    assert len(calls) == 1 and _links(calls) == calls, calls
    a_objects, b_objects = setup.entries()["a.onnx"]["objects"], setup.entries(cache_b)["a.onnx"]["objects"]
    assert a_objects == b_objects and len(b_objects) >= 3  # the runtime, a kernel, the entry points
    assert set(setup.object_rows(cache_b)) == set(b_objects)
    want = ort_run(setup.a, {"x": np.load(setup.x)})[0]
    np.testing.assert_allclose(np.load(str(setup.x) + ".out.npy"), want, rtol=1e-4, atol=1e-4)
