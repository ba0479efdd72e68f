"""Linking an exported model: the partition's kernel objects, nncc's C runtime object and
the API's object, combined into one relocatable object in which only the API's names stay
global (so two exported models, each with its own runtime, link into one program), then
made a shared library (linking libc, libm and pthread only) and a static archive.

The runtime's GEMM and convolution helpers call BLAS only through a pointer that nncc's
Python loader sets; nothing sets it here, so they run nncc's own C loops.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from nncc.errors import NnccError
from nncc.export.c_api import WEIGHTS_MARK


class ExportBuildError(NnccError):
    """A tool failed while linking the exported library."""


def link(toolchain, objects: list[bytes], api_source: str, hash_source: str, prefix: str, exported: list[str],
         weights: bytes | None = None) -> tuple[bytes, bytes]:
    """(libPREFIX.so, libPREFIX.a). ``hash_source``: the weights check's BLAKE3; ``weights``: the weights file to put inside the library
    (the API's source then includes it from a file this function writes: see ``WEIGHTS``)."""
    with tempfile.TemporaryDirectory(prefix="nncc-export-") as tmp:
        if weights is not None:
            with open(os.path.join(tmp, WEIGHTS), "wb") as f:
                f.write(weights)
            api_source = api_source.replace(WEIGHTS_MARK, _plain_path(os.path.join(tmp, WEIGHTS)))
        paths = []
        for i, data in enumerate([toolchain.compile_object(api_source), toolchain.compile_object(hash_source)]
                                 + list(objects)):
            paths.append(os.path.join(tmp, f"u{i}.o"))
            with open(paths[-1], "wb") as f:
                f.write(data)
        combined = os.path.join(tmp, "combined.o")
        _run([toolchain.path, "-r", "-nostdlib", *paths, "-o", combined], "combining the objects")
        keep = os.path.join(tmp, "keep.txt")
        with open(keep, "w") as f:
            f.write("\n".join(exported) + "\n")
        single = os.path.join(tmp, f"{prefix}.o")
        _run([_tool(toolchain.path, "objcopy"), f"--keep-global-symbols={keep}", combined, single],
             "keeping only the API's names global")
        shared = os.path.join(tmp, f"lib{prefix}.so")
        sanitize = [f for f in toolchain.link_flags if f.startswith("-f")]
        _run([toolchain.path, "-shared", *sanitize, f"-Wl,-soname,lib{prefix}.so", single, "-o", shared,
              "-lm", "-lpthread"], "linking the shared library")
        archive = os.path.join(tmp, f"lib{prefix}.a")
        _run([_tool(toolchain.path, "ar"), "rcD", archive, single], "making the static library")
        with open(shared, "rb") as f, open(archive, "rb") as g:
            return f.read(), g.read()


WEIGHTS = "embedded.weights"


def _plain_path(path: str) -> str:
    """A path the assembler's .incbin takes as it is (a temporary folder's)."""
    if not all(c.isalnum() or c in "/._-+" for c in path):
        raise ExportBuildError(f"the temporary folder's path {path!r} has characters .incbin cannot take")
    return path


def _tool(compiler: str, name: str) -> str:
    """The binutils tool the compiler itself uses, else the one on PATH."""
    try:
        done = subprocess.run([compiler, f"-print-prog-name={name}"], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL)
        named = done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        named = ""
    found = named if os.path.isabs(named) and os.access(named, os.X_OK) else shutil.which(named or name)
    if found is None:
        raise ExportBuildError(f"{name} (binutils) is needed to link an exported library and was not found")
    return found


def _run(cmd: list[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExportBuildError(f"{what} failed: {exc}") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise ExportBuildError(f"{what} failed: {(lines or ['no message'])[0][:300]}")
