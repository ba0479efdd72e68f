"""The remote tier's settings record, its key file, and the ``--remote`` flag of this
process. nncc.settings.remote_settings resolves the record (flag > environment > config
file > default, validated alike; the key itself may also be given as $NNCC_REMOTE_KEY, a
secret never in the config file): the store never reads settings itself. Without a URL
there is no remote tier at all.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass

from nncc.cache.remote.errors import RemoteConfigError
from nncc.util.files import PrivateFileError, read_private_file

ENV_URL = "NNCC_REMOTE"
ENV_KEY_FILE = "NNCC_REMOTE_KEY_FILE"
ENV_KEY = "NNCC_REMOTE_KEY"
ENV_S3_ENDPOINT = "NNCC_S3_ENDPOINT"
ENV_TIMEOUT = "NNCC_REMOTE_TIMEOUT"  # seconds, for a connect and for each request
ENV_LEASE = "NNCC_REMOTE_LEASE"  # seconds a compile lease lives unless renewed
ENV_WAIT = "NNCC_REMOTE_WAIT"  # seconds a machine waits for another's compile

_flag_url: str | None = None


@dataclass(frozen=True)
class RemoteSettings:
    url: str | None
    key: bytes | None  # the team secret, raw; None when none is configured
    key_problem: str | None  # why there is no key (for the one warning)
    timeout: float = 2.0
    lease_seconds: float = 60.0
    wait_seconds: float = 300.0
    poll_seconds: float = 0.25
    s3_endpoint: str | None = None


def use_remote(url: str | None) -> None:
    """The command line's ``--remote URL``: overrides $NNCC_REMOTE for this process."""
    global _flag_url
    _flag_url = url or None


def flag_url() -> str | None:
    """The ``--remote URL`` given to this process, if any."""
    return _flag_url


MIN_KEY_BYTES = 32  # manifests and their MACs sit in the store: a short key is guessed offline


def read_key_file(path: str) -> tuple[bytes | None, str | None]:
    """(secret, None), or (None, why it cannot be read). A file that is not the user's own
    regular file, or that group or others may read or write, is refused (RemoteConfigError):
    whoever reads it can publish native code the fleet runs."""
    try:
        secret = read_private_file(path, f"the remote key file {path}", 1 << 16).strip()
    except PrivateFileError as exc:
        raise RemoteConfigError(str(exc)) from None
    except OSError as exc:
        return None, f"cannot read the key file ${ENV_KEY_FILE}={path}: {exc.strerror or exc}"
    if not secret:
        return None, f"the key file ${ENV_KEY_FILE}={path} is empty"
    return secret, None


def write_key_file(path: str) -> None:
    """A fresh random key (32 bytes, as 64 hex digits) in a new file of mode 0600; an
    existing file is never replaced (FileExistsError)."""
    import secrets  # lazy: start-up

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, secrets.token_hex(MIN_KEY_BYTES).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def shown(url: str) -> str:
    """The URL as messages show it: without a password (redis://:secret@host)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
