"""The verified compilation cache, after NNAPI's compilation caching: a token per prepared
model, a model cache and a data cache, and a hash index checked before use (docs/cache.md).

    model, outcome = nncc.cache.prepare("model.onnx", preference="low-power")
    outcome.outcome  # "hit" | "miss" | "recompiled" | "unavailable" | "disabled"

Submodules: token (the cache key), direct (tokens from file identities), index (sqlite
hash index), files (verified reads, atomic writes), store (entries by token), flows (hit,
miss and no-cache prepare), folder (whose folder, trust, safe removal), locking
(per-token flock), gc (eviction), verify (integrity check).
"""

from nncc.cache.folder import CacheRefused  # noqa: F401
from nncc.cache.files import CacheEntryError  # noqa: F401
from nncc.cache.flows import CacheOutcome, artifact_bytes, prepare  # noqa: F401
from nncc.cache.folder import CacheUnavailable  # noqa: F401
from nncc.cache.store import Cache, default_cache_dir, resolve_cache_dir  # noqa: F401
from nncc.cache.token import compute_token  # noqa: F401

__all__ = ["Cache", "CacheEntryError", "CacheOutcome", "CacheRefused", "CacheUnavailable", "artifact_bytes",
           "compute_token", "default_cache_dir", "prepare", "resolve_cache_dir"]
