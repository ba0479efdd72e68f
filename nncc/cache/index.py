"""The persistent hash index: an sqlite database beside (not inside) the entry files.

It is the trust anchor of the cache, a persistent map kept apart from the cache files:
token -> blake3 of the model cache and of the data cache, recorded when an entry is saved
and checked before an entry is prepared, and the blake3 of every chunk of the data cache
(checked a few at a time on a hit). It also keeps sizes, versions, timestamps, hit counts
and the counters shown by ``nncc cache info``, and the direct-mode manifest: a model
file's identity (path, size, times, inode) -> the token its bytes hashed to.

* WAL journal, a busy timeout, and retries on "database is locked".
* The schema version lives in ``PRAGMA user_version``. Schema 1 (no statistics tables) is
  migrated in place; any other schema is dropped and recreated (this is a cache: losing
  rows only costs recompiles).
* Statistics: the counters table also keeps the time hits and compiles took, the compile
  time hits avoided, and why each miss happened; ``history`` remembers entries that left
  (evicted, removed, retired by a version change) so that a later miss can say why.
* A file that is not a database, or a malformed one, is deleted and rebuilt empty; the
  entry files it described become orphans for gc/verify (files are never re-adopted
  without their recorded hashes).
* When the nncc version recorded in ``meta`` differs from the running one, the index is
  reinitialized: rows move to the ``stale`` table and are never prepared again.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass

from nncc.cache.folder import create_private_file

SCHEMA_VERSION = 6
MIGRATABLE = (1, 2, 3, 4, 5)  # older schemas whose rows are kept: only tables, columns and counters are added
READABLE = (1, 2, 3, 4, 5, 6)  # schemas a read-only open can serve from (a missing column reads as NULL)
INDEX_NAME = "index.sqlite3"
COUNTERS = ("hits", "misses", "corruptions", "recompiles", "evictions", "upgrades",
            "remote_hits", "remote_misses", "remote_rejected", "remote_errors")  # the remote tier's, per machine
# Why a model was compiled: each miss and recompile counts once under one of these.
MISS_REASONS = ("new_model", "changed_options", "version_change", "tamper", "evicted")
# Time statistics, in microseconds (the counters are integers).
TIMINGS = ("hit_microseconds", "timed_hits", "compile_microseconds", "timed_compiles", "saved_microseconds")
ALL_COUNTERS = COUNTERS + tuple(f"miss_{r}" for r in MISS_REASONS) + TIMINGS
HISTORY_LIMIT = 10000  # rows kept in ``history``, newest first
STAGES = ("quick", "optimized")  # an entry's stage (nncc/preparing/stages.py)
_RETRIES = 50

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    token TEXT PRIMARY KEY,
    plan_hash TEXT NOT NULL,
    data_hash TEXT NOT NULL,
    plan_size INTEGER NOT NULL,
    data_size INTEGER NOT NULL,
    nncc_version TEXT NOT NULL,
    format_version INTEGER NOT NULL,
    source_path TEXT,
    model_hash TEXT,
    preference TEXT,
    options TEXT,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0,
    compile_seconds REAL,
    stage TEXT,
    origin TEXT
);
CREATE INDEX IF NOT EXISTS entries_last_used ON entries (last_used);
CREATE TABLE IF NOT EXISTS chunks (
    token TEXT PRIMARY KEY,
    hashes BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS manifest (
    key TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    files TEXT NOT NULL,
    recorded REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS manifest_token ON manifest (token);
CREATE TABLE IF NOT EXISTS history (
    token TEXT PRIMARY KEY,
    model_hash TEXT,
    options TEXT,
    nncc_version TEXT,
    why TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS history_model ON history (model_hash);
CREATE INDEX IF NOT EXISTS history_at ON history (at);
CREATE TABLE IF NOT EXISTS native_failures (
    token TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    recorded REAL NOT NULL,
    compiler TEXT
);
CREATE TABLE IF NOT EXISTS objects (
    key TEXT PRIMARY KEY,
    hash TEXT NOT NULL,
    size INTEGER NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS entry_objects (
    token TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (token, key)
);
CREATE TABLE IF NOT EXISTS code_hashes (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    digest TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS stale (
    token TEXT PRIMARY KEY,
    nncc_version TEXT,
    plan_size INTEGER,
    data_size INTEGER,
    source_path TEXT,
    dropped REAL
);
"""

ENTRY_COLUMNS = ("token", "plan_hash", "data_hash", "plan_size", "data_size", "nncc_version",
                 "format_version", "source_path", "model_hash", "preference", "options",
                 "created", "last_used", "hits", "compile_seconds", "stage", "origin")


class IndexCorrupt(Exception):
    """The index file is not a usable database (rebuilt by the caller)."""


class IndexUnavailable(Exception):
    """The index cannot be opened or written (read-only, full, permissions...)."""


def disk_full(exc: BaseException) -> bool:
    """SQLITE_FULL, as sqlite3 words it."""
    return "disk is full" in str(exc).lower()


@dataclass
class Entry:
    token: str
    plan_hash: str
    data_hash: str
    plan_size: int
    data_size: int
    nncc_version: str
    format_version: int
    source_path: str | None
    model_hash: str | None
    preference: str | None
    options: str | None
    created: float
    last_used: float
    hits: int
    compile_seconds: float | None
    stage: str | None = None  # "quick" (portable plan, native stage to come) or "optimized"
    origin: str | None = None  # "local" (compiled here) or "remote <url>" (adopted from the remote tier)

    @property
    def size(self) -> int:
        return self.plan_size + self.data_size

    @property
    def from_remote(self) -> bool:
        return bool(self.origin) and self.origin.startswith("remote")

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ENTRY_COLUMNS} | {"size": self.size}

    @property
    def problem(self) -> str | None:
        """Why this row cannot be an entry nncc wrote (someone edited the index), or None.
        Such a row is never used: listings skip it, verification reports it as corrupt."""
        def number(v, kinds=(int,)):
            return type(v) in kinds and v >= 0

        if not (type(self.token) is str and len(self.token) == 64
                and all(ch in "0123456789abcdef" for ch in self.token)):
            return "its token is not 64 hex digits"
        for name in ("plan_hash", "data_hash", "nncc_version"):
            if type(getattr(self, name)) is not str:
                return f"{name} is not text"
        for name in ("plan_size", "data_size", "format_version", "hits"):
            if not number(getattr(self, name)):
                return f"{name} is not a non-negative integer: {getattr(self, name)!r:.40}"
        for name in ("created", "last_used"):
            if not number(getattr(self, name), (int, float)):
                return f"{name} is not a time: {getattr(self, name)!r:.40}"
        if self.compile_seconds is not None and not number(self.compile_seconds, (int, float)):
            return f"compile_seconds is not a number: {self.compile_seconds!r:.40}"
        if self.stage is not None and self.stage not in STAGES:
            return f"stage is not one of {', '.join(STAGES)}: {self.stage!r:.40}"
        for name in ("source_path", "model_hash", "preference", "options", "origin"):
            if getattr(self, name) is not None and type(getattr(self, name)) is not str:
                return f"{name} is not text"
        return None


def _corrupt(exc: BaseException) -> bool:
    """sqlite3 raises DatabaseError (not OperationalError) for SQLITE_NOTADB/CORRUPT."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)


def _busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class Index:
    """One connection to the index of one cache directory."""

    def __init__(self, directory: str, version: str, format_version: int, timeout: float = 30.0):
        self.directory = directory
        self.path = os.path.join(directory, INDEX_NAME)
        self.version = version
        self.format_version = format_version
        self.timeout = timeout
        self.conn: sqlite3.Connection | None = None
        self.reinitialized = False  # True when this open retired another version's rows
        self._selected: str | None = None  # the entry columns this index has (see _entry_columns)
        self.read_only = False

    # -- opening ---------------------------------------------------------------------

    def open_read_only(self) -> "Index":
        """Open an existing index for reading only (a cache on read-only storage): no WAL
        switch, no schema work, no statistics. Only an index of this nncc version and
        schema serves; anything else raises IndexUnavailable. Raises IndexCorrupt too."""
        if not os.path.isfile(self.path):
            raise IndexUnavailable(f"no index at {self.path}")
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.path))
        last: Exception | None = None
        # mode=ro needs the WAL's -shm file or a directory to create it in; read-only
        # storage that has neither opens as immutable (nothing can change it from here)
        for query in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                conn = sqlite3.connect(uri + query, uri=True, timeout=self.timeout, isolation_level=None,
                                       check_same_thread=False)
                self.conn = conn
                if self._guard(lambda: conn.execute("PRAGMA user_version").fetchone()[0]) not in READABLE:
                    raise IndexUnavailable(f"{self.path} has another schema version")
                if self._guard(lambda: self._meta("nncc_version")) != self.version:
                    raise IndexUnavailable(f"{self.path} was written by another nncc version")
                self.read_only = True
                return self
            except (sqlite3.Error, IndexUnavailable) as exc:
                self.close()
                last = exc
            except IndexCorrupt:
                self.close()
                raise
        raise IndexUnavailable(f"cannot read {self.path}: {last}")

    def open(self, exclusive: bool = False) -> "Index":
        """Open (creating if needed). Raises IndexCorrupt or IndexUnavailable.

        ``exclusive`` holds the database locked until close() and keeps WAL's index in
        this process's memory, so it needs no ``-shm`` file: on a full disk, where that
        file cannot grow, the index can still be read, and written once space is freed.
        Other processes wait (busy timeout) or, for `nncc run`, do without the cache.

        A new index file is created with mode 0600 (SQLite gives its WAL files the same
        mode); a symbolic link in its place is refused, so SQLite never writes through it."""
        if os.path.islink(self.path):
            raise IndexUnavailable(f"{self.path} is a symbolic link; refusing to open it")
        try:
            create_private_file(self.path)
        except OSError as exc:
            raise IndexUnavailable(f"cannot create {self.path}: {exc.strerror or exc}") from None
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"cannot open {self.path}: {exc}") from None
        self.conn = conn
        try:
            self._retry(lambda: conn.execute("PRAGMA busy_timeout = %d" % int(self.timeout * 1000)))
            if exclusive:  # before the first access, or the -shm file is used anyway
                conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            mode = self._retry(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
            if not mode or str(mode[0]).lower() != "wal":
                raise IndexUnavailable(f"cannot switch {self.path} to WAL (got {mode and mode[0]})")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._retry(self._init_schema)
        except BaseException as exc:
            self.close()
            if _corrupt(exc):
                raise IndexCorrupt(str(exc)) from None
            if isinstance(exc, sqlite3.Error):
                raise IndexUnavailable(f"cannot use {self.path}: {exc}") from None
            raise
        return self

    def _init_schema(self) -> None:
        conn = self.conn
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current == SCHEMA_VERSION and self._version_matches():
            return
        with self._transaction():
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            if current in MIGRATABLE:
                self._migrate(current)
            elif current != SCHEMA_VERSION:
                for (name,) in conn.execute(
                        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'").fetchall():
                    conn.execute(f'DROP TABLE IF EXISTS "{name}"')
                self._create_tables()
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            recorded = self._meta("nncc_version")
            if recorded is None:
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('nncc_version', ?)", (self.version,))
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('created', ?)", (repr(time.time()),))
            elif recorded != self.version:
                # The compiler changed: retire every row, so that nothing compiled by another
                # version is ever prepared. Their files become STALE garbage for gc/verify.
                conn.execute(
                    "INSERT OR REPLACE INTO stale SELECT token, nncc_version, plan_size, data_size,"
                    " source_path, ? FROM entries", (time.time(),))
                self._remember_leaving("retired", None)
                conn.execute("DELETE FROM entries")
                conn.execute("DELETE FROM chunks")
                conn.execute("DELETE FROM manifest")
                conn.execute("DELETE FROM native_failures")
                conn.execute("UPDATE meta SET value = ? WHERE key = 'nncc_version'", (self.version,))
                self.reinitialized = True
            for name in ALL_COUNTERS:
                conn.execute("INSERT OR IGNORE INTO counters VALUES (?, 0)", (name,))

    def _migrate(self, current: int) -> None:
        """Bring an index of an older schema (MIGRATABLE) to this one without losing its
        entries: the tables it lacks (``history``, ``chunks``, ``manifest``) and the
        statistics counters are added. Entries without chunk hashes get them on their next
        hit, after their data cache matches its whole-file hash. The compile time its hits already avoided is taken from the
        entries (their compile time times their hits)."""
        self._create_tables()
        present = {row[1] for row in self.conn.execute("PRAGMA table_info(entries)")}
        for column in ENTRY_COLUMNS:
            if column not in present:  # e.g. stage: NULL for rows written before it existed
                self.conn.execute(f"ALTER TABLE entries ADD COLUMN {column}")
        for name in ALL_COUNTERS:
            self.conn.execute("INSERT OR IGNORE INTO counters VALUES (?, 0)", (name,))
        self.conn.execute(
            "UPDATE counters SET value = (SELECT coalesce(CAST(sum(hits * compile_seconds) * 1e6 AS INTEGER), 0)"
            " FROM entries) WHERE name = 'saved_microseconds'")
        self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _remember_leaving(self, why: str, token: str | None) -> None:
        """Record entries about to leave ``entries`` (one token, or all of them) in
        ``history``, so that a later miss of the same model can say why it missed. Inside
        the caller's transaction; the oldest rows beyond HISTORY_LIMIT go."""
        where, args = ("WHERE token = ?", (token,)) if token is not None else ("", ())
        self.conn.execute("INSERT OR REPLACE INTO history SELECT token, model_hash, options, nncc_version, ?, ?"
                          f" FROM entries {where}", (why, time.time(), *args))
        self.conn.execute("DELETE FROM history WHERE token IN (SELECT token FROM history ORDER BY at DESC"
                          " LIMIT -1 OFFSET ?)", (HISTORY_LIMIT,))

    def _create_tables(self) -> None:
        # executescript would COMMIT the open transaction; run the statements one by one.
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                self.conn.execute(statement)

    def _version_matches(self) -> bool:
        try:
            return self._meta("nncc_version") == self.version
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise
            return False  # no meta table yet

    def _meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def healthy(self) -> bool:
        """A full structural check (``PRAGMA quick_check``): only run after a corruption was
        reported, to tell a real one from a transient failure."""
        try:
            rows = self._read(lambda c: c.execute("PRAGMA quick_check").fetchall())
        except (IndexCorrupt, IndexUnavailable):
            return False
        return rows == [("ok",)]

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except sqlite3.Error:
                pass
            self.conn = None

    # -- plumbing ----------------------------------------------------------------------

    def _retry(self, fn):
        delay = 0.005
        for attempt in range(_RETRIES):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or attempt == _RETRIES - 1:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    def _transaction(self):
        index = self

        class _Tx:
            def __enter__(self):
                index.conn.execute("BEGIN IMMEDIATE")

            def __exit__(self, kind, exc, tb):
                if kind is None:
                    index.conn.execute("COMMIT")
                else:
                    try:
                        index.conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass

        return _Tx()

    def _write(self, fn):
        """Run ``fn`` in a write transaction, retrying when another process holds the lock."""
        def attempt():
            with self._transaction():
                return fn(self.conn)

        return self._guard(lambda: self._retry(attempt))

    def _read(self, fn):
        return self._guard(lambda: self._retry(lambda: fn(self.conn)))

    @staticmethod
    def _guard(fn):
        try:
            return fn()
        except sqlite3.Error as exc:
            if _corrupt(exc):
                raise IndexCorrupt(str(exc)) from None
            raise IndexUnavailable(str(exc)) from None

    # -- entries -----------------------------------------------------------------------

    def _entry_columns(self, conn) -> str:
        """ENTRY_COLUMNS for a SELECT; a column an older index (read in place) lacks reads
        as NULL."""
        if self._selected is None:
            present = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
            self._selected = ", ".join(c if c in present else f"NULL AS {c}" for c in ENTRY_COLUMNS)
        return self._selected

    def get(self, token: str) -> Entry | None:
        """The token's entry; None when there is none or its row is malformed (see
        Entry.problem): a compile then replaces the row."""
        row = self._read(lambda c: c.execute(
            f"SELECT {self._entry_columns(c)} FROM entries WHERE token = ?", (token,)).fetchone())
        entry = None if row is None else Entry(*row)
        return None if entry is None or entry.problem else entry

    def entries(self, order: str = "last_used DESC") -> list[Entry]:
        """The well-formed entries; ``malformed()`` lists the others."""
        return [e for e in self._all_entries(order) if not e.problem]

    def malformed(self) -> list[tuple[object, str]]:
        """(token, why) of every row that cannot be an entry nncc wrote."""
        return [(e.token, e.problem) for e in self._all_entries("rowid") if e.problem]

    def _all_entries(self, order: str) -> list[Entry]:
        rows = self._read(lambda c: c.execute(
            f"SELECT {self._entry_columns(c)} FROM entries ORDER BY {order}").fetchall())
        return [Entry(*r) for r in rows]

    def tokens_with_prefix(self, prefix: str) -> list[str]:
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return [r[0] for r in self._read(lambda c: c.execute(
            "SELECT token FROM entries WHERE token LIKE ? ESCAPE '\\' UNION "
            "SELECT token FROM stale WHERE token LIKE ? ESCAPE '\\'", (pattern, pattern)).fetchall())]

    def stale(self) -> dict[str, dict]:
        rows = self._read(lambda c: c.execute(
            "SELECT token, nncc_version, plan_size, data_size, source_path, dropped FROM stale").fetchall())
        keys = ("token", "nncc_version", "plan_size", "data_size", "source_path", "dropped")
        return {r[0]: dict(zip(keys, r)) for r in rows}

    def insert(self, entry: Entry, counter: str = "misses", chunks: bytes = b"") -> None:
        """Commit an entry's row (and its data cache's chunk hashes) in one transaction."""
        values = tuple(getattr(entry, k) for k in ENTRY_COLUMNS)

        def fn(c):
            c.execute(f"INSERT OR REPLACE INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES "
                      f"({', '.join('?' * len(ENTRY_COLUMNS))})", values)
            c.execute("INSERT OR REPLACE INTO chunks VALUES (?, ?)", (entry.token, chunks))
            c.execute("DELETE FROM stale WHERE token = ?", (entry.token,))
            c.execute("DELETE FROM native_failures WHERE token = ?", (entry.token,))  # a new build: its own record
            c.execute("UPDATE counters SET value = value + 1 WHERE name = ?", (counter,))

        self._write(fn)

    def record_hit(self, token: str, seconds: float | None = None, saved: float | None = None) -> None:
        """Count a hit. Hit counts and last-used times are statistics: this connection stops
        fsyncing from here on (the commit and the checkpoint at close), which takes a hit
        from ~15 ms to well under 1 ms on a journaling filesystem. An OS crash may then lose
        the update or tear the file; a torn index is detected and rebuilt, and no index
        content is trusted without the files' hashes matching it."""
        now = time.time()
        self.conn.execute("PRAGMA synchronous = OFF")

        def fn(c):
            c.execute("UPDATE entries SET hits = hits + 1, last_used = ? WHERE token = ?", (now, token))
            c.execute("UPDATE counters SET value = value + 1 WHERE name = 'hits'")
            if seconds is not None:  # how long the hit took, and the compile it avoided
                self._add(c, {"hit_microseconds": seconds, "saved_microseconds": saved or 0.0}, timed="timed_hits")

        self._write(fn)

    def delete(self, token: str, counter: str | None = None) -> bool:
        why = {"evictions": "evicted", "corruptions": "corrupt"}.get(counter, "removed")
        remember = True

        def fn(c):
            if remember:
                self._remember_leaving(why, token)
            c.execute("DELETE FROM entry_objects WHERE token = ?", (token,))
            n = c.execute("DELETE FROM entries WHERE token = ?", (token,)).rowcount
            n += c.execute("DELETE FROM stale WHERE token = ?", (token,)).rowcount
            c.execute("DELETE FROM chunks WHERE token = ?", (token,))
            c.execute("DELETE FROM manifest WHERE token = ?", (token,))
            c.execute("DELETE FROM native_failures WHERE token = ?", (token,))
            if counter:
                c.execute("UPDATE counters SET value = value + 1 WHERE name = ?", (counter,))
            return n > 0

        try:
            return self._write(fn)
        except IndexUnavailable as exc:
            if not disk_full(exc):
                raise
            remember = False  # a full disk: the row goes without its history (statistics only)
            return self._write(fn)

    # -- native-stage failures: a compile that failed is not retried on every run --------

    def record_failure(self, token: str, reason: str, compiler: str | None) -> None:
        now = time.time()
        self._write(lambda c: c.execute("INSERT OR REPLACE INTO native_failures VALUES (?, ?, ?, ?)",
                                        (token, reason, now, compiler)))

    def failure(self, token: str) -> dict | None:
        """{reason, recorded, compiler} of the token's failed native compile, or None."""
        row = self._read(lambda c: c.execute(
            "SELECT reason, recorded, compiler FROM native_failures WHERE token = ?", (token,)).fetchone())
        return None if row is None else dict(zip(("reason", "recorded", "compiler"), row))

    def stage_counts(self) -> dict[str, int]:
        """How many entries hold each stage (rows written before stages count as neither)."""
        rows = dict(self._read(lambda c: c.execute("SELECT stage, count(*) FROM entries GROUP BY stage").fetchall()))
        return {stage: int(rows.get(stage, 0)) for stage in STAGES}

    def failures(self) -> dict[str, dict]:
        rows = self._read(lambda c: c.execute(
            "SELECT token, reason, recorded, compiler FROM native_failures ORDER BY recorded").fetchall())
        return {r[0]: dict(zip(("reason", "recorded", "compiler"), r[1:])) for r in rows}

    def chunks(self, token: str) -> bytes | None:
        """The data cache's chunk hashes as recorded with the entry (None: no row, or an
        older index read in place that has no such table)."""
        try:
            row = self._read(lambda c: c.execute("SELECT hashes FROM chunks WHERE token = ?", (token,)).fetchone())
        except IndexUnavailable as exc:
            if "no such table" in str(exc):
                return None
            raise
        return None if row is None or not isinstance(row[0], bytes) else row[0]

    def set_chunks(self, token: str, hashes: bytes) -> None:
        """Record chunk hashes for an entry that has none (one from an older index, after
        its data cache matched its whole-file hash)."""
        self._write(lambda c: c.execute("INSERT OR IGNORE INTO chunks SELECT token, ? FROM entries WHERE token = ?",
                                        (hashes, token)))

    def manifest_get(self, key: str) -> tuple[str, str] | None:
        """(token, files JSON) recorded for a direct-mode key, or None."""
        try:
            row = self._read(lambda c: c.execute("SELECT token, files FROM manifest WHERE key = ?",
                                                 (key,)).fetchone())
        except IndexUnavailable as exc:
            if "no such table" in str(exc):
                return None  # an older index read in place
            raise
        if row is None or not all(isinstance(v, str) for v in row):
            return None
        return row[0], row[1]

    def manifest_put(self, key: str, token: str, files: str) -> None:
        now = time.time()
        self._write(lambda c: c.execute("INSERT OR REPLACE INTO manifest VALUES (?, ?, ?, ?)",
                                        (key, token, files, now)))

    @staticmethod
    def _add(conn, seconds_by_counter: dict[str, float], timed: str | None = None) -> None:
        for name, seconds in seconds_by_counter.items():
            conn.execute("UPDATE counters SET value = value + ? WHERE name = ?", (round(seconds * 1e6), name))
        if timed:
            conn.execute("UPDATE counters SET value = value + 1 WHERE name = ?", (timed,))

    def record_miss(self, classify, compile_seconds: float) -> str:
        """Count why a model was compiled (``classify(conn)`` names one of MISS_REASONS,
        reading the index in the same transaction) and how long the compile took."""
        def fn(c):
            reason = classify(c)
            c.execute("UPDATE counters SET value = value + 1 WHERE name = ?", (f"miss_{reason}",))
            self._add(c, {"compile_microseconds": compile_seconds}, timed="timed_compiles")
            return reason

        return self._write(fn)

    def zero_counters(self) -> None:
        """Reset every counter (``nncc cache zero-stats``); entries and their own hit counts stay."""
        def fn(c):
            c.execute("UPDATE counters SET value = 0")
            c.execute("INSERT OR REPLACE INTO meta VALUES ('stats_zeroed', ?)", (repr(time.time()),))

        self._write(fn)

    def bump(self, counter: str, by: int = 1) -> None:
        self._write(lambda c: c.execute("UPDATE counters SET value = value + ? WHERE name = ?", (by, counter)))

    def counters(self, names=COUNTERS) -> dict[str, int]:
        """The counters ``names`` (default: the lookup counters; ALL_COUNTERS adds the
        statistics); a counter an older index lacks reads 0."""
        rows = dict(self._read(lambda c: c.execute("SELECT name, value FROM counters").fetchall()))
        return {name: int(rows.get(name, 0)) for name in names}

    def totals(self) -> tuple[int, int]:
        """(entry count, total bytes of entry files) as recorded."""
        count, size = self._read(lambda c: c.execute(
            "SELECT count(*), coalesce(sum(plan_size + data_size), 0) FROM entries").fetchone())
        return int(count), int(size)

    def meta(self) -> dict[str, str]:
        return dict(self._read(lambda c: c.execute("SELECT key, value FROM meta").fetchall()))

    # -- nncc's own source files: their hashes by (path, size, mtime), for the token -----

    def code_hashes(self) -> dict[str, tuple[int, int, str]]:
        """{path: (size, mtime_ns, sha256 hex)} remembered; {} when they cannot be read
        (the token then hashes the files: slower, never wrong)."""
        try:
            rows = self._read(lambda c: c.execute("SELECT path, size, mtime_ns, digest FROM code_hashes").fetchall())
        except (IndexUnavailable, IndexCorrupt):
            return {}
        return {r[0]: (r[1], r[2], r[3]) for r in rows if isinstance(r[3], str)}

    def put_code_hashes(self, rows) -> None:
        """Remember (path, size, mtime_ns, sha256 hex) rows; a failure only costs time."""
        if self.read_only:
            return
        try:
            self._write(lambda c: c.executemany("INSERT OR REPLACE INTO code_hashes VALUES (?, ?, ?, ?)", rows))
        except (IndexUnavailable, IndexCorrupt):
            pass

    # -- kernel objects ----------------------------------------------------------------
    # key (the object's name: blake3 of its source, compiler and flags) -> blake3 of the
    # object file's bytes, checked whenever the file is read back; and which objects each
    # entry's code was linked from, so that gc keeps those.

    def object_hash(self, key: str) -> tuple[str, int] | None:
        """(hash, size) recorded for an object, or None."""
        return self._read(lambda c: c.execute("SELECT hash, size FROM objects WHERE key = ?", (key,)).fetchone())

    def put_object(self, key: str, digest: str, size: int) -> None:
        now = time.time()
        self._write(lambda c: c.execute(
            "INSERT OR REPLACE INTO objects (key, hash, size, created, last_used) VALUES (?, ?, ?, ?, ?)",
            (key, digest, size, now, now)))

    def touch_objects(self, keys) -> None:
        now = time.time()
        self._write(lambda c: c.executemany("UPDATE objects SET last_used = ? WHERE key = ?",
                                            [(now, k) for k in keys]))

    def link_objects(self, token: str, keys) -> None:
        """Record that ``token``'s entry was linked from ``keys`` (replacing any record)."""
        def fn(c):
            c.execute("DELETE FROM entry_objects WHERE token = ?", (token,))
            c.executemany("INSERT OR IGNORE INTO entry_objects (token, key) VALUES (?, ?)",
                          [(token, k) for k in keys])

        self._write(fn)

    def objects(self) -> list[dict]:
        """Every recorded object, least recently used first, with the number of entries
        that need it (``users``)."""
        rows = self._read(lambda c: c.execute(
            "SELECT o.key, o.hash, o.size, o.created, o.last_used, "
            "(SELECT count(*) FROM entry_objects l JOIN entries e ON e.token = l.token WHERE l.key = o.key) "
            "FROM objects o ORDER BY o.last_used ASC").fetchall())
        names = ("key", "hash", "size", "created", "last_used", "users")
        return [dict(zip(names, r)) for r in rows]

    def entry_objects(self, token: str) -> list[str]:
        return [r[0] for r in self._read(lambda c: c.execute(
            "SELECT key FROM entry_objects WHERE token = ? ORDER BY key", (token,)).fetchall())]

    def delete_object(self, key: str) -> None:
        self._write(lambda c: c.execute("DELETE FROM objects WHERE key = ?", (key,)))

    def object_totals(self) -> tuple[int, int]:
        """(object count, total bytes of object files) as recorded."""
        count, size = self._read(lambda c: c.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM objects").fetchone())
        return int(count), int(size)
