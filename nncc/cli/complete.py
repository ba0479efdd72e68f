"""Shell-completion helpers. They run on every TAB press, so they must be fast and can
never fail: any problem means "no suggestions".

Cache tokens are read straight from the index with sqlite3, read-only (``mode=ro``) and
with a short timeout: completing creates, locks, migrates or rewrites nothing, and does
not import nncc.cache (whose import alone costs more than the whole lookup).
"""

from __future__ import annotations

import os
import sqlite3
from urllib.parse import quote

from nncc.settings import cache_dir as setting
from nncc.util.units import format_bytes

INDEX_NAME = "index.sqlite3"  # = nncc.cache.index.INDEX_NAME (a test keeps them equal)
ENV_DIR = "NNCC_CACHE_DIR"  # = nncc.cache.store.ENV_DIR
SHORT = 12  # the token prefix shown by `nncc cache ls` and the cache report lines
LIMIT = 200


def cache_directory(cache_dir: str | None = None) -> str:
    """nncc.settings.cache_dir (the cache package's import is not needed for it)."""
    return setting(cache_dir)


def cached_tokens(cache_dir: str | None, incomplete: str) -> list[tuple[str, str]]:
    """(value, help) pairs for what `nncc cache rm`/`ls` accept, starting with ``incomplete``:
    cache tokens (the 12-digit prefix, the whole token once more than 12 digits are typed)
    with the model's file name and the entry's size as help, and the models' file names with
    their entry count and size (so that a shell that shows no help still shows the names).
    Retired (stale) entries are offered too, marked so."""
    try:
        path = os.path.join(cache_directory(cache_dir), INDEX_NAME)
        if not os.path.isfile(path):
            return []

        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=0.5)
        try:
            rows = conn.execute(
                "SELECT token, source_path, plan_size + data_size, 0 FROM entries "
                "UNION ALL SELECT token, source_path, plan_size + data_size, 1 FROM stale "
                "ORDER BY 1").fetchall()
        finally:
            conn.close()
        prefix = incomplete.lower()
        hex_prefix = all(ch in "0123456789abcdef" for ch in prefix)
        tokens: dict[str, str] = {}
        models: dict[str, list[int]] = {}
        for token, source, size, stale in rows:
            name = os.path.basename(source) if isinstance(source, str) and source else "?"
            if hex_prefix and isinstance(token, str) and token.startswith(prefix):
                value = token[:SHORT] if len(prefix) <= SHORT else token
                tokens.setdefault(value, f"{name}, {format_bytes(size or 0)}" + (" (stale)" if stale else ""))
            if name != "?" and name.startswith(incomplete):
                count_size = models.setdefault(name, [0, 0])
                count_size[0] += 1
                count_size[1] += size or 0
        names = {name: f"{n} {'entry' if n == 1 else 'entries'}, {format_bytes(size)}"
                 for name, (n, size) in models.items()}
        return (sorted(tokens.items()) + sorted(names.items()))[:LIMIT]
    except Exception:  # a broken, locked or foreign index: no suggestions, never an error
        return []
