"""Stateful execution of the recurrent fixture: bound buffers vs feeding outputs back by hand.

    python benchmarks/bench_stateful.py [--steps 1000] [--runs 5]

Runs fixtures/gru_cell.onnx for N steps three ways, in one process, interleaved, and
prints the median of several runs as a markdown table: nncc with the state in a bound
executor-managed buffer (nncc.runtime.stepping.run_steps), nncc feeding h_out back into
h_in by hand, and onnxruntime feeding it back by hand (for scale). The final states of
all three are compared.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import numpy as np

import nncc
from nncc.runtime.stepping import run_steps

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "gru_cell.onnx"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    model = nncc.compile_model(FIXTURE)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((args.steps, 1, 1, 16)).astype(np.float32)
    h0 = np.zeros((1, 1, 32), np.float32)

    def bound():
        return run_steps(model, {"h_out": "h_in"}, args.steps, {"h_in": h0}, ({"x": x} for x in xs))["h_out"]

    def by_hand():
        h = h0
        for x in xs:
            h = model.run({"x": x, "h_in": h})["h_out"]
        return h

    runners = {"nncc, bound buffers": bound, "nncc, fed back by hand": by_hand}
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(FIXTURE), options, providers=["CPUExecutionProvider"])

        def ort_by_hand():
            h = h0
            for x in xs:
                h = session.run(["h_out"], {"x": x, "h_in": h})[0]
            return h

        runners["onnxruntime, fed back by hand"] = ort_by_hand
    except ImportError:
        print("onnxruntime is not installed: its row is left out")
    times = {name: [] for name in runners}
    finals = {}
    for _ in range(args.runs):
        for name, fn in runners.items():  # interleaved, so machine noise hits all alike
            start = time.perf_counter()
            finals[name] = fn()
            times[name].append(time.perf_counter() - start)
    reference = finals["nncc, fed back by hand"]
    print(f"gru_cell, {args.steps} steps, median of {args.runs} runs\n")
    print("| way | total ms | per step µs | vs by hand | max abs diff of final state |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.median(times["nncc, fed back by hand"])
    for name, samples in times.items():
        median = statistics.median(samples)
        diff = float(np.max(np.abs(finals[name] - reference)))
        print(f"| {name} | {median * 1e3:.1f} | {median / args.steps * 1e6:.1f} | {median / base:.2f}x | {diff:.2e} |")
    print(f"\ncommand: python benchmarks/bench_stateful.py --steps {args.steps} --runs {args.runs}")


if __name__ == "__main__":
    main()
