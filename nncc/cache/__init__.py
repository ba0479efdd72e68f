"""The verified compilation cache's store, after NNAPI's compilation caching: entries by
token (a model cache and a data cache each), a hash index checked before every use, and
the housekeeping around them (docs/cache.md). It keeps bytes and knows nothing of plans,
models or the runtime: preparing a model through it is nncc.preparing's, and
``nncc.prepare`` the public API.

It imports nothing of nncc but its own modules, nncc.util and nncc.errors: the token that
names an entry is computed above it (nncc.preparing.token), and its settings arrive as
plain values and records from the caller.

Submodules: direct (tokens found by file identities),
index (sqlite hash index), files (verified reads, atomic writes), store (entries by
token), folder (whose folder, trust, safe removal), locking (per-token flock), objects
(kernel object files), gc and limits (eviction), verify (integrity check), stats,
select (naming entries), remote (the team's shared store).
"""

from nncc.cache.files import CacheEntryError  # noqa: F401
from nncc.cache.folder import CacheRefused, CacheUnavailable  # noqa: F401
from nncc.cache.store import Cache  # noqa: F401

__all__ = ["Cache", "CacheEntryError", "CacheRefused", "CacheUnavailable"]
