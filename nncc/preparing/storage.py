"""The local cache and the team's remote tier behind one interface, as ccache has them:
``get`` reads a verified local entry; on a local miss ``read_through`` asks the remote, and
a verified remote entry is put into the local cache (its atomic write and index commit)
and read from there like any hit; after a local store, ``write_back`` shares it.

Only the local reads and writes take the token's local lock, and only while they read or
write: no remote call (a fetch, a wait for another machine's compile, an upload) is ever
made under it, so a slow remote never holds up this machine's other processes.
"""

from __future__ import annotations

import time

import nncc.cache.stats as cache_stats
from nncc.cache.files import CacheEntryError
from nncc.preparing.entries import locked, read_entry


class Storage:
    def __init__(self, cache, settings):
        self.cache = cache
        self.settings = settings  # the resolved settings of this prepare

    def read(self, token: str):
        """(prepared, None) for a verified entry, (None, why) for a rejected one, (None,
        None) for none; the caller holds the token's lock (or the cache is read-only)."""
        cache = self.cache
        entry = cache.index.get(token)
        if entry is None:
            return None, None
        started = time.perf_counter()
        try:
            prepared = read_entry(cache, entry, self.settings.trust_remote_native)
        except CacheEntryError as exc:
            return None, exc
        cache_stats.record_hit(cache, entry, time.perf_counter() - started)
        return prepared, None

    def get(self, token: str):
        """``read`` under the token's shared lock, which keeps gc from removing the entry
        while it is verified."""
        if self.cache.read_only:  # nothing can remove an entry there, and no lock file can be made
            return self.read(token)
        with locked(self.cache, token, shared=True):
            return self.read(token)

    def read_through(self, token: str, source, opts, stage: str):
        """On a local miss: ``(prepared, stage)`` from the remote tier, put into the local
        cache first, or None (compile; this machine then holds the fleet's lease on it
        when it took one). No local lock is held here."""
        from nncc.preparing.remote import on_local_miss  # lazy: start-up (only on a miss)

        return on_local_miss(self.cache, token, source, opts, stage, self.settings.remote,
                             self.settings.trust_remote_native)

    def write_back(self, token: str) -> None:
        """Share the entry just stored locally (and release the lease on it)."""
        from nncc.preparing.remote import after_local_commit  # lazy: start-up

        after_local_commit(self.cache, token, self.settings.remote)

    def abandon(self, token: str) -> None:
        """Nothing of ours to share for ``token``: release the lease on it, if any."""
        from nncc.preparing.remote import abandon  # lazy: start-up

        abandon(token)

    def remote_state(self) -> str | None:
        """None without a remote tier, "" while it works, else why it went off."""
        from nncc.preparing.remote import remote_state  # lazy: start-up

        return remote_state(self.settings.remote)
