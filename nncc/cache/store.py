"""The compilation cache: entry files on disk, the hash index, and ``prepare``.

Layout of a cache directory (docs/cache.md has the full story)::

    CACHEDIR.TAG
    index.sqlite3 (+ -wal, -shm)      token -> hashes, sizes, versions, counters
    locks/<token>.lock                one flock file per token
    entries/<t[:2]>/<token>.plan      model cache: program + inline constants (verified)
    entries/<t[:2]>/<token>.data      data cache: large constants, 64-byte aligned (mmap)
    entries/<t[:2]>/.<token>.<kind>.<pid>-<rand>.tmp   an atomic write in progress

The three NNAPI flows: hit (prepare from the verified files), miss (compile, write both
files atomically, then commit the index row) and no cache (compile; touch nothing).
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import stat
import time
from dataclasses import dataclass, field

from blake3 import blake3

from nncc.cache.folder import (ENTRY_NAME, SHARD_NAME, TEMP_NAME, CacheRefused, CacheUnavailable, check_trusted,
                               folder_state, make_private, refuse_foreign, remove_entry_path)
from nncc.cache.index import INDEX_NAME, Entry, Index, IndexCorrupt, IndexUnavailable, disk_full
from nncc.cache.locking import FileLock, LockBusy, try_lock
from nncc.util.notice import warn
from nncc.errors import ModelFormatError, PlanFormatError
from nncc.util.files import kind, open_file, read_at_most, read_model_file

ENTRIES = "entries"
LOCKS = "locks"
PLAN = ".plan"
DATA = ".data"
TAG_NAME = "CACHEDIR.TAG"
CACHEDIR_TAG = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
                b"# This file is a cache directory tag created by nncc.\n"
                b"# For information about cache directory tags see https://bford.info/cachedir/\n")
TOKEN_RE = re.compile(r"^[0-9a-f]{64}$")
ENTRY_FILE_RE = ENTRY_NAME  # <token>.plan, <token>.data
TEMP_FILE_RE = TEMP_NAME  # .<token>.<kind>.<pid>-<8 hex>.tmp, as _write_file names them
ENV_DIR = "NNCC_CACHE_DIR"


class CacheEntryError(Exception):
    """An entry failed verification; it must not be prepared."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind  # "corrupt" | "missing" | "unreadable" | "stale"
        self.detail = detail


class CacheWriteError(Exception):
    """Writing an entry failed (disk full, read-only...)."""


@dataclass
class CacheOutcome:
    """What the cache did for one prepare: reported by ``nncc run``/``compile --json``."""

    outcome: str  # "hit" | "miss" | "disabled" | "unavailable" | "recompiled"
    token: str | None
    seconds: float
    directory: str | None = None
    detail: str | None = None  # why an entry was rejected or the cache was unavailable

    def as_dict(self) -> dict:
        return {"outcome": self.outcome, "token": self.token, "seconds": self.seconds,
                "directory": self.directory, "detail": self.detail}


def default_cache_dir() -> str:
    import platformdirs

    return platformdirs.user_cache_dir("nncc", appauthor=False)


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> str:
    """--cache-dir, else $NNCC_CACHE_DIR, else the platform's user cache directory."""
    if cache_dir:
        return os.path.abspath(os.fspath(cache_dir))
    env = os.environ.get(ENV_DIR)
    return os.path.abspath(env) if env else default_cache_dir()


def _hash(buffer) -> str:
    size = len(buffer)
    return blake3(buffer, max_threads=blake3.AUTO if size >= (8 << 20) else 1).hexdigest()


@dataclass
class TokenFiles:
    """What the entries/ folder holds for one token."""

    token: str
    plan: str | None = None
    data: str | None = None
    temps: list[str] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [p for p in (self.plan, self.data) if p]

    def size(self) -> int:
        total = 0
        for p in self.paths() + self.temps:
            try:
                total += os.lstat(p).st_size
            except OSError:
                pass
        return total


def no_space_left(directory: str) -> bool:
    """The file system holding ``directory`` has no free block or inode for this user."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail == 0 or (st.f_files > 0 and st.f_favail == 0)


def _read_only_directory(directory: str) -> bool:
    """An existing cache directory this process cannot write into (access() reports a
    read-only mount even to root)."""
    return os.path.isdir(directory) and not os.access(directory, os.W_OK | os.X_OK)


class Cache:
    """One opened cache directory. ``Cache.open(dir)``; close() when done."""

    def __init__(self, directory: str):
        self.directory = directory
        self.entries_dir = os.path.join(directory, ENTRIES)
        self.locks_dir = os.path.join(directory, LOCKS)
        self.index: Index | None = None
        self.read_only = False  # opened for reading only: hits are served, nothing is written
        # Opened to free space on a full disk (see open(reclaim=True)): files go first and
        # the index rows they leave behind are deleted once there is room for the write.
        self.reclaiming = False
        self.disk_full = False  # found full at open (then read_only or reclaiming)
        self._unindexed: list[tuple[str, str | None]] = []  # (token, counter) rows still to delete
        self.last_failure: str | None = None  # why the last remove/remove_files left a file behind

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def open(cls, directory: str | os.PathLike | None = None, create: bool = True,
             read_only_ok: bool = False, reclaim: bool = False, trust_shared: bool | None = None) -> "Cache":
        """Open (and create) a cache directory. Raises CacheUnavailable. With
        ``read_only_ok``, a filled cache that cannot be written (read-only storage, another
        user's) opens for reading: ``cache.read_only`` is then True.

        With ``reclaim`` (the commands that remove entries), a cache whose index cannot be
        opened because its disk is full opens anyway, to free space: the index is held
        exclusively (no ``-shm`` file needed, and no reader can look up an entry while its
        files go first), and ``cache.reclaiming`` is True.

        A folder that is not nncc's (not empty, no nncc signature), or one that is not
        private to this user (unless ``trust_shared``, default $NNCC_CACHE_TRUST_SHARED),
        raises CacheRefused (nncc/cache/folder.py). ``create=False`` never creates
        anything: no cache there raises CacheUnavailable."""
        try:
            return cls._open(directory, create, read_only_ok, trust_shared)
        except CacheRefused:
            raise
        except CacheUnavailable:
            path = resolve_cache_dir(directory)
            if not ((reclaim or read_only_ok) and os.path.isfile(os.path.join(path, INDEX_NAME))
                    and no_space_left(path)):
                raise
        cache = cls(path)
        cache.disk_full = True
        if not reclaim:  # serve and show what is there, store nothing
            return cache._open_read_only()
        try:
            cache.index = cache._new_index().open(exclusive=True)
        except (IndexCorrupt, IndexUnavailable) as exc:
            raise CacheUnavailable(f"{path} is on a full disk and its index cannot be read ({exc})") from None
        cache.reclaiming = True
        return cache

    @classmethod
    def _open(cls, directory, create: bool, read_only_ok: bool, trust_shared: bool | None) -> "Cache":
        cache = cls(resolve_cache_dir(directory))
        state = folder_state(cache.directory)
        if state == "foreign":
            if os.path.isdir(cache.directory):
                refuse_foreign(cache.directory)
            raise CacheUnavailable(f"{cache.directory} is not a directory")
        if not create and (state != "nncc" or not os.path.isfile(os.path.join(cache.directory, INDEX_NAME))):
            raise CacheUnavailable(f"no cache at {cache.directory}")
        if state == "nncc" or (state == "empty" and os.stat(cache.directory).st_uid != os.geteuid()):
            check_trusted(cache.directory, trust_shared)  # before writing anything there
        # (an empty folder of this user's is made private (0700) when the cache is created)
        try:
            if create:
                if read_only_ok and state == "nncc" and _read_only_directory(cache.directory):
                    return cache._open_read_only()
                cache._create(state, trust_shared)
        except CacheWriteError as exc:
            raise CacheUnavailable(str(exc)) from None
        except OSError as exc:
            raise CacheUnavailable(f"cannot use {cache.directory}: {exc.strerror or exc}") from None
        check_trusted(cache.directory, trust_shared)  # what was just created, or already there
        cache.index = cache._open_index()
        return cache

    def _create(self, state: str, trust_shared: bool | None) -> None:
        """Make the folder a cache: mode 0700 where nncc creates or initializes it (an
        existing empty folder keeps its mode when a shared cache is trusted), the signature
        (CACHEDIR.TAG) first, then entries/ and locks/ (Index.open creates the index, 0600)."""
        from nncc.cache.folder import trust_shared_from_env

        if state == "missing":
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            make_private(self.directory)
        elif state == "empty" and os.stat(self.directory).st_uid == os.geteuid() and not (
                trust_shared if trust_shared is not None else trust_shared_from_env()):
            make_private(self.directory)
        tag = os.path.join(self.directory, TAG_NAME)
        if not os.path.lexists(tag):
            _write_file(tag, CACHEDIR_TAG, f".{TAG_NAME}")
        for d in (self.entries_dir, self.locks_dir):
            if not os.path.lexists(d):
                try:
                    os.mkdir(d, 0o700)
                    make_private(d)
                except FileExistsError:
                    pass  # another process creating the cache made it first
            if os.path.islink(d) or not os.path.isdir(d):
                raise CacheUnavailable(f"{d} is not a directory")
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise CacheUnavailable(f"{self.directory} is not writable")

    def _open_read_only(self) -> "Cache":
        try:
            self.index = self._new_index().open_read_only()
        except (IndexUnavailable, IndexCorrupt) as exc:
            why = "on a full disk" if self.disk_full else "read-only"
            raise CacheUnavailable(f"{self.directory} is {why} and its index cannot serve ({exc})") from None
        self.read_only = True
        return self

    def _new_index(self) -> Index:
        import nncc
        from nncc.plan.format import FORMAT_VERSION

        return Index(self.directory, nncc.__version__, FORMAT_VERSION)

    def _open_index(self) -> Index:
        try:
            return self._new_index().open()
        except IndexCorrupt as exc:
            return self.rebuild_index(str(exc))
        except IndexUnavailable as exc:
            raise CacheUnavailable(str(exc)) from None

    def rebuild_index(self, reason: str) -> Index:
        """Replace an unreadable index with an empty one (under the index lock, so that
        concurrent processes rebuild it once)."""
        if self.index is not None:
            self.index.close()
            self.index = None
        try:
            with FileLock(os.path.join(self.locks_dir, "index.lock")):
                try:
                    index = self._new_index().open()
                    if index.healthy():  # someone else rebuilt it meanwhile
                        self.index = index
                        return index
                    index.close()
                except IndexCorrupt:
                    pass
                path = self._new_index().path
                for suffix in ("", "-wal", "-shm", "-journal"):
                    try:
                        os.unlink(path + suffix)
                    except FileNotFoundError:
                        pass
                warn(f"cache index {path} was unreadable ({reason}); rebuilt it empty")
                self.index = self._new_index().open()
                return self.index
        except (IndexCorrupt, IndexUnavailable, OSError) as exc:
            raise CacheUnavailable(f"cannot rebuild the cache index: {exc}") from None

    def close(self) -> None:
        if self.index is not None:
            try:
                self._delete_unindexed()
                if self._unindexed:
                    warn(f"the disk holding {self.directory} is still full: {len(self._unindexed)} "
                         "removed entries keep their index rows (`nncc cache verify --fix` drops them)")
            finally:
                self.index.close()
                self.index = None

    def delete_row(self, token: str, counter: str | None = None) -> None:
        """Delete an index row (and count it). A full disk postpones it until a later
        removal has freed room for the write."""
        self._unindexed.append((token, counter))
        self._delete_unindexed()

    def _delete_unindexed(self) -> None:
        while self._unindexed:
            token, counter = self._unindexed[0]
            try:
                self.index.delete(token, counter)
            except IndexUnavailable as exc:
                if disk_full(exc):
                    return  # retried after the next removal, and at close()
                raise
            self._unindexed.pop(0)

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- layout ------------------------------------------------------------------------

    def shard(self, token: str) -> str:
        return os.path.join(self.entries_dir, token[:2])

    def paths(self, token: str) -> tuple[str, str]:
        base = os.path.join(self.shard(token), token)
        return base + PLAN, base + DATA

    def lock_path(self, token: str) -> str:
        return os.path.join(self.locks_dir, token + ".lock")

    def lock(self, token: str, shared: bool = False, blocking: bool = True) -> FileLock:
        return FileLock(self.lock_path(token), shared=shared, blocking=blocking)

    def scan(self) -> tuple[dict[str, TokenFiles], list[str]]:
        """Every name under entries/: by token (names nncc writes, whatever their file type,
        so that an entry file replaced by a directory can be healed), plus the names nncc
        never writes (foreign: reported, never removed). A symlinked entries/ or shard is
        foreign as a whole and is not looked into."""
        tokens: dict[str, TokenFiles] = {}
        foreign: list[str] = []
        if os.path.islink(self.entries_dir):
            return tokens, [self.entries_dir]
        try:
            shards = sorted(os.listdir(self.entries_dir))
        except FileNotFoundError:
            return tokens, foreign
        for shard in shards:
            folder = os.path.join(self.entries_dir, shard)
            if not SHARD_NAME.match(shard) or not os.path.isdir(folder) or os.path.islink(folder):
                foreign.append(folder)
                continue
            for name in sorted(os.listdir(folder)):
                path = os.path.join(folder, name)
                m = ENTRY_FILE_RE.match(name) or TEMP_FILE_RE.match(name)
                if m is None or m.group(1)[:2] != shard:
                    foreign.append(path)
                    continue
                files = tokens.setdefault(m.group(1), TokenFiles(m.group(1)))
                if name.endswith(".tmp"):
                    files.temps.append(path)
                elif m.group(2) == "plan":
                    files.plan = path
                else:
                    files.data = path
        return tokens, foreign

    # -- reading: verify, then parse the verified bytes --------------------------------

    def load(self, entry: Entry):
        """Prepare a CompiledModel from an entry, verifying it first, with no gap between
        check and use.

        The model cache is read into memory once; those bytes are hashed and compared with
        the index, and then those same bytes are parsed. The data cache is mapped read-only
        and the mapping is hashed; it only holds numbers whose offsets and lengths come
        from the verified model cache and are bounds-checked against the mapping's length.
        Raises CacheEntryError; never returns an unverified plan.
        """
        import nncc
        from nncc.model import CompiledModel
        from nncc.plan.format import FORMAT_VERSION, deserialize

        if entry.nncc_version != nncc.__version__ or entry.format_version != FORMAT_VERSION:
            raise CacheEntryError("stale", f"was written by nncc {entry.nncc_version} "
                                           f"(format {entry.format_version})")
        plan_path, data_path = self.paths(entry.token)
        model_bytes = _read_bytes(plan_path, "model cache", entry.plan_size)
        if len(model_bytes) != entry.plan_size:
            raise CacheEntryError("corrupt", f"model cache has {len(model_bytes)} bytes, "
                                             f"the index recorded {entry.plan_size}")
        if _hash(model_bytes) != entry.plan_hash:
            raise CacheEntryError("corrupt", "model cache does not match its recorded hash")
        data = _map_data(data_path, entry)
        try:
            plan = deserialize(model_bytes, data=data)
        except PlanFormatError as exc:
            raise CacheEntryError("corrupt", f"model cache is malformed: {exc}") from None
        if plan.producer != nncc.__version__:
            raise CacheEntryError("stale", f"model cache was produced by nncc {plan.producer}")
        # the native code was hashed with the plan above and is loaded from those bytes
        model = CompiledModel(plan, trust_native=True, origin=f"cache entry {entry.token[:12]}")
        model._cache_parts = (model_bytes, data)
        return model

    # -- writing -----------------------------------------------------------------------

    def write(self, token: str, model_bytes: bytes, data_bytes: bytes) -> tuple[str, str]:
        """Write both files atomically (each: temp in the same folder, fsync, rename, then
        fsync the folder). Returns their hashes, taken from the in-memory buffers. The
        caller commits the index row afterwards and holds the token's lock throughout."""
        plan_hash, data_hash = _hash(model_bytes), _hash(data_bytes)
        plan_path, data_path = self.paths(token)
        try:
            if os.path.islink(self.shard(token)):
                raise CacheWriteError(f"{self.shard(token)} is a symbolic link; nothing is written through it")
            os.makedirs(self.shard(token), mode=0o700, exist_ok=True)
            _write_file(plan_path, model_bytes, f".{token}{PLAN}")
            _write_file(data_path, data_bytes, f".{token}{DATA}")
            _fsync_dir(self.shard(token))
        except BaseException as exc:
            # Interrupted (Ctrl-C, SIGTERM) or failed: no half entry stays behind.
            for p in (plan_path, data_path):
                _unlink(p)
            if isinstance(exc, (OSError, CacheWriteError)):
                raise CacheWriteError(str(exc)) from None
            raise
        return plan_hash, data_hash

    def remove(self, token: str, counter: str | None = None, lock: FileLock | None = None,
               blocking: bool = False) -> bool:
        """Delete an entry (row first, then files, then its lock file) under the token's
        exclusive lock. With ``lock`` the caller already holds it. Returns False when the
        token is busy (someone is reading or writing it) and ``blocking`` is False, or when
        a file could not be removed (``last_failure`` says why)."""
        self.last_failure = None
        if not TOKEN_RE.match(token):  # a malformed row: its paths are not nncc's to touch
            self.delete_row(token, counter)
            return True
        held = lock
        if held is None:
            try:
                held = self.lock(token, shared=False, blocking=blocking).acquire()
            except LockBusy:
                return False
        try:
            # The row goes first, so that no reader finds a row whose files are gone; on a
            # full disk, where the index cannot be written yet, the files go first to make room.
            row_first = not self.reclaiming
            if row_first:
                try:
                    self.index.delete(token, counter)
                except IndexUnavailable as exc:
                    if not disk_full(exc):
                        raise
                    row_first = False  # a reader in between finds the files missing: rejected, never run
            failures = [why for why in map(self._remove_path, self.paths(token)) if why]
            if not row_first:
                self.delete_row(token, counter)
            if lock is None:
                held.unlink()
            if failures:
                self.last_failure = "; ".join(failures)
            return not failures
        finally:
            if lock is None:
                held.release()

    def remove_files(self, paths, token: str | None) -> bool:
        """Remove files of a token with no index row (orphans, leftovers, stale), unless the
        token is busy. Re-checks under the lock that no row appeared meanwhile. Only names
        nncc writes are removed (never a foreign file): False, with ``last_failure``, for
        anything left behind."""
        self.last_failure = None
        if token is None:
            self.last_failure = "not a file nncc writes; left alone"
            return False
        held = try_lock(self.lock_path(token))
        if held is None:
            return False
        try:
            if self.index.get(token) is not None:
                return False  # a writer committed it meanwhile: it is an entry now
            failures = [why for why in map(self._remove_path, paths) if why]
            held.unlink()
            self._delete_unindexed()  # a full disk may have room for the index now
            if failures:
                self.last_failure = "; ".join(failures)
            return not failures
        finally:
            held.release()

    def _remove_path(self, path: str) -> str | None:
        """Remove one entry or temp file (an empty directory in its place too); never a
        foreign name, never through a symlinked folder. None, or why it stays."""
        return remove_entry_path(self.directory, path)

    def total_size(self) -> int:
        return self.index.totals()[1]


# -- prepare: the three flows ---------------------------------------------------------


def prepare(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
            use_cache: bool = True, trust_shared: bool | None = None, model_bytes: bytes | None = None,
            **options):
    """Compile ``path`` through the cache: returns ``(CompiledModel, CacheOutcome)``.

    Hit: prepare from the verified cache files. Miss: compile, store, return. use_cache
    False: compile, read and write nothing. A cache that cannot be used (read-only, full,
    broken index) degrades to an in-memory compile with one warning line; it never fails.
    So does a folder that is not nncc's or not private to this user (``trust_shared``,
    default $NNCC_CACHE_TRUST_SHARED, trusts a shared one).
    ``model_bytes``: the model file's bytes when the caller has read them already (a model
    read from a pipe can be read only once); external data is still found next to ``path``.
    """
    from nncc.compiler import CompileOptions

    start = time.perf_counter()
    opts = CompileOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})
    data = read_model_file(path) if model_bytes is None else model_bytes
    if not use_cache:
        model = _compile(path, data, opts)
        return model, CacheOutcome("disabled", None, time.perf_counter() - start)
    from nncc.cache.token import compute_token

    directory = resolve_cache_dir(cache_dir)
    token = compute_token(path, data, opts, skip_dirs=(directory,)).hex()
    try:
        cache = Cache.open(directory, read_only_ok=True, trust_shared=trust_shared)
    except CacheUnavailable as exc:
        reason = f"{exc}; {exc.hint}" if exc.hint else str(exc)
        return _degraded(path, data, opts, token, directory, reason, start)
    try:
        if cache.read_only:
            return _prepare_read_only(cache, token, path, data, opts, start)
        for attempt in (0, 1):
            try:
                return _prepare_cached(cache, token, path, data, opts, start)
            except IndexCorrupt as exc:
                if attempt:
                    raise CacheUnavailable(str(exc)) from None
                cache.rebuild_index(str(exc))
    except (CacheUnavailable, IndexUnavailable, IndexCorrupt, OSError) as exc:
        return _degraded(path, data, opts, token, directory, str(exc), start)
    finally:
        cache.close()


def _degraded(path, data, opts, token, directory, reason, start, model=None):
    warn(f"compilation cache at {directory} is unavailable ({reason}); compiling in memory")
    if model is None:
        model = _compile(path, data, opts)
    return model, CacheOutcome("unavailable", token, time.perf_counter() - start, directory, reason)


def _prepare_read_only(cache: Cache, token: str, path, data: bytes, opts, start: float):
    """A cache on read-only storage serves verified hits (no lock: nothing here can
    remove an entry, and the files are verified in memory as always) and stores nothing."""
    model, rejected = _try_hit(cache, token)
    if model is not None:
        return model, CacheOutcome("hit", token, time.perf_counter() - start, cache.directory)
    reason = (("disk full, " if cache.disk_full else "read-only, ")
              + (f"entry rejected: {rejected.detail}" if rejected else "no entry for this model"))
    return _degraded(path, data, opts, token, cache.directory, reason, start)


def _try_hit(cache: Cache, token: str):
    """(model, None) for a verified entry, (None, why) for a rejected one, (None, None)
    when there is no entry."""
    entry = cache.index.get(token)
    if entry is None:
        return None, None
    try:
        model = cache.load(entry)
    except CacheEntryError as exc:
        return None, exc
    _record_hit(cache, token)
    return model, None


def _prepare_cached(cache: Cache, token: str, path, data: bytes, opts, start: float):
    directory = cache.directory
    rejected: CacheEntryError | None = None
    if cache.index.get(token) is not None:
        # Hit path: a shared lock keeps gc from deleting the entry while it is verified.
        with _locked(cache, token, shared=True):
            model, rejected = _try_hit(cache, token)
            if model is not None:
                return model, CacheOutcome("hit", token, time.perf_counter() - start, directory)
    with _locked(cache, token, shared=False) as held:
        # Re-check under the exclusive lock: another process may have compiled it while we
        # waited (make -j), or already replaced the entry we rejected.
        model, again = _try_hit(cache, token)
        if model is not None:
            return model, CacheOutcome("hit", token, time.perf_counter() - start, directory)
        rejected = again or rejected
        if rejected is not None:
            warn(f"cache entry {token[:12]} rejected: {rejected.detail}; recompiling")
            cache.remove(token, counter="corruptions", lock=held)
        compile_start = time.perf_counter()
        from nncc.cache.objects import objects_in

        with objects_in(cache):  # kernel object cache: objects built once, linked from here
            plan = _compile_plan(path, data, opts)
        compile_seconds = time.perf_counter() - compile_start
        from nncc.model import CompiledModel

        model = CompiledModel(plan, trust_native=True)  # native code built just now
        try:
            _store(cache, token, plan, path, data, opts, compile_seconds,
                   counter="recompiles" if rejected else "misses")
        except (CacheWriteError, IndexUnavailable) as exc:
            return _degraded(path, data, opts, token, directory, f"cannot store: {exc}", start, model)
        from nncc.cache.objects import record_entry_objects

        record_entry_objects(cache, token, plan)  # gc keeps the objects this entry was linked from
    outcome = "recompiled" if rejected else "miss"
    try:
        from nncc.cache.gc import auto_collect

        auto_collect(cache, keep={token})
    except (IndexUnavailable, IndexCorrupt, OSError):
        pass  # gc is housekeeping: it never fails a run
    detail = rejected.detail if rejected else None
    return model, CacheOutcome(outcome, token, time.perf_counter() - start, directory, detail)


class _locked:
    """Token lock for prepare; failing to lock makes the cache unavailable (not the run)."""

    def __init__(self, cache: Cache, token: str, shared: bool):
        self.lock = cache.lock(token, shared=shared)

    def __enter__(self) -> FileLock:
        try:
            return self.lock.acquire()
        except OSError as exc:
            raise CacheUnavailable(f"cannot lock {self.lock.path}: {exc.strerror or exc}") from None

    def __exit__(self, *exc) -> None:
        self.lock.release()


def _record_hit(cache: Cache, token: str) -> None:
    if cache.read_only:
        return  # statistics cannot be written there
    try:
        cache.index.record_hit(token)
    except IndexUnavailable:
        pass  # statistics only: a read-only index still serves verified hits


def _store(cache: Cache, token: str, plan, path, data: bytes, opts, compile_seconds: float,
           counter: str) -> Entry:
    import json

    import nncc
    from nncc.plan.format import FORMAT_VERSION, serialize_parts

    from nncc.util.interrupts import held_signals

    model_bytes, data_bytes = serialize_parts(plan)
    committed = False
    try:
        # TOCTOU on save: the hashes are of the in-memory buffers that are then written out.
        plan_hash, data_hash = cache.write(token, model_bytes, data_bytes)
        # Ctrl-C/SIGTERM wait until the row is committed (or failed): an interrupt that
        # surfaces right after the commit must not delete the files of a committed row.
        with held_signals():
            now = time.time()
            entry = Entry(
                token=token, plan_hash=plan_hash, data_hash=data_hash,
                plan_size=len(model_bytes), data_size=len(data_bytes),
                nncc_version=nncc.__version__, format_version=FORMAT_VERSION,
                source_path=os.path.abspath(os.fspath(path)), model_hash=blake3(data).hexdigest(),
                preference=opts.preference, options=json.dumps(opts.as_dict(), sort_keys=True),
                created=now, last_used=now, hits=0, compile_seconds=compile_seconds,
            )
            cache.index.insert(entry, counter=counter)  # committed only once both files are in place
            committed = True
    except BaseException:
        if not committed:  # failed or interrupted before the commit: no files without a row
            for p in cache.paths(token):
                _unlink(p)
        raise
    return entry


def _compile_plan(path, data: bytes, opts):
    """Compile from the very bytes that were hashed into the token."""
    from nncc.compiler import compile_graph
    from nncc.frontend.onnx import parse_model

    try:
        graph = parse_model(data, base_dir=os.path.dirname(os.path.abspath(path)))
    except ModelFormatError as exc:
        raise ModelFormatError(f"{os.fspath(path)} is not a valid ONNX model: {exc}") from None
    return compile_graph(graph, opts)


def _compile(path, data: bytes, opts):
    from nncc.model import CompiledModel

    return CompiledModel(_compile_plan(path, data, opts), trust_native=True)  # built just now


def artifact_bytes(model) -> bytes:
    """The single-file artifact (``nncc compile -o``) of a prepared model. For a model
    prepared from the cache it is assembled from the verified model and data caches, so it
    is byte-identical to what an uncached compile writes."""
    parts = getattr(model, "_cache_parts", None)
    if parts is None:
        return model.to_bytes()
    from nncc.plan import format as plan_format

    model_bytes, data = parts
    producer, sections = plan_format.read_sections(model_bytes)
    return plan_format._assemble(producer, [
        (b"PROG", bytes(sections[b"PROG"])),
        (b"INLN", bytes(sections.get(b"INLN", b""))),
        (b"DATA", bytes(data)),
        *([(b"CODE", bytes(sections[b"CODE"]))] if b"CODE" in sections else []),
    ])


# -- file helpers ------------------------------------------------------------------------


def _open_entry_file(path: str, what: str) -> tuple[int, int]:
    """(descriptor, size) of a cache file, opened without blocking and checked to be a
    regular file: anything else in its place (a FIFO, a link to a device) is a corrupt
    entry, never a hang or an endless read. The caller closes the descriptor."""
    try:
        fd, st = open_file(path)
    except FileNotFoundError:
        raise CacheEntryError("missing", f"{what} file is missing") from None
    except OSError as exc:
        raise CacheEntryError("unreadable", f"cannot read the {what}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CacheEntryError("corrupt", f"{what} file is {kind(st.st_mode)}, not a regular file")
    return fd, st.st_size


def _read_bytes(path: str, what: str, expected_size: int | None = None) -> bytes:
    """A cache file's bytes, read once, at most the size fstat declared. With
    ``expected_size`` a file of another size is rejected without being read."""
    fd, size = _open_entry_file(path, what)
    try:
        if expected_size is not None and size != expected_size:
            raise CacheEntryError("corrupt", f"{what} has {size} bytes, the index recorded {expected_size}")
        return read_at_most(fd, size)
    except OSError as exc:
        raise CacheEntryError("unreadable", f"cannot read the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _map_data(path: str, entry: Entry):
    """Map the data cache read-only and check the mapping against the index."""
    fd, size = _open_entry_file(path, "data cache")
    try:
        if size != entry.data_size:
            raise CacheEntryError("corrupt", f"data cache has {size} bytes, the index recorded "
                                             f"{entry.data_size}")
        buffer = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise CacheEntryError("unreadable", f"cannot map the data cache: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if _hash(buffer) != entry.data_hash:
        raise CacheEntryError("corrupt", "data cache does not match its recorded hash")
    return buffer


def _write_file(path: str, data, prefix: str) -> None:
    """Atomic write: a uniquely named temp file in the same folder, fsync, rename."""
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f"{prefix}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise CacheWriteError(f"cannot write in {folder}: {exc.strerror or exc}") from None
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        _unlink(tmp)
        if isinstance(exc, OSError):
            raise CacheWriteError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        pass
