"""Exporting models and building C programs against them, for the tests of `nncc export`.

``export`` runs the real command in a process of its own; ``driver`` compiles
tests/export_driver.c against one form of an exported library (shared, static, embedded
weights; plain or under AddressSanitizer and UBSan) with the system C compiler.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

from nncc.native.toolchain import find_toolchain
from tests.conftest import ROOT
from tests.models import GraphBuilder

DRIVER = ROOT / "tests" / "export_driver.c"
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")


def convnet(path):
    """Convolutions (blocked layout, a residual Add), pooling, a classifier."""
    b = GraphBuilder(name="convnet", seed=1)
    x = b.input([1, 3, 24, 24])
    bias = b.const(b.rng.standard_normal(16) * 0.1)
    y = b.node("Relu", [b.node("Conv", [x, b.weight([16, 3, 3, 3]), bias], pads=[1, 1, 1, 1])])
    z = b.node("Conv", [y, b.weight([16, 16, 3, 3])], pads=[1, 1, 1, 1])
    y = b.node("Relu", [b.node("Add", [z, y])])
    y = b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = b.node("Conv", [y, b.weight([32, 16, 1, 1])])
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])])
    y = b.node("Softmax", [b.node("Gemm", [y, b.weight([10, 32]), b.const(np.zeros(10))], transB=1)], axis=1)
    b.output(y)
    return b.save(path), b.feeds


def block(path):
    """A transformer block: attention whose products multiply two run-time tensors (the
    runtime's GEMM, which the export builds with nncc's own loops), a residual, layer
    normalization and a two-layer MLP."""
    b = GraphBuilder(name="block", seed=2)
    x = b.input([1, 16, 32])
    q, k, v = (b.node("MatMul", [x, b.weight([32, 32])]) for _ in range(3))
    s = b.node("Mul", [b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 2, 1])]), b.const(32 ** -0.5)])
    o = b.node("MatMul", [b.node("Softmax", [s], axis=-1), v])
    r = b.node("Add", [o, x])
    n = b.node("LayerNormalization", [r, b.const(np.ones(32)), b.const(np.zeros(32))], axis=-1)
    h = b.node("Relu", [b.node("Add", [b.node("MatMul", [n, b.weight([32, 64])]), b.const(np.full(64, 0.1))])])
    y = b.node("Add", [b.node("MatMul", [h, b.weight([64, 32])]), r])
    b.output(y)
    return b.save(path), b.feeds


def mlp(path, seed=0, width=48):
    """Two fully connected layers."""
    b = GraphBuilder(name="mlp", seed=seed)
    x = b.input([2, 40])
    h = b.node("Relu", [b.node("Gemm", [x, b.weight([width, 40]), b.const(np.full(width, 0.05))], transB=1)])
    b.output(b.node("Sigmoid", [b.node("MatMul", [h, b.weight([width, 8])])]))
    return b.save(path), b.feeds


def compiler() -> str | None:
    toolchain = find_toolchain()
    return None if toolchain is None else toolchain.path


def export(model, out, *args, cache, env=None, check=True) -> subprocess.CompletedProcess:
    """`nncc export MODEL -o OUT ARGS...` with ``cache`` as its cache folder (None: ARGS
    say, e.g. --no-cache)."""
    where = ["--cache-dir", str(cache)] if cache is not None else []
    done = subprocess.run([sys.executable, "-m", "nncc", "export", str(model), "-o", str(out), *where,
                           *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "NNCC_UPGRADE_AFTER": "off", **(env or {})})
    if check:
        assert done.returncode == 0, done.stderr
    return done


def driver(folder: pathlib.Path, name: str, form: str, sanitize: bool = False) -> pathlib.Path:
    """tests/export_driver.c linked with the library in ``folder``: ``form`` "shared" or
    "static" (the embedded form is either, exported with --embed-weights)."""
    exe = folder.parent / f"driver-{folder.name}-{form}{'-asan' if sanitize else ''}"  # beside, not in it
    cmd = [compiler(), "-O1", "-std=c11", f"-DPFX={name}", "-include", str(folder / f"{name}.h"),
           *(SANITIZE if sanitize else ()), str(DRIVER), "-o", str(exe)]
    if form == "shared":
        cmd += [f"-L{folder}", f"-l{name}", f"-Wl,-rpath,{folder}"]
    else:
        cmd += [str(folder / f"lib{name}.a"), "-lm", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return exe


def driver_env(sanitize: bool) -> dict:
    """The driver's environment: without any sanitizer runtime this process was given, and
    with leak checks on for a sanitized driver (a C program frees what it takes)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if sanitize:
        env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0"
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    return env


def run_driver(exe: pathlib.Path, weights: str, feeds: list[np.ndarray], sizes: list[int], work: pathlib.Path,
               sanitize: bool = False, batch: int | None = None) -> list[np.ndarray]:
    """The outputs (flat) the driver computes from ``feeds`` (in the library's input order);
    ``batch``: through run_batch with that many samples."""
    inputs, outputs = work / "in.bin", work / "out.bin"
    inputs.write_bytes(b"".join(np.ascontiguousarray(f, np.float32).tobytes() for f in feeds))
    count = [] if batch is None else [str(batch)]
    done = subprocess.run([str(exe), "run", weights, str(inputs), str(outputs), *count], capture_output=True,
                          text=True, timeout=300, env=driver_env(sanitize))
    assert done.returncode == 0, done.stderr
    assert not done.stderr, done.stderr
    flat = np.frombuffer(outputs.read_bytes(), np.float32)
    assert flat.size == sum(sizes)
    return np.split(flat, np.cumsum(sizes)[:-1])


def refused_batches(exe: pathlib.Path, weights: str, sizes: list[int], sanitize: bool = False) -> list[tuple[int, str]]:
    """(code, message) of run_batch with each of ``sizes`` in one driver process (sizes it
    refuses before touching a buffer)."""
    done = subprocess.run([str(exe), "batch", weights, *map(str, sizes)], capture_output=True, text=True,
                          timeout=300, env=driver_env(sanitize))
    assert done.returncode == 0, done.stderr
    assert not done.stderr, done.stderr
    rows = [line.split(" ", 1) for line in done.stdout.splitlines()]
    assert len(rows) == len(sizes), done.stdout
    return [(int(code), message) for code, message in rows]


def open_files(exe: pathlib.Path, paths: list[str], sanitize: bool = False) -> list[tuple[int, str]]:
    """(code, message) of opening each of ``paths`` in one driver process."""
    done = subprocess.run([str(exe), "open", *paths], capture_output=True, text=True, timeout=600,
                          env=driver_env(sanitize))
    assert done.returncode == 0, done.stderr
    assert not done.stderr, done.stderr
    rows = [line.split(" ", 1) for line in done.stdout.splitlines()]
    assert len(rows) == len(paths), done.stdout
    return [(int(code), message) for code, message in rows]


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
