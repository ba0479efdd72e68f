"""OpenVINO's own per-layer times for a model, to set beside profile_native.py's steps.

    python benchmarks/openvino_layers.py build/real-models/mobilenetv2_int8_qdq.onnx [--threads 2] [--runs 200]

Compiles the model for the CPU with PERF_COUNT on, warms up, then sums each executed
layer's counter over ``--runs`` runs: prints the wall time per run, the layers' sum, and
each layer's mean in microseconds (its type, OpenVINO's kernel, its name), slowest first.
Random normal input, unknown dimensions 1.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np


def main() -> None:
    import openvino as ov  # only this script needs it

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    core = ov.Core()
    model = core.read_model(args.model)
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": args.threads, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    shape = [d.get_length() if d.is_static else 1 for d in model.inputs[0].get_partial_shape()]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(50):
        request.infer({0: x})
    totals: dict[tuple, float] = collections.defaultdict(float)
    start = time.perf_counter()
    for _ in range(args.runs):
        request.infer({0: x})
        for layer in request.profiling_info:
            if layer.status.name == "EXECUTED":
                totals[(layer.node_name, layer.node_type, layer.exec_type)] += layer.real_time.total_seconds() * 1e6
    print(f"wall per run: {(time.perf_counter() - start) / args.runs * 1e3:.3f} ms")
    print(f"sum of layers: {sum(totals.values()) / args.runs:.1f} us")
    for (name, kind, kernel), total in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"{total / args.runs:8.1f} us  {kind:20s} {kernel:28s} {name}")


if __name__ == "__main__":
    main()
