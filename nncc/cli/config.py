"""`nncc config`: show each setting's effective value and where it came from, and edit
the config file (set, unset), like `pip config` or ccache's `-M`/`-p`."""

from __future__ import annotations

import os

import click

from nncc.cli.options import verbosity_options
from nncc.cli.output import emit_json, status
from nncc.settings import SETTINGS, cache_dir, config_path, file_value, masked, read_config, resolve

@click.group()
@verbosity_options
def config():
    """Show and edit settings: a flag wins over the environment, which wins over the
    config file (`nncc config path`), which wins over the default."""


def _shown(resolved) -> str:
    """The value as written (``500M``, not its bytes); an unset cache.dir shows the
    folder it stands for."""
    if resolved.key == "cache.dir":
        return cache_dir() if resolved.value is None else resolved.value
    if resolved.raw is None:
        return "-"

    return masked(str(resolved.raw))


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@verbosity_options
def show(as_json):
    """Each setting's effective value and where it came from."""
    path = config_path()
    tables = read_config(path)
    resolved = [resolve(key) for key in SETTINGS]
    unknown = [key for key in _keys(tables) if key not in SETTINGS]
    if as_json:
        emit_json({"config_file": path, "exists": _exists(path),
                   "settings": {r.key: {"value": masked(r.value), "raw": masked(r.raw), "source": r.source,
                                        "where": r.where,
                                        "env": SETTINGS[r.key].env} for r in resolved},
                   "unknown_keys": unknown})
        return
    rows = [(r.key, _shown(r), r.where if r.source != "file" else "config file") for r in resolved]
    width = [max(len(row[i]) for row in rows) for i in range(2)]
    click.echo(f"config file: {path}" + ("" if _exists(path) else " (none yet)"))
    for key, value, where in rows:
        click.echo(f"{key:<{width[0]}}  {value:<{width[1]}}  ({where})")
    if unknown:
        from nncc.util.notice import warn  # lazy: start-up

        warn(f"{path} has keys nncc does not know, ignored: {', '.join(unknown)}")


def _keys(tables: dict) -> list[str]:
    """The file's keys, dotted: "cache.max_size", or "name" for a value outside a table."""
    return [f"{name}.{key}" for name, group in tables.items() if isinstance(group, dict) for key in group] + \
        [name for name, group in tables.items() if not isinstance(group, dict)]


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _complete_keys(ctx, param, incomplete):
    from click.shell_completion import CompletionItem  # lazy: start-up

    return [CompletionItem(key, help=s.help) for key, s in SETTINGS.items() if key.startswith(incomplete)]


def json_option(command):
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")(command)


@config.command("set")
@click.argument("key", shell_complete=_complete_keys)
@click.argument("value")
@json_option
@verbosity_options
def set_(key, value, as_json):
    """Set KEY to VALUE in the config file (checked first; written atomically)."""
    from nncc.settings_file import set_value  # lazy: start-up

    path = config_path()
    checked = set_value(key, value, path)
    _, stored = file_value(read_config(path), key)
    effective = resolve(key)
    if as_json:
        emit_json({"config_file": path, "key": key, "value": masked(checked), "raw": masked(stored),
                   "effective_source": effective.source})
    status(f"nncc: set {key} = {masked(stored)} in {path} (mode 600)")
    if effective.source == "env":
        status(f"nncc: note: {effective.where} is set, and wins over the config file")


@config.command("unset")
@click.argument("key", shell_complete=_complete_keys)
@json_option
@verbosity_options
def unset(key, as_json):
    """Remove KEY from the config file (its default, or the environment, applies again)."""
    from nncc.settings_file import unset_value  # lazy: start-up

    path = config_path()
    removed = unset_value(key, path)
    if as_json:
        emit_json({"config_file": path, "key": key, "removed": removed})
    if removed:
        status(f"nncc: removed {key} from {path}")
    else:
        status(f"nncc: {key} is not set in {path}; nothing to do")


@config.command("path")
@json_option
@verbosity_options
def path(as_json):
    """Print the config file's path (it need not exist yet)."""
    where = config_path()
    if as_json:
        emit_json({"config_file": where, "exists": _exists(where)})
    else:
        click.echo(where)
