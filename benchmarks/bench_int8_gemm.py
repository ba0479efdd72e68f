"""Billions of int8 products a second of the native DynamicQuantizeMatMul step, on AMX tiles
and with vpdpbusd (``NNCC_AMX=0``), per shape.

    python benchmarks/bench_int8_gemm.py                          # BERT-base's products, M 1 to 512
    python benchmarks/bench_int8_gemm.py --m 8 --m 128 --kn 768x3072 --rounds 5

For each shape one model of a single DynamicQuantizeMatMul (A float32 [M, K], B a constant
int8 [K, N], per-column scales, a bias) is compiled once; each round runs it in a process
with the tiles permitted and one with ``NNCC_AMX=0`` (which the runtime reads once per
process), alternating, each timing the median of --runs calls after --warmup. The figure is
2 x M x N x K over the median of the rounds' medians, and includes the step's quantization
of A and its epilogue, as a model pays them. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = """
import sys, time, numpy as np, nncc
model = nncc.compile_model(sys.argv[1])
a = np.random.default_rng(0).standard_normal((int(sys.argv[2]), int(sys.argv[3]))).astype(np.float32)
for _ in range(int(sys.argv[4])):
    model.run({"a": a})
times = []
for _ in range(int(sys.argv[5])):
    t = time.perf_counter(); model.run({"a": a}); times.append(time.perf_counter() - t)
times.sort()
print(times[len(times) // 2])
"""


def model(path: pathlib.Path, m: int, k: int, n: int) -> None:
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(np.clip(np.round(rng.standard_normal((k, n)) * 30), -128, 127).astype(np.int8), "b"),
             numpy_helper.from_array(rng.uniform(0.01, 0.03, n).astype(np.float32), "bs"),
             numpy_helper.from_array(np.zeros(n, np.int8), "bz"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, (m, k))],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, action="append", help="rows of A (repeatable)")
    parser.add_argument("--kn", action="append", help="KxN of B (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    ms = args.m or [1, 4, 8, 16, 32, 128, 512]
    kns = [tuple(int(v) for v in kn.split("x")) for kn in (args.kn or ["768x768", "768x3072", "3072x768"])]
    cache = tempfile.mkdtemp(prefix="bench-int8-")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=os.environ.get("NNCC_CACHE_DIR", cache))
    print(f"{'M':>5} {'K':>5} {'N':>5} {'amx Gop/s':>10} {'vpdpbusd':>10} {'ratio':>6}")
    for k, n in kns:
        for m in ms:
            path = pathlib.Path(cache) / f"q{m}x{k}x{n}.onnx"
            model(path, m, k, n)
            seconds = {"1": [], "0": []}
            for _ in range(args.rounds):
                for flag in ("1", "0"):
                    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(m), str(k), str(args.warmup),
                                           str(args.runs)], env=dict(env, NNCC_AMX=flag), capture_output=True,
                                          text=True, check=True)
                    seconds[flag].append(float(done.stdout.split()[-1]))
            rate = {flag: 2 * m * n * k / statistics.median(v) / 1e9 for flag, v in seconds.items()}
            print(f"{m:>5} {k:>5} {n:>5} {rate['1']:>10.1f} {rate['0']:>10.1f} {rate['1'] / rate['0']:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
