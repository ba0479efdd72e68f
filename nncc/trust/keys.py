"""The secret keys that sign artifacts and decide whose native code runs.

Each user has one 32-byte key, made on first use in nncc's user config directory; a team
shares one by pointing ``NNCC_TRUST_KEY_FILE`` at a copy of it (nncc.settings reads the
variable; the functions here receive the path). A key file holds the key as 64 hex
digits. It must be a regular file owned by the user and readable by nobody else: anyone
who can read it can sign code that this user's nncc will run.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from dataclasses import dataclass

import platformdirs
from blake3 import blake3

from nncc.errors import TrustKeyError
from nncc.util.files import PrivateFileError, read_private_file

KEY_BYTES = 32
ENV_KEY_FILE = "NNCC_TRUST_KEY_FILE"
KEY_FILE_NAME = "trust.key"
_FINGERPRINT_CONTEXT = "nncc 2026 artifact signing key fingerprint"
_MAX_FILE = 4096  # a key file is 65 bytes; anything much larger is not one


@dataclass(frozen=True)
class TrustKey:
    secret: bytes
    path: str
    whose: str  # "your key" or "the NNCC_TRUST_KEY_FILE key", for messages

    @property
    def fingerprint(self) -> bytes:
        return fingerprint(self.secret)


def fingerprint(secret: bytes) -> bytes:
    """A short public name of a key: 8 bytes derived from it one way, so printing it tells
    nothing about the key."""
    return blake3(secret, derive_key_context=_FINGERPRINT_CONTEXT).digest()[:8]


def user_key_path() -> str:
    return os.path.join(platformdirs.user_config_dir("nncc", appauthor=False), KEY_FILE_NAME)


def signing_key(team: str | None = None) -> TrustKey:
    """The key nncc signs with: the team key when ``team`` (the command's
    ``NNCC_TRUST_KEY_FILE``) names one, else the user's own, created now if it does not
    exist yet."""
    if team:
        return read_key(team, f"the {ENV_KEY_FILE} key", env=True)
    path = user_key_path()
    if not os.path.lexists(path):
        _create(path)
    return read_key(path, "your key")


def trusted_keys(team: str | None = None) -> list[TrustKey]:
    """The keys whose signatures let native code run: the team key if ``team`` names one,
    and the user's own if it exists (looking never creates one)."""
    keys = []
    if team:
        keys.append(read_key(team, f"the {ENV_KEY_FILE} key", env=True))
    path = user_key_path()
    if os.path.lexists(path):
        keys.append(read_key(path, "your key"))
    return keys


def read_key(path: str, whose: str, env: bool = False) -> TrustKey:
    """The key in ``path``, after checking the opened file is the user's, private and a
    key; any problem is one TrustKeyError line saying what to do."""
    named = f"the {ENV_KEY_FILE} file {path}" if env else f"the key file {path}"

    try:
        raw = read_private_file(path, named, _MAX_FILE + 1)
    except FileNotFoundError:
        raise TrustKeyError(f"{named} does not exist") from None
    except PrivateFileError as exc:
        raise TrustKeyError(str(exc)) from None
    except OSError as exc:
        raise TrustKeyError(f"cannot read {named}: {exc.strerror or exc}") from None
    text = raw.strip()
    try:
        secret = bytes.fromhex(text.decode("ascii")) if len(text) == 2 * KEY_BYTES else b""
    except (UnicodeDecodeError, ValueError):
        secret = b""
    if len(secret) != KEY_BYTES:
        raise TrustKeyError(f"{named} does not hold a key ({2 * KEY_BYTES} hex digits)")
    return TrustKey(secret, path, whose)


def _create(path: str) -> None:
    """Write a new random key to ``path`` at mode 0600, atomically and never over another:
    the complete file is linked into place, so of two first uses at once one key wins and
    both use it."""
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".trust-", suffix=".tmp", dir=folder)  # mode 0600
    except OSError as exc:
        raise TrustKeyError(f"cannot create the key file {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(secrets.token_bytes(KEY_BYTES).hex().encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made the key first: it is the one used
        except OSError as exc:
            raise TrustKeyError(f"cannot create the key file {path}: {exc.strerror or exc}") from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
