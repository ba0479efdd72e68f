"""Reading feeds from .npy/.npz files, writing outputs atomically. (Random feeds:
nncc.runtime.random_inputs.)"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import zipfile
from typing import Mapping

import numpy as np

from nncc.errors import FileAccessError, InputError
from nncc.ir.graph import TensorInfo
from nncc.util.atomic import write_atomic_with
from nncc.util.files import kind as file_kind
from nncc.util.files import open_file
from nncc.util.limits import check_bytes, check_shape


@contextlib.contextmanager
def _reading(path: str, kind: str):
    """Turn what np.load raises into one-line nncc errors."""
    try:
        yield
    except FileNotFoundError:
        raise FileAccessError(f"cannot read {path}: no such file") from None
    except IsADirectoryError:
        raise FileAccessError(f"cannot read {path}: it is a directory") from None
    except PermissionError:
        raise FileAccessError(f"cannot read {path}: permission denied") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path} is not a readable {kind} file ({_first_line(exc)})") from None


def _open_regular(path: str, kind: str) -> int:
    """A descriptor of ``path``, opened without blocking and checked to be a regular file:
    a FIFO or a device given as an input file is refused, never waited on or read without end."""
    with _reading(path, kind):
        fd, st = open_file(path)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(f"{path} is {file_kind(st.st_mode)}, not a {kind} file")
    return fd


NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"


def _check_magic(fd: int, path: str, kind: str) -> None:
    """Refuse a file that is neither .npy nor .npz by its first bytes. np.load takes any
    other file for a pickle and says only that pickles are not allowed, which misleads
    when the file is text or something else entirely."""
    head = os.pread(fd, 64, 0)
    if head.startswith(NPY_MAGIC) or head.startswith(ZIP_MAGIC):
        return  # which of the two it is, the callers say
    if not head:
        what = "it is empty"
    elif _looks_like_text(head):
        what = "it holds text"
    else:
        what = f"it does not start with the {kind} signature"
    if what == "it holds text" and kind == ".npy":
        hint = f"convert it first, e.g. numpy.save('x.npy', numpy.loadtxt('{path}'))"
    else:
        hint = "write it with " + ("numpy.save(path, array)" if kind == ".npy"
                                   else "numpy.savez(path, NAME=array, ...)")
    raise InputError(f"{path} is not a {kind} file: {what}", hint=hint)


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def load_npy(path: str) -> np.ndarray:
    """Memory-map a .npy file (no copy); object arrays are refused, never unpickled."""
    fd = _open_regular(path, ".npy")
    try:
        _check_magic(fd, path, ".npy")
        # np.load maps by name: on Linux the name of the checked descriptor, so a file
        # swapped for a FIFO after the check is never opened
        own = f"/proc/self/fd/{fd}"
        with _reading(path, ".npy"):
            array = np.load(own if os.path.exists(own) else path, mmap_mode="r", allow_pickle=False)
    finally:
        os.close(fd)
    if not isinstance(array, np.ndarray):  # an .npz archive: np.load opened it as NpzFile
        array.close()
        raise InputError(f"{path} is an .npz archive, not a .npy file; pass it with --inputs {path}")
    return array


def load_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive, read from the one descriptor that was checked. Each
    member's header is read first: the sizes it declares (a small compressed member can
    declare terabytes) are checked against the memory bound before anything is inflated."""
    with os.fdopen(_open_regular(path, ".npz"), "rb") as f, _reading(path, ".npz"):
        _check_magic(f.fileno(), path, ".npz")
        archive = np.load(f, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):  # a plain array has no close()
            raise InputError(f"{path} is a .npy file; pass it with --input NAME={path}")
        with archive:
            total = 0
            for member in archive.zip.namelist():
                with archive.zip.open(member) as stream:
                    version = np.lib.format.read_magic(stream)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(stream)
                total += check_shape(shape, dtype.itemsize, f"array {member!r} in {path}")
                check_bytes(total, f"the arrays in {path}")
            return {name: archive[name] for name in archive.files}


def save_npz(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Write an .npz atomically: a failure never leaves a half-written file at ``path``."""
    for name, value in arrays.items():
        _only_tensor(name, value)
    write_atomic_with(path, lambda f: _write_npz(f, arrays))


MAP_THRESHOLD = 1 << 20  # outputs this large are written in place through a memory map


def output_paths(directory: str, names) -> dict[str, str]:
    """Where OutputDir writes each output: DIR/NAME.npy, NAME made a safe file name."""
    paths: dict[str, str] = {}
    for name in names:
        file_name = re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".npy"
        if file_name in paths.values() or file_name.startswith("."):
            file_name = f"output{len(paths)}_{file_name.lstrip('.')}"
        paths[name] = os.path.join(directory, file_name)
    return paths


class OutputDir:
    """Writes each output of a run as DIR/NAME.npy.

    Large outputs of static shape are memory-mapped .npy files handed to the executor as
    output buffers, so kernels write straight into the file; each file appears under its
    final name only when the run succeeded (temp file, then rename).
    """

    def __init__(self, directory: str, model, mapped: bool = True):
        self.directory = directory
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise FileAccessError(f"cannot create {directory}: {exc.strerror or exc}") from None
        self.paths = output_paths(directory, model.output_names)
        self.buffers: dict[str, np.ndarray] = {}
        self._temps: dict[str, str] = {}
        if mapped:
            for name, info in model.output_infos.items():
                if info.is_static and info.dtype is not None and \
                        int(np.prod(info.shape, dtype=np.int64)) * info.dtype.itemsize >= MAP_THRESHOLD:
                    self._map(name, info)

    def _map(self, name: str, info: TensorInfo) -> None:
        try:
            fd, tmp = tempfile.mkstemp(prefix=".nncc-", suffix=".npy.tmp", dir=self.directory)
            os.close(fd)
            self._temps[name] = tmp
            self.buffers[name] = np.lib.format.open_memmap(tmp, mode="w+", dtype=info.dtype, shape=info.shape)
        except OSError as exc:
            raise FileAccessError(f"cannot write into {self.directory}: {exc.strerror or exc}") from None

    def finish(self, outputs: Mapping[str, np.ndarray]) -> None:
        for name, value in outputs.items():
            _only_tensor(name, value)
            if name in self._temps:
                self.buffers[name].flush()
                os.replace(self._temps.pop(name), self.paths[name])
            else:
                write_atomic_with(self.paths[name],
                                  lambda f, v=value: np.lib.format.write_array(f, _storable(v), allow_pickle=False))

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, *exc_info) -> None:
        self.buffers.clear()
        for tmp in self._temps.values():  # a failed run leaves no partial file behind
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _write_npz(f, arrays: Mapping[str, np.ndarray]) -> None:
    """What np.savez does, minus its keyword arguments: outputs named 'file' or
    'allow_pickle' would collide with them."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, _storable(value), allow_pickle=False)


def _storable(value) -> np.ndarray:
    """Strings (object arrays of str) are written as numpy unicode arrays: readable
    without unpickling, and fed back as strings (nncc.runtime.feeds)."""
    array = np.asanyarray(value)
    return array.astype(str) if array.dtype.kind == "O" else array


def _only_tensor(name: str, value) -> None:
    if value is None or isinstance(value, list):  # what a sequence or optional output holds
        what = "an empty optional" if value is None else "a sequence"
        raise InputError(f"output {name!r} is {what}, not a tensor: it cannot be written as an array file")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
