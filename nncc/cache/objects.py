"""The kernel object cache: compiled translation units of native code, kept beside the entries.

    objects/<k[:2]>/<key>.o                      one object file; the key names its source,
                                                 compiler, version and flags
    objects/<k[:2]>/.<key>.o.<pid>-<rand>.tmp    an atomic write in progress

Objects are verified like entries: the index records the blake3 of each file's bytes when it
is written, and a compile uses an object only when the bytes it read match (those bytes, in
memory, are what it links; a missing, truncated or tampered file is compiled again and
replaced, never linked). The index also records which objects each entry was linked from:
gc removes objects no entry needs, and the size bound counts objects with the entries.
"""

from __future__ import annotations

import contextlib
import os

from blake3 import blake3

from nncc.cache.files import CacheEntryError, CacheWriteError, read_entry_file, write_file_atomic
from nncc.cache.folder import OBJECT_NAME, OBJECT_TEMP_NAME, SHARD_NAME, make_private, remove_name
from nncc.cache.index import IndexCorrupt, IndexUnavailable, disk_full
from nncc.cache.reports import Finding, Removal
from nncc.util.notice import warn

OBJECTS = "objects"
# No lock guards an object's write: removing a file another process is writing (or has
# just renamed, before its row) only makes that write fail or the row name a missing
# file, and either costs one compile later, never a wrong object.


class CacheObjects:
    """The object store of one opened, writable cache: what native builds load and save
    objects through (nncc.preparing.compiling installs it)."""

    def __init__(self, cache):
        self.cache = cache
        self.directory = os.path.join(cache.directory, OBJECTS)

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".o")

    def load(self, key: str) -> bytes | None:
        """The object's bytes when they match the index; None (compile it) otherwise."""
        try:
            recorded = self.cache.index.object_hash(key)
        except (IndexUnavailable, IndexCorrupt):
            return None
        if recorded is None:
            return None
        digest, size = recorded
        try:
            data = read_entry_file(self.path(key), "kernel object", expected_size=size)
        except CacheEntryError as exc:
            if exc.kind != "missing":
                warn(f"kernel object {key[:12]} rejected: {exc.detail}; compiling it again")
            return None
        if blake3(data).hexdigest() != digest:
            warn(f"kernel object {key[:12]} rejected: it does not match its recorded hash; compiling it again")
            return None
        return data

    def save(self, key: str, data: bytes) -> None:
        """Write the object atomically, then record its hash. A cache that cannot take it
        (full, read-only) only costs a compile next time."""
        shard = os.path.dirname(self.path(key))
        try:
            for folder in (self.directory, shard):
                if not os.path.isdir(folder):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(folder, 0o700)
                        make_private(folder)
            write_file_atomic(self.path(key), data, f".{key}.o")
            self.cache.index.put_object(key, blake3(data).hexdigest(), len(data))
        except (CacheWriteError, IndexUnavailable, IndexCorrupt, OSError):
            pass


def record_entry_objects(cache, token: str, plan) -> None:
    """Record which objects ``token``'s entry was linked from (the keys its plan lists), so
    that gc keeps them. Housekeeping: a failure here never fails the compile."""
    info = plan.options.get("native")
    keys = info.get("objects") if isinstance(info, dict) else None
    if not keys:
        return
    try:
        cache.index.link_objects(token, keys)
        cache.index.touch_objects(keys)
    except (IndexUnavailable, IndexCorrupt):
        pass


def object_bytes(cache) -> int:
    return cache.index.object_totals()[1]


def collect_objects(cache, report, dry_run: bool, scan: bool = True, over: int | None = None) -> int:
    """Remove objects no entry needs, least recently used first: all of them, or (``over``)
    only until that many bytes are freed. With ``scan``, also files with no index row and
    temp files left by an interrupted write, and rows whose file is gone. Returns the bytes
    freed (or that would be, for a dry run)."""
    store = CacheObjects(cache)
    freed = 0
    for row in cache.index.objects():
        if row["users"] or (over is not None and freed >= over):
            continue
        path = store.path(row["key"])
        removal = Removal(row["key"], "object", row["size"], None, [path])
        if not dry_run:
            why = _remove(cache, path)
            if why is not None:
                report.failed.append({"token": row["key"], "paths": [path], "reason": why})
                continue
            _forget(cache, row["key"])
        report.removed.append(removal)
        freed += row["size"]
    if scan:
        freed += _collect_files(cache, store, report, dry_run)
    return freed


def dry_release(cache, report, token: str, remaining: set[str]) -> int:
    """For a dry run: report the objects ``token``'s entry needed that no entry in
    ``remaining`` needs (what evicting it would remove); returns their bytes."""
    mine = set(cache.index.entry_objects(token))
    for other in remaining:
        mine -= set(cache.index.entry_objects(other))
    already = {r.token for r in report.removed if r.reason == "object"}
    store, freed = CacheObjects(cache), 0
    for row in cache.index.objects():
        if row["key"] in mine and row["key"] not in already:
            report.removed.append(Removal(row["key"], "object", row["size"], None, [store.path(row["key"])]))
            freed += row["size"]
    return freed


def _collect_files(cache, store: CacheObjects, report, dry_run: bool) -> int:
    if not os.path.isdir(store.directory) or os.path.islink(store.directory):
        return 0
    recorded = {row["key"] for row in cache.index.objects()}
    freed = 0
    for path, found, temp in _unrecorded(store, recorded):
        if not found and not temp:
            continue  # not a name nncc writes: never removed
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        removal = Removal(None, "leftover", st.st_size, None, [path])
        if not dry_run:
            why = _remove(cache, path)
            if why is not None:
                report.failed.append({"token": None, "paths": [path], "reason": why})
                continue
        report.removed.append(removal)
        freed += st.st_size
    if not dry_run:  # rows whose file is gone describe nothing
        for key in recorded:
            if not os.path.lexists(store.path(key)):
                _forget(cache, key)
    return freed


def verify_objects(cache, fix: bool) -> list:
    """``nncc cache verify`` findings for kernel objects that are not as recorded: CORRUPT
    (size or hash differs), MISSING (a row whose file is gone), ORPHAN and LEFTOVER (files
    with no row, temp files). An object that is as recorded is not listed. ``fix`` removes
    each file and row (a compile that needs one builds it again)."""
    store = CacheObjects(cache)
    findings = []
    rows = cache.index.objects()
    for row in rows:
        key, path = row["key"], store.path(row["key"])
        try:
            data = read_entry_file(path, "kernel object", expected_size=row["size"])
            status, detail = ("OK", "") if blake3(data).hexdigest() == row["hash"] else \
                ("CORRUPT", "kernel object does not match its recorded hash")
        except CacheEntryError as exc:
            status = "MISSING" if exc.kind == "missing" else "CORRUPT"
            detail = exc.detail
        if status == "OK":
            continue
        finding = Finding(status, key, detail, [path], row["size"])
        if fix:
            why = _remove(cache, path)
            if why is None:
                _forget(cache, key)
            finding.fixed, finding.not_fixed = why is None, why
        findings.append(finding)
    recorded = {row["key"] for row in rows}
    if not os.path.isdir(store.directory) or os.path.islink(store.directory):
        return findings
    for path, found, temp in _unrecorded(store, recorded):
        if not found and not temp:
            findings.append(Finding("FOREIGN", None, "not a name nncc writes; left alone", [path], _size(path)))
            continue
        status, detail = ("ORPHAN", "kernel object with no index row") if found else \
            ("LEFTOVER", "temp file of an interrupted write")
        finding = Finding(status, (found or temp).group(1), detail, [path], _size(path))
        if fix:
            why = _remove(cache, path)
            finding.fixed, finding.not_fixed = why is None, why
        findings.append(finding)
    return findings


def _unrecorded(store, recorded: set):
    """(path, object-name match, temp-name match) of every file in the objects folder's
    shards that is not a recorded object; symlinked or misnamed shards are not entered."""
    for shard in sorted(os.listdir(store.directory)):
        folder = os.path.join(store.directory, shard)
        if not SHARD_NAME.match(shard) or os.path.islink(folder) or not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            found = OBJECT_NAME.match(name)
            if found and found.group(1) in recorded:
                continue
            yield os.path.join(folder, name), found, OBJECT_TEMP_NAME.match(name)


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _forget(cache, key: str) -> None:
    """Drop an object's row once its file is gone. On a full disk the row may have to stay:
    it then names a missing file, which a compile replaces and the next gc drops."""
    try:
        cache.index.delete_object(key)
    except IndexUnavailable as exc:
        if not disk_full(exc):
            raise


def _remove(cache, path: str) -> str | None:
    rel = os.path.relpath(path, cache.directory).split(os.sep)
    name = rel[-1]
    pattern = OBJECT_NAME if OBJECT_NAME.match(name) else OBJECT_TEMP_NAME
    return remove_name([cache.directory, OBJECTS, rel[1]], name, pattern)
