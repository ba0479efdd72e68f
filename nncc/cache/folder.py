"""What makes a folder nncc's to manage, whether it may be trusted, and how its files go.

* **Signature.** nncc manages a folder only if it is absent, empty, or carries nncc's own
  signature: a ``CACHEDIR.TAG`` holding nncc's line, or an ``index.sqlite3``. Any other
  folder that holds something is someone else's: it is refused, never written into.
* **Trust.** The index is the trust anchor, so the folder, its index (and the index's WAL
  files), ``entries/``, ``locks/`` and ``objects/`` must be owned by the user running nncc
  and writable by no one else, unless trusting a shared cache is asked for explicitly
  (``NNCC_CACHE_TRUST_SHARED=1``, ``--trust-shared-cache``, ``trust_shared=True``). A
  symlinked index, ``entries/``, ``locks/`` or ``objects/`` is refused whatever the
  setting: SQLite and removals must never write through to another file or folder.
* **Removal.** Only names nncc itself writes are ever deleted (entry files, kernel objects,
  their temp files, lock files), and only through folders opened without following symlinks.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from nncc.errors import NnccError

TAG_NAME = "CACHEDIR.TAG"
INDEX_NAME = "index.sqlite3"
TAG_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
NNCC_TAG_LINE = b"# This file is a cache directory tag created by nncc."
ENV_TRUST = "NNCC_CACHE_TRUST_SHARED"

# The names nncc writes under entries/<t[:2]>/ and locks/ (nncc/cache/store.py makes them).
ENTRY_NAME = re.compile(r"^([0-9a-f]{64})\.(plan|data)$")
TEMP_NAME = re.compile(r"^\.([0-9a-f]{64})\.(plan|data)\.[0-9]+-[0-9a-f]{8}\.tmp$")
LOCK_NAME = re.compile(r"^[0-9a-f]{64}\.lock$")
UPGRADE_LOCK_NAME = re.compile(r"^[0-9a-f]{64}\.upgrade$")  # held by the builder of an optimized stage
SHARD_NAME = re.compile(r"^[0-9a-f]{2}$")
# Kernel objects under objects/<k[:2]>/ (nncc/cache/objects.py makes them), and their temps.
OBJECT_NAME = re.compile(r"^([0-9a-f]{64})\.o$")
OBJECT_TEMP_NAME = re.compile(r"^\.([0-9a-f]{64})\.o\.[0-9]+-[0-9a-f]{8}\.tmp$")
# The tag being written by another nncc that is creating the cache right now.
TAG_TEMP_NAME = re.compile(r"^\.CACHEDIR\.TAG\.[0-9]+-[0-9a-f]{8}\.tmp$")


class CacheUnavailable(NnccError):
    """The cache location cannot be used (read-only, full, not a directory...)."""


class CacheRefused(CacheUnavailable):
    """The folder is not nncc's to manage, or not safe to trust: a usage error (exit 2).
    ``nncc run`` does without the cache instead (one warning line)."""

    exit_code = 2


def _lstat(path: str):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def has_nncc_tag(path: str) -> bool:
    """``path`` is a regular file whose first bytes are a cache tag written by nncc."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, 512)
    except OSError:
        return False
    finally:
        os.close(fd)
    return head.startswith(TAG_SIGNATURE) and NNCC_TAG_LINE in head


def folder_state(directory: str) -> str:
    """"missing", "empty", "nncc" (carries nncc's signature) or "foreign"."""
    try:
        st = os.stat(directory)  # the folder itself may be reached through a link
    except FileNotFoundError:
        return "missing" if not os.path.islink(directory) else "foreign"
    except OSError:
        return "foreign"
    if not stat.S_ISDIR(st.st_mode):
        return "foreign"
    if _signed(directory):
        return "nncc"
    try:
        with os.scandir(directory) as it:
            # empty, or holding only the tag another nncc is writing there this instant
            empty = all(TAG_TEMP_NAME.match(e.name) for e in it)
    except OSError:
        return "foreign"
    if empty:
        return "empty"
    # Another nncc creating the cache may have put its tag in place between the check above
    # and the scan; it writes the tag before anything else, so look once more.
    return "nncc" if _signed(directory) else "foreign"


def _signed(directory: str) -> bool:
    """The folder carries nncc's signature: its index, or its CACHEDIR.TAG."""
    index = _lstat(os.path.join(directory, INDEX_NAME))
    if index is not None and stat.S_ISREG(index.st_mode):
        return True
    return has_nncc_tag(os.path.join(directory, TAG_NAME))


def refuse_foreign(directory: str) -> None:
    raise CacheRefused(
        f"{directory} is not an nncc cache: it is not empty and has no nncc CACHEDIR.TAG or "
        f"{INDEX_NAME}, so nncc will not write into it or delete anything there",
        hint="name an empty or new folder with --cache-dir or NNCC_CACHE_DIR")


def _describe(st) -> str:
    try:
        import pwd  # lazy: Unix only

        owner = pwd.getpwuid(st.st_uid).pw_name
    except (ImportError, KeyError):
        owner = f"uid {st.st_uid}"
    return f"mode {stat.S_IMODE(st.st_mode):04o}, owner {owner}"


def check_trusted(directory: str, trust_shared: bool) -> None:
    """Raise CacheRefused unless the cache folder's trust anchor is private to this user
    (or trusting a shared one was asked for). Symlinks are refused in any case."""
    me = os.geteuid()
    for name in ("", INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm", "entries", "locks", "objects"):
        path = os.path.join(directory, name) if name else directory
        try:
            st = os.lstat(path) if name else os.stat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode) and name:
            raise CacheRefused(f"{path} is a symbolic link; nncc will not use a cache through it",
                               hint=f"remove the link (a cache's {name} is never a link)")
        if trust_shared:
            continue
        if st.st_uid != me or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = "is owned by another user" if st.st_uid != me else "is writable by group or others"
            fix = (f"chmod go-w {path}" if st.st_uid == me
                   else "use a cache folder of your own")
            raise CacheRefused(
                f"{path} {why} ({_describe(st)}): anyone who can write there can make nncc run "
                f"their plans", hint=f"{fix}, or set {ENV_TRUST}=1 (or --trust-shared-cache) to trust it")


def make_private(path: str) -> None:
    """Give a folder nncc created (or is about to initialize) mode 0700, whatever the umask
    or default ACLs gave it."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        os.chmod(path, 0o700)


def create_private_file(path: str) -> None:
    """Create an empty file with mode 0600 unless it exists (never through a symlink)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    os.close(fd)


# -- removing nncc's own files ------------------------------------------------------------


def _open_dir(name: str, dir_fd: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def remove_name(folders: list[str], name: str, pattern: re.Pattern) -> str | None:
    """Remove ``name`` from the folder reached by ``folders`` (opened one by one, following
    no symlink). Only a name matching ``pattern`` is touched; an empty directory of that
    name is removed too (an entry file replaced by one), a non-empty one is not.
    Returns None when the name is gone (or never was), else why it could not go."""
    if not pattern.match(name):
        return f"{name} is not a name nncc writes"
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(folders[0], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for folder in folders[1:]:
                fds.append(_open_dir(folder, fds[-1]))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return f"{os.path.join(*folders)} is not a real folder (a symbolic link?); left alone"
            return f"cannot open {os.path.join(*folders)}: {exc.strerror or exc}"
        fd = fds[-1]
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            return None
        try:
            if stat.S_ISDIR(st.st_mode):
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return f"{os.path.join(*folders, name)} is a directory that is not empty; left alone"
            return f"cannot remove {os.path.join(*folders, name)}: {exc.strerror or exc}"
        return None
    finally:
        for fd in fds:
            os.close(fd)


def remove_entry_path(cache_dir: str, path: str) -> str | None:
    """Remove an entry or temp file ``cache_dir/entries/<shard>/<name>`` (see remove_name)."""
    rel = os.path.relpath(path, cache_dir).split(os.sep)
    if len(rel) != 3 or rel[0] != "entries" or not SHARD_NAME.match(rel[1]):
        return f"{path} is not where nncc keeps entries"
    name = rel[2]
    pattern = ENTRY_NAME if ENTRY_NAME.match(name) else TEMP_NAME
    m = pattern.match(name)
    if m is not None and m.group(1)[:2] != rel[1]:
        return f"{path} is not in its token's folder"
    return remove_name([cache_dir, "entries", rel[1]], name, pattern)
