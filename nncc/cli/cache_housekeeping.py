"""`nncc cache verify`, `gc`, `rm`, `clear` and `zero-stats`: checking the cache and removing
from it."""

from __future__ import annotations

import sys

import click

from nncc.cli.cache_common import (CacheCommandError, cache_dir_option, command_settings, complete_tokens,
                                   item_count, json_option, known_entries, model_name, open_cache, parse_bound,
                                   report_failed)
from nncc.cli.cache_options import checked_remote_url
from nncc.cli.options import verbosity_options
from nncc.cli.output import emit_json, status, verbosity
from nncc.errors import NnccError


@click.command("zero-stats")
@cache_dir_option
@json_option
@verbosity_options
def zero_stats(cache_dir, trust_shared, as_json):
    """Reset the counters `nncc cache info` shows (entries stay)."""
    c, directory = open_cache(cache_dir, trust_shared)
    if c is not None:
        with c:
            c.index.zero_counters()
    if as_json:
        emit_json({"directory": directory, "zeroed": c is not None})
    else:
        click.echo(f"zeroed the statistics of {directory}" if c is not None else
                   f"no cache at {directory}: nothing to zero")


@click.command("verify")
@click.option("--fix", is_flag=True, help="Remove corrupt, missing, stale, orphan and leftover files.")
@cache_dir_option
@json_option
@verbosity_options
def verify(fix, cache_dir, trust_shared, as_json):
    """Rehash every entry; exit 1 when anything is wrong (with --fix: left unfixed).
    Debris of killed processes (ORPHAN, LEFTOVER) is reported, not wrong: gc removes it."""
    from nncc.cache.verify import DEBRIS, VerifyReport  # lazy: start-up
    from nncc.cache.verify import verify as run_verify  # lazy: start-up
    from nncc.cli.progress import live_progress  # lazy: start-up

    c, directory = open_cache(cache_dir, trust_shared)
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
    from nncc.cache.verify import PROBLEMS  # lazy: start-up

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


@click.command("gc")
@click.option("--max-size", metavar="SIZE", help="Evict least recently used entries until under SIZE (500M, 2G).")
@click.option("--max-age", metavar="AGE", help="Evict entries not used for AGE (7d, 12h).")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@click.option("--remote", "on_remote", is_flag=True,
              help="Apply the limits to the remote tier instead (age: since upload).")
@click.option("--remote-url", "remote_url", metavar="URL", callback=checked_remote_url,
              help="The remote for --remote (default: $NNCC_REMOTE).")
@cache_dir_option
@json_option
@verbosity_options
def gc(max_size, max_age, dry_run, on_remote, remote_url, cache_dir, trust_shared, as_json):
    """Remove stale, orphan and leftover files, old entries, and LRU entries above a size.
    The size and age bounds are the configured ones (cache.max_size, cache.max_age), as
    applied after every store, unless --max-size or --max-age is given.
    Exit 1 when something could not be removed (other than being in use). With --remote,
    apply --max-size and --max-age to the remote tier (the local cache is left alone)."""
    from nncc.cache.gc import GcReport, collect  # lazy: start-up
    from nncc.util.units import format_bytes  # lazy: start-up
    from nncc.cli.progress import live_progress  # lazy: start-up

    size = parse_bound("size", max_size, "--max-size")
    age = parse_bound("age", max_age, "--max-age")
    if on_remote:
        return _gc_remote(size, age, dry_run, as_json, remote_url)
    settings = command_settings(cache_dir)
    if max_size is None and max_age is None:  # the configured bounds, as `ccache --cleanup`
        size, age = settings.max_size, settings.max_age
    c, directory = open_cache(cache_dir, trust_shared, settings=settings)
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
            click.echo(f"{verb} {token:<12} {r.reason:<8} {format_bytes(r.bytes):>10}  {model_name(r.source)}")
        for token in report.skipped_busy:
            click.echo(f"nncc: skipped {token[:12]} (in use)", err=True)
        report_failed(report)
        removed = item_count(len(report.removed))
        click.echo(f"dry run: {removed} would go, freeing {format_bytes(report.freed)}" if dry_run
                   else f"removed {removed}, freed {format_bytes(report.freed)}")
    if report.failed:
        sys.exit(1)


def _gc_remote(size, age, dry_run, as_json, remote_url) -> None:
    from nncc.cache.remote.errors import RemoteFault  # lazy: start-up
    from nncc.cache.remote.gc import WrongKey, collect_remote  # lazy: start-up
    from nncc.cli.cache_remote import RemoteCommandError, open_tier, remote_fault  # lazy: start-up
    from nncc.util.units import format_bytes  # lazy: start-up

    tier = open_tier(remote_url)
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


@click.command("rm")
@click.argument("tokens", nargs=-1, required=True, metavar="TOKEN|PATTERN...", shell_complete=complete_tokens)
@cache_dir_option
@json_option
@verbosity_options
def rm(tokens, cache_dir, trust_shared, as_json):
    """Remove entries by token prefix or model-name pattern.

    A TOKEN prefix must name one entry; a PATTERN (a glob on the model's file name, such
    as 'resnet*' or 'mlp') removes every entry of the models it matches."""
    removed, busy = [], []
    c, directory = open_cache(cache_dir, trust_shared)
    if c is None:
        raise CacheCommandError(f"no cache entry matches {tokens[0]!r}: there is no cache at {directory}")
    with c:
        resolved = []
        for argument in tokens:
            for token in _resolve(c, argument):
                if token not in resolved:
                    resolved.append(token)
        known = known_entries(c)
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
        from nncc.util.units import format_bytes  # lazy: start-up

        for token in removed:
            source, size = known.get(token, (None, None))
            click.echo(f"removed {token[:12]}  {model_name(source)}" + (f"  {format_bytes(size)}" if size else ""))
        for token in busy:
            click.echo(f"nncc: {token[:12]} is in use; not removed", err=True)
    if busy:
        sys.exit(1)


def _resolve(c, argument: str) -> list[str]:
    """The tokens ``argument`` names: one entry by unambiguous token prefix (also an
    orphan's files on disk), or every entry and retired row whose model name matches it."""
    from nncc.cache.select import is_token_prefix, name_matches  # lazy: start-up

    by_name = sorted(t for t, (source, _) in known_entries(c).items() if name_matches(source, argument))
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


@click.command("clear")
@cache_dir_option
@json_option
@verbosity_options
def clear(cache_dir, trust_shared, as_json):
    """Remove every entry and every file nncc left in the cache (counters are kept).
    Files nncc never writes are left alone."""
    from nncc.cache.gc import GcReport, collect  # lazy: start-up
    from nncc.util.units import format_bytes  # lazy: start-up
    from nncc.cli.progress import live_progress  # lazy: start-up

    c, directory = open_cache(cache_dir, trust_shared)
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
        report_failed(report)
        click.echo(f"cleared {directory}: removed {item_count(len(report.removed))}, "
                   f"freed {format_bytes(report.freed)}")
    if remaining or report.failed:
        sys.exit(1)
