"""Per-run overhead of a model whose compute takes microseconds: nncc against onnxruntime.

    python benchmarks/small_model_overhead.py [--runs 20000] [--rounds 5] [--size 16]

The model is a Gemm (size x size, bias) and a Relu over a [1, size] input: its arithmetic
is a few hundred multiply-adds, so what a run costs is the runtime's own path from the call
to the kernel and back (feed checks, output allocation, the step loop). Each runtime runs
alone in a process of its own, --rounds times, alternating; a round times --runs calls of
``run`` after a warm-up and keeps the median of its per-call times in batches of 100. nncc
runs its native plan (the optimized stage, prepared through a temporary cache), onnxruntime
one intra-op thread. Prints the median over rounds, in microseconds per run.
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

_TIMER = r"""
import json, sys, time
import numpy as np
runtime, path, size, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = np.random.default_rng(1).standard_normal((1, size)).astype(np.float32)
if runtime == "nncc":
    from nncc.model import prepare
    model, outcome = prepare(path, stage="optimized", background=None)
    assert model.native_partitions >= 1, "no native code: is a C compiler installed?"
    call = lambda: model.run({"x": x})
else:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    call = lambda: session.run(None, {"x": x})
for _ in range(1000):
    call()
batches = []
for _ in range(runs // 100):
    start = time.perf_counter()
    for _ in range(100):
        call()
    batches.append((time.perf_counter() - start) / 100)
print(json.dumps(sorted(batches)[len(batches) // 2]))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nncc-small-") as folder:
        path = os.path.join(folder, "small.onnx")
        subprocess.run([sys.executable, "-c", _MODEL, str(args.size), path], check=True)
        env = dict(os.environ, NNCC_CACHE_DIR=os.path.join(folder, "cache"), NNCC_UPGRADE_AFTER="off")
        seen: dict[str, list[float]] = {"nncc": [], "onnxruntime": []}
        for _ in range(args.rounds):
            for runtime in seen:
                done = subprocess.run([sys.executable, "-c", _TIMER, runtime, path, str(args.size), str(args.runs)],
                                      env=env, check=True, capture_output=True, text=True)
                seen[runtime].append(json.loads(done.stdout.splitlines()[-1]))
    for runtime, times in seen.items():
        print(f"{runtime:12s} {statistics.median(times) * 1e6:8.1f} us per run "
              f"(rounds: {', '.join(f'{t * 1e6:.1f}' for t in times)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
