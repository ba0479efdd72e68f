"""Compile time of nncc next to onnxruntime's session creation, measured side by side.

For each model (default: light_vgg19 and light_resnet50 from the onnx wheel) it times, in
one run, interleaved round-robin so that machine noise hits every column alike:

  nncc process     a whole `python -m nncc compile MODEL -o OUT.nncc --no-cache` process
  nncc in-process  nncc.compile_model(MODEL) + to_bytes() (what the process spends compiling)
  ort in-process   onnxruntime.InferenceSession(MODEL) with default graph optimizations
  ort process      a whole `python -c "import onnxruntime; InferenceSession(MODEL)"` process

and prints the medians as a markdown table with ratios (nncc / onnxruntime).

    python benchmarks/bench_compile.py [--runs 7] [--model PATH ...]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time


def light_model(name: str) -> pathlib.Path:
    import onnx

    return pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def nncc_compile_command(model: pathlib.Path, out: pathlib.Path) -> list[str]:
    command = [sys.executable, "-m", "nncc", "compile", str(model), "-o", str(out)]
    help_text = subprocess.run([sys.executable, "-m", "nncc", "compile", "--help"],
                               capture_output=True, text=True).stdout
    if "--no-cache" in help_text:
        command.append("--no-cache")
    return command


def ort_process_command(model: pathlib.Path) -> list[str]:
    code = ("import onnxruntime as ort; o = ort.SessionOptions(); o.log_severity_level = 3; "
            f"ort.InferenceSession({str(model)!r}, o, providers=['CPUExecutionProvider'])")
    return [sys.executable, "-c", code]


def time_process(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"failed: {shlex.join(command)}\n{result.stderr}")
    return elapsed


def time_nncc_in_process(model: pathlib.Path) -> float:
    import nncc

    start = time.perf_counter()
    nncc.compile_model(model).to_bytes()
    return time.perf_counter() - start


def time_ort_in_process(model: pathlib.Path) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()  # default graph optimizations (ORT_ENABLE_ALL)
    options.log_severity_level = 3  # the light models carry unused initializers: no warnings
    start = time.perf_counter()
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="measurements per column (median is reported)")
    parser.add_argument("--model", action="append", type=pathlib.Path,
                        help="ONNX model (repeatable); default: light_vgg19 and light_resnet50")
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    models = args.model or [light_model("vgg19"), light_model("resnet50")]

    import onnxruntime

    import nncc

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="nncc-bench-"))
    env = dict(os.environ, NNCC_CACHE_DIR=str(tmp / "cache"))
    rows = []
    for model in models:
        out = tmp / f"{model.stem}.nncc"
        nncc_cmd = nncc_compile_command(model, out)
        ort_cmd = ort_process_command(model)
        columns = {
            "nncc process": lambda: time_process(nncc_cmd, env),
            "nncc in-process": lambda: time_nncc_in_process(model),
            "ort in-process": lambda: time_ort_in_process(model),
            "ort process": lambda: time_process(ort_cmd, env),
        }
        for fn in columns.values():  # warm-up: file cache, lazy imports, BLAS init
            fn()
        samples: dict[str, list[float]] = {name: [] for name in columns}
        for _ in range(args.runs):
            for name, fn in columns.items():
                samples[name].append(fn())
        med = {name: statistics.median(values) for name, values in samples.items()}
        rows.append((model.name, med, out.stat().st_size, nncc_cmd, ort_cmd))

    print(f"nncc {nncc.__version__}, onnxruntime {onnxruntime.__version__}, python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs; median of {args.runs} runs each, interleaved\n")
    print("| model | nncc compile (process) | ort session (process) | ratio | "
          "nncc compile (in-process) | ort session (in-process) | ratio | artifact |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, med, size, _, _ in rows:
        print(f"| {name} | {med['nncc process'] * 1000:.0f} ms | {med['ort process'] * 1000:.0f} ms | "
              f"{med['nncc process'] / med['ort process']:.2f}x | "
              f"{med['nncc in-process'] * 1000:.1f} ms | {med['ort in-process'] * 1000:.1f} ms | "
              f"{med['nncc in-process'] / med['ort in-process']:.2f}x | {size / 1024:.0f} KiB |")
    print("\ncommands:")
    for name, _, _, nncc_cmd, ort_cmd in rows:
        print(f"  {name}: {shlex.join(nncc_cmd)}")
        print(f"  {name}: {shlex.join(ort_cmd)}")
    print("  in-process: nncc.compile_model(MODEL).to_bytes() vs "
          "onnxruntime.InferenceSession(MODEL, SessionOptions(), providers=['CPUExecutionProvider'])")


if __name__ == "__main__":
    main()
