"""The verified compilation cache's store, after NNAPI's compilation caching: entries by
token (a model cache and a data cache each), a hash index checked before every use, and
the housekeeping around them (docs/cache.md). It keeps bytes and knows nothing of plans,
models or the runtime: preparing a model through it is nncc.preparing's, and
``nncc.prepare`` the public API.

Submodules: token (the cache key, hashing helpers), direct (tokens from file identities),
index (sqlite hash index), files (verified reads, atomic writes), store (entries by
token), folder (whose folder, trust, safe removal), locking (per-token flock), objects
(kernel object files), gc and limits (eviction), verify (integrity check), stats,
select (naming entries), remote (the team's shared store).
"""

from nncc.cache.files import CacheEntryError  # noqa: F401
from nncc.cache.folder import CacheRefused, CacheUnavailable  # noqa: F401
from nncc.cache.store import Cache  # noqa: F401
from nncc.cache.token import compute_token  # noqa: F401

__all__ = ["Cache", "CacheEntryError", "CacheOutcome", "CacheRefused", "CacheUnavailable", "artifact_bytes",
           "compute_token", "default_cache_dir", "prepare", "resolve_cache_dir"]


def __getattr__(name):
    """``nncc.cache.prepare`` and friends, and the cache folder's setting, as documented
    before the store was split from the prepare layer and the settings: resolved on use
    (lazy), so that the store itself imports nothing above it."""
    if name in ("prepare", "artifact_bytes"):
        import nncc.model

        return getattr(nncc.model, name)
    if name in ("resolve_cache_dir", "default_cache_dir"):  # the cache.dir setting, resolved
        from nncc import settings

        return settings.cache_dir if name == "resolve_cache_dir" else settings.default_cache_dir
    if name == "CacheOutcome":
        from nncc.preparing.outcome import CacheOutcome

        return CacheOutcome
    raise AttributeError(f"module 'nncc.cache' has no attribute {name!r}")
