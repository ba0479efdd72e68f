"""The remote tier's settings, in one function: the URL, the key and the time limits come
from nncc.settings (flag > environment > config file > default, validated alike); the
key itself may also be given as $NNCC_REMOTE_KEY (a secret: never in the config file).
Without a URL there is no remote tier at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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


def _key() -> tuple[bytes | None, str | None]:
    from nncc.settings import value

    path = value("remote.key_file")
    if path:
        try:
            with open(path, "rb") as f:
                secret = f.read().strip()
        except OSError as exc:
            return None, f"cannot read the key file ${ENV_KEY_FILE}={path}: {exc.strerror or exc}"
        if not secret:
            return None, f"the key file ${ENV_KEY_FILE}={path} is empty"
        return secret, None
    secret = os.environ.get(ENV_KEY, "").strip().encode()
    if secret:
        return secret, None
    return None, f"no key: set ${ENV_KEY_FILE} or ${ENV_KEY} to the team's secret"


def remote_settings() -> RemoteSettings:
    from nncc.settings import value

    url = value("remote.url", _flag_url, "--remote")
    if url is None:
        return RemoteSettings(None, None, None)
    key, problem = _key()
    return RemoteSettings(
        url=url, key=key, key_problem=problem,
        timeout=value("remote.timeout"),
        lease_seconds=value("remote.lease"),
        wait_seconds=value("remote.wait"),
        s3_endpoint=os.environ.get(ENV_S3_ENDPOINT) or None,
    )


def shown(url: str) -> str:
    """The URL as messages show it: without a password (redis://:secret@host)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
