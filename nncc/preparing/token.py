"""The cache token: 32 bytes naming one compiled result.

Everything that can change what the compiler produces is folded into the token, in one
place, ``compute_token``. Hashing never parses the model: a cache hit must not pay for
(or even import) the ONNX frontend.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import sys
import time

import numpy as np
from blake3 import blake3

from nncc import _version
from nncc.plan import format as plan_format
from nncc.util.files import external_data_path, open_file

TOKEN_SCHEME = "nncc-cache-token/5"  # bump when the list of ingredients changes
TOKEN_BYTES = 32
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nncc/
EXTERNAL_MARKER = b"location"  # the key of every ONNX external-data entry


def compute_token(model_path: str | os.PathLike, model_bytes: bytes | memoryview, options,
                  skip_dirs: tuple[str, ...] = ()) -> bytes:
    """Return the 32-byte blake3 token of compiling ``model_bytes`` with ``options``.

    Ingredients, each framed as (label, length, value) so no two lists hash alike:

    1. ``TOKEN_SCHEME``: the version of this very list.
    2. The blake3 of the model file's bytes (the bytes the caller read once, and will
       compile from on a miss, so what is hashed is what is compiled).
    3. External data the model may reference (see ``external_files``): the relative path
       and blake3 of every candidate file; empty when the model bytes do not contain the
       marker ``b"location"`` (the model then cannot reference external data).
    4. nncc's version (``__version__``): passes, lowering and kernels change with it.
    5. The artifact format version (``nncc.plan.format.FORMAT_VERSION``).
    6. The identity (name, version, maker, targets) of every backend the options name (the
       built-in native backend aside: ingredient 7 covers its compiler) and of the CPU
       fallback, after the options' plugins are loaded. Installed packages' entry points
       are read only to find a named backend that is not built in, so a run on the
       built-in backends never pays for reading every installed package's metadata.
    7. The compile options: ``CompileOptions.as_dict()`` (preference, opt level, backend
       order, plugins, threads).
    8. The loaded plugins and their versions (``loaded_plugins()``).
    9. numpy's version and the byte order: compile-time constant folding runs numpy, and
       constants are stored in native byte order.
    10. nncc's own code (``code_fingerprint``): the path relative to the package and the
        sha256 of the contents of every source file of the installed package. A source
        checkout (an editable install) changes its code without changing
        ``__version__``; an entry compiled by other code must then miss, not be served.
        Two installs of the same code (other folders, other times, other machines) agree,
        so a fleet shares entries. About 1 ms per process (a wheel's RECORD, or hashes
        remembered in the cache index).

    4-10 are hashed first, into ``token_context``, which direct mode reuses.
    The model's own path is *not* an ingredient: the same bytes in two places share an
    entry. Plugins named in ``options`` are imported here (they register kernels and
    backends that change the result, and a plan using their kernels needs them loaded).
    """
    return token_from(token_context(options), model_path, model_bytes, skip_dirs)


def token_from(context: bytes, model_path, model_bytes, skip_dirs=(), seen: list | None = None) -> bytes:
    """compute_token, given ``token_context(options)``. ``seen`` (a list) receives the
    identity of every file and folder the external-data search looked at."""
    return token_of(model_subject(model_path, model_bytes, skip_dirs, seen), context)


def model_subject(model_path, model_bytes, skip_dirs=(), seen: list | None = None) -> bytes:
    """The digest of ingredients 2 and 3: the model's bytes and the external data it may
    read. With another context it names the same model compiled otherwise (the remote
    tier's portable entry) without hashing the model again."""
    h = blake3()
    _put(h, "model", blake3(model_bytes, max_threads=_threads(len(model_bytes))).digest())
    for rel, digest in external_files(model_path, model_bytes, skip_dirs, seen):
        _put(h, "external", rel.encode("utf-8", "surrogateescape") + b"\0" + digest)
    return h.digest()


def token_of(subject: bytes, context: bytes) -> bytes:
    h = blake3()
    _put(h, "scheme", TOKEN_SCHEME)
    _put(h, "subject", subject)
    _put(h, "context", context)
    return h.digest()


def token_context(options, memo=None) -> bytes:
    """The digest of every ingredient but the model's own bytes and files (3-10 above):
    what a direct-mode lookup must match as well as the file's identity. ``memo``: the
    cache index, which remembers the hashes of nncc's source files (``code_fingerprint``)."""
    from nncc.backends.registry import get_backend, load_plugin, loaded_plugins  # lazy: start-up

    for module in options.plugins:
        load_plugin(module)
    names = dict.fromkeys(n for n in (*options.backends, "cpu") if n != "native")
    backends = [get_backend(name).identity() for name in names]

    h = blake3()
    _put(h, "nncc", _version.__version__)
    _put(h, "format", str(plan_format.FORMAT_VERSION))
    _put(h, "backends", _json(backends))
    _put(h, "options", _json(options.as_dict()))
    _put(h, "plugins", _json(loaded_plugins()))
    _put(h, "numpy", np.__version__)
    _put(h, "byteorder", sys.byteorder)
    _put(h, "code", code_fingerprint(PACKAGE_DIR, memo))
    return h.digest()


def _put(h, label: str, value: bytes | str) -> None:
    """One ingredient, framed as (label, length, value) so that no two lists hash alike."""
    raw = value.encode() if isinstance(value, str) else bytes(value)
    tag = label.encode()
    h.update(len(tag).to_bytes(4, "little") + tag + len(raw).to_bytes(8, "little"))
    h.update(raw)


SOURCE_SUFFIXES = (".py", ".c", ".h")  # the package's code: Python, and the C the native backend builds
_fingerprints: dict[str, bytes] = {}  # package folder -> fingerprint, once per process
TOO_NEW = 2.0  # seconds: a file changed this recently may change again within its mtime's tick


def code_fingerprint(package_dir: str, memo=None) -> bytes:
    """blake3 over (path relative to ``package_dir``, sha256 of the contents) of every
    source file below it (``SOURCE_SUFFIXES``), in a fixed order: never an absolute path or
    a time, so two installs of the same code agree wherever and whenever they were made,
    and any changed byte changes it. Byte-code caches are not part of it.

    Kept near a millisecond per process: an installed wheel's ``RECORD`` already holds
    the sha256 of each file (used when every source file on disk is listed there with its
    size); otherwise (a source checkout, an editable install) each file is hashed, unless
    ``memo`` (the cache index) remembers its hash under the same (path, size, mtime).
    Computed once per process per folder."""
    known = _fingerprints.get(package_dir)
    if known is not None:
        return known
    files = source_files(package_dir)
    digests = _record_digests(package_dir, files)
    if digests is None:
        digests = _content_digests(files, memo)
    h = blake3()
    for rel in sorted(files):
        h.update(f"{rel}\0{digests[rel]}\n".encode("utf-8", "surrogateescape"))
    _fingerprints[package_dir] = digest = h.digest()
    return digest


def forget_fingerprints() -> None:
    """Compute the fingerprint afresh on the next call (tests that edit a package)."""
    _fingerprints.clear()


def source_files(package_dir: str) -> dict[str, tuple[str, os.stat_result]]:
    """{path relative to the package, with "/": (absolute path, stat)} of every source file."""
    found = {}
    for folder, subfolders, names in os.walk(package_dir):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in names:
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            found[os.path.relpath(path, package_dir).replace(os.sep, "/")] = (path, st)
    return found


def _record_digests(package_dir: str, files: dict) -> dict[str, str] | None:
    """sha256 (hex) of each source file from the installed wheel's RECORD, or None when
    there is no RECORD naming exactly these files with these sizes (an editable install,
    a checkout, or a file edited or added after installing: then the contents are hashed)."""
    import base64  # lazy: start-up
    import csv  # lazy: start-up

    parent, name = os.path.split(os.path.abspath(package_dir))
    try:
        infos = [d for d in os.listdir(parent) if d.startswith(name + "-") and d.endswith(".dist-info")]
    except OSError:
        return None
    for info in infos:
        try:
            with open(os.path.join(parent, info, "RECORD"), newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        digests = {}
        for row in rows:
            if len(row) < 3 or not row[0].startswith(name + "/"):
                continue
            rel = row[0][len(name) + 1:]
            if rel not in files:
                if rel.endswith(SOURCE_SUFFIXES) and "__pycache__" not in rel:
                    break  # a listed source file is gone
                continue
            algo, _, value = row[1].partition("=")
            if algo != "sha256" or not row[2].isdigit() or int(row[2]) != files[rel][1].st_size:
                break
            try:
                digests[rel] = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
            except ValueError:
                break
        else:
            if digests.keys() == files.keys():
                return digests
    return None


def _content_digests(files: dict, memo=None) -> dict[str, str]:
    """sha256 (hex) of each file's contents; ``memo`` (``code_hashes``/``put_code_hashes``)
    spares reading a file whose (path, size, mtime) it has seen, and learns the others."""
    import hashlib  # lazy: start-up

    remembered = memo.code_hashes() if memo is not None else {}
    digests, learned = {}, []
    recent = time.time() - TOO_NEW
    for rel, (path, st) in files.items():
        seen = remembered.get(path)
        if seen is not None and seen[:2] == (st.st_size, st.st_mtime_ns):
            digests[rel] = seen[2]
            continue
        try:
            with open(path, "rb") as f:
                digests[rel] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            digests[rel] = "unreadable"
            continue
        if st.st_mtime_ns / 1e9 < recent:  # an edit within the same tick would go unseen
            learned.append((path, st.st_size, st.st_mtime_ns, digests[rel]))
    if learned and memo is not None:
        memo.put_code_hashes(learned)
    return digests


def external_files(model_path, model_bytes, skip_dirs=(), seen: list | None = None) -> list[tuple[str, bytes]]:
    """Files whose contents the ONNX reader may read as external data, with their hashes.

    The reader resolves each external tensor's ``location`` relative to the model's folder
    and refuses paths that leave it. Without parsing the model: if the model bytes do not
    contain ``b"location"`` there is no external data. Otherwise every regular file in the
    model's folder tree whose *name* occurs in the model bytes is a candidate (a location
    string always ends with the name of the file it resolves to, and strings are stored
    verbatim in the protobuf wire format), so the set is a superset of what the reader can
    open. Files not present are simply absent from the list, so creating one later changes
    the token too. The nncc cache directory is skipped if it lies inside the folder.
    ``seen`` receives (path, stat) of every folder walked, taken before it is listed, and
    of every file hashed, taken before it is read (see nncc/cache/direct.py).
    """
    if EXTERNAL_MARKER not in model_bytes:
        return []

    base = os.path.dirname(os.path.abspath(model_path))
    skip = {os.path.realpath(d) for d in skip_dirs}
    data = bytes(model_bytes)
    found = []
    for root, dirs, files in os.walk(base):
        if seen is not None:
            # taken after os.walk listed it: a name added in between leaves the folder's
            # times too new for direct mode to record them (nncc/cache/direct.py)
            seen.append((root, _stat_or_none(root)))
        dirs[:] = sorted(d for d in dirs if os.path.realpath(os.path.join(root, d)) not in skip)
        for name in sorted(files):
            if os.fsencode(name) not in data:
                continue
            rel = os.path.relpath(os.path.join(root, name), base)
            try:
                # the reader's own rule, before anything is opened: a symlink leading out
                # of the folder is refused by the reader, so it is never read here either
                path = external_data_path(base, rel)
                digest = _hash_file(path, seen)
            except (OSError, ValueError):
                continue  # not a readable regular file inside the folder: the reader could not use it
            found.append((rel, digest))
    return found


def _stat_or_none(path: str):
    try:
        return os.stat(path)
    except OSError:
        return None


def _hash_file(path: str, seen: list | None = None) -> bytes:
    fd, st = open_file(path)  # never blocks on a FIFO; what is hashed is what fstat saw
    try:
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if seen is not None:
            seen.append((path, st))
        h = blake3(max_threads=_threads(st.st_size))
        if st.st_size:
            with mmap.mmap(fd, st.st_size, access=mmap.ACCESS_READ) as mapped:
                h.update(mapped)
        return h.digest()
    finally:
        os.close(fd)


def _threads(size: int) -> int:
    return blake3.AUTO if size >= (8 << 20) else 1


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
