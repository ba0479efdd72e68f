"""``nncc.load_library(DIR)``: run an exported library from Python through ctypes, numpy
arrays in and out, through the same C API a C program calls (names and shapes included).
A library that takes its batch at run time runs whatever batch the inputs hold.
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

from nncc.errors import InputError, NnccError
from nncc.ir.graph import TensorInfo
from nncc.native.toolchain import sanitizer_loaded, sanitizer_preload


class LibraryError(NnccError):
    """The exported library refused a call; ``code`` is its error code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class ExportedLibrary:
    """One opened model of an exported library: ``run(feeds)`` -> {output name: array}."""

    def __init__(self, path: str, prefix: str, weights: str | None, threads: int):
        self.lib = ctypes.CDLL(os.path.abspath(path))
        self.prefix = prefix
        f = self._function
        f("last_error", ctypes.c_char_p, [])
        f("batch_name", ctypes.c_char_p, [])
        for kind in ("input", "output"):
            f(f"{kind}_count", ctypes.c_int, [])
            f(f"{kind}_name", ctypes.c_char_p, [ctypes.c_int])
            f(f"{kind}_rank", ctypes.c_int, [ctypes.c_int])
            f(f"{kind}_shape", ctypes.POINTER(ctypes.c_int64), [ctypes.c_int])
            f(f"{kind}_batch_axis", ctypes.c_int, [ctypes.c_int])
        f("open", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)])
        f("run_batch", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p])
        f("close", None, [ctypes.c_void_p])
        self.inputs = self._tensors("input")
        self.outputs = self._tensors("output")
        batch = self.api("batch_name")()
        self.batch = None if batch is None else batch.decode(errors="replace")  # the batch's dimension name
        self.handle = ctypes.c_void_p()
        self._check(self.api("open")(None if weights is None else os.fsencode(weights), threads,
                                     ctypes.byref(self.handle)))

    def _function(self, name: str, restype, argtypes) -> None:
        fn = getattr(self.lib, f"{self.prefix}_{name}")
        fn.restype, fn.argtypes = restype, argtypes

    def api(self, name: str):
        return getattr(self.lib, f"{self.prefix}_{name}")

    def _tensors(self, kind: str) -> list[tuple[str, tuple[int | None, ...]]]:
        """(name, shape) of each input or output, None on the batch's axis."""
        out = []
        for i in range(self.api(f"{kind}_count")()):
            rank = self.api(f"{kind}_rank")(i)
            shape = self.api(f"{kind}_shape")(i)
            out.append((self.api(f"{kind}_name")(i).decode(), tuple(None if shape[d] < 0 else shape[d]
                                                                    for d in range(rank))))
        return out

    def _check(self, code: int) -> None:
        if code != 0:
            raise LibraryError(f"{self.prefix}: {self.api('last_error')().decode(errors='replace')}", code)

    # what `nncc run DIR` reads of a model, as of a CompiledModel: the library is one native call
    native_partitions = last_run_native_partitions = 1

    def _infos(self, tensors) -> dict[str, TensorInfo]:
        return {name: TensorInfo(np.dtype(np.float32), tuple(self.batch if d is None else d for d in shape))
                for name, shape in tensors}

    @property
    def input_infos(self) -> dict[str, TensorInfo]:
        """Each input's dtype and shape, the batch's axis by its dimension name."""
        return self._infos(self.inputs)

    @property
    def output_infos(self) -> dict[str, TensorInfo]:
        return self._infos(self.outputs)

    @property
    def output_names(self) -> list[str]:
        return [name for name, _ in self.outputs]

    def run(self, feeds: dict, outputs: dict | None = None) -> dict[str, np.ndarray]:
        """The outputs for ``feeds``; ``outputs``: arrays to write them into (by name)."""
        results = self._run(feeds)
        for name, target in (outputs or {}).items():
            if name not in results:
                raise InputError(f"no output {name!r}")
            if target.shape != results[name].shape:
                raise InputError(f"output {name!r} has shape {results[name].shape}, not {target.shape}")
            np.copyto(target, results[name])
            results[name] = target
        return results

    def _run(self, feeds: dict) -> dict[str, np.ndarray]:
        if not self.handle:
            raise InputError(f"{self.prefix}: the model is closed")
        arrays, batch = [], None
        for name, shape in self.inputs:
            if name not in feeds:
                raise InputError(f"missing input {name!r}")
            array = np.ascontiguousarray(feeds[name], dtype=np.float32)
            if len(array.shape) != len(shape) or any(d is not None and d != a for d, a in zip(shape, array.shape)):
                raise InputError(f"input {name!r} has shape {array.shape}, the library takes {_shape_text(shape)}")
            if None in shape:
                size = array.shape[shape.index(None)]
                if batch is not None and size != batch:
                    raise InputError(f"input {name!r} holds a batch of {size}, another input one of {batch}")
                batch = size
            arrays.append(array)
        batch = 1 if batch is None else batch
        results = {name: np.empty(tuple(batch if d is None else d for d in shape), np.float32)
                   for name, shape in self.outputs}
        inputs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        outputs = (ctypes.c_void_p * max(1, len(results)))(*[a.ctypes.data for a in results.values()])
        self._check(self.api("run_batch")(self.handle, batch, inputs, outputs))
        return results

    def close(self) -> None:
        if self.handle:
            self.api("close")(self.handle)
            self.handle = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _shape_text(shape) -> str:
    return "[" + ", ".join("N" if d is None else str(d) for d in shape) + "]"


def load_library(directory: str | os.PathLike, name: str | None = None, threads: int = 0) -> ExportedLibrary:
    """Open the model exported into ``directory`` (``name``: its prefix, when the folder
    holds several). Its weights file is NAME.weights there, unless they are embedded."""
    directory = os.fspath(directory)
    if name is None:
        found = sorted(os.path.basename(p)[3:-3] for p in glob.glob(os.path.join(glob.escape(directory), "lib*.so")))
        if not found:
            raise InputError(f"{directory} is a directory holding no exported library "
                             "(no libNAME.so from nncc export)")
        if len(found) > 1:
            raise InputError(f"{directory} holds {len(found)} exported libraries; name the one to load")
        name = found[0]
    library = os.path.join(directory, f"lib{name}.so")
    if not os.path.isfile(library):
        raise InputError(f"no exported library {library}")
    if _sanitized(os.path.join(directory, f"{name}.pc")) and not sanitizer_loaded():
        # dlopen'ed into a process without the sanitizer runtime, it would abort the process
        raise InputError(f"{library} was built with AddressSanitizer and loads only into a process started "
                         "with the sanitizer runtime", hint=f"LD_PRELOAD=\"{sanitizer_preload()}\"")
    weights = os.path.join(directory, f"{name}.weights")
    return ExportedLibrary(library, name, weights if os.path.exists(weights) else None, threads)


def _sanitized(pc_file: str) -> bool:
    """Whether the export's pkg-config file says its code was built with the sanitizers."""
    try:
        with open(pc_file) as f:
            return "-fsanitize=" in f.read()
    except OSError:
        return False
