"""s3://bucket/prefix: a remote tier on any S3-compatible object store, through botocore
(the optional extra ``nncc[s3]``).

botocore brings what a fleet needs and a hand-written client lacked: the whole AWS
credential chain (environment variables, the shared config and credentials files,
profiles, container and instance roles), retries with backoff on 5xx, SlowDown and
throttling, and the multipart upload that objects over 5 GiB require. It costs about
0.3 s to import and 0.2 s to make a client, paid only when a local miss asks the remote
(a compile follows anyway); a local hit imports none of it.

Endpoint: $NNCC_S3_ENDPOINT (path-style requests, which every S3-compatible server
accepts), else AWS's own. Region: the AWS configuration's, else us-east-1.

A PUT is atomic in S3: readers see the old object or the whole new one; so is a completed
multipart upload. ``create`` is a PUT with ``If-None-Match: *``. A lease is such a create
holding its owner and deadline; an expired one is deleted and created again. Deleting a
dead lease and creating a new one are two requests, so two machines breaking the same
dead lease at once may both compile: a documented best effort, which costs one extra
compile and never a wrong result.
"""

from __future__ import annotations

import time

from nncc.cache.remote.backend import Listed, RecordedLeases, RemoteStore, lease_record, parse_lease
from nncc.cache.remote.errors import RemoteConfigError, RemoteFault, RemoteTimeout

MULTIPART_THRESHOLD = 64 << 20  # objects larger than this go up in parts
PART_SIZE = 64 << 20  # S3 takes 5 MiB to 5 GiB per part, up to 10,000 parts
RETRIES = 3  # attempts per request (botocore's standard retry mode, with backoff)


class S3Store(RecordedLeases, RemoteStore):
    def __init__(self, url: str, bucket: str, prefix: str, endpoint: str | None, timeout: float):
        try:
            import botocore.exceptions  # lazy: optional extra
            import botocore.session  # lazy: optional extra
            from botocore.config import Config  # lazy: optional extra
        except ImportError:
            raise RemoteConfigError(f"{url} needs botocore, which is not installed",
                                    hint="pip install 'nncc[s3]'") from None
        self.url = url
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._errors = botocore.exceptions
        try:
            session = botocore.session.get_session()
            region = session.get_config_variable("region") or "us-east-1"
            config = Config(connect_timeout=timeout, read_timeout=timeout,
                            retries={"mode": "standard", "total_max_attempts": RETRIES},
                            s3={"addressing_style": "path" if endpoint else "auto"})
            self._client = session.create_client("s3", endpoint_url=endpoint or None, region_name=region,
                                                 config=config)
        except ValueError as exc:
            raise RemoteConfigError(f"cannot use the S3 endpoint {endpoint!r}: {exc}") from None
        except Exception as exc:  # a broken AWS config file, an unknown profile...
            raise RemoteFault(f"cannot set up the S3 client: {exc}") from None

    # -- requests --------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, key: str | None, fn, absent=(), refused=()):
        """``fn(client)``; ``absent`` (HTTP statuses or error codes) return None, ``refused``
        return False; every other failure is a RemoteFault."""
        try:
            return fn(self._client)
        except self._errors.ClientError as exc:
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = error.get("Code", "")
            if status in absent or code in absent:
                return None
            if status in refused or code in refused:
                return False
            raise RemoteFault(f"S3 {what} {key or self.bucket} answered {status} {code}".rstrip()) from None
        except Exception as exc:  # no credentials, connection errors, anything else botocore raises
            timeouts = (self._errors.ReadTimeoutError, self._errors.ConnectTimeoutError, TimeoutError)
            timed_out = isinstance(exc, timeouts)
            kind, verb = (RemoteTimeout, "timed out") if timed_out else (RemoteFault, "failed")
            raise kind(f"S3 {what} {key or self.bucket} {verb}: {exc or type(exc).__name__}") from None

    # -- the store -------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        def fetch(s3):
            with s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"] as body:
                return body.read()

        return self._call("GET", key, fetch, absent=(404, "NoSuchKey"))

    def put(self, key: str, data) -> None:
        if len(data) > MULTIPART_THRESHOLD:
            return self._put_in_parts(key, data)
        self._call("PUT", key, lambda s3: s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data)))

    def _put_in_parts(self, key: str, data) -> None:
        """A multipart upload: the object appears whole when it completes, or not at all
        (a failed upload is aborted, so its parts do not linger)."""
        full = self._key(key)
        upload = self._call("PUT", key, lambda s3: s3.create_multipart_upload(Bucket=self.bucket, Key=full))
        upload_id = upload["UploadId"]
        view = memoryview(data)
        try:
            done = []
            for number, start in enumerate(range(0, len(view), PART_SIZE), 1):
                chunk = bytes(view[start:start + PART_SIZE])
                answer = self._call("PUT", key, lambda s3: s3.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=chunk))
                done.append({"PartNumber": number, "ETag": answer["ETag"]})
            self._call("PUT", key, lambda s3: s3.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": done}))
        except BaseException:
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            except Exception:
                pass  # the bucket's lifecycle rule for incomplete uploads collects it (docs/cache.md)
            raise

    def create(self, key: str, data) -> bool:
        created = self._call("PUT", key, lambda s3: s3.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=bytes(data), IfNoneMatch="*"),
            refused=(409, 412, "PreconditionFailed", "ConditionalRequestConflict"))
        return created is not False

    def exists(self, key: str) -> bool:
        found = self._call("HEAD", key, lambda s3: s3.head_object(Bucket=self.bucket, Key=self._key(key)),
                           absent=(404, "NoSuchKey", "NotFound"))
        return found is not None

    def delete(self, key: str) -> None:
        self._call("DELETE", key, lambda s3: s3.delete_object(Bucket=self.bucket, Key=self._key(key)),
                   absent=(404,))

    def list(self, prefix: str) -> list[Listed]:
        def scan(s3):
            found = []
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"][len(self.prefix) + 1:] if self.prefix else item["Key"]
                    modified = item.get("LastModified")
                    found.append(Listed(key, int(item.get("Size", 0)),
                                        modified.timestamp() if modified is not None else None))
            return found

        return self._call("LIST", prefix, scan)

    def acquire_lease(self, key: str, owner: str, seconds: float) -> bool:
        for _ in (0, 1):
            if self.create(key, lease_record(owner, time.time() + seconds)):
                return True
            record = parse_lease(self.get(key))
            if record is not None and record[1] > time.time():
                return False
            self.delete(key)  # expired (or unreadable): its holder died
        return False

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass
