"""The compilation cache's store: entry files on disk and the hash index, by token.

The store does not know what an entry means: it puts, gets (verified), lists, removes
and collects an entry's two parts. Compiling on a miss and preparing a model on a hit are
nncc.preparing's (flows.py).

Layout of a cache directory (docs/cache.md has the full story)::

    CACHEDIR.TAG
    index.sqlite3 (+ -wal, -shm)      token -> hashes, sizes, versions, counters
    locks/<token>.lock                one flock file per token
    entries/<t[:2]>/<token>.plan      model cache: program + inline constants (verified)
    entries/<t[:2]>/<token>.data      data cache: large constants, 64-byte aligned (mmap)
    entries/<t[:2]>/.<token>.<kind>.<pid>-<rand>.tmp   an atomic write in progress
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field

from nncc import _version
from nncc.cache.folder import (ENTRY_NAME, SHARD_NAME, TEMP_NAME, CacheRefused, CacheUnavailable, check_trusted,
                               folder_state, make_private, refuse_foreign, remove_entry_path)
from nncc.cache.index import INDEX_NAME, Entry, Index, IndexCorrupt, IndexUnavailable, disk_full
from nncc.cache.locking import FileLock, LockBusy, lock_problem, try_lock
from nncc.cache.files import (CacheEntryError, CacheWriteError, chunk_hashes, content_hash, fsync_dir,
                              map_entry_file, read_entry_file, spot_check, unlink_quietly, write_file_atomic)
from nncc.util.notice import warn

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
TEMP_FILE_RE = TEMP_NAME  # .<token>.<kind>.<pid>-<8 hex>.tmp, as write_file_atomic names them
ENV_DIR = "NNCC_CACHE_DIR"
# Held while a thread of this process opens a connection to an index or rebuilds one. The
# rebuild unlinks the index and its -wal and -shm files one by one, and SQLite shares one
# record of a file's locks and shared memory among a process's connections: a connection
# another thread opened in between (the load-ahead thread's, say) would make a stray -shm
# that the rebuild then unlinks, and the rebuilt index fails with "disk I/O error".
# Processes do not share that record, and the file lock serializes their rebuilds.
_INDEX_OPENING = threading.RLock()


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


def _absolute(directory) -> str:
    """The cache folder as the settings resolve it (``~`` expanded, absolute): the caller
    resolved which one it is (nncc.settings.cache_dir)."""
    return os.path.abspath(os.path.expanduser(os.fspath(directory)))


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
        self.index_rebuilt: str | None = None  # why the index was unreadable, when opening rebuilt it empty

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def open(cls, directory: str | os.PathLike, create: bool = True,
             read_only_ok: bool = False, reclaim: bool = False, trust_shared: bool = False) -> "Cache":
        """Open (and create) a cache directory. Raises CacheUnavailable. With
        ``read_only_ok``, a filled cache that cannot be written (read-only storage, another
        user's) opens for reading: ``cache.read_only`` is then True.

        With ``reclaim`` (the commands that remove entries), a cache whose index cannot be
        opened because its disk is full opens anyway, to free space: the index is held
        exclusively (no ``-shm`` file needed, and no reader can look up an entry while its
        files go first), and ``cache.reclaiming`` is True.

        A folder that is not nncc's (not empty, no nncc signature), or one that is not
        private to this user (unless ``trust_shared``: the resolved cache.trust_shared
        setting, which the store never reads itself), raises CacheRefused (nncc/cache/folder.py). ``create=False`` never creates
        anything: no cache there raises CacheUnavailable."""
        try:
            return cls._open(directory, create, read_only_ok, trust_shared)
        except CacheRefused:
            raise
        except CacheUnavailable:
            path = _absolute(directory)
            if not ((reclaim or read_only_ok) and os.path.isfile(os.path.join(path, INDEX_NAME))
                    and no_space_left(path)):
                raise
        cache = cls(path)
        cache.disk_full = True
        if not reclaim:  # serve and show what is there, store nothing
            return cache._open_read_only()
        try:
            with _INDEX_OPENING:
                cache.index = cache._new_index().open(exclusive=True)
        except (IndexCorrupt, IndexUnavailable) as exc:
            raise CacheUnavailable(f"{path} is on a full disk and its index cannot be read ({exc})") from None
        cache.reclaiming = True
        return cache

    @classmethod
    def _open(cls, directory, create: bool, read_only_ok: bool, trust_shared: bool) -> "Cache":
        cache = cls(_absolute(directory))
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

    def _create(self, state: str, trust_shared: bool) -> None:
        """Make the folder a cache: mode 0700 where nncc creates or initializes it (an
        existing empty folder keeps its mode when a shared cache is trusted), the signature
        (CACHEDIR.TAG) first, then entries/ and locks/ (Index.open creates the index, 0600)."""
        if state == "missing":
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            make_private(self.directory)
        elif state == "empty" and os.stat(self.directory).st_uid == os.geteuid() and not trust_shared:
            make_private(self.directory)
        tag = os.path.join(self.directory, TAG_NAME)
        if not os.path.lexists(tag):
            write_file_atomic(tag, CACHEDIR_TAG, f".{TAG_NAME}")
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
            with _INDEX_OPENING:
                self.index = self._new_index().open_read_only()
        except (IndexUnavailable, IndexCorrupt) as exc:
            why = "on a full disk" if self.disk_full else "read-only"
            raise CacheUnavailable(f"{self.directory} is {why} and its index cannot serve ({exc})") from None
        self.read_only = True
        return self

    def _new_index(self) -> Index:
        return Index(self.directory, _version.__version__, _version.FORMAT_VERSION)

    def _open_index(self) -> Index:
        try:
            with _INDEX_OPENING:
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
            with _INDEX_OPENING, FileLock(os.path.join(self.locks_dir, "index.lock")):
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
                self.index_rebuilt = reason
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

    # -- reading: verified parts -------------------------------------------------------

    def get(self, entry: Entry, spot_checks: int = 1) -> tuple[bytes, object]:
        """An entry's (model cache bytes, data cache mapping), checked against the index,
        with no gap between check and use: what is returned is what was checked.

        The model cache (the program and any native code: what decides what runs) is read
        into memory once and those bytes are hashed in full. The data cache holds only
        numbers, whose offsets and lengths come from the verified model cache and are
        bounds-checked against the mapping when parsed: a changed byte there can give
        wrong values, nothing else. So it is mapped, its size checked, and ``spot_checks``
        of its chunks hashed (see files.spot_check): the cost stays flat in the size of
        the weights, and over successive hits every chunk is checked. ``verify_data``
        (``nncc cache verify``) hashes it whole. Raises CacheEntryError."""
        from nncc.cache.versions import stale_writer  # lazy: start-up

        stale = stale_writer(entry.nncc_version, entry.format_version)
        if stale:
            raise CacheEntryError("stale", f"was {stale}")
        plan_path, data_path = self.paths(entry.token)
        model_bytes = read_entry_file(plan_path, "model cache", entry.plan_size)
        if content_hash(model_bytes) != entry.plan_hash:
            raise CacheEntryError("corrupt", "model cache does not match its recorded hash")
        data = map_entry_file(data_path, "data cache", entry.data_size)
        hashes = self.index.chunks(entry.token)
        if hashes is None:
            # an entry from an older index: checked whole this once, then by chunks
            if content_hash(data) != entry.data_hash:
                raise CacheEntryError("corrupt", "data cache does not match its recorded hash")
            if not self.read_only:
                try:
                    self.index.set_chunks(entry.token, chunk_hashes(data))
                except IndexUnavailable:
                    pass  # checked whole again next time
            return model_bytes, data
        bad = spot_check(data, hashes, count=spot_checks)
        if bad is not None:
            raise CacheEntryError("corrupt", f"data cache chunk {bad} does not match its recorded hash")
        return model_bytes, data

    # -- writing -----------------------------------------------------------------------

    def put(self, token: str, model_bytes: bytes, data_bytes, counter: str = "misses", **row) -> Entry:
        """Store an entry: both files written atomically, then its index row committed
        (``row``: the Entry fields that describe where it came from). The hashes are of
        the in-memory buffers that are then written out. The caller holds the token's
        lock. Raises CacheWriteError or IndexUnavailable; nothing is left half-written."""
        from nncc.util.interrupts import held_signals  # lazy: start-up

        committed = False
        try:
            plan_hash, data_hash = self.write(token, model_bytes, data_bytes)
            chunks = chunk_hashes(data_bytes)
            # Ctrl-C/SIGTERM wait until the row is committed (or failed): an interrupt that
            # surfaces right after the commit must not delete the files of a committed row.
            with held_signals():
                now = time.time()
                entry = Entry(token=token, plan_hash=plan_hash, data_hash=data_hash,
                              plan_size=len(model_bytes), data_size=len(data_bytes),
                              nncc_version=_version.__version__, format_version=_version.FORMAT_VERSION,
                              created=now, last_used=now, hits=0, **row)
                self.index.insert(entry, counter=counter, chunks=chunks)  # once both files are in place
                committed = True
        except BaseException:
            if not committed:  # failed or interrupted before the commit: no files without a row
                for path in self.paths(token):
                    unlink_quietly(path)
            raise
        return entry

    def write(self, token: str, model_bytes: bytes, data_bytes: bytes) -> tuple[str, str]:
        """Write both files atomically (each: temp in the same folder, fsync, rename, then
        fsync the folder). Returns their hashes, taken from the in-memory buffers. The
        caller commits the index row afterwards and holds the token's lock throughout."""
        plan_hash, data_hash = content_hash(model_bytes), content_hash(data_bytes)
        plan_path, data_path = self.paths(token)
        try:
            if os.path.islink(self.shard(token)):
                raise CacheWriteError(f"{self.shard(token)} is a symbolic link; nothing is written through it")
            os.makedirs(self.shard(token), mode=0o700, exist_ok=True)
            write_file_atomic(plan_path, model_bytes, f".{token}{PLAN}")
            write_file_atomic(data_path, data_bytes, f".{token}{DATA}")
            fsync_dir(self.shard(token))
        except BaseException as exc:
            # Interrupted (Ctrl-C, SIGTERM) or failed: no half entry stays behind.
            for path in (plan_path, data_path):
                unlink_quietly(path)
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
            except OSError as exc:  # a lock file replaced by a symlink, an unreadable locks/
                self.last_failure = lock_problem(self.lock_path(token), exc)
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
