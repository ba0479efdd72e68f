"""Where a native plan's time goes, step by step (generated C timed from inside).

    python benchmarks/profile_native.py build/real-models/gpt2.onnx [--runs 20] [--threads 1] [--precision bf16]

Compiles the model with every step of the generated code wrapped in a monotonic clock
(step_classes.compile_profiled passes nncc.native.codegen.generate's profile_steps; such
code is never cached), runs it, and prints the time per op type and the slowest steps. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from step_classes import compile_profiled, step_times  # noqa: E402

from nncc.util.threads import set_blas_threads  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", default="f32", help="of products by constant weights: f32 or bf16")
    args = parser.parse_args()
    set_blas_threads(args.threads)
    model, units = compile_profiled(args.model, precision=args.precision)
    feeds = {name: np.random.default_rng(0).standard_normal(info.shape).astype(np.float32)
             for name, info in model.input_infos.items()}
    model.run(feeds)
    for _ in range(args.runs):
        model.run(feeds)
    by_op: collections.Counter = collections.Counter()
    steps = []
    times = step_times(model, units)
    for symbol, _, _, names in units:
        for name, ns in zip(names, times[symbol]):
            ms = ns / 1e6 / (args.runs + 1)
            by_op[name.split()[0]] += ms
            steps.append((ms, name))
    total = sum(by_op.values())
    print(f"{args.model}: {total:.2f} ms per run in native steps ({args.threads} BLAS thread(s))")
    for op, ms in by_op.most_common():
        print(f"  {op:24s} {ms:8.2f} ms  {100 * ms / total:5.1f}%")
    print("slowest steps:")
    for ms, name in sorted(steps, reverse=True)[:12]:
        print(f"  {ms:8.3f} ms  {name}")
    print("per convolution class: benchmarks/bench_peers.py (benchmarks/step_classes.py)")


if __name__ == "__main__":
    main()
