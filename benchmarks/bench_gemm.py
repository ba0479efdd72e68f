"""GFLOP/s of the native backend's GEMM by constant weights, next to numpy's matmul.

    python benchmarks/bench_gemm.py                      # every shape, 2 threads
    python benchmarks/bench_gemm.py --m 1 --m 128 --kn 768x3072 --act Gelu --threads 1
    python benchmarks/bench_gemm.py --precision bf16 --m 64 --kn 2048x2048   # + the bfloat16 GEMM

For each shape, a model of one MatMul by a constant [K, N] matrix plus a bias (and an
activation, --act) is compiled natively twice: with nncc's packed GEMM (nncc/native/
gemm_gen.py) and with the path it replaced (the BLAS numpy has loaded, split over nncc's
pool, the bias copied in before and the activation after: "blas"). The native partition is
called directly (the C entry point, through ctypes, as the executor calls it), so Python's
per-run overhead is not timed. numpy's ``matmul`` alone (no bias, no activation) runs with
the same number of BLAS threads, and the sgemm peak is numpy's 2048 x 2048 product. With
--precision bf16 a fourth runner, "bf16", is the same model compiled with precision bf16
(nncc/native/gemm_bf16_gen.py); its GFLOP/s count the same 2 x M x N x K. The runners are
timed in alternating blocks; each figure is the median of the blocks (--stat best: the
fastest block, what the code does when nothing else takes its core).

With --models, whole models instead: build/real-models/bert.onnx and gpt2.onnx (generated
on first use) and mlp3 (3 x Linear 1024x1024 + ReLU, batch 64), nncc native against
onnxruntime at its defaults but for intra_op_num_threads, each runtime in a process of its
own, the processes alternated --rounds times; per round the median of --runs calls after
--warmup, and the median over rounds is quoted. --before DIR adds the nncc checkout at DIR
(e.g. the main branch, before this GEMM) as a third runtime.

    python benchmarks/bench_gemm.py --models --before /work/main --rounds 5

A script, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MS = [1, 64, 128, 256, 512]
# (K, N) of the models' layers: BERT / GPT-2 (hidden 512, FFN 2048), BERT-base (768, 3072), mlp3
KNS = [(512, 512), (512, 2048), (2048, 512), (768, 768), (768, 3072), (3072, 768), (1024, 1024)]


def write_model(path: str, m: int, k: int, n: int, act: str) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(k * 7 + n)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) * 0.1
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["z" if act else "y"])]
    if act == "Gelu":
        nodes.append(helper.make_node("Gelu", ["z"], ["y"]))
    elif act:
        nodes.append(helper.make_node(act, ["z"], ["y"]))
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.save(model, path)


def native_call(path: str, x: np.ndarray, packed: bool, precision: str = "f32"):
    """A zero-argument function calling the model's one native partition in place."""
    import nncc
    from nncc.native import gemm_gen

    original_emit = gemm_gen.emit_matmul
    if not packed:
        gemm_gen.emit_matmul = lambda w, node: False
    try:
        model = nncc.compile_model(path, precision=precision)
        model.run({"x": x})
    finally:
        gemm_gen.emit_matmul = original_emit
    # the native step itself, as the executor holds it (a one-call model's run may reach it
    # through its feeds-only fast path, so its __call__ is not what a run calls)
    steps = [call.fn for unit in model._executor.units if unit.kind == "native" for call in unit.calls]
    if model.native_partitions != 1 or len(steps) != 1:
        raise SystemExit(f"{path}: expected one native call, got {len(steps)} in {model.native_partitions} partition(s)")
    step = steps[0]
    fn, table, ws = step.fn, step.table, step.workspace.ctypes.data

    def run():
        fn(table, ws)
    run.model = model  # keeps the library and the buffers alive
    return run


def per_call(run, seconds: float) -> float:
    """Seconds per call over a block lasting about ``seconds``."""
    run()
    calls, start = 1, time.perf_counter()
    run()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(seconds / once))
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls


def peak(threads: int, blocks: int) -> float:
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    out = np.empty_like(a)
    times = [per_call(lambda: np.matmul(a, a, out=out), 0.3) for _ in range(blocks)]
    return 2 * 2048 ** 3 / statistics.median(times) / 1e9


def write_mlp3(path: str) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array((rng.standard_normal((1024, 1024)) / 32).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(1024) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], ["y" if i == 2 else f"h{i}"])]
        x = f"h{i}"
    graph = helper.make_graph(nodes, "mlp3", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 1024])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def model_paths() -> list[str]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from real_models import write_all

    out = ROOT / "build" / "real-models"
    write_all(str(out))
    mlp3 = out / "mlp3.onnx"
    if not mlp3.exists():
        write_mlp3(str(mlp3))
    return [str(out / "bert.onnx"), str(out / "gpt2.onnx"), str(mlp3)]


def one_model(runtime: str, path: str, threads: int, warmup: int, runs: int) -> float:
    """Median ms per call of ``path`` in this process: "nncc" (native) or "onnxruntime"."""
    if runtime == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        shapes = {i.name: i.shape for i in session.get_inputs()}
        feeds = {n: np.random.default_rng(0).standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        run = lambda: session.run(None, feeds)  # noqa: E731
    else:
        import nncc
        from nncc.util.threads import set_blas_threads

        set_blas_threads(threads)
        model = nncc.compile_model(path)
        feeds = {n: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32)
                 for n, i in model.input_infos.items()}
        run = lambda: model.run(feeds)  # noqa: E731
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def models(args) -> None:
    import json
    import subprocess

    runtimes = {"nncc": str(ROOT), "onnxruntime": str(ROOT)}
    if args.before:
        runtimes["nncc before"] = str(pathlib.Path(args.before).resolve())
    for path in model_paths():
        figures: dict[str, list[float]] = {name: [] for name in runtimes}
        order = list(runtimes)
        for round_ in range(args.rounds):
            for name in (order if round_ % 2 == 0 else order[::-1]):
                env = dict(os.environ, PYTHONPATH=runtimes[name])
                done = subprocess.run([sys.executable, __file__, "--one-model", json.dumps(
                    [name.split()[0], path, args.threads, args.warmup, args.runs])], env=env, capture_output=True,
                    text=True, check=True)
                figures[name].append(float(done.stdout.strip().splitlines()[-1]))
        med = {name: statistics.median(v) for name, v in figures.items()}
        print(f"{pathlib.Path(path).stem:6s} " + "   ".join(
            f"{name} {med[name]:6.2f} ms [{min(figures[name]):.2f}-{max(figures[name]):.2f}]" for name in runtimes),
            flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, action="append", help="rows of A (repeatable); default 1 64 128 256 512")
    parser.add_argument("--kn", action="append", help="KxN (repeatable); default the models' layer shapes")
    parser.add_argument("--act", default="Relu", help="activation after the bias: Relu, Gelu, Tanh, or '' for none")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                        help="bf16: also time the product compiled with precision bf16")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--block-seconds", type=float, default=0.1)
    parser.add_argument("--stat", choices=["median", "best"], default="median",
                        help="the blocks' median, or their best (on a busy machine, the least disturbed)")
    parser.add_argument("--models", action="store_true", help="time whole models against onnxruntime")
    parser.add_argument("--before", help="an nncc checkout to time as well (--models)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--one-model", help=argparse.SUPPRESS)  # a child: [runtime, path, threads, warmup, runs]
    args = parser.parse_args()
    if args.one_model:
        import json

        print(one_model(*json.loads(args.one_model)))
        return
    if args.models:
        return models(args)
    from nncc.native import codegen  # noqa: F401  (imports before the threads are set)
    from nncc.util.threads import limit_blas_threads, set_blas_threads

    set_blas_threads(args.threads)
    shapes = [(m, k, n) for m in (args.m or MS)
              for k, n in ([tuple(map(int, s.split("x"))) for s in args.kn] if args.kn else KNS)]
    print(f"sgemm peak (numpy 2048^2, {args.threads} threads): {peak(args.threads, args.blocks):.0f} GFLOP/s")
    bf16 = args.precision == "bf16"
    print(f"{'M':>4} {'K':>5} {'N':>5}   {'packed':>7} {'blas':>7} {'numpy':>7}" + (f" {'bf16':>7}" if bf16 else "")
          + "  GFLOP/s   packed/numpy  packed us" + ("    bf16 us" if bf16 else ""))
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        for m, k, n in shapes:
            path = os.path.join(tmp, f"g{m}_{k}_{n}.onnx")
            write_model(path, m, k, n, args.act)
            x = rng.standard_normal((m, k)).astype(np.float32)
            w = np.random.default_rng(2).standard_normal((k, n)).astype(np.float32)
            y = np.empty((m, n), np.float32)
            runners = {"packed": native_call(path, x, True), "blas": native_call(path, x, False),
                       "numpy": lambda: np.matmul(x, w, out=y)}
            if bf16:
                runners["bf16"] = native_call(path, x, True, "bf16")
            times = {name: [] for name in runners}
            order = list(runners)
            for block in range(args.blocks):
                for name in (order if block % 2 == 0 else order[::-1]):
                    with limit_blas_threads(1 if name != "numpy" else args.threads):
                        times[name].append(per_call(runners[name], args.block_seconds))
            flops = 2 * m * n * k
            pick = statistics.median if args.stat == "median" else min
            rate = {name: flops / pick(t) / 1e9 for name, t in times.items()}
            print(f"{m:4d} {k:5d} {n:5d}   {rate['packed']:7.1f} {rate['blas']:7.1f} {rate['numpy']:7.1f}"
                  + (f" {rate['bf16']:7.1f}" if bf16 else "")
                  + f"            {rate['packed'] / rate['numpy']:5.2f}  {flops / rate['packed'] / 1e3:9.1f}"
                  + (f"  {flops / rate['bf16'] / 1e3:9.1f}" if bf16 else ""), flush=True)


if __name__ == "__main__":
    main()
