"""`nncc cache push` and `nncc cache pull`: move entries between the local cache and the
remote tier by hand; `nncc cache remote keygen`; and the remote parts of `cache info` and
`cache gc --remote`."""

from __future__ import annotations

import json
import os
import sys

import click
import platformdirs

from nncc.cache.files import CacheEntryError
from nncc.cache.remote.errors import PoisonedEntry, RemoteFault
from nncc.cache.remote.record import shown, write_key_file
from nncc.cache.remote.tier import RemoteTier
from nncc.cli.output import emit_json, status
from nncc.errors import NnccError
from nncc.settings import remote_settings, value


class RemoteCommandError(NnccError):
    exit_code = 2


def open_tier(remote_url=None):
    """The configured remote tier, for a command that asked for it: an error when there is
    none, or no key (a run would only warn; a command that asked must not pretend)."""
    settings = remote_settings(remote_url)
    if settings.url is None:
        raise RemoteCommandError("no remote cache: give --remote URL or set NNCC_REMOTE")
    if settings.key is None:
        raise RemoteCommandError(f"remote cache {shown(settings.url)} is off: {settings.key_problem}")
    return RemoteTier.open(settings)


def remote_fault(tier, exc) -> NnccError:
    return NnccError(f"remote cache {tier.url} failed: {exc}")


def push(cache, tokens, as_json: bool, remote_url=None) -> None:
    from nncc.preparing.remote import push_entry  # lazy: start-up

    tier = open_tier(remote_url)
    pushed, failed = [], []
    chosen = tokens or [e.token for e in cache.index.entries() if not _portable_stage(e)]
    try:
        for token in chosen:
            try:
                entry = cache.index.get(token)
                if entry is not None and _portable_stage(entry):
                    raise CacheEntryError("quick", "a quick stage is shared under its portable name by the run "
                                                   "that compiles it; push it once it is optimized")
                push_entry(tier, cache, token)
                pushed.append(token)
            except CacheEntryError as exc:
                failed.append({"token": token, "reason": exc.detail})
            except PoisonedEntry as exc:
                failed.append({"token": token, "reason": f"the remote holds an entry that does not verify "
                                                         f"under your key ({exc}); left as it is"})
    except RemoteFault as exc:
        raise remote_fault(tier, exc) from None
    finally:
        tier.close()
    _report("pushed", pushed, failed, tier.url, as_json)


def _portable_stage(entry) -> bool:
    """A quick entry of options that name the native backend: its remote name is the
    portable one, which only the compiling run knows (it hashes the model)."""
    try:
        backends = json.loads(entry.options or "{}").get("backends") or []
    except (ValueError, AttributeError):
        backends = []
    return entry.stage == "quick" and "native" in backends


def pull(cache, tokens, as_json: bool, remote_url=None) -> None:
    from nncc.preparing.remote import adopt  # lazy: start-up

    trust_native = bool(value("remote.trust_native"))  # resolved once for the command
    tier = open_tier(remote_url)
    pulled, failed = [], []
    try:
        for token in tokens:
            if cache.index.get(token) is not None:
                pulled.append(token)  # already here, verified on its next use as always
                continue
            try:
                found = tier.fetch(token, check_hashes=False)  # hashed as they are stored
                if found is None:
                    failed.append({"token": token, "reason": "not in the remote cache"})
                    continue
                # a put into the local cache, under the token's lock while it writes
                model = adopt(cache, token, *found, counter="remote_hits", origin=f"remote {tier.url}",
                              trust_native=trust_native)
            except PoisonedEntry as exc:
                cache.index.bump("remote_rejected")
                failed.append({"token": token, "reason": f"rejected: {exc}"})
                continue
            (pulled.append(token) if model is not None
             else failed.append({"token": token, "reason": "could not be stored locally"}))
    except RemoteFault as exc:
        raise remote_fault(tier, exc) from None
    finally:
        tier.close()
    _report("pulled", pulled, failed, tier.url, as_json)


def _report(verb: str, done, failed, url: str, as_json: bool) -> None:
    if as_json:
        emit_json({"remote": url, verb: done, "failed": failed})
    else:
        for token in done:
            click.echo(f"{verb} {token}")
        for f in failed:
            click.echo(f"nncc: not {verb} {f['token'][:12]}: {f['reason']}", err=True)
        status(f"{verb} {len(done)} entr{'y' if len(done) == 1 else 'ies'} ({url})")
    if failed:
        sys.exit(1)


def remote_info(remote_url=None) -> dict | None:
    """The remote's own figures for `cache info`, or None when no remote is configured."""
    settings = remote_settings(remote_url)
    if settings.url is None:
        return None
    if settings.key is None:
        return {"url": shown(settings.url), "state": f"off: {settings.key_problem}"}
    tier = RemoteTier.open(settings)
    try:
        return {"state": "on"} | tier.stats()
    except RemoteFault as exc:
        return {"url": shown(settings.url), "state": f"unreachable: {exc}"}
    finally:
        tier.close()


def keygen(path: str | None, as_json: bool) -> None:
    if path is None:
        path = os.path.join(platformdirs.user_config_dir("nncc", appauthor=False), "remote.key")
    path = os.path.abspath(os.path.expanduser(path))
    try:
        write_key_file(path)
    except FileExistsError:
        raise RemoteCommandError(f"{path} exists; a key file is never replaced (remove it first, "
                                 "or name another file)") from None
    except OSError as exc:
        raise RemoteCommandError(f"cannot write the key file {path}: {exc.strerror or exc}") from None
    if as_json:
        emit_json({"key_file": path})
    else:
        click.echo(path)
    status(f"nncc: wrote a new remote key to {path} (mode 600). Use it with `nncc config set remote.key_file "
           f"{path}` and give the fleet's machines a copy over a secure channel")
