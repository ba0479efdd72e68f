"""The remote tier's record: the URL, the team key and the time-outs a store is opened
with. nncc.settings resolves it (flag > environment > config file > default, and reads the
key file): the stores receive this plain record and read no setting themselves. Without a
URL there is no remote tier at all.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass

MIN_KEY_BYTES = 32  # manifests and their MACs sit in the store: a short key is guessed offline


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
