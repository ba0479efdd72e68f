"""``nncc cache verify``: rehash every entry and account for every file.

Statuses:

    OK           row and both files present, sizes and blake3 hashes match the index
    CORRUPT      a file's size or hash differs from the index, or its header is unreadable
    MISSING      the index has a row but a file is gone
    STALE        written by another nncc version (retired row, or a file whose header
                 names another producer)
    ORPHAN       debris: an entry file with no index row (a write killed after its
                 rename, an index rebuilt from nothing); never used, removed by gc
    LEFTOVER     debris: the temp file of a write killed midway; removed by gc
    IN-PROGRESS  files of a token whose lock is held right now (a compile is writing it,
                 or a run is reading it): neither wrong nor touched
    FOREIGN      a name in entries/ that nncc never writes (or a symlinked folder there):
                 reported, never removed, never followed

Kernel objects (objects/, nncc/cache/objects.py) are rehashed too; only those that are not
as recorded are listed, with the same statuses (the token is then the object's key).

CORRUPT, MISSING and STALE are problems (verify fails); debris is not. ``fix=True``
removes problems and debris (under the token's exclusive lock, skipping busy tokens, and
only names nncc writes). Checking never parses a plan beyond its fixed header: nothing is
prepared here.
"""

from __future__ import annotations

import os
import re
import stat
import struct

from nncc.cache.files import CacheEntryError, content_hash, read_entry_file
from nncc.cache.locking import LockBusy, lock_problem, try_lock
from nncc.cache.objects import verify_objects
from nncc.cache.versions import stale_writer
from nncc.cache.reports import DEBRIS, PROBLEMS, Finding, VerifyReport  # noqa: F401 (their home)
from nncc.cache.store import TOKEN_RE
from nncc.util import progress
from nncc.util.files import open_file



def _producer(path: str) -> str | None:
    """The producer version in a plan file's fixed header (no parsing beyond it)."""
    try:
        fd, st = open_file(path)  # never blocks, even on a FIFO
        try:
            head = os.pread(fd, 32, 0) if stat.S_ISREG(st.st_mode) else b""
        finally:
            os.close(fd)
        magic, _version, _count, producer = struct.unpack("<8sII16s", head)
        if magic != b"NNCCPLAN":
            return None
        return producer.rstrip(b"\0").decode("ascii")
    except (OSError, struct.error, UnicodeDecodeError):
        return None


def _busy(cache, token: str) -> bool:
    held = try_lock(cache.lock_path(token))
    if held is None:
        return True
    held.unlink()  # safe while held exclusively (see locking.py); keeps locks/ from filling up
    held.release()
    return False


def classify_files(cache, skip: set[str] = frozenset()) -> list[Finding]:
    """Findings for files that have no live index row (tokens in ``skip`` excluded)."""
    rows = {e.token for e in cache.index.entries()}
    stale = cache.index.stale()
    tokens, foreign = cache.scan()
    findings = []
    for path in foreign:
        size = _size(path) if not os.path.isdir(path) else 0
        findings.append(Finding("FOREIGN", None, "not a name nncc writes; left alone", [path], size))
    for token, files in sorted(tokens.items()):
        if token in skip:
            continue
        if files.temps:
            status = "IN-PROGRESS" if _busy(cache, token) else "LEFTOVER"
            findings.append(Finding(status, token, "temp file of an interrupted write", list(files.temps),
                                    sum(_size(p) for p in files.temps)))
        if token in rows or not files.paths():
            continue
        busy = _busy(cache, token)
        paths = files.paths()
        size = sum(_size(p) for p in paths)
        if token in stale:
            findings.append(Finding("STALE", token, f"written by nncc {stale[token]['nncc_version']}",
                                    paths, size, stale[token]["source_path"]))
            continue
        producer = _producer(files.plan) if files.plan else None
        if producer is not None and stale_writer(producer):
            findings.append(Finding("STALE", token, stale_writer(producer), paths, size))
        elif busy:
            findings.append(Finding("IN-PROGRESS", token, "being written", paths, size))
        else:
            findings.append(Finding("ORPHAN", token, "no index row", paths, size))
    return findings


def verify(cache, fix: bool = False) -> VerifyReport:
    findings: list[Finding] = []
    if cache.index_rebuilt:  # damaged: what it listed is lost (its files are orphans now)
        findings.append(Finding("CORRUPT", None, f"the index was damaged ({cache.index_rebuilt}) and was rebuilt "
                                "empty: the entries it listed are orphans now", [cache.index.path],
                                not_fixed="rebuilt empty: what it listed is lost"))
    entries = cache.index.entries(order="token ASC")
    with progress.task("verifying cache entries", total=len(entries)) as task:
        for entry in entries:
            task.advance()
            token = entry.token
            if not TOKEN_RE.match(str(token)):  # a damaged row: lock and read nothing it names
                finding = Finding("CORRUPT", token, "the index row's token is not 64 hex digits", [], 0)
                if fix:
                    finding.fixed = cache.remove(token)
                findings.append(finding)
                continue
            paths = list(cache.paths(token))
            try:
                with cache.lock(token, shared=True, blocking=False):
                    current = cache.index.get(token)
                    if current is None:
                        continue  # removed meanwhile
                    status, detail = _check(cache, current)
            except LockBusy:
                findings.append(Finding("IN-PROGRESS", token, "being written", paths, entry.size,
                                        entry.source_path))
                continue
            except OSError as exc:  # its lock file replaced (a symlink): nothing is read through it
                finding = Finding("CORRUPT", token, lock_problem(cache.lock_path(token), exc), paths, entry.size,
                                  entry.source_path)
                if fix:
                    finding.fixed = cache.remove(token, counter="corruptions")
                    finding.not_fixed = None if finding.fixed else (cache.last_failure or "busy")
                findings.append(finding)
                continue
            finding = Finding(status, token, detail, paths, entry.size, entry.source_path)
            if fix and status != "OK":
                finding.fixed = cache.remove(token, counter="corruptions" if status == "CORRUPT" else None)
                finding.not_fixed = None if finding.fixed else (cache.last_failure or "busy")
            findings.append(finding)
        malformed = cache.index.malformed()
        for token, why in malformed:  # rows someone edited: never used, reported, dropped by --fix
            hexed = isinstance(token, str) and re.fullmatch(r"[0-9a-f]{64}", token) is not None
            paths = list(cache.paths(token)) if hexed else []
            finding = Finding("CORRUPT", str(token), f"index row is malformed: {why}", paths, 0)
            if fix:
                finding.fixed = cache.remove(token, counter="corruptions") if hexed else _drop_row(cache, token)
            findings.append(finding)
        task.describe("accounting for every file in the cache")
        skip = {e.token for e in entries} | {t for t, _ in malformed if isinstance(t, str)}
        for finding in classify_files(cache, skip=skip):
            if fix and finding.status in PROBLEMS + DEBRIS:
                finding.fixed = cache.remove_files(finding.paths, finding.token)
                finding.not_fixed = None if finding.fixed else (cache.last_failure or "busy")
            findings.append(finding)
        if fix:  # retired rows whose files are gone
            tokens, _ = cache.scan()
            for token in cache.index.stale():
                if token not in tokens:
                    cache.delete_row(token)

        task.describe("rehashing kernel objects")
        findings.extend(verify_objects(cache, fix))  # only those that are not as recorded
    return VerifyReport(findings, fix)


def _drop_row(cache, token) -> bool:
    cache.delete_row(token)
    return True


def _check(cache, entry) -> tuple[str, str]:
    stale = stale_writer(entry.nncc_version, entry.format_version)
    if stale:
        return "STALE", stale
    plan_path, data_path = cache.paths(entry.token)
    for path, size, digest, what in ((plan_path, entry.plan_size, entry.plan_hash, "model cache"),
                                     (data_path, entry.data_size, entry.data_hash, "data cache")):
        try:
            data = read_entry_file(path, what, size)
        except CacheEntryError as exc:
            return ("MISSING" if exc.kind == "missing" else "CORRUPT"), exc.detail
        if len(data) != size:
            return "CORRUPT", f"{what} has {len(data)} bytes, the index recorded {size}"
        if content_hash(data) != digest:
            return "CORRUPT", f"{what} does not match its recorded hash"
    producer = _producer(plan_path)
    if producer is None:
        return "CORRUPT", "model cache header is unreadable"
    stale = stale_writer(producer)
    if stale:
        return "STALE", f"model cache {stale}"
    return "OK", ""


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0
