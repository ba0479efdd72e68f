"""Signing artifacts that carry native code, and deciding whether a signature is trusted.

The MAC is blake3 in keyed mode over the artifact's seal message (nncc.plan.format): the
header and every section's checksum, hence every byte that decides what runs. A MAC that
verifies under a trusted key proves the artifact was made by a holder of that key and is
unchanged since; it says nothing about whether that holder is benign.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from blake3 import blake3

from nncc.errors import TrustKeyError
from nncc.plan.format import SEAL_SCHEME, seal_payload
from nncc.plan.plan import ArtifactSeal
from nncc.trust.keys import ENV_KEY_FILE, signing_key, trusted_keys


def mac(secret: bytes, message: bytes) -> bytes:
    return blake3(message, key=secret).digest()


def sign(message: bytes, team_key_file: str | None = None) -> bytes:
    """The SIGN section for ``message``, under the signing key (made on first use):
    the team's when ``team_key_file`` (the command's NNCC_TRUST_KEY_FILE) names one."""
    key = signing_key(team_key_file)
    return seal_payload(key.fingerprint, mac(key.secret, message))


@dataclass(frozen=True)
class Verdict:
    """Whether an artifact's signature lets its native code run, and why (for one line)."""

    trusted: bool
    signed: bool
    fingerprint: str | None  # hex; None when unsigned
    reason: str  # "signed by your key ..." or why not trusted
    remedy: str = ""  # how to trust it, when not trusted
    whose: str | None = None  # the trusted key's owner, when trusted

    def as_dict(self) -> dict:
        return {"signed": self.signed, "key_fingerprint": self.fingerprint, "trusted": self.trusted,
                "trusted_key": self.whose, "reason": self.reason}


_FORCE = "pass --trust-native (trust_native=True) if you trust whoever built it"
_RESIGN = "recompile it with nncc compile to sign it with your key, or " + _FORCE


def check(seal: ArtifactSeal | None, team_key_file: str | None = None) -> Verdict:
    """The verdict on an artifact's seal under the user's trusted keys, the team's
    (``team_key_file``, the command's NNCC_TRUST_KEY_FILE) among them; TrustKeyError if a
    key file is unusable. The key is chosen by fingerprint; the MAC alone decides."""
    if seal is None:
        return Verdict(False, False, None, "it is not signed", _RESIGN)
    hexprint = seal.fingerprint.hex()
    if seal.scheme != SEAL_SCHEME:
        return Verdict(False, True, hexprint, f"it is signed with an unknown scheme {seal.scheme}", _RESIGN)
    keys = [k for k in trusted_keys(team_key_file) if hmac.compare_digest(k.fingerprint, seal.fingerprint)]
    if not keys:
        return Verdict(False, True, hexprint, f"it is signed by another key {hexprint}, not yours"
                       + (f" nor the {ENV_KEY_FILE} key" if team_key_file else ""),
                       f"to trust that key, point {ENV_KEY_FILE} at a private copy of it; or {_FORCE}")
    for key in keys:  # one, unless two trusted keys share a fingerprint
        if hmac.compare_digest(mac(key.secret, seal.message), seal.mac):
            return Verdict(True, True, hexprint, f"signed by {key.whose} {hexprint}", whose=key.whose)
    return Verdict(False, True, hexprint, f"its MAC does not verify under {keys[0].whose} {hexprint}: "
                   "it was changed after it was signed", "recompile it from the model")


def describe(seal: ArtifactSeal | None, team_key_file: str | None = None) -> dict:
    """The verdict for `nncc inspect`; a key file that cannot be used is reported, not raised."""
    try:
        return check(seal, team_key_file).as_dict()
    except TrustKeyError as exc:
        fingerprint = None if seal is None else seal.fingerprint.hex()
        return Verdict(False, seal is not None, fingerprint, f"cannot check it: {exc}").as_dict()
