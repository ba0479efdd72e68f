"""AWS Signature Version 4 for S3 requests, on the standard library alone.

Only what the S3 store sends is covered: a method, a path, a query, a few headers and an
unsigned payload (the tier verifies every object with blake3 anyway).
"""

from __future__ import annotations

import hashlib
import hmac
import time
import urllib.parse

UNSIGNED = "UNSIGNED-PAYLOAD"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def quote(text: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(text, safe=safe)


def sign(method: str, host: str, path: str, query: dict[str, str], headers: dict[str, str], *,
         access_key: str, secret_key: str, region: str, session_token: str | None = None,
         now: float | None = None) -> dict[str, str]:
    """The headers to send (the given ones plus date, payload hash, token and
    Authorization). ``path`` is already URI-encoded."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    day = stamp[:8]
    headers = {k.lower(): v.strip() for k, v in headers.items()}
    headers |= {"host": host, "x-amz-date": stamp, "x-amz-content-sha256": UNSIGNED}
    if session_token:
        headers["x-amz-security-token"] = session_token
    names = sorted(headers)
    canonical_query = "&".join(f"{quote(k)}={quote(v)}" for k, v in sorted(query.items()))
    canonical = "\n".join([method, path, canonical_query, *(f"{n}:{headers[n]}" for n in names), "",
                           ";".join(names), UNSIGNED])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret_key).encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                                f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return headers
