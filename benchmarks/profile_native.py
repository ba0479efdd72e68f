"""Where a native plan's time goes, step by step (generated C timed from inside).

    python benchmarks/profile_native.py build/real-models/gpt2.onnx [--runs 20] [--threads 1] [--precision bf16] [--steps]
    python benchmarks/profile_native.py build/corpus/bert.onnx --dim batch=1 --dim sequence=64
    python benchmarks/profile_native.py MODEL.onnx --feeds inputs.npz

Compiles the model with every step of the generated code wrapped in a monotonic clock
(step_classes.compile_profiled passes nncc.native.codegen.generate's profile_steps; such
code is never cached), runs it, and prints the time per op type and the slowest steps.

Native code is generated for fixed sizes, so every symbolic dimension of the model's
inputs is fixed before the compile: by ``--dim NAME=SIZE`` (the names ``nncc inspect``
shows; build/corpus/manifest.json lists each corpus model's sizes under "dims"), or read
off the arrays of ``--feeds FILE.npz`` (one array per input, by name), which are then what
the model runs on; inputs the file leaves out get seeded random values. A dimension left
unbound, or bound twice to different sizes, is a one-line error (exit 2). A script, not a
test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from step_classes import compile_profiled, step_times  # noqa: E402

from nncc.errors import NnccError  # noqa: E402
from nncc.frontend.onnx import load_model  # noqa: E402
from nncc.runtime.random_inputs import random_feeds  # noqa: E402
from nncc.util.threads import set_blas_threads  # noqa: E402

PROG = "profile_native.py"


class Refused(Exception):
    """Arguments that cannot profile this model: one line, exit 2."""


def parse_dims(specs: list[str]) -> dict[str, int]:
    dims = {}
    for spec in specs:
        name, sep, size = spec.rpartition("=")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            raise Refused(f"--dim takes NAME=SIZE with a positive size, not {spec!r}")
        if dims.get(name, int(size)) != int(size):
            raise Refused(f"--dim gives {name} two sizes, {dims[name]} and {size}")
        dims[name] = int(size)
    return dims


def load_feeds(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as saved:
            if not hasattr(saved, "files"):
                raise Refused(f"--feeds {path} holds one array, not an .npz of arrays by input name")
            return {name: saved[name] for name in saved.files}
    except (OSError, ValueError) as exc:
        raise Refused(f"--feeds {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def bind_dims(declared: dict, given: dict[str, int], feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """The size of every symbolic dimension of the inputs: ``given`` (--dim), plus each
    one read off the feeds' shapes; a refusal names what is missing or contradicts."""
    dims, source = dict(given), {name: f"--dim {name}={size}" for name, size in given.items()}
    for name, array in feeds.items():
        if name not in declared:
            raise Refused(f"--feeds has an array {name!r}, which is no input of the model "
                          f"(its inputs: {', '.join(declared)})")
        shape = declared[name]
        if shape is None:
            continue
        if len(shape) != array.ndim:
            raise Refused(f"--feeds's {name!r} has {array.ndim} dimensions, the model's input {len(shape)}")
        for axis, dim in enumerate(shape):
            if isinstance(dim, str):
                size = int(array.shape[axis])
                if dims.get(dim, size) != size:
                    raise Refused(f"dimension {dim} is {size} in --feeds's {name!r} (axis {axis}) but "
                                  f"{dims[dim]} by {source[dim]}")
                dims[dim] = size
                source[dim] = f"--feeds's {name!r}"
    for name, shape in declared.items():
        for axis, dim in enumerate(shape or ()):
            if isinstance(dim, str) and dim not in dims:
                raise Refused(f"input {name!r} has the symbolic dimension {dim} (axis {axis}) and no size for it: "
                              f"give --dim {dim}=SIZE, or --feeds FILE.npz (build/corpus/manifest.json lists a "
                              "corpus model's sizes)")
    return dims


def profile(args) -> None:
    given = parse_dims(args.dim)
    feeds = load_feeds(args.feeds) if args.feeds else {}
    graph = load_model(args.model)
    declared = {name: (None if (info := graph.values.get(name)) is None or info.shape is None else tuple(info.shape))
                for name in graph.inputs}
    dims = bind_dims(declared, given, feeds)
    set_blas_threads(args.threads)
    options = {"precision": args.precision}
    if dims:
        options["dims"] = dims
    model, units = compile_profiled(args.model, **options)
    # inputs the file leaves out: seeded random values of the declared types and sizes
    missing = {name: info for name, info in model.input_infos.items() if name not in feeds}
    feeds = {**random_feeds(missing, 0, dims), **feeds}
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
    sizes = "".join(f", {name}={size}" for name, size in dims.items())
    print(f"{args.model}: {total:.2f} ms per run in native steps ({args.threads} BLAS thread(s){sizes}; "
          f"{model.native_partitions} native partition(s))")
    for op, ms in by_op.most_common():
        print(f"  {op:24s} {ms:8.2f} ms  {100 * ms / total:5.1f}%")
    if args.steps:  # every step, in the order they run
        print("steps:")
        for ms, name in steps:
            print(f"  {ms:8.3f} ms  {name}")
    else:
        print("slowest steps:")
        for ms, name in sorted(steps, reverse=True)[:12]:
            print(f"  {ms:8.3f} ms  {name}")
    print("per convolution class: benchmarks/bench_peers.py (benchmarks/step_classes.py)")


def main() -> int:
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", action="store_true", help="every step's time in the order they run, not the 12 slowest")
    parser.add_argument("--precision", default="f32", help="of products by constant weights: f32 or bf16")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="the size of a symbolic input dimension (repeatable)")
    parser.add_argument("--feeds", metavar="FILE.npz",
                        help="the inputs to run on, by name; their shapes fix the symbolic dimensions")
    args = parser.parse_args()
    try:
        profile(args)
    except (Refused, NnccError) as exc:
        print(f"{PROG}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
