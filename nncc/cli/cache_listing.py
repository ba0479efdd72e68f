"""`nncc cache ls` and `nncc cache info`: what the cache holds and whether it pays off."""

from __future__ import annotations

import json
import os
import time

import click

from nncc.cli.cache_common import (cache_dir_option, command_settings, complete_tokens, json_option, model_name,
                                   open_cache, say_no_cache, when)
from nncc.cli.cache_options import remote_option
from nncc.cli.options import verbosity_options
from nncc.cli.output import emit_json, status
from nncc.preparing.deviation import PLAN_KEY, describe


SORTS = {"size": "(plan_size + data_size) DESC", "last-used": "last_used DESC", "hits": "hits DESC"}


@click.command("ls")
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
    from nncc.cache.select import matches  # lazy: start-up

    c, directory = open_cache(cache_dir, trust_shared, read_only_ok=True)
    if c is None:
        if as_json:
            emit_json({"directory": directory, "entries": []})
        say_no_cache(directory)
        return
    with c:
        entries = c.index.entries(order=SORTS[sort])
        malformed = c.index.malformed()
        linked = {e.token: c.index.entry_objects(e.token) for e in entries}
        objects = c.index.objects()
    if patterns:
        entries = [e for e in entries if any(matches(e.token, e.source_path, p) for p in patterns)]
    if malformed:  # someone edited the index: such rows are never used
        from nncc.util.notice import warn  # lazy: start-up

        warn(f"skipped {len(malformed)} malformed index row(s) ({malformed[0][1]}); "
             "`nncc cache verify --fix` removes them")
    if as_json:
        emit_json({"directory": c.directory,
                   "entries": [e.as_dict() | {"objects": linked[e.token]} | _check(e) for e in entries],
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
    from nncc.cli.fit_table import Column, render, terminal_width  # lazy: start-up
    from nncc.util.units import format_bytes  # lazy: start-up

    columns = [Column("token", keep=True), Column("model", keep=True)]
    rows = [[e.token[:12], model_name(e.source_path)] for e in entries]

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
        add(Column("deviation"), [_deviation(e) for e in entries])
    add(Column("size", 6, right=True), [format_bytes(e.size) for e in entries])
    add(Column("preference", 5), [e.preference or "-" for e in entries])
    add(Column("hits", 4, right=True), [str(e.hits) for e in entries])
    used = when if wide else _ago
    add(Column("last used", 3), [used(e.last_used) for e in entries])
    add(Column("version", 2), [e.nncc_version for e in entries])
    add(Column("created", 1), [used(e.created) for e in entries])
    return render(columns, rows, None if wide else terminal_width())


def _check(entry) -> dict:
    """A precision's measured deviation from float32, as the entry's row recorded it."""
    try:
        options = json.loads(entry.options or "{}")
    except ValueError:
        return {}
    check = options.get(PLAN_KEY) if isinstance(options, dict) else None
    return {"precision": options.get("precision"), PLAN_KEY: check} if isinstance(check, dict) else {}


def _deviation(entry) -> str:
    """The deviation column: the precision and its largest deviation from float32, or -."""
    check = _check(entry)
    if not check:
        return "-"
    record = check[PLAN_KEY]
    values = [v for v in (record.get("deviation") or {}).values() if isinstance(v, (int, float))]
    text = f"{check['precision']} {describe(max(values, default=0.0))}"
    if isinstance(record.get("bfloat16_layers"), int):  # how many layers run bfloat16 weights, how many stayed float32
        widening = (record.get("float32_widening") or {}).get("layers") or []
        text += f" ({record['bfloat16_layers']} bf16, {len(widening) + len(record.get('float32_layers') or [])} f32)"
    return text


def _ago(ts) -> str:
    """How long ago, in at most 10 characters: '12 min ago', '3 d ago'."""
    if not ts:
        return "-"
    seconds = max(0.0, time.time() - ts)
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


@click.command("info")
@cache_dir_option
@remote_option
@json_option
@verbosity_options
def info(cache_dir, trust_shared, remote_url, as_json):
    """Location, size, counters, and whether the cache pays off (like `ccache -s`), with the
    remote tier's counters and, when one is configured, its own size."""
    from nncc.cli.cache_remote import remote_info  # lazy: start-up

    from nncc.cache.index import ALL_COUNTERS, COUNTERS, INDEX_NAME  # lazy: start-up
    from nncc.cache.stats import summary  # lazy: start-up
    from nncc.util.units import format_bytes  # lazy: start-up

    from nncc.cli.native_note import native_off  # lazy: start-up

    settings = command_settings(cache_dir)
    off = native_off((), "native")  # why this machine builds no native stage, if it builds none
    c, directory = open_cache(cache_dir, trust_shared, read_only_ok=True, settings=settings)
    if c is None:
        if as_json:
            emit_json({"directory": directory, "exists": False, "index": os.path.join(directory, INDEX_NAME),
                       "nncc_version": None, "entries": 0, "total_bytes": 0, "max_bytes": settings.max_size,
                       "stale_entries": 0, "objects": 0, "object_bytes": 0,
                       "unused_objects": 0, "counters": {name: 0 for name in COUNTERS}, "hit_rate": None,
                       "stats": summary({name: 0 for name in ALL_COUNTERS}), "stats_since": None,
                       "read_only": False, "disk_full": False, "remote": remote_info(remote_url),
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
    payload["remote"] = remote_info(remote_url)
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
        ("Counted since", when(payload["stats_since"]) + " (`nncc cache zero-stats` resets the counters)"),
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
        rows.append(("Native build failed", f"{token[:12]} at {when(failure['recorded'])}: {failure['reason']}"))
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
    from nncc.util.units import format_seconds  # lazy: start-up

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
