"""redis://host:port/db: a remote tier on Redis, through the ``redis`` client (the
optional extra ``nncc[redis]``).

Objects are plain string keys under ``nncc:``; a SET is atomic, so a reader never sees part
of a value. A lease is ``SET key owner NX PX ms``: Redis itself expires it when its holder
dies, and a small script deletes or extends it only while it still names its owner.
A full Redis (``maxmemory`` with no eviction) answers writes with an OOM error: a fault.
"""

from __future__ import annotations

import time

from nncc.cache.remote.backend import Listed, RemoteStore
from nncc.cache.remote.errors import RemoteConfigError, RemoteFault, RemoteTimeout
from nncc.cache.remote.record import shown

PREFIX = "nncc:"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
          "end return 0")


class RedisStore(RemoteStore):
    def __init__(self, url: str, timeout: float):
        try:
            import redis  # lazy: optional extra
            from redis.backoff import NoBackoff  # lazy: optional extra
            from redis.retry import Retry  # lazy: optional extra
        except ImportError:
            raise RemoteConfigError(f"{shown(url)} needs the Redis client, which is not installed",
                                    hint="pip install 'nncc[redis]'") from None
        self.url = shown(url)  # for messages: never the password
        self._errors = (redis.exceptions.RedisError, OSError)
        self._timeouts = (redis.exceptions.TimeoutError, TimeoutError)
        try:
            # no retries: one short time-out, then the run goes on without the remote
            self._client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                                retry=Retry(NoBackoff(), 0), retry_on_timeout=False)
        except ValueError as exc:
            raise RemoteConfigError(f"cannot use the Redis URL {shown(url)}: {exc}") from None

    def _call(self, what: str, fn):
        try:
            return fn(self._client)
        except Exception as exc:  # the client's own errors, and any other it lets out
            timed_out = isinstance(exc, self._timeouts)
            kind, verb = (RemoteTimeout, "timed out") if timed_out else (RemoteFault, "failed")
            raise kind(f"Redis {what} {verb}: {exc or type(exc).__name__}") from None

    def get(self, key: str) -> bytes | None:
        return self._call("GET", lambda r: r.get(PREFIX + key))

    def put(self, key: str, data) -> None:
        self._call("SET", lambda r: r.set(PREFIX + key, bytes(data)))

    def create(self, key: str, data) -> bool:
        return bool(self._call("SET NX", lambda r: r.set(PREFIX + key, bytes(data), nx=True)))

    def exists(self, key: str) -> bool:
        return bool(self._call("EXISTS", lambda r: r.exists(PREFIX + key)))

    def delete(self, key: str) -> None:
        self._call("DEL", lambda r: r.delete(PREFIX + key))

    def list(self, prefix: str) -> list[Listed]:
        def scan(r):
            keys = list(r.scan_iter(match=PREFIX + prefix + "*", count=1000))
            pipe = r.pipeline(transaction=False)
            for k in keys:
                pipe.strlen(k)
                pipe.object("idletime", k)  # Redis keeps no write time: last access is the nearest
            answers = pipe.execute(raise_on_error=False)
            now = time.time()
            return [Listed(k.decode()[len(PREFIX):], int(n), now - idle if isinstance(idle, int) else None)
                    for k, n, idle in zip(keys, answers[0::2], answers[1::2]) if isinstance(n, int)]

        return self._call("SCAN", scan)

    def acquire_lease(self, key: str, owner: str, seconds: float) -> bool:
        return bool(self._call("SET NX", lambda r: r.set(PREFIX + key, owner, nx=True, px=int(seconds * 1000))))

    def renew_lease(self, key: str, owner: str, seconds: float) -> bool:
        return bool(self._call("PEXPIRE", lambda r: r.eval(_RENEW, 1, PREFIX + key, owner, int(seconds * 1000))))

    def release_lease(self, key: str, owner: str) -> None:
        self._call("DEL", lambda r: r.eval(_RELEASE, 1, PREFIX + key, owner))

    def memory(self) -> dict:
        info = self._call("INFO", lambda r: r.info("memory"))
        return {"used_memory": info.get("used_memory"), "maxmemory": info.get("maxmemory")}

    def close(self) -> None:
        try:
            self._client.close()
        except self._errors:
            pass
