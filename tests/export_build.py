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

DRIVER = ROOT / "tests" / "export_driver.c"
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")


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
               sanitize: bool = False) -> list[np.ndarray]:
    """The outputs (flat) the driver computes from ``feeds`` (in the library's input order)."""
    inputs, outputs = work / "in.bin", work / "out.bin"
    inputs.write_bytes(b"".join(np.ascontiguousarray(f, np.float32).tobytes() for f in feeds))
    done = subprocess.run([str(exe), "run", weights, str(inputs), str(outputs)], capture_output=True, text=True,
                          timeout=300, env=driver_env(sanitize))
    assert done.returncode == 0, done.stderr
    assert not done.stderr, done.stderr
    flat = np.frombuffer(outputs.read_bytes(), np.float32)
    assert flat.size == sum(sizes)
    return np.split(flat, np.cumsum(sizes)[:-1])


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
