"""The user's settings: each one comes from a flag, else the environment, else the config
file, else its default, and is checked the same way, with the same message, whatever its
source ("bad size 'banana' in NNCC_CACHE_MAX_SIZE: ...", "... in --max-size: ...").

The config file is TOML, ``config.toml`` in platformdirs' user config directory (or the
file ``$NNCC_CONFIG_FILE`` names), one table per group::

    [cache]
    dir = "/srv/nncc-cache"
    max_size = "5G"

    [run]
    preference = "low-power"

Reading it costs one stat when there is no file, and one parse per process otherwise
(kept while the file's size and mtime stay the same). This module imports neither click
nor rich, and nothing a cache hit does not need; ``nncc.settings_file`` writes the file.
"""

from __future__ import annotations

import functools
import os
import re
import urllib.parse
from dataclasses import dataclass, replace
from typing import Any, Callable

from nncc.compiler import PRECISIONS, PREFERENCES  # the one lists (cheap: the compiler loads its graph lazily)
from nncc.util.limits import set_memory_limit
from nncc.util.setting_values import (AGE_HELP, SIZE_HELP, SettingError, bad_value, masked,  # noqa: F401
                                      parse_age, parse_size)

ENV_CONFIG_FILE = "NNCC_CONFIG_FILE"
CONFIG_NAME = "config.toml"
OFF = ("0", "off", "none", "unlimited")  # a limit that is disabled

HASH_MODES = ("content", "direct")


# -- checks: raw value -> value, or ValueError(why) ------------------------------------------


def _limit(parse: Callable) -> Callable:
    """A bound that ``off`` (or 0) disables; a bad one gets the message gc's option gets."""

    def check(raw):
        if str(raw).strip().lower() in OFF:
            return None
        return parse(raw)

    return check


def _directory(raw) -> str:
    text = str(raw).strip()
    if not text:
        raise ValueError("name a folder")
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError("it exists and is not a directory")
    return path


def _file(raw) -> str:
    text = str(raw).strip()
    if not text:
        raise ValueError("name a file")
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.isdir(path):
        raise ValueError("it is a directory, not a file")
    return path


def _choice(choices: tuple[str, ...]) -> Callable:
    def check(raw):
        if raw not in choices:
            raise ValueError(f"choose from {', '.join(choices)}")
        return raw

    return check


def _count(noun: str, none_word: str, none_spellings: tuple[str, ...], zero: str | None = None) -> Callable:
    """A whole number, at least 1; 0 or one of ``none_spellings`` means None. With ``zero``
    (what 0 does), 0 is a value of its own and only ``none_spellings`` mean None."""
    why = (f"use a whole number of {noun} (0: {zero}), or {none_word}" if zero is not None
           else f"use a whole number of {noun}, at least 1, or {none_word}")

    def check(raw):
        if isinstance(raw, str) and raw.strip().lower() in none_spellings:
            return None
        if isinstance(raw, bool):
            raise ValueError(why)
        try:
            value = int(str(raw).strip()) if not isinstance(raw, int) else raw
        except ValueError:
            raise ValueError(why) from None
        if value < 0:
            raise ValueError(why)
        return value if zero is not None else value or None

    return check


# hits before a quick entry's native stage is built: 0 starts it at the miss itself; off
# (never, none) builds it only on request
_upgrade_after = _count("hits", "off", ("off", "never", "none"), zero="at the miss")
_threads = _count("threads", "auto", ("auto", "0", ""))
_shape_plans = _count("plans", "off", ("off", "0", "none"))


_TRUE = ("1", "yes", "on", "true")
_FALSE = ("0", "no", "off", "false")


def _switch(raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("use 1, yes, on or true, or 0, no, off or false")


def _seconds(raw) -> float:
    if isinstance(raw, bool):
        raise ValueError("use a number of seconds greater than 0")
    try:
        value = float(str(raw).strip().lower().removesuffix("s"))
    except ValueError:
        raise ValueError("use a number of seconds greater than 0") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("use a number of seconds greater than 0")
    return value


REMOTE_URL_HELP = "use a URL such as file:///shared/nncc, redis://host:6379/0 or s3://bucket/prefix"


def _url(raw) -> str | None:
    """A remote tier's URL, checked as far as it can be without connecting: a scheme nncc
    has a store for, and what that store needs (a host and a db number, a bucket, an
    absolute path)."""
    text = str(raw).strip()
    if text.lower() in ("", "off", "none"):
        return None
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", text, re.I):
        raise ValueError(REMOTE_URL_HELP)
    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise ValueError("its port is not a number from 0 to 65535") from None
    if scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise ValueError("a Redis remote is redis://host:port/db: name the host")
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"the Redis db {db!r} is not a number (redis://host:port/0)")
    elif scheme == "s3":
        if not parts.netloc:
            raise ValueError("an S3 remote is s3://bucket/prefix: name the bucket")
    elif scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError("a shared-folder remote is file:///absolute/path")
    else:
        raise ValueError(f"unknown scheme {scheme!r}: {REMOTE_URL_HELP}")
    return text


def _seconds_between(low: float, high: float) -> Callable:
    """A number of seconds from ``low`` to ``high``."""
    why = f"use a number of seconds from {low:g} to {high:g}"

    def check(raw):
        try:
            value = _seconds(raw)
        except ValueError:
            raise ValueError(why) from None
        if not low <= value <= high:
            raise ValueError(why)
        return value

    return check


# -- the table of settings -------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    key: str  # "<table>.<name>" in config.toml
    what: str  # the noun in messages: "bad <what> 'x' in <source>: <why>"
    env: str | None
    default: Any  # the raw default (checked like any other value); None: unset
    check: Callable[[Any], Any]
    help: str

    @property
    def table(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split(".", 1)[1]


SETTINGS: dict[str, Setting] = {s.key: s for s in (
    Setting("cache.dir", "cache directory", "NNCC_CACHE_DIR", None, _directory,
            "where compiled models are cached (default: the user cache directory)"),
    Setting("cache.max_size", "size", "NNCC_CACHE_MAX_SIZE", "2G", _limit(parse_size),
            "size bound applied after every store; least recently used entries go first (off: none)"),
    Setting("cache.max_age", "age", "NNCC_CACHE_MAX_AGE", "off", _limit(parse_age),
            "entries unused this long are evicted after a store (off: never)"),
    Setting("cache.trust_shared", "switch", "NNCC_CACHE_TRUST_SHARED", "off", _switch,
            "use a cache folder another user owns or others can write (whoever can write there "
            "chooses the code nncc runs)"),
    Setting("cache.hash_mode", "hash mode", "NNCC_CACHE_HASH_MODE", "direct", _choice(HASH_MODES),
            "how a model is looked up: direct (by file identity, then content) or content (always hash)"),
    Setting("cache.upgrade_after", "hit count", "NNCC_UPGRADE_AFTER", "0", _upgrade_after,
            "hits after which a quick (portable) entry gets its native stage in the background "
            "(0: started at the miss; off: never)"),
    Setting("run.threads", "thread count", "NNCC_THREADS", "auto", _threads,
            "BLAS and native threads for `nncc run` (auto: the BLAS library's own count)"),
    Setting("run.shape_plans", "plan count", "NNCC_SHAPE_PLANS", "8", _shape_plans,
            "plans kept per model for the input shapes a model with dynamic dimensions runs with "
            "(off: every run uses the general plan)"),
    Setting("run.preference", "preference", "NNCC_PREFERENCE", "fast-single-answer", _choice(PREFERENCES),
            "the --preference used when none is given"),
    Setting("native.cc_timeout", "timeout", "NNCC_CC_TIMEOUT", "300", _seconds,
            "seconds one native build (a C compiler run) may take"),
    Setting("native.precision", "precision", "NNCC_PRECISION", "f32", _choice(PRECISIONS),
            "the --precision used when none is given: f32, bf16 (products by constant weights with bfloat16 "
            "weights, at bfloat16's accuracy), or auto (bf16 within a tolerance)"),
    Setting("native.sanitize", "switch", "NNCC_NATIVE_SANITIZE", "off", _switch,
            "build native code with AddressSanitizer and UBSan (runs only with their runtimes "
            "preloaded; see docs/native.md)"),
    Setting("remote.url", "remote URL", "NNCC_REMOTE", None, _url,
            "shared remote cache tier (file://, redis:// or s3:// URL; unset: none)"),
    Setting("remote.key_file", "remote key file", "NNCC_REMOTE_KEY_FILE", None, _file,
            "file holding the remote tier's shared secret key"),
    Setting("remote.trust_native", "switch", "NNCC_REMOTE_TRUST_NATIVE", "no", _switch,
            "run native code from the remote tier (built by any holder of the team key); "
            "off: its portable plans run and native code is built here"),
    Setting("remote.timeout", "timeout", "NNCC_REMOTE_TIMEOUT", "2", _seconds_between(0.1, 600),
            "seconds one remote operation may take in all (plus a second per 10 MiB it moves)"),
    Setting("remote.lease", "timeout", "NNCC_REMOTE_LEASE", "60", _seconds_between(1, 86400),
            "seconds a compile lease lives unless its holder renews it"),
    Setting("remote.wait", "timeout", "NNCC_REMOTE_WAIT", "300", _seconds_between(0.1, 86400),
            "seconds a machine waits for another one's compile of the same model"),
)}


# -- the config file ---------------------------------------------------------------------------


def config_path() -> str:
    """$NNCC_CONFIG_FILE, else config.toml in the user config directory."""
    named = os.environ.get(ENV_CONFIG_FILE)
    if named:
        return os.path.abspath(os.path.expanduser(named))
    import platformdirs  # lazy: start-up

    return os.path.join(platformdirs.user_config_dir("nncc", appauthor=False), CONFIG_NAME)


_parsed: dict[str, tuple[tuple, dict]] = {}  # path -> (stat signature, tables)


def read_config(path: str | None = None) -> dict:
    """The config file's tables ({} when there is none); SettingError when unreadable or
    not TOML. Parsed once per process while the file stays the same."""
    path = path or config_path()
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # no file there: nothing configured
        return {}
    except OSError as exc:
        raise SettingError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    signature = (st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _parsed.get(path)
    if cached is not None and cached[0] == signature:
        return cached[1]
    import tomllib  # lazy: start-up

    try:
        with open(path, "rb") as f:
            tables = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"the config file {path} is not valid TOML: {exc}",
                           hint="fix or remove it; `nncc config path` names it") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingError(f"cannot read the config file {path}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    _parsed[path] = (signature, tables)
    return tables


def file_value(tables: dict, key: str) -> tuple[bool, Any]:
    """(present, raw value) of ``key`` ("table.name") in the parsed file."""
    table, name = key.split(".", 1)
    group = tables.get(table)
    if isinstance(group, dict) and name in group:
        return True, group[name]
    return False, None


# -- resolution --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    key: str
    value: Any  # checked; None for an unset or disabled setting
    raw: Any  # as given
    source: str  # "flag" | "env" | "file" | "default"
    where: str  # the flag, the variable, "cache.max_size in PATH", or "default"


def check(setting: Setting | str, raw, where: str):
    """``raw`` checked as ``setting``; SettingError naming ``where`` when it is not valid."""
    setting = SETTINGS[setting] if isinstance(setting, str) else setting
    try:
        return setting.check(raw)
    except ValueError as exc:
        raise bad_value(setting.what, raw, where, str(exc)) from None


def resolve(key: str, flag=None, flag_name: str | None = None) -> Resolved:
    """The effective value of ``key``: ``flag`` (when not None), else its environment
    variable (when set and not empty), else the config file, else the default."""
    setting = SETTINGS[key]
    if flag is not None:
        where = flag_name or f"--{setting.name.replace('_', '-')}"
        return Resolved(key, check(setting, flag, where), flag, "flag", where)
    if setting.env:
        raw = os.environ.get(setting.env)
        if raw is not None and raw.strip():
            return Resolved(key, check(setting, raw, setting.env), raw, "env", setting.env)
    path = config_path()
    present, raw = file_value(read_config(path), key)
    if present:
        where = f"{key} in {path}"
        value = check(setting, _relative_to(path, raw) if setting.check in (_directory, _file) else raw, where)
        return Resolved(key, value, raw, "file", where)
    value = None if setting.default is None else check(setting, setting.default, "the default")
    return Resolved(key, value, setting.default, "default", "default")


def _relative_to(path: str, raw):
    """A relative path in the config file is relative to the file's folder."""
    if isinstance(raw, str) and raw.strip() and not os.path.isabs(os.path.expanduser(raw.strip())):
        return os.path.join(os.path.dirname(path), raw.strip())
    return raw


def value(key: str, flag=None, flag_name: str | None = None):
    return resolve(key, flag, flag_name).value


# -- the groups the core asks for --------------------------------------------------------------


def cache_dir(flag=None) -> str:
    """--cache-dir (``flag``), else $NNCC_CACHE_DIR, else cache.dir, else the platform's
    user cache directory; an existing non-directory is a bad value wherever it came from."""
    chosen = value("cache.dir", None if flag in (None, "") else os.fspath(flag), "--cache-dir")
    return default_cache_dir() if chosen is None else chosen


def default_cache_dir() -> str:
    """The platform's user cache directory for nncc."""
    import platformdirs  # lazy: start-up

    return platformdirs.user_cache_dir("nncc", appauthor=False)


# -- settings of the environment only (no config key) -----------------------------------------
# Read here, like every other setting, and handed down as values: no module below this one
# reads the environment.

ENV_MAX_MEMORY = "NNCC_MAX_MEMORY"  # the most one model may make nncc allocate (nncc.util.limits)
ENV_CC = "CC"  # the C compiler, as build tools name it; set but empty: none
ENV_CC_JOBS = "NNCC_CC_JOBS"  # compiler processes at once
ENV_TRUST_KEY_FILE = "NNCC_TRUST_KEY_FILE"  # a team's signing key, trusted beside the user's own


def memory_bound() -> int | None:
    """$NNCC_MAX_MEMORY in bytes, checked; None: the machine's own bound."""
    text = os.environ.get(ENV_MAX_MEMORY, "").strip()
    if not text:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:  # worded as every bad setting
        raise bad_value("size", text, ENV_MAX_MEMORY, str(exc)) from None


def bound_memory() -> None:
    """Resolve $NNCC_MAX_MEMORY and make it the bound of this command's allocations: each
    entry point that reads a model, an artifact or inputs calls this first."""
    set_memory_limit(memory_bound())


def c_compiler() -> str | None:
    """$CC: the C compiler the user chose ("" chooses none), or None (the first of cc,
    gcc, clang on PATH)."""
    return os.environ.get(ENV_CC)


def trust_key_file() -> str | None:
    """The team's signing key file ($NNCC_TRUST_KEY_FILE), or None."""
    return os.environ.get(ENV_TRUST_KEY_FILE) or None


def _compiler_jobs() -> int | None:
    """$NNCC_CC_JOBS when it is a whole number above 0, else None (one per usable core)."""
    try:
        chosen = int(os.environ.get(ENV_CC_JOBS, "0"))
    except ValueError:
        return None
    return chosen if chosen > 0 else None


def build_settings() -> tuple[tuple[str, Any], ...]:
    """The backends' own option records as this command's settings make them, by backend
    name: the native backend's (nncc.backends.native_options) sanitize mode, compiler
    time-out, $CC and $NNCC_CC_JOBS, since its toolchain reads none itself (a --target, a
    compile option, is set over it)."""
    from nncc.backends.native_options import NativeOptions  # lazy: start-up (the toolchain module)

    return (("native", NativeOptions(sanitize=bool(value("native.sanitize")), cc_timeout=value("native.cc_timeout"),
                                     cc=c_compiler(), cc_jobs=_compiler_jobs())),)


@dataclass(frozen=True)
class CacheSettings:
    """Every setting a prepare through the cache uses, resolved and checked once: the core
    receives this record, never this module."""

    directory: str
    max_size: int | None  # bytes; None: no bound
    max_age: float | None  # seconds; None: no bound
    hash_mode: str  # "content" | "direct"
    max_size_where: str = "default"  # where the size bound came from, for messages
    upgrade_after: int | None = 0  # hits before a quick entry's optimized stage is built (0: at the miss); None: never
    trust_remote_native: bool = False  # remote.trust_native
    shape_plans: int | None = 8  # run.shape_plans; None: off
    trust_shared: bool = False  # cache.trust_shared: use a folder another user owns or others can write
    # the backends' own option records (build_settings: how native code is built), by backend name
    backend_options: tuple[tuple[str, Any], ...] = ()
    # the remote tier's record (nncc.cache.remote.record.RemoteSettings), resolved on
    # first use and then kept for the command (with_remote): a local hit never reads the
    # key file nor imports remote code. None: no remote tier for this prepare.
    remote: Callable[[], Any] | None = None


def cache_settings(cache_dir_flag=None, hash_mode_flag=None) -> CacheSettings:
    """Everything the cache's flows need, resolved and checked once per command."""
    size = resolve("cache.max_size")
    return CacheSettings(cache_dir(cache_dir_flag), size.value, value("cache.max_age"),
                         value("cache.hash_mode", hash_mode_flag, "--hash-mode"), size.where,
                         upgrade_after=value("cache.upgrade_after"),
                         trust_remote_native=bool(value("remote.trust_native")),
                         shape_plans=value("run.shape_plans"), trust_shared=value("cache.trust_shared"),
                         backend_options=build_settings())


REMOTE_KEYS = ("remote.url", "remote.key_file", "remote.trust_native", "remote.timeout", "remote.lease",
               "remote.wait")
ENV_REMOTE_KEY = "NNCC_REMOTE_KEY"  # the team secret itself: a secret is never in the config file
ENV_S3_ENDPOINT = "NNCC_S3_ENDPOINT"  # an S3-compatible server other than AWS (tests, MinIO)


def check_remote_settings(remote_url=None) -> None:
    """Every remote setting, checked when a command starts rather than on its first
    local miss: a bad one is a SettingError (one line, exit 2) before anything runs.
    ``remote_url``: the command's ``--remote URL``, if given."""
    for key in REMOTE_KEYS:
        resolve(key, remote_url if key == "remote.url" else None, "--remote" if key == "remote.url" else None)


# -- the remote tier's record ---------------------------------------------------------------


def configured_url(remote_url=None) -> str | None:
    """The remote tier's URL: ``remote_url`` (the command's --remote), else $NNCC_REMOTE,
    else remote.url; None: none."""
    return value("remote.url", remote_url or None, "--remote")


def with_remote(settings: CacheSettings, remote_url=None) -> CacheSettings:
    """``settings`` for a command that prepares through the cache: every remote setting is
    checked now, whether or not a remote is configured (not on the first local miss), and
    the tier's record is built once, when the first miss asks for it. ``remote_url``: the
    command's --remote, which wins over the other sources."""
    check_remote_settings(remote_url)
    return replace(settings, remote=functools.cache(functools.partial(remote_settings, remote_url)))


def remote_settings(remote_url=None):
    """The remote tier's record (nncc.cache.remote.record.RemoteSettings), resolved, with
    the team key read."""
    from nncc.cache.remote.record import RemoteSettings  # lazy: start-up (only with a remote)

    url = configured_url(remote_url)
    if url is None:
        return RemoteSettings(None, None, None)
    key, problem = _remote_key()
    return RemoteSettings(
        url=url, key=key, key_problem=problem,
        timeout=value("remote.timeout"),
        lease_seconds=value("remote.lease"),
        wait_seconds=value("remote.wait"),
        s3_endpoint=os.environ.get(ENV_S3_ENDPOINT) or None,
    )


def _remote_key() -> tuple[bytes | None, str | None]:
    """(the team secret, None), or (None, why there is none: the tier is then off with one
    warning). A weak key, or a key file others can read, is refused: RemoteConfigError."""
    from nncc.cache.remote.errors import RemoteConfigError  # lazy: start-up (only with a remote)
    from nncc.cache.remote.record import MIN_KEY_BYTES  # lazy: start-up (only with a remote)

    resolved = resolve("remote.key_file")
    if resolved.value:
        named = f"${resolved.where}={resolved.value}" if resolved.source == "env" else resolved.value
        secret, problem = read_remote_key_file(resolved.value, named)
        where = f"the key file {resolved.value}"
        if problem:
            return None, problem
    else:
        secret = os.environ.get(ENV_REMOTE_KEY, "").strip().encode()
        where = f"${ENV_REMOTE_KEY}"
        if not secret:
            return None, f"no key: set ${SETTINGS['remote.key_file'].env} or ${ENV_REMOTE_KEY} to the team's secret"
    if len(secret) < MIN_KEY_BYTES:
        raise RemoteConfigError(f"the remote key in {where} is {len(secret)} bytes, too short to keep "
                                f"the fleet's entries safe: use at least {MIN_KEY_BYTES} random "
                                "bytes (`nncc cache remote keygen` writes a key file)")
    return secret, None


def read_remote_key_file(path: str, named: str) -> tuple[bytes | None, str | None]:
    """(secret, None), or (None, why it cannot be read); ``named``: the file as messages
    name it. A file that is not the user's own regular file, or that group
    or others may read or write, is refused (RemoteConfigError): whoever reads it can
    publish native code the fleet runs."""
    from nncc.cache.remote.errors import RemoteConfigError  # lazy: start-up (only with a remote)
    from nncc.util.files import PrivateFileError, read_private_file  # lazy: start-up

    try:
        secret = read_private_file(path, f"the remote key file {path}", 1 << 16).strip()
    except PrivateFileError as exc:
        raise RemoteConfigError(str(exc)) from None
    except OSError as exc:
        return None, f"cannot read the key file {named}: {exc.strerror or exc}"
    if not secret:
        return None, f"the key file {named} is empty"
    return secret, None
