"""An exported C library against onnxruntime from a cold process: time to the first answer.

    python benchmarks/bench_export.py                       # MobileNetV2, real weights
    python benchmarks/bench_export.py --model MODEL.onnx [--runs 5] [--dim N=1 ...]

Exports MODEL with `nncc export` (through a fresh cache folder), builds a C program over
its API (the README's example: zeros in, the first values of each output out) against the
static library, and times, as the median of --runs fresh processes each:
- c: the C program, from process start to its first answer (open: map and check the
  weights; one run; exit), one thread;
- ort: `python -c` importing onnxruntime and numpy, making a session (one intra-op
  thread) and running once on zeros.
It also reports the library sizes: libNAME.so and libNAME.a without the weights, the
weights file, and libNAME.so with --embed-weights. The model file is in the page cache
for both (each is run once before timing). Without --model the model is
benchmarks/real_models.py's mobilenetv2(), written once into build/real-models/. A script,
not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def wall(cmd: list[str], env=None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    return time.perf_counter() - start


def median_of(runs: int, cmd: list[str], env=None) -> float:
    wall(cmd, env)  # the files into the page cache
    return statistics.median(wall(cmd, env) for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="ONNX model (default: real_models.py's mobilenetv2)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dim", action="append", default=[], help="NAME=SIZE, as nncc export takes it")
    args = parser.parse_args()
    if args.model is None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from real_models import write_one

        args.model = write_one(str(ROOT / "build" / "real-models"), "mobilenetv2")
    from nncc.export.writer import default_name, example_program
    from nncc.native.toolchain import find_toolchain

    name = default_name(args.model)
    work = pathlib.Path(tempfile.mkdtemp(prefix="nncc-bench-export-"))
    try:
        dims = [a for d in args.dim for a in ("--dim", d)]
        base = [sys.executable, "-m", "nncc", "export", args.model, "--cache-dir", str(work / "cache"), *dims]
        subprocess.run(base + ["-o", str(work / "lib")], check=True)
        subprocess.run(base + ["-o", str(work / "embedded"), "--embed-weights"], check=True)
        program = work / "example.c"
        program.write_text(example_program(name, embedded=False))
        exe = work / "example"
        subprocess.run([find_toolchain().path, "-O2", str(program), "-o", str(exe), f"-I{work / 'lib'}",
                        str(work / "lib" / f"lib{name}.a"), "-lm", "-lpthread"], check=True)
        import onnx

        graph = onnx.load(args.model, load_external_data=False).graph
        fixed = dict(d.split("=") for d in args.dim)
        feeds = {i.name: [int(fixed.get(d.dim_param, d.dim_value or 1)) for d in i.type.tensor_type.shape.dim]
                 for i in graph.input if i.name not in {t.name for t in graph.initializer}}
        ort = ("import numpy as np, onnxruntime as ort\n"
               "o = ort.SessionOptions(); o.intra_op_num_threads = 1\n"
               f"s = ort.InferenceSession({args.model!r}, o, providers=['CPUExecutionProvider'])\n"
               f"s.run(None, {{k: np.zeros(v, np.float32) for k, v in {feeds!r}.items()}})\n")
        c_env = dict(os.environ)
        c_seconds = median_of(args.runs, [str(exe), str(work / "lib" / f"{name}.weights")], c_env)
        # the C program opens with 0 threads (one per core); one thread is the fair match
        program.write_text(example_program(name, embedded=False).replace(", 0, &model)", ", 1, &model)"))
        subprocess.run([find_toolchain().path, "-O2", str(program), "-o", str(exe), f"-I{work / 'lib'}",
                        str(work / "lib" / f"lib{name}.a"), "-lm", "-lpthread"], check=True)
        c_one = median_of(args.runs, [str(exe), str(work / "lib" / f"{name}.weights")], c_env)
        ort_seconds = median_of(args.runs, [sys.executable, "-c", ort])
        size = {f: (work / "lib" / f).stat().st_size for f in (f"lib{name}.so", f"lib{name}.a", f"{name}.weights")}
        embedded = (work / "embedded" / f"lib{name}.so").stat().st_size
        print(f"model {args.model} ({name}), median of {args.runs} processes, first answer:")
        print(f"  C program (static library), 1 thread:      {c_one * 1000:8.1f} ms")
        print(f"  C program (static library), 1 per core:    {c_seconds * 1000:8.1f} ms")
        print(f"  python -c onnxruntime, 1 intra-op thread:  {ort_seconds * 1000:8.1f} ms")
        print(f"sizes: lib{name}.so {size[f'lib{name}.so'] / 1024:.0f} KiB, lib{name}.a "
              f"{size[f'lib{name}.a'] / 1024:.0f} KiB (without weights); {name}.weights "
              f"{size[f'{name}.weights'] / 1024:.0f} KiB; lib{name}.so with --embed-weights {embedded / 1024:.0f} KiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
