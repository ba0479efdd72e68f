"""The cache options `nncc run` and `nncc compile` share with the cache commands, and the
one line that reports what the cache did."""

from __future__ import annotations

import click

from nncc.cli.options import command_cache_dir
from nncc.cli.output import detail, status
from nncc.settings import check


def trust_option(command):
    # absent: None, so that the API reads $NNCC_CACHE_TRUST_SHARED (whatever click's flag default)
    return click.option("--trust-shared-cache", "trust_shared", is_flag=True,
                        callback=lambda ctx, param, value: True if value else None,
                        help="Use a cache folder that another user owns or others can write "
                             "(as NNCC_CACHE_TRUST_SHARED=1): trust whoever can write there.")(command)


def checked_remote_url(ctx, param, value):
    """--remote URL, checked before the command runs (one line); the command passes it on
    to the settings it resolves, where it wins over $NNCC_REMOTE and remote.url."""
    if value:
        check("remote.url", value, "--remote")
    return value or None


def remote_option(command):
    """--remote URL: the team's remote cache tier (overrides $NNCC_REMOTE)."""
    return click.option("--remote", "remote_url", metavar="URL", callback=checked_remote_url,
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
        from nncc.util.units import format_bytes  # lazy: start-up

        text += (f"; evicted {evicted.entries} {'entry' if evicted.entries == 1 else 'entries'} "
                 f"({format_bytes(evicted.bytes)})")
    status(f"nncc: {text}")
    if getattr(outcome, "upgrade", None):
        detail(f"nncc: building the optimized stage in the background ({outcome.upgrade})")
    if outcome.token:
        detail(f"nncc: cache token {outcome.token}" + (f" in {outcome.directory}" if outcome.directory else ""))
