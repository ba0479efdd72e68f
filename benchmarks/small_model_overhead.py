"""Per-run overhead of a model whose compute takes microseconds: nncc against onnxruntime.

    python benchmarks/small_model_overhead.py [--runs 20000] [--rounds 5] [--size 16]
    python benchmarks/small_model_overhead.py --model fixtures/resnet_block.onnx --runs 2000
    python benchmarks/small_model_overhead.py --model tabular.onnx --dim batch=32 --runs 2000

The model is a Gemm (size x size, bias) and a Relu over a [1, size] input: its arithmetic
is a few hundred multiply-adds, so what a run costs is the runtime's own path from the call
to the kernel and back (feed checks, output allocation, the step loop). ``--model`` times
another model instead, its inputs random at their declared shapes (``--dim`` sizes a
symbolic dimension, 1 otherwise). Each runtime runs alone in a process of its own,
--rounds times, alternating; a round times --runs calls of ``run`` after a warm-up and
keeps the median of its per-call times in batches of 100, and the process's CPU time per
call (user + system, every thread: a pool's idle threads that spin show here, not in the
wall time). nncc runs its native plan (the optimized stage, prepared through a temporary
cache, after a first process has run the model once so that a dynamic model's shape plan
is built), onnxruntime one intra-op thread. Prints the medians over rounds, in microseconds
per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_MODEL = r"""
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
size, path = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32), "w")
b = numpy_helper.from_array(rng.standard_normal(size).astype(np.float32), "b")
graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["g"]), helper.make_node("Relu", ["g"], ["y"])],
                          "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], [w, b])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, path)
"""

_FEEDS = r"""
import json, sys
import numpy as np
import onnx
from nncc.frontend.dim_names import is_placeholder
path, dims, target = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
graph = onnx.load(path, load_external_data=False).graph
constant = {i.name for i in graph.initializer}
rng = np.random.default_rng(1)
feeds = {}
for value in graph.input:
    if value.name in constant:
        continue
    kind = value.type.tensor_type
    # a dimension by the name nncc gives it: a "?" or a missing size is "<input>:<axis>"
    names = [d.dim_param if d.dim_param and not is_placeholder(d.dim_param) else f"{value.name}:{axis}"
             for axis, d in enumerate(kind.shape.dim)]
    shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else dims.get(name, 1)
             for d, name in zip(kind.shape.dim, names)]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type)
    if dtype.kind == "f":
        feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    else:  # ids and categories: small, so every table they index holds them
        feeds[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
np.savez(target, **feeds)
"""

_TIMER = r"""
import json, resource, sys, time
import numpy as np
runtime, path, feeds_path, runs, dims = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5])
with np.load(feeds_path) as saved:
    feeds = {name: saved[name] for name in saved.files}
if runtime == "nncc-warm":  # the process before: the optimized entry, and a dynamic model's native plan
    from nncc.model import prepare  # for the feeds' shape, which a later process finds at its first run
    prepare(path, stage="optimized", background=None)
    if dims:
        prepare(path, stage="optimized", background=None, dims=dims)
    print(json.dumps(None))
    sys.exit(0)
if runtime == "nncc":
    from nncc.model import prepare
    model, outcome = prepare(path)
    model.run(feeds)
    assert model.last_run_native_partitions >= 1, "no native code: is a C compiler installed?"
    call = lambda: model.run(feeds)
else:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    call = lambda: session.run(None, feeds)
for _ in range(max(100, runs // 20)):
    call()
batches = []
before = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(runs // 100):
    start = time.perf_counter()
    for _ in range(100):
        call()
    batches.append((time.perf_counter() - start) / 100)
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / (len(batches) * 100)
print(json.dumps([sorted(batches)[len(batches) // 2], cpu]))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--model", help="an ONNX file to time instead of the Gemm + Relu")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="a symbolic dimension's size for --model's inputs (1 unless given)")
    args = parser.parse_args()
    dims = {}
    for item in args.dim:
        name, _, size = item.partition("=")
        if not size.isdigit() or int(size) < 1:
            parser.error(f"--dim takes NAME=SIZE with a size from 1, not {item!r}")
        dims[name] = int(size)
    with tempfile.TemporaryDirectory(prefix="nncc-small-") as folder:
        path = os.path.abspath(args.model) if args.model else os.path.join(folder, "small.onnx")
        if not args.model:
            subprocess.run([sys.executable, "-c", _MODEL, str(args.size), path], check=True)
        feeds = os.path.join(folder, "feeds.npz")
        subprocess.run([sys.executable, "-c", _FEEDS, path, json.dumps(dims), feeds], check=True)
        env = dict(os.environ, NNCC_CACHE_DIR=os.path.join(folder, "cache"), NNCC_UPGRADE_AFTER="off")

        def timed(runtime: str):
            done = subprocess.run([sys.executable, "-c", _TIMER, runtime, path, feeds, str(args.runs),
                                   json.dumps(dims)],
                                  env=env, check=True, capture_output=True, text=True)
            return json.loads(done.stdout.splitlines()[-1])

        timed("nncc-warm")
        seen: dict[str, list] = {"nncc": [], "onnxruntime": []}
        for _ in range(args.rounds):
            for runtime in seen:
                seen[runtime].append(timed(runtime))
    for runtime, rounds in seen.items():
        wall = statistics.median(r[0] for r in rounds)
        cpu = statistics.median(r[1] for r in rounds)
        print(f"{runtime:12s} {wall * 1e6:8.1f} us per run, CPU {cpu * 1e6:8.1f} us "
              f"(rounds: {', '.join(f'{r[0] * 1e6:.1f}' for r in rounds)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
