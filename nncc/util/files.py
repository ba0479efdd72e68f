"""Reading model, artifact and cache files that may be hostile, with one-line errors.

Every such file is opened once, without blocking (opening a FIFO that has no writer would
wait forever), checked with fstat, and read through that same descriptor: a regular file
up to the size it declares, never more (a symlink to /dev/zero is not a regular file and
is refused). A model or artifact named on the command line may also be a pipe
(``nncc run <(cat model.onnx)``, ``/dev/stdin``): it is read once, up to
``PIPE_LIMIT`` bytes. Artifacts and ONNX models are told apart by their first bytes
(no parsing: the cache hashes these bytes).
"""

from __future__ import annotations

import fcntl
import io
import mmap
import os
import stat

from nncc.errors import FileAccessError
from nncc.util.limits import PIPE_LIMIT

ARTIFACT_MAGIC = b"NNCCPLAN"  # the first bytes of every nncc artifact (nncc/plan/format.py)
_CHUNK = 1 << 20


def open_file(path: str | os.PathLike) -> tuple[int, os.stat_result]:
    """(descriptor, its fstat): opened read-only with O_NONBLOCK, which is then cleared, so
    that a FIFO without a writer neither blocks the open nor fakes an early end later.
    Raises OSError. The caller closes the descriptor."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def kind(mode: int) -> str:
    """What a non-regular file is, for messages."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_at_most(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes from the descriptor's current position (fewer at an early end)."""
    if size <= 0:
        return b""
    with io.open(fd, "rb", closefd=False) as f:
        return f.read(size)


def read_pipe(fd: int, limit: int = PIPE_LIMIT) -> bytearray | None:
    """Everything a pipe delivers, or None when it delivers more than ``limit`` bytes."""
    data = bytearray()
    while True:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return data
        data += chunk
        if len(data) > limit:
            return None


def _access_error(path, exc: OSError) -> FileAccessError:
    if isinstance(exc, FileNotFoundError):
        return FileAccessError(f"cannot read {path}: no such file",
                               hint=f"check the path; relative paths start at {os.getcwd()}")
    return FileAccessError(f"cannot read {path}: {exc.strerror or exc}")


def read_source(path: str | os.PathLike, what: str = "model", map_artifact: bool = True, lazy_model: bool = False):
    """A model or artifact named by the user, read once: ``(buffer, is_artifact)``.

    A regular file is read up to its size, or memory-mapped when it is an artifact (its
    constants are used in place) and ``map_artifact``; a pipe is read up to PIPE_LIMIT.
    Anything else (a directory, a device) is refused with FileAccessError. With
    ``lazy_model``, a regular file that is not an artifact is not read: ``(None, False)``
    (the cache may find its entry without reading it)."""
    try:
        fd, st = open_file(path)
    except OSError as exc:
        raise _access_error(path, exc) from None
    try:
        if stat.S_ISFIFO(st.st_mode):
            data = read_pipe(fd)
            if data is None:
                raise FileAccessError(f"{path} is a pipe delivering more than {PIPE_LIMIT >> 30} GiB; "
                                      "give large models and artifacts as regular files")
            return data, bytes(data[:len(ARTIFACT_MAGIC)]) == ARTIFACT_MAGIC
        if not stat.S_ISREG(st.st_mode):
            raise FileAccessError(f"{path} is {kind(st.st_mode)}, not a {what} file")
        artifact = os.pread(fd, len(ARTIFACT_MAGIC), 0) == ARTIFACT_MAGIC
        if artifact and map_artifact and st.st_size:
            return mmap.mmap(fd, st.st_size, access=mmap.ACCESS_READ), True
        if lazy_model and not artifact:
            return None, False
        return read_at_most(fd, st.st_size), artifact
    except OSError as exc:
        raise _access_error(path, exc) from None
    finally:
        os.close(fd)


def read_model_file(path: str | os.PathLike) -> bytes:
    """An ONNX model file's bytes (a regular file or a pipe), read once."""
    data, _ = read_source(path, "model", map_artifact=False)
    return data


def is_artifact(path: str | os.PathLike) -> bool:
    """Whether a regular file starts like an nncc artifact. For callers that read the file
    again afterwards, so a pipe (which can be read only once) is refused."""
    try:
        fd, st = open_file(path)
    except OSError as exc:
        raise _access_error(path, exc) from None
    try:
        if not stat.S_ISREG(st.st_mode):
            raise FileAccessError(f"{path} is {kind(st.st_mode)}, not a regular model file")
        return os.pread(fd, len(ARTIFACT_MAGIC), 0) == ARTIFACT_MAGIC
    except OSError as exc:
        raise _access_error(path, exc) from None
    finally:
        os.close(fd)


def external_data_path(base_dir: str, location: str) -> str:
    """The file an ONNX external-data ``location`` names: relative to the model's folder
    ``base_dir``, and inside it. Raises ValueError saying why not (a NUL byte, an absolute
    path, a ``..`` step, or a symlink leading out). The ONNX reader and the cache token
    share this rule, so the token never reads a file the reader would refuse."""
    if "\0" in location:
        raise ValueError("contains a NUL byte")
    if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        raise ValueError("leaves the model folder")
    path = os.path.join(base_dir, location)
    folder, real = os.path.realpath(base_dir), os.path.realpath(path)
    try:
        inside = os.path.commonpath([folder, real]) == folder
    except ValueError:  # different drives on Windows
        inside = False
    if not inside:
        raise ValueError("leaves the model folder")
    return path


def read_private_file(path: str, named: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a secret's file, after checking the file opened (a rename
    after the check changes nothing) is a regular file, the user's own, and neither
    readable nor writable by group or others: whoever reads a key can act as its owner.
    Raises OSError when it cannot be opened, PrivateFileError naming ``named`` otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PrivateFileError(f"{named} is not a regular file")
        if st.st_uid != os.geteuid():
            raise PrivateFileError(f"{named} is owned by user id {st.st_uid}, not by you: keep your own copy, "
                                   "mode 600")
        if st.st_mode & 0o077:
            raise PrivateFileError(f"{named} is readable or writable by others (mode "
                                   f"{stat.S_IMODE(st.st_mode):04o}); run chmod 600 {path}, and treat the "
                                   "key as leaked if others could read it")
        return os.read(fd, limit)
    finally:
        os.close(fd)


class PrivateFileError(ValueError):
    """A secret's file that is not private to the user (its message says what to fix)."""
