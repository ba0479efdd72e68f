"""`nncc cache push`, `pull` and `remote keygen`: moving entries to and from the remote tier."""

from __future__ import annotations

import click

from nncc.cli.cache_common import (CacheCommandError, WholeSummaries, cache_dir_option, command_settings,
                                   complete_tokens, json_option, open_cache)
from nncc.cli.cache_options import remote_option
from nncc.cli.options import verbosity_options
from nncc.errors import NnccError


@click.command("push")
@click.argument("tokens", nargs=-1, shell_complete=complete_tokens)
@cache_dir_option
@remote_option
@json_option
@verbosity_options
def push(tokens, cache_dir, trust_shared, remote_url, as_json):
    """Upload local entries (all of them, or the TOKENs: unambiguous prefixes) to the remote."""
    from nncc.cli import cache_remote  # lazy: start-up

    c, directory = open_cache(cache_dir, trust_shared, read_only_ok=True)
    if c is None:
        raise CacheCommandError(f"nothing to push: there is no cache at {directory}")
    with c:
        cache_remote.push(c, [_resolve_prefix(c, t) for t in tokens], as_json, remote_url)


@click.group("remote", cls=WholeSummaries)
def remote():
    """Set up the remote tier a fleet shares (docs/cache.md)."""


@remote.command("keygen")
@click.argument("path", type=click.Path(dir_okay=False), required=False)
@json_option
@verbosity_options
def keygen(path, as_json):
    """Write a fresh random team key to PATH (default: remote.key in the user config
    folder), mode 600; an existing file is never replaced."""
    from nncc.cli import cache_remote  # lazy: start-up

    cache_remote.keygen(path, as_json)


@click.command("pull")
@click.argument("tokens", nargs=-1, required=True)
@cache_dir_option
@remote_option
@json_option
@verbosity_options
def pull(tokens, cache_dir, trust_shared, remote_url, as_json):
    """Fetch entries by full token from the remote, verify them and store them locally."""
    from nncc.cache.store import TOKEN_RE  # lazy: start-up
    from nncc.cli import cache_remote  # lazy: start-up

    for token in tokens:
        if not TOKEN_RE.match(token):
            raise CacheCommandError(f"{token!r} is not a full token (64 hex digits)")
    c, directory = open_cache(cache_dir, trust_shared)
    if c is None:
        from nncc.cache.store import Cache, CacheUnavailable  # lazy: start-up

        try:
            c = Cache.open(directory, trust_shared=trust_shared or command_settings(cache_dir).trust_shared)
        except CacheUnavailable as exc:
            raise NnccError(f"cannot open the cache: {exc}") from None
    with c:
        cache_remote.pull(c, list(tokens), as_json, remote_url)


def _resolve_prefix(c, prefix: str) -> str:
    p = prefix.lower()
    if not p or any(ch not in "0123456789abcdef" for ch in p):
        raise CacheCommandError(f"{prefix!r} is not a token (hex digits)")
    matches = sorted(set(c.index.tokens_with_prefix(p)))
    if len(matches) != 1:
        raise CacheCommandError(f"{prefix!r} matches {len(matches)} local entries; give an unambiguous prefix")
    return matches[0]
