"""`nncc cache`: list, inspect, verify, garbage-collect and empty the compilation cache."""

from __future__ import annotations

import sys
import time

import click

from nncc.cli.options import verbosity_options
from nncc.cli.output import detail, emit_json, status
from nncc.errors import NnccError

SORTS = {"size": "(plan_size + data_size) DESC", "last-used": "last_used DESC", "hits": "hits DESC"}


class CacheCommandError(NnccError):
    exit_code = 2


def trust_option(command):
    # absent: None, so that the API reads $NNCC_CACHE_TRUST_SHARED (whatever click's flag default)
    return click.option("--trust-shared-cache", "trust_shared", is_flag=True,
                        callback=lambda ctx, param, value: True if value else None,
                        help="Use a cache folder that another user owns or others can write "
                             "(as NNCC_CACHE_TRUST_SHARED=1): trust whoever can write there.")(command)


def cache_options(command):
    """Decorate ``command`` with --cache-dir, --no-cache and --trust-shared-cache."""
    command = trust_option(command)
    command = click.option("--no-cache", "no_cache", is_flag=True,
                           help="Compile without reading or writing the compilation cache.")(command)
    return click.option("--cache-dir", type=click.Path(file_okay=False), metavar="DIR",
                        help="Compilation cache directory (default: $NNCC_CACHE_DIR, else the user "
                             "cache directory).")(command)


def report_cache(outcome) -> None:
    """One line on stderr: what the cache did and how long preparing took."""
    ms = outcome.seconds * 1000
    token = f" {outcome.token[:12]}" if outcome.token else ""
    text = {
        "hit": f"cache hit{token}: prepared from the cache in {ms:.1f} ms",
        "miss": f"cache miss{token}: compiled and stored in {ms:.1f} ms",
        "recompiled": f"cache entry{token} was rejected: recompiled and stored in {ms:.1f} ms",
        "unavailable": f"cache unavailable: compiled in memory in {ms:.1f} ms",
        "disabled": f"cache disabled: compiled in {ms:.1f} ms",
    }.get(outcome.outcome, f"cache {outcome.outcome}{token} in {ms:.1f} ms")
    status(f"nncc: {text}")
    if outcome.token:
        detail(f"nncc: cache token {outcome.token}" + (f" in {outcome.directory}" if outcome.directory else ""))


def cache_dir_option(command):
    command = trust_option(command)
    return click.option("--cache-dir", type=click.Path(file_okay=False), metavar="DIR",
                        help="Cache directory (default: $NNCC_CACHE_DIR, else the user cache dir).")(command)


def json_option(command):
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")(command)


def _open(cache_dir, trust_shared, read_only_ok: bool = False):
    """``(cache, directory)``: the cache, or None where there is none yet (no folder, an
    empty one, or for ``ls``/``info`` a signed one without an index): no command creates
    a cache. Commands
    that only read (``read_only_ok``) also open one on read-only storage or a full disk;
    the others, which remove things, open one on a full disk to free space (Cache.open's
    ``reclaim``). A folder that is not nncc's, or not private, is refused (exit 2)."""
    import os

    from nncc.cache.folder import INDEX_NAME, CacheRefused, folder_state
    from nncc.cache.store import Cache, CacheUnavailable, resolve_cache_dir

    directory = resolve_cache_dir(cache_dir)
    state = folder_state(directory)
    if state in ("missing", "empty") or (
            state == "nncc" and read_only_ok and not os.path.lexists(os.path.join(directory, INDEX_NAME))):
        return None, directory
    try:
        return Cache.open(directory, read_only_ok=read_only_ok, reclaim=not read_only_ok,
                          trust_shared=trust_shared), directory
    except CacheRefused as exc:
        raise CacheCommandError(f"cannot use the cache: {exc}", hint=exc.hint) from None
    except CacheUnavailable as exc:
        raise NnccError(f"cannot open the cache: {exc}") from None


def _no_cache(directory) -> None:
    status(f"nncc: no cache at {directory} (nothing cached there yet)")


def _when(ts) -> str:
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _model_name(path) -> str:
    import os

    return os.path.basename(path) if path else "-"


def complete_tokens(ctx, param, incomplete):
    """Shell completion of TOKEN arguments: token prefixes from the cache index."""
    from click.shell_completion import CompletionItem

    from nncc.cli.complete import cached_tokens

    return [CompletionItem(value, help=help) for value, help in
            cached_tokens(ctx.params.get("cache_dir"), incomplete)]


@click.group()
@verbosity_options
def cache():
    """Inspect, verify and garbage-collect the compilation cache."""


@cache.command("ls")
@click.option("--sort", type=click.Choice(sorted(SORTS)), default="last-used", show_default=True,
              help="Order of the entries.")
@cache_dir_option
@json_option
@verbosity_options
def ls(sort, cache_dir, trust_shared, as_json):
    """List cache entries."""
    c, directory = _open(cache_dir, trust_shared, read_only_ok=True)
    if c is None:
        if as_json:
            emit_json({"directory": directory, "entries": []})
        _no_cache(directory)
        return
    with c:
        entries = c.index.entries(order=SORTS[sort])
        malformed = c.index.malformed()
        linked = {e.token: c.index.entry_objects(e.token) for e in entries}
        objects = c.index.objects()
    if malformed:  # someone edited the index: such rows are never used
        from nncc.cache.store import warn

        warn(f"skipped {len(malformed)} malformed index row(s) ({malformed[0][1]}); "
             "`nncc cache verify --fix` removes them")
    if as_json:
        emit_json({"directory": c.directory,
                   "entries": [e.as_dict() | {"objects": linked[e.token]} for e in entries],
                   "objects": objects})
        return
    from rich.console import Console
    from rich.table import Table

    from nncc.util.units import format_bytes

    out = Console()
    if not out.is_terminal:  # piped: do not squeeze the table into 80 columns
        out = Console(width=200)
    table = Table(title=f"nncc cache at {c.directory}", title_justify="left")
    for col in ("token", "model", "model cache", "data cache", "objects", "preference", "created", "last used",
                "hits", "version"):
        table.add_column(col, justify="right" if col in ("model cache", "data cache", "objects", "hits") else "left",
                         no_wrap=True)
    for e in entries:
        table.add_row(e.token[:12], _model_name(e.source_path), format_bytes(e.plan_size),
                      format_bytes(e.data_size), str(len(linked[e.token])), e.preference or "-", _when(e.created),
                      _when(e.last_used), str(e.hits), e.nncc_version)
    out.print(table)
    if not entries:
        status("(empty)")
    if objects:
        unused = sum(1 for o in objects if not o["users"])
        status(f"{len(objects)} kernel object(s), {format_bytes(sum(o['size'] for o in objects))}; "
               f"{unused} needed by no entry")


@cache.command("info")
@cache_dir_option
@json_option
@verbosity_options
def info(cache_dir, trust_shared, as_json):
    """Location, size and hit/miss/corruption counters (like `ccache -s`)."""
    from nncc.cache.gc import default_max_size
    from nncc.cache.index import COUNTERS, INDEX_NAME
    from nncc.util.units import format_bytes

    c, directory = _open(cache_dir, trust_shared, read_only_ok=True)
    if c is None:
        import os

        if as_json:
            emit_json({"directory": directory, "exists": False, "index": os.path.join(directory, INDEX_NAME),
                       "nncc_version": None, "entries": 0, "total_bytes": 0, "max_bytes": default_max_size(),
                       "stale_entries": 0, "objects": 0, "object_bytes": 0, "unused_objects": 0, "counters": {name: 0 for name in COUNTERS}, "hit_rate": None,
                       "read_only": False, "disk_full": False})
            return
        click.echo(f"Cache directory  {directory}\nExists           no (nothing cached there yet)")
        return
    with c:
        count, size = c.index.totals()
        objects = c.index.objects()
        counters = c.index.counters()
        meta = c.index.meta()
        stale = len(c.index.stale())
        payload = {
            "directory": c.directory,
            "index": c.index.path,
            "nncc_version": meta.get("nncc_version"),
            "entries": count,
            "total_bytes": size,
            "max_bytes": default_max_size(),
            "stale_entries": stale,
            "objects": len(objects),
            "object_bytes": sum(o["size"] for o in objects),
            "unused_objects": sum(1 for o in objects if not o["users"]),
            "counters": counters,
            "read_only": c.read_only,
            "disk_full": c.disk_full,
            "exists": True,
        }
    lookups = counters["hits"] + counters["misses"] + counters["recompiles"]
    payload["hit_rate"] = counters["hits"] / lookups if lookups else None
    if as_json:
        emit_json(payload)
        return
    limit = payload["max_bytes"]
    rows = [
        ("Cache directory", payload["directory"]),
        ("Index", payload["index"]),
        ("nncc version", str(payload["nncc_version"])),
        ("Entries", f"{count} ({format_bytes(size)})"),
        ("Kernel objects", f"{payload['objects']} ({format_bytes(payload['object_bytes'])}), "
                           f"{payload['unused_objects']} needed by no entry"),
        ("Total size", f"{format_bytes(size + payload['object_bytes'])}"
                       + (f" (limit {format_bytes(limit)})" if limit else " (no limit)")),
        ("Stale entries", str(stale)),
        ("Hits", str(counters["hits"])),
        ("Misses", str(counters["misses"])),
        ("Corruptions", str(counters["corruptions"])),
        ("Recompiles", str(counters["recompiles"])),
        ("Evictions", str(counters["evictions"])),
        ("Hit rate", "-" if payload["hit_rate"] is None else f"{payload['hit_rate'] * 100:.1f} %"),
    ]
    if payload["disk_full"]:
        rows.insert(1, ("Disk full", "yes: serves verified hits, stores nothing (`nncc cache gc` frees space)"))
    elif payload["read_only"]:
        rows.insert(1, ("Read-only", "yes: serves verified hits, stores nothing"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")


@cache.command("verify")
@click.option("--fix", is_flag=True, help="Remove corrupt, missing, stale, orphan and leftover files.")
@cache_dir_option
@json_option
@verbosity_options
def verify(fix, cache_dir, trust_shared, as_json):
    """Rehash every entry; exit 1 when anything is wrong (with --fix: left unfixed).
    Debris of killed processes (ORPHAN, LEFTOVER) is reported, not wrong: gc removes it."""
    from nncc.cache.verify import DEBRIS, VerifyReport
    from nncc.cache.verify import verify as run_verify
    from nncc.cli.output import verbosity
    from nncc.cli.progress import live_progress

    c, directory = _open(cache_dir, trust_shared)
    if c is None:
        report = VerifyReport([], fix)
    else:
        with c, live_progress():
            report = run_verify(c, fix=fix)
    if as_json:
        emit_json({"directory": directory} | report.as_dict())
    else:
        for f in report.findings:
            if f.status == "OK" and verbosity() <= 0:
                continue
            token = f.token[:12] if f.token else "-"
            action = " [removed]" if f.fixed else (f" [not removed: {f.not_fixed}]" if f.not_fixed else "")
            if f.status in DEBRIS and not f.fixed and not f.not_fixed:
                action += " (debris: `nncc cache gc` removes it)"
            click.echo(f"{f.status:<11} {token:<12} {f.detail}{action}  {' '.join(f.paths)}")
        counts = report.counts()
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "empty cache"
        status(f"{'ok' if report.ok else 'problems found'}: {summary}")
    if not report.ok:
        sys.exit(1)


@cache.command("gc")
@click.option("--max-size", metavar="SIZE", help="Evict least recently used entries until under SIZE (500M, 2G).")
@click.option("--max-age", metavar="AGE", help="Evict entries not used for AGE (7d, 12h).")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@cache_dir_option
@json_option
@verbosity_options
def gc(max_size, max_age, dry_run, cache_dir, trust_shared, as_json):
    """Remove stale, orphan and leftover files, old entries, and LRU entries above a size.
    Exit 1 when something could not be removed (other than being in use)."""
    from nncc.cache.gc import GcReport, collect, parse_age, parse_size
    from nncc.util.units import format_bytes
    from nncc.cli.progress import live_progress

    size = parse_size(max_size) if max_size is not None else None
    age = parse_age(max_age) if max_age is not None else None
    c, directory = _open(cache_dir, trust_shared)
    if c is None:
        report = GcReport(dry_run=dry_run)
    else:
        with c, live_progress():
            report = collect(c, max_size=size, max_age=age, dry_run=dry_run)
    if as_json:
        emit_json({"directory": directory} | report.as_dict())
    else:
        verb = "would remove" if dry_run else "removed"
        for r in report.removed:
            token = r.token[:12] if r.token else "-"
            click.echo(f"{verb} {token:<12} {r.reason:<8} {format_bytes(r.bytes):>10}  {_model_name(r.source)}")
        for token in report.skipped_busy:
            click.echo(f"nncc: skipped {token[:12]} (in use)", err=True)
        _report_failed(report)
        status(f"{verb} {len(report.removed)} item(s), {'would free' if dry_run else 'freed'} "
               f"{format_bytes(report.freed)}")
    if report.failed:
        sys.exit(1)


def _report_failed(report) -> None:
    for failure in report.failed:
        click.echo(f"nncc: not removed: {failure['reason']}", err=True)


@cache.command("rm")
@click.argument("tokens", nargs=-1, required=True, shell_complete=complete_tokens)
@cache_dir_option
@json_option
@verbosity_options
def rm(tokens, cache_dir, trust_shared, as_json):
    """Remove entries by token (unambiguous prefixes accepted)."""
    removed, busy = [], []
    c, directory = _open(cache_dir, trust_shared)
    if c is None:
        raise CacheCommandError(f"no cache entry matches {tokens[0]!r}: there is no cache at {directory}")
    with c:
        resolved = []
        for prefix in tokens:
            p = prefix.lower()
            if not p or any(ch not in "0123456789abcdef" for ch in p):
                raise CacheCommandError(f"{prefix!r} is not a token (hex digits)")
            on_disk, _ = c.scan()
            matches = sorted(set(c.index.tokens_with_prefix(p)) | {t for t in on_disk if t.startswith(p)})
            if not matches:
                raise CacheCommandError(f"no cache entry matches {prefix!r}")
            if len(matches) > 1:
                shown = ", ".join(m[:12] for m in matches[:5])
                raise CacheCommandError(f"{prefix!r} is ambiguous: it matches {len(matches)} entries ({shown})")
            resolved.append(matches[0])
        for token in resolved:
            if c.remove(token):
                removed.append(token)
            elif c.last_failure:
                raise NnccError(f"could not remove {token[:12]}: {c.last_failure}")
            else:
                busy.append(token)
    if as_json:
        emit_json({"removed": removed, "busy": busy})
    else:
        for token in removed:
            click.echo(f"removed {token}")
        for token in busy:
            click.echo(f"nncc: {token[:12]} is in use; not removed", err=True)
    if busy:
        sys.exit(1)


@cache.command("clear")
@cache_dir_option
@json_option
@verbosity_options
def clear(cache_dir, trust_shared, as_json):
    """Remove every entry and every file nncc left in the cache (counters are kept).
    Files nncc never writes are left alone."""
    from nncc.cache.gc import GcReport, collect
    from nncc.util.units import format_bytes
    from nncc.cli.progress import live_progress

    c, directory = _open(cache_dir, trust_shared)
    remaining = 0
    if c is None:
        report = GcReport()
    else:
        with c, live_progress():
            report = collect(c, max_size=0)
            for token, _ in c.index.malformed():  # edited rows: dropped; a token that is not
                if isinstance(token, str):        # nncc's names no file that remove() touches
                    c.remove(token)
                else:
                    c.delete_row(token)
            remaining = c.index.totals()[0]
    if as_json:
        emit_json({"directory": directory, "removed": len(report.removed), "freed_bytes": report.freed,
                   "busy": report.skipped_busy, "failed": report.failed})
    else:
        _report_failed(report)
        status(f"cleared {directory}: removed {len(report.removed)} item(s), "
               f"freed {format_bytes(report.freed)}")
    if remaining or report.failed:
        sys.exit(1)
