"""What the `nncc cache` subcommands share: their options, opening the cache, the error
they raise, and a few formatting helpers."""

from __future__ import annotations

import os
import time

import click

from nncc.cli.cache_options import trust_option
from nncc.cli.options import command_cache_dir
from nncc.cli.output import status
from nncc.errors import NnccError
from nncc.settings import bad_value, cache_settings, parse_age, parse_size


class CacheCommandError(NnccError):
    exit_code = 2


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
    return cache_settings(cache_dir)


def parse_bound(kind: str, text: str | None, where: str):
    """A --max-size or --max-age value (None when not given), worded as a bad setting."""
    if text is None:
        return None

    try:
        return (parse_size if kind == "size" else parse_age)(text)
    except ValueError as exc:
        raise CacheCommandError(str(bad_value(kind, text, where, str(exc)))) from None


def open_cache(cache_dir, trust_shared, read_only_ok: bool = False, settings=None):
    """``(cache, directory)``: the cache, or None where there is none yet (no folder, an
    empty one, or for ``ls``/``info`` a signed one without an index): no command creates
    a cache. Commands
    that only read (``read_only_ok``) also open one on read-only storage or a full disk;
    the others, which remove things, open one on a full disk to free space (Cache.open's
    ``reclaim``). A folder that is not nncc's, or not private, is refused (exit 2)."""
    from nncc.cache.folder import INDEX_NAME, CacheRefused, folder_state  # lazy: start-up
    from nncc.cache.store import Cache, CacheUnavailable  # lazy: start-up

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


def say_no_cache(directory) -> None:
    status(f"nncc: no cache at {directory} (nothing cached there yet)")


def when(ts) -> str:
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def model_name(path) -> str:
    return os.path.basename(path) if path else "-"


def item_count(n: int) -> str:
    return f"{n} item" if n == 1 else f"{n} items"


def report_failed(report) -> None:
    for failure in report.failed:
        click.echo(f"nncc: not removed: {failure['reason']}", err=True)


def known_entries(c) -> dict:
    """token -> (model path, size) of every entry and retired row."""
    known = {t: (row["source_path"], (row["plan_size"] or 0) + (row["data_size"] or 0))
             for t, row in c.index.stale().items()}
    known.update({e.token: (e.source_path, e.size) for e in c.index.entries()})
    return known


def complete_tokens(ctx, param, incomplete):
    """Shell completion of TOKEN arguments: token prefixes from the cache index."""
    from click.shell_completion import CompletionItem  # lazy: start-up

    from nncc.cli.complete import cached_tokens  # lazy: start-up

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
