"""`nncc cache`: list, inspect, verify, garbage-collect and empty the compilation cache."""

from __future__ import annotations

import sys
import time

import click

from nncc.cli.options import command_cache_dir, verbosity_options
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


def _use_remote(ctx, param, value):
    # every command that takes --remote sets it, to None when absent: a flag given to one
    # command never carries over to the next one run in the same process
    if value:
        from nncc.settings import check

        check("remote.url", value, "--remote")  # a bad URL is one line before the command runs
    if value or "nncc.cache.remote.settings" in sys.modules:
        from nncc.cache.remote.settings import use_remote

        use_remote(value)


def remote_option(command):
    """--remote URL: the team's remote cache tier (overrides $NNCC_REMOTE)."""
    return click.option("--remote", metavar="URL", expose_value=False, callback=_use_remote,
                        help="Remote cache tier behind the local one: redis://host:port/db, "
                             "s3://bucket/prefix or file:///path (default: $NNCC_REMOTE).")(command)


def cache_options(command):
    """Decorate ``command`` with --cache-dir, --no-cache, --trust-shared-cache, --hash-mode
    and --remote."""
    command = remote_option(command)
    command = click.option("--hash-mode", type=click.Choice(["direct", "content"]), default=None,
                           help="How a model's cache entry is found: direct (default, $NNCC_CACHE_HASH_MODE) "
                                "trusts an unchanged file's identity (path, size, times, inode) and "
                                "reads nothing; content always hashes the model.")(command)
    command = trust_option(command)
    command = click.option("--no-cache", "no_cache", is_flag=True,
                           help="Compile without reading or writing the compilation cache.")(command)
    # checked by nncc.settings, with the same message as $NNCC_CACHE_DIR or cache.dir
    return click.option("--cache-dir", type=click.Path(), metavar="DIR", callback=command_cache_dir,
                        help="Compilation cache directory (default: $NNCC_CACHE_DIR, else cache.dir "
                             "in the config file, else the user cache directory).")(command)


def report_cache(outcome) -> None:
    """One line on stderr: what the cache did and how long preparing took."""
    ms = outcome.seconds * 1000
    token = f" {outcome.token[:12]}" if outcome.token else ""
    remote = getattr(outcome, "remote_seconds", None)
    wait = ""
    if remote is not None and outcome.outcome != "remote hit":
        # the remote's wait is not compile time: "remote wait 2.0 s (timed out); compiled ..."
        note = getattr(outcome, "remote_note", None)
        wait = f"remote wait {remote:.1f} s" + (f" ({note})" if note else "") + "; "
        ms = max(0.0, ms - remote * 1000)
    text = {
        "hit": f"cache hit{token}: prepared from the cache in {ms:.1f} ms",
        "remote hit": f"remote hit{token}: fetched from the remote cache, verified, stored and prepared "
                      f"in {ms:.1f} ms",
        "miss": f"cache miss{token}: {wait}compiled and stored in {ms:.1f} ms",
        "recompiled": f"cache entry{token} was rejected: {wait}recompiled and stored in {ms:.1f} ms",
        "unavailable": f"cache unavailable: compiled in memory in {ms:.1f} ms",
        "disabled": f"cache disabled: compiled in {ms:.1f} ms",
        "not-stored": f"cache miss{token}: {wait}compiled in {ms:.1f} ms, not stored (over the size limit)",
    }.get(outcome.outcome, f"cache {outcome.outcome}{token} in {ms:.1f} ms")
    if getattr(outcome, "stage", None):
        text += f" ({outcome.stage} stage)"
    evicted = getattr(outcome, "evicted", None)
    if evicted:
        from nncc.util.units import format_bytes

        text += (f"; evicted {evicted.entries} {'entry' if evicted.entries == 1 else 'entries'} "
                 f"({format_bytes(evicted.bytes)})")
    status(f"nncc: {text}")
    if getattr(outcome, "upgrade", None):
        detail(f"nncc: building the optimized stage in the background ({outcome.upgrade})")
    if outcome.token:
        detail(f"nncc: cache token {outcome.token}" + (f" in {outcome.directory}" if outcome.directory else ""))


def cache_dir_option(command):
    command = trust_option(command)
    return click.option("--cache-dir", type=click.Path(), metavar="DIR", callback=command_cache_dir,
                        help="Cache directory (default: $NNCC_CACHE_DIR, else cache.dir in the config "
                             "file, else the user cache dir).")(command)


def json_option(command):
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")(command)


def command_settings(cache_dir):
    """Every cache setting, resolved and checked when the command starts: a bad one is one
    line and exit 2 whatever the cache holds (or whether there is one)."""
    from nncc.settings import cache_settings

    return cache_settings(cache_dir)


def parse_bound(kind: str, text: str | None, where: str):
    """A --max-size or --max-age value (None when not given), worded as a bad setting."""
    if text is None:
        return None
    from nncc.settings import bad_value, parse_age, parse_size

    try:
        return (parse_size if kind == "size" else parse_age)(text)
    except ValueError as exc:
        raise CacheCommandError(str(bad_value(kind, text, where, str(exc)))) from None


def _open(cache_dir, trust_shared, read_only_ok: bool = False, settings=None):
    """``(cache, directory)``: the cache, or None where there is none yet (no folder, an
    empty one, or for ``ls``/``info`` a signed one without an index): no command creates
    a cache. Commands
    that only read (``read_only_ok``) also open one on read-only storage or a full disk;
    the others, which remove things, open one on a full disk to free space (Cache.open's
    ``reclaim``). A folder that is not nncc's, or not private, is refused (exit 2)."""
    import os

    from nncc.cache.folder import INDEX_NAME, CacheRefused, folder_state
    from nncc.cache.store import Cache, CacheUnavailable

    settings = settings or command_settings(cache_dir)
    directory = settings.directory
    trust_shared = settings.trust_shared if trust_shared is None else trust_shared
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


class WholeSummaries(click.Group):
    """A group whose --help shows each subcommand's first sentence whole (wrapped), where
    click would cut it to fit one line ("LRU...")."""

    def format_commands(self, ctx, formatter):
        rows = [(name, self.commands[name].get_short_help_str(limit=1000)) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=WholeSummaries)
@verbosity_options
def cache():
    """Inspect, verify and garbage-collect the compilation cache."""


@cache.command("ls")
@click.argument("patterns", nargs=-1, metavar="[TOKEN|PATTERN]...", shell_complete=complete_tokens)
@click.option("--sort", type=click.Choice(sorted(SORTS)), default="last-used", show_default=True,
              help="Order of the entries.")
@click.option("--wide", is_flag=True, help="Show every column, whatever the terminal's width.")
@cache_dir_option
@json_option
@verbosity_options
def ls(patterns, sort, wide, cache_dir, trust_shared, as_json):
    """List cache entries (all, or those TOKEN or PATTERN names).

    TOKEN is a token prefix; PATTERN a glob on the model's file name ('resnet*', 'mlp').
    The table fits the terminal: the least useful columns go first; --wide shows all."""
    from nncc.cache.select import matches

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
    if patterns:
        entries = [e for e in entries if any(matches(e.token, e.source_path, p) for p in patterns)]
    if malformed:  # someone edited the index: such rows are never used
        from nncc.util.notice import warn

        warn(f"skipped {len(malformed)} malformed index row(s) ({malformed[0][1]}); "
             "`nncc cache verify --fix` removes them")
    if as_json:
        emit_json({"directory": c.directory,
                   "entries": [e.as_dict() | {"objects": linked[e.token]} for e in entries],
                   "objects": objects})
        return
    click.echo(f"nncc cache at {c.directory}")
    if entries:
        click.echo(_entry_table(entries, wide, linked))
    else:
        status(f"nncc: no entries{' match ' + ', '.join(map(repr, patterns)) if patterns else ''}")


def _entry_table(entries, wide: bool, linked: dict) -> str:
    """The listing: token prefix and model name always whole; at the terminal's width the
    least useful columns go first (created, version, last used, hits, preference, size);
    ``wide`` shows every column, the two cache files' sizes and the kernel objects each
    entry was linked from too, with full timestamps."""
    from nncc.cli.fit_table import Column, render, terminal_width
    from nncc.util.units import format_bytes

    columns = [Column("token", keep=True), Column("model", keep=True)]
    rows = [[e.token[:12], _model_name(e.source_path)] for e in entries]

    def add(column, values):
        columns.append(column)
        for row, value in zip(rows, values):
            row.append(value)

    if wide:
        add(Column("model cache", right=True), [format_bytes(e.plan_size) for e in entries])
        add(Column("data cache", right=True), [format_bytes(e.data_size) for e in entries])
    if wide:
        add(Column("stage"), [e.stage or "-" for e in entries])
        add(Column("origin"), [(e.origin or "-").split(" ", 1)[0] for e in entries])
        add(Column("objects", right=True), [str(len(linked[e.token])) for e in entries])
    add(Column("size", 6, right=True), [format_bytes(e.size) for e in entries])
    add(Column("preference", 5), [e.preference or "-" for e in entries])
    add(Column("hits", 4, right=True), [str(e.hits) for e in entries])
    used = _when if wide else _ago
    add(Column("last used", 3), [used(e.last_used) for e in entries])
    add(Column("version", 2), [e.nncc_version for e in entries])
    add(Column("created", 1), [used(e.created) for e in entries])
    return render(columns, rows, None if wide else terminal_width())


def _ago(ts) -> str:
    """How long ago, in at most 10 characters: '12 min ago', '3 d ago'."""
    if not ts:
        return "-"
    seconds = max(0.0, time.time() - ts)
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


@cache.command("info")
@cache_dir_option
@remote_option
@json_option
@verbosity_options
def info(cache_dir, trust_shared, as_json):
    """Location, size, counters, and whether the cache pays off (like `ccache -s`), with the
    remote tier's counters and, when one is configured, its own size."""
    from nncc.cli.cache_remote import remote_info

    from nncc.cache.index import ALL_COUNTERS, COUNTERS, INDEX_NAME
    from nncc.cache.stats import summary
    from nncc.util.units import format_bytes

    from nncc.cli.native_note import native_off

    settings = command_settings(cache_dir)
    off = native_off((), "native")  # why this machine builds no native stage, if it builds none
    c, directory = _open(cache_dir, trust_shared, read_only_ok=True, settings=settings)
    if c is None:
        import os

        if as_json:
            emit_json({"directory": directory, "exists": False, "index": os.path.join(directory, INDEX_NAME),
                       "nncc_version": None, "entries": 0, "total_bytes": 0, "max_bytes": settings.max_size,
                       "stale_entries": 0, "objects": 0, "object_bytes": 0,
                       "unused_objects": 0, "counters": {name: 0 for name in COUNTERS}, "hit_rate": None,
                       "stats": summary({name: 0 for name in ALL_COUNTERS}), "stats_since": None,
                       "read_only": False, "disk_full": False, "remote": remote_info(),
                       "stages": {"quick": 0, "optimized": 0}, "native_failures": {}, "native_off": off})
            return
        click.echo(f"Cache directory  {directory}\nExists           no (nothing cached there yet)")
        if off:
            click.echo(f"Native code      off: {off}")
        return
    with c:
        count, size = c.index.totals()
        objects = c.index.objects()
        counters = c.index.counters(ALL_COUNTERS)
        meta = c.index.meta()
        stale = len(c.index.stale())
        failures = c.index.failures()
        stages = c.index.stage_counts()
        payload = {
            "directory": c.directory,
            "index": c.index.path,
            "nncc_version": meta.get("nncc_version"),
            "entries": count,
            "total_bytes": size,
            "max_bytes": settings.max_size,
            "stale_entries": stale,
            "objects": len(objects),
            "object_bytes": sum(o["size"] for o in objects),
            "unused_objects": sum(1 for o in objects if not o["users"]),
            "counters": {name: counters[name] for name in COUNTERS},
            "stats": summary(counters),
            "stats_since": _float(meta.get("stats_zeroed") or meta.get("created")),
            "read_only": c.read_only,
            "disk_full": c.disk_full,
            "exists": True,
            "stages": stages,  # entries per stage: quick (native stage to come) or optimized
            "native_failures": failures,  # token -> why its native stage failed to build
            "native_off": off,
        }
    lookups = counters["hits"] + counters["misses"] + counters["recompiles"]
    payload["hit_rate"] = counters["hits"] / lookups if lookups else None
    payload["remote"] = remote_info()
    if as_json:
        emit_json(payload)
        return
    limit = payload["max_bytes"]
    rows = [
        ("Cache directory", payload["directory"]),
        ("Index", payload["index"]),
        ("nncc version", str(payload["nncc_version"])),
        ("Entries", str(count)),
        ("Stages", f"{stages['quick']} quick, {stages['optimized']} optimized"),
        ("Kernel objects", f"{payload['objects']} ({format_bytes(payload['object_bytes'])}), "
                           f"{payload['unused_objects']} needed by no entry"),
        ("Total size", f"{format_bytes(size + payload['object_bytes'])}"
                       + (f" (limit {format_bytes(limit)})" if limit else " (no limit)")),
        ("Stale entries", str(stale)),
        *_worth_rows(counters, payload["stats"], payload["hit_rate"]),
        ("Corruptions", str(counters["corruptions"])),
        ("Recompiles", str(counters["recompiles"])),
        ("Evictions", str(counters["evictions"])),
        ("Counted since", _when(payload["stats_since"]) + " (`nncc cache zero-stats` resets the counters)"),
        ("Upgrades", str(counters["upgrades"])),
        ("Hit rate", "-" if payload["hit_rate"] is None else f"{payload['hit_rate'] * 100:.1f} %"),
        ("Remote hits", str(counters["remote_hits"])),
        ("Remote misses", str(counters["remote_misses"])),
        ("Remote rejected", str(counters["remote_rejected"])),
        ("Remote errors", str(counters["remote_errors"])),
    ]
    remote = payload["remote"]
    if remote is not None:
        rows.append(("Remote", f"{remote['url']} ({remote['state']})"))
        if remote["state"] == "on":
            rows.append(("Remote entries", f"{remote['entries']} in {format_bytes(remote['bytes'])}"
                         + (f", {remote['rejected_entries']} that do not verify" if remote["rejected_entries"]
                            else "")))
    if payload["disk_full"]:
        rows.insert(1, ("Disk full", "yes: serves verified hits, stores nothing (`nncc cache gc` frees space)"))
    elif payload["read_only"]:
        rows.insert(1, ("Read-only", "yes: serves verified hits, stores nothing"))
    if off:
        rows.append(("Native code", f"off: {off}"))
    for token, failure in failures.items():  # not retried until the compiler or the model changes
        rows.append(("Native build failed", f"{token[:12]} at {_when(failure['recorded'])}: {failure['reason']}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")


def _float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _worth_rows(counters: dict, stats: dict, hit_rate) -> list[tuple[str, str]]:
    """Hits, misses and their reasons, and the time the cache saved, one line each."""
    from nncc.util.units import format_seconds

    def average(seconds, what):
        return "" if seconds is None else f", {format_seconds(seconds)} {what} on average"

    hits = counters["hits"]
    reasons = ", ".join(f"{reason.replace('_', ' ')} {n}" for reason, n in stats["miss_reasons"].items() if n)
    saved = format_seconds(stats["time_saved_seconds"])
    return [
        ("Hits", f"{hits}{average(stats['average_hit_seconds'], 'to load')}"),
        ("Misses", f"{counters['misses']}{average(stats['average_compile_seconds'], 'to compile')}"),
        ("Miss reasons", reasons or "-"),
        ("Hit rate", "-" if hit_rate is None else f"{hit_rate * 100:.1f} %"),
        ("Time saved", f"{saved} (compiles avoided {format_seconds(stats['compile_seconds_avoided'])}, "
                       f"hits took {format_seconds(stats['hit_seconds'])})"),
    ]


@cache.command("zero-stats")
@cache_dir_option
@json_option
@verbosity_options
def zero_stats(cache_dir, trust_shared, as_json):
    """Reset the counters `nncc cache info` shows (entries stay)."""
    c, directory = _open(cache_dir, trust_shared)
    if c is not None:
        with c:
            c.index.zero_counters()
    if as_json:
        emit_json({"directory": directory, "zeroed": c is not None})
    else:
        click.echo(f"zeroed the statistics of {directory}" if c is not None else
                   f"no cache at {directory}: nothing to zero")


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
        click.echo(_verify_summary(report))
    if not report.ok:
        sys.exit(1)


def _verify_summary(report) -> str:
    """One line that says what was found and what was done: '4 entries verified: all OK',
    'problems fixed: 1 CORRUPT removed, 3 OK', 'problems found: 1 MISSING, 3 OK'."""
    from nncc.cache.verify import PROBLEMS

    counts = report.counts()
    if not counts:
        return "nothing to verify: the cache is empty"
    if set(counts) == {"OK"}:
        return f"{counts['OK']} {'entry' if counts['OK'] == 1 else 'entries'} verified: all OK"
    parts = []
    for status_name, n in sorted(counts.items(), key=lambda item: (item[0] == "OK", item[0])):
        fixed = sum(1 for f in report.findings if f.status == status_name and f.fixed)
        parts.append(f"{n} {status_name}" + (" removed" if fixed == n else f" ({fixed} removed)" if fixed else ""))
    problems = [f for f in report.findings if f.status in PROBLEMS]
    if not problems:
        verdict = "no problems"
    elif report.ok:
        verdict = "problems fixed"
    else:
        verdict = "problems found"
    return f"{verdict}: {', '.join(parts)}"


@cache.command("gc")
@click.option("--max-size", metavar="SIZE", help="Evict least recently used entries until under SIZE (500M, 2G).")
@click.option("--max-age", metavar="AGE", help="Evict entries not used for AGE (7d, 12h).")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@click.option("--remote", "on_remote", is_flag=True,
              help="Apply the limits to the remote tier instead (age: since upload).")
@click.option("--remote-url", metavar="URL", expose_value=False, callback=_use_remote,
              help="The remote for --remote (default: $NNCC_REMOTE).")
@cache_dir_option
@json_option
@verbosity_options
def gc(max_size, max_age, dry_run, on_remote, cache_dir, trust_shared, as_json):
    """Remove stale, orphan and leftover files, old entries, and LRU entries above a size.
    The size and age bounds are the configured ones (cache.max_size, cache.max_age), as
    applied after every store, unless --max-size or --max-age is given.
    Exit 1 when something could not be removed (other than being in use). With --remote,
    apply --max-size and --max-age to the remote tier (the local cache is left alone)."""
    from nncc.cache.gc import GcReport, collect
    from nncc.util.units import format_bytes
    from nncc.cli.progress import live_progress

    size = parse_bound("size", max_size, "--max-size")
    age = parse_bound("age", max_age, "--max-age")
    if on_remote:
        return _gc_remote(size, age, dry_run, as_json)
    settings = command_settings(cache_dir)
    if max_size is None and max_age is None:  # the configured bounds, as `ccache --cleanup`
        size, age = settings.max_size, settings.max_age
    c, directory = _open(cache_dir, trust_shared, settings=settings)
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
        click.echo(f"dry run: {_items(len(report.removed))} would go, freeing {format_bytes(report.freed)}" if dry_run
                   else f"removed {_items(len(report.removed))}, freed {format_bytes(report.freed)}")
    if report.failed:
        sys.exit(1)


def _items(n: int) -> str:
    return f"{n} item" if n == 1 else f"{n} items"


def _gc_remote(size, age, dry_run, as_json) -> None:
    from nncc.cache.remote.errors import RemoteFault
    from nncc.cache.remote.gc import WrongKey, collect_remote
    from nncc.cli.cache_remote import RemoteCommandError, open_tier, remote_fault
    from nncc.util.units import format_bytes

    tier = open_tier()
    try:
        report = collect_remote(tier, max_size=size, max_age=age, dry_run=dry_run)
    except RemoteFault as exc:
        raise remote_fault(tier, exc) from None
    except WrongKey as exc:
        raise RemoteCommandError(str(exc)) from None
    finally:
        tier.close()
    if as_json:
        emit_json({"remote": tier.url} | report.as_dict())
        return
    verb = "would remove" if dry_run else "removed"
    for r in report.entries:
        size_text = format_bytes(r["size"]) if r["size"] is not None else "-"
        click.echo(f"{verb} {r['token'][:12]:<12} {r['reason']:<8} {size_text:>10}")
    status(f"{verb} {len(report.entries)} remote entr{'y' if len(report.entries) == 1 else 'ies'} and "
           f"{len(report.parts)} part(s), {'would free' if dry_run else 'freed'} {format_bytes(report.freed)}; "
           f"{report.kept_entries} entries ({format_bytes(report.kept_bytes)}) kept at {tier.url}")


@cache.command("push")
@click.argument("tokens", nargs=-1, shell_complete=complete_tokens)
@cache_dir_option
@remote_option
@json_option
@verbosity_options
def push(tokens, cache_dir, trust_shared, as_json):
    """Upload local entries (all of them, or the TOKENs: unambiguous prefixes) to the remote."""
    from nncc.cli import cache_remote

    c, directory = _open(cache_dir, trust_shared, read_only_ok=True)
    if c is None:
        raise CacheCommandError(f"nothing to push: there is no cache at {directory}")
    with c:
        cache_remote.push(c, [_resolve_prefix(c, t) for t in tokens], as_json)


@cache.group("remote", cls=WholeSummaries)
def remote():
    """Set up the remote tier a fleet shares (docs/cache.md)."""


@remote.command("keygen")
@click.argument("path", type=click.Path(dir_okay=False), required=False)
@json_option
@verbosity_options
def keygen(path, as_json):
    """Write a fresh random team key to PATH (default: remote.key in the user config
    folder), mode 600; an existing file is never replaced."""
    from nncc.cli import cache_remote

    cache_remote.keygen(path, as_json)


@cache.command("pull")
@click.argument("tokens", nargs=-1, required=True)
@cache_dir_option
@remote_option
@json_option
@verbosity_options
def pull(tokens, cache_dir, trust_shared, as_json):
    """Fetch entries by full token from the remote, verify them and store them locally."""
    from nncc.cache.store import TOKEN_RE
    from nncc.cli import cache_remote

    for token in tokens:
        if not TOKEN_RE.match(token):
            raise CacheCommandError(f"{token!r} is not a full token (64 hex digits)")
    c, directory = _open(cache_dir, trust_shared)
    if c is None:
        from nncc.cache.store import Cache, CacheUnavailable

        try:
            c = Cache.open(directory, trust_shared=trust_shared or command_settings(cache_dir).trust_shared)
        except CacheUnavailable as exc:
            raise NnccError(f"cannot open the cache: {exc}") from None
    with c:
        cache_remote.pull(c, list(tokens), as_json)


def _resolve_prefix(c, prefix: str) -> str:
    p = prefix.lower()
    if not p or any(ch not in "0123456789abcdef" for ch in p):
        raise CacheCommandError(f"{prefix!r} is not a token (hex digits)")
    matches = sorted(set(c.index.tokens_with_prefix(p)))
    if len(matches) != 1:
        raise CacheCommandError(f"{prefix!r} matches {len(matches)} local entries; give an unambiguous prefix")
    return matches[0]


def _report_failed(report) -> None:
    for failure in report.failed:
        click.echo(f"nncc: not removed: {failure['reason']}", err=True)


@cache.command("rm")
@click.argument("tokens", nargs=-1, required=True, metavar="TOKEN|PATTERN...", shell_complete=complete_tokens)
@cache_dir_option
@json_option
@verbosity_options
def rm(tokens, cache_dir, trust_shared, as_json):
    """Remove entries by token prefix or model-name pattern.

    A TOKEN prefix must name one entry; a PATTERN (a glob on the model's file name, such
    as 'resnet*' or 'mlp') removes every entry of the models it matches."""
    removed, busy = [], []
    c, directory = _open(cache_dir, trust_shared)
    if c is None:
        raise CacheCommandError(f"no cache entry matches {tokens[0]!r}: there is no cache at {directory}")
    with c:
        resolved = []
        for argument in tokens:
            for token in _resolve(c, argument):
                if token not in resolved:
                    resolved.append(token)
        known = _known(c)
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
        from nncc.util.units import format_bytes

        for token in removed:
            source, size = known.get(token, (None, None))
            click.echo(f"removed {token[:12]}  {_model_name(source)}" + (f"  {format_bytes(size)}" if size else ""))
        for token in busy:
            click.echo(f"nncc: {token[:12]} is in use; not removed", err=True)
    if busy:
        sys.exit(1)


def _known(c) -> dict:
    """token -> (model path, size) of every entry and retired row."""
    known = {t: (row["source_path"], (row["plan_size"] or 0) + (row["data_size"] or 0))
             for t, row in c.index.stale().items()}
    known.update({e.token: (e.source_path, e.size) for e in c.index.entries()})
    return known


def _resolve(c, argument: str) -> list[str]:
    """The tokens ``argument`` names: one entry by unambiguous token prefix (also an
    orphan's files on disk), or every entry and retired row whose model name matches it."""
    from nncc.cache.select import is_token_prefix, name_matches

    by_name = sorted(t for t, (source, _) in _known(c).items() if name_matches(source, argument))
    by_token = []
    if is_token_prefix(argument):
        p = argument.lower()
        on_disk, _ = c.scan()
        by_token = sorted(set(c.index.tokens_with_prefix(p)) | {t for t in on_disk if t.startswith(p)})
    if by_token and by_name:
        raise CacheCommandError(f"{argument!r} is both a token prefix and a model name; give more digits "
                                f"of the token or a pattern such as '{argument}.onnx'")
    if by_name:
        return by_name
    if not by_token:
        what = "" if is_token_prefix(argument) else " (not a token: no model name matches it either)"
        raise CacheCommandError(f"no cache entry matches {argument!r}{what}",
                                hint="`nncc cache ls` lists the tokens and model names")
    if len(by_token) > 1:
        shown = ", ".join(m[:12] for m in by_token[:5])
        raise CacheCommandError(f"{argument!r} is ambiguous: it matches {len(by_token)} entries ({shown})")
    return by_token


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
        click.echo(f"cleared {directory}: removed {_items(len(report.removed))}, freed {format_bytes(report.freed)}")
    if remaining or report.failed:
        sys.exit(1)
