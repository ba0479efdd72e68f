"""s3://bucket/prefix: a remote tier on any S3-compatible object store.

The client is nncc's own: SigV4-signed requests over ``http.client`` from the standard
library. It needs no extra package and imports in about 20 ms (http.client and ssl),
where boto3 takes about a quarter of a second and 30 MB of botocore; a local hit never
imports even this.
Requests are path-style (``endpoint/bucket/key``), which every S3-compatible server
accepts. Endpoint: $NNCC_S3_ENDPOINT, else AWS's regional one; credentials and region from
the usual AWS variables.

A PUT is atomic in S3: readers see the old object or the whole new one. A lease is a PUT
with ``If-None-Match: *`` (create only if absent), holding its owner and deadline; an
expired one is deleted and created again. Deleting a dead lease and creating a new one are
two requests, so two machines breaking the same dead lease at once may both compile: a
documented best effort, which costs one extra compile and never a wrong result.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.parse

from nncc.cache.remote.backend import Listed, RecordedLeases, RemoteStore, lease_record, parse_lease
from nncc.cache.remote.errors import RemoteConfigError, RemoteFault
from nncc.cache.remote.sigv4 import quote, sign

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Store(RecordedLeases, RemoteStore):
    def __init__(self, url: str, bucket: str, prefix: str, endpoint: str | None, timeout: float):
        self.url = url
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = endpoint or f"https://s3.{self.region}.amazonaws.com"
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteConfigError(f"the S3 endpoint {endpoint!r} is not an http(s) URL")
        self.secure = parts.scheme == "https"
        self.host = parts.netloc
        self.base = parts.path.rstrip("/")
        self.access_key = os.environ.get("AWS_ACCESS_KEY_ID")
        self.secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY")
        self.session_token = os.environ.get("AWS_SESSION_TOKEN")
        if not (self.access_key and self.secret_key):
            raise RemoteConfigError(f"{url} needs credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # one connection; the lease heartbeat runs in a thread

    # -- requests --------------------------------------------------------------------

    def _object_path(self, key: str | None) -> str:
        path = f"{self.base}/{quote(self.bucket)}"
        if key is not None:
            full = f"{self.prefix}/{key}" if self.prefix else key
            path += "/" + quote(full, safe="-_.~/")
        return path

    def _request(self, method: str, key: str | None, body=b"", query=None, headers=None):
        """(status, headers, body bytes); RemoteFault when the server cannot be reached."""
        with self._lock:
            return self._send(method, key, body, query, headers)

    def _send(self, method, key, body, query, headers):
        query = query or {}
        path = self._object_path(key)
        signed = sign(method, self.host, path, query, dict(headers or {}), access_key=self.access_key,
                      secret_key=self.secret_key, region=self.region, session_token=self.session_token)
        target = path + ("?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in sorted(query.items()))
                         if query else "")
        for attempt in (0, 1):  # a kept-alive connection the server closed is retried once, fresh
            conn = self._connection()
            try:
                conn.request(method, target, body=body, headers=signed)
                response = conn.getresponse()
                data = response.read()
                return response.status, response, data
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop()
                if attempt:
                    raise RemoteFault(f"S3 {method} failed: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise RemoteFault(f"S3 {method} to {self.host} failed: {exc}") from None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.secure else http.client.HTTPConnection
            self._conn = cls(self.host, timeout=self.timeout)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _fail(self, method: str, key: str | None, status: int, data: bytes) -> RemoteFault:
        code = _xml_text(data, "Code") or ""
        return RemoteFault(f"S3 {method} {key or self.bucket} answered {status} {code}".rstrip())

    # -- the store -------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        status, _, data = self._request("GET", key)
        if status == 404:
            return None
        if status != 200:
            raise self._fail("GET", key, status, data)
        return data

    def put(self, key: str, data, headers=None) -> None:
        status, _, body = self._request("PUT", key, body=bytes(data), headers=headers)
        if status not in (200, 201):
            raise self._fail("PUT", key, status, body)

    def create(self, key: str, data) -> bool:
        status, _, body = self._request("PUT", key, body=bytes(data), headers={"If-None-Match": "*"})
        if status in (409, 412):
            return False
        if status not in (200, 201):
            raise self._fail("PUT", key, status, body)
        return True

    def delete(self, key: str) -> None:
        status, _, body = self._request("DELETE", key)
        if status not in (200, 204, 404):
            raise self._fail("DELETE", key, status, body)

    def list(self, prefix: str) -> list[Listed]:
        import xml.etree.ElementTree as ET

        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        found, token = [], None
        while True:
            query = {"list-type": "2", "prefix": full}
            if token:
                query["continuation-token"] = token
            status, _, data = self._request("GET", None, query=query)
            if status != 200:
                raise self._fail("LIST", prefix, status, data)
            try:
                root = ET.fromstring(data)
            except ET.ParseError as exc:
                raise RemoteFault(f"S3 listing is not XML: {exc}") from None
            for item in root.iter(_NS + "Contents"):
                key = item.findtext(_NS + "Key") or ""
                size = int(item.findtext(_NS + "Size") or 0)
                found.append(Listed(key[len(self.prefix) + 1:] if self.prefix else key, size,
                                    _parse_time(item.findtext(_NS + "LastModified"))))
            if root.findtext(_NS + "IsTruncated") != "true":
                return found
            token = root.findtext(_NS + "NextContinuationToken")

    def acquire_lease(self, key: str, owner: str, seconds: float) -> bool:
        for _ in (0, 1):
            status, _, data = self._request("PUT", key, body=lease_record(owner, time.time() + seconds),
                                            headers={"If-None-Match": "*"})
            if status in (200, 201):
                return True
            if status not in (409, 412):
                raise self._fail("PUT", key, status, data)
            record = parse_lease(self.get(key))
            if record is not None and record[1] > time.time():
                return False
            self.delete(key)  # expired (or unreadable): its holder died
        return False


    def close(self) -> None:
        self._drop()


def _xml_text(data: bytes, tag: str) -> str | None:
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        return None
    return root.findtext(tag) or root.findtext(_NS + tag)


def _parse_time(text: str | None) -> float | None:
    import calendar

    if not text:
        return None
    try:
        return calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
