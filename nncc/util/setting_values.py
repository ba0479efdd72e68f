"""Setting values and their one error message, apart from the settings themselves
(nncc.settings): sizes and ages as users write them, and "bad <what> <value> in <where>:
<why>" for any value from any source. A leaf: the core parses a value of its own with it
(``$NNCC_MAX_MEMORY``) without reading the settings.
"""

from __future__ import annotations

import re

from nncc.errors import NnccError

SIZE_HELP = "use a number with an optional K, M, G or T suffix (e.g. 500M, 2G)"
AGE_HELP = "use a number with s, m, h, d or w (e.g. 7d, 12h)"
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class SettingError(NnccError):
    """A setting's value is not valid, or the config file cannot be read."""

    exit_code = 2


def parse_size(text) -> int:
    """'500M', '2G', '1.5GiB', '123' (bytes) -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text).lower())
    if not m or isinstance(text, bool):
        raise ValueError(SIZE_HELP)
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def parse_age(text) -> float:
    """'7d', '12h', '30m', '45s', '2w' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", str(text).lower())
    if not m:
        raise ValueError(AGE_HELP)
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def masked(text):
    """``text`` with the password of any URL in it replaced by ``***``
    (redis://:secret@host -> redis://:***@host): for every output, JSON included."""
    if not isinstance(text, str) or "@" not in text:
        return text
    return re.sub(r"(\b[a-z][a-z0-9+.-]*://[^/@\s:]*:)[^/@\s]*@", r"\1***@", text, flags=re.I)


def bad_value(what: str, raw, where: str, why: str) -> SettingError:
    """The one message for a bad value, whatever its source (a URL's password masked)."""
    return SettingError(f"bad {what} {masked(raw)!r} in {where}: {why}", hint=_fix_hint(where))


def _fix_hint(where: str) -> str | None:
    if " in " in where:  # the config file
        key = where.split(" in ", 1)[0]
        return f"`nncc config set {key} VALUE` or `nncc config unset {key}`"
    if where.startswith("NNCC_"):
        return f"fix or unset {where}"
    return None
