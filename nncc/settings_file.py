"""Editing the config file: ``set`` and ``unset`` of one key, checked, written atomically.

tomllib only reads TOML, so the file is written here: tables of plain values (strings,
numbers, booleans, arrays of them), which is all nncc's settings need. Keys nncc does not
know (a newer version's) are kept as they are; comments are not (the file is rewritten).
"""

from __future__ import annotations

import math
import os
import re

from nncc.settings import SETTINGS, SettingError, check, config_path, read_config
from nncc.util.atomic import write_atomic

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def set_value(key: str, raw: str, path: str | None = None) -> object:
    """Check ``raw`` as ``key`` and store it; returns the checked value."""
    setting = _known(key)
    path = path or config_path()
    checked = check(setting, raw, key)
    if setting.key in ("cache.dir", "remote.key_file"):
        stored = checked  # absolute: the file does not depend on where `config set` ran
    elif setting.key == "run.threads":
        stored = checked if checked is not None else "auto"
    else:
        stored = raw.strip()
    tables = _copy(read_config(path))
    tables.setdefault(setting.table, {})
    if not isinstance(tables[setting.table], dict):
        raise SettingError(f"cannot set {key}: {setting.table} in {path} is not a table; edit the file by hand")
    tables[setting.table][setting.name] = stored
    write(path, tables)
    return checked


def unset_value(key: str, path: str | None = None) -> bool:
    """Remove ``key`` from the file; False when it was not there."""
    setting = _known(key)
    path = path or config_path()
    tables = _copy(read_config(path))
    group = tables.get(setting.table)
    if not isinstance(group, dict) or setting.name not in group:
        return False
    del group[setting.name]
    if not group:
        del tables[setting.table]
    write(path, tables)
    return True


def _known(key: str):
    if key not in SETTINGS:
        raise SettingError(f"unknown setting {key!r}; the settings are {', '.join(SETTINGS)}",
                           hint="`nncc config show` lists them with their values")
    return SETTINGS[key]


def _copy(tables: dict) -> dict:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in tables.items()}


def write(path: str, tables: dict) -> None:
    """Write ``tables`` as TOML to ``path`` atomically, mode 0600."""
    text = dumps(tables)
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    except OSError as exc:
        raise SettingError(f"cannot create the folder of the config file {path}: {exc.strerror or exc}") from None
    write_atomic(path, text.encode("utf-8"), 0o600)  # it may name a remote with its password


def dumps(tables: dict) -> str:
    """TOML for top-level plain values and one level of tables of plain values."""
    lines = [f"{_key(k)} = {_value(v, k)}" for k, v in tables.items() if not isinstance(v, dict)]
    for name, group in tables.items():
        if not isinstance(group, dict):
            continue
        if lines:
            lines.append("")
        lines.append(f"[{_key(name)}]")
        for k, v in group.items():
            if isinstance(v, dict):
                raise SettingError(f"cannot rewrite the config file: {name}.{k} is a nested table; "
                                   "edit the file by hand")
            lines.append(f"{_key(k)} = {_value(v, f'{name}.{k}')}")
    return "\n".join(lines) + "\n" if lines else ""


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _string(name)


def _value(value, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list) and not any(isinstance(v, (list, dict)) for v in value):
        return "[" + ", ".join(_value(v, where) for v in value) + "]"
    raise SettingError(f"cannot rewrite the config file: {where} holds a {type(value).__name__}; "
                       "edit the file by hand")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
