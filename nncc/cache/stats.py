"""Cache statistics that answer "is it worth it": what hits cost, what compiles cost, the
compile time hits avoided, and why each miss happened.

The prepare flows call ``record_hit`` and ``record_miss``; ``summary`` turns the index's
counters into the figures ``nncc cache info`` shows. Statistics never fail a run: an index
that cannot be written just misses an update.

Miss reasons, decided from the index at the time of the miss (first that applies):

* ``tamper``: an entry was there but failed verification (or was dropped as corrupt);
* ``evicted``: this very entry was there before and was evicted or removed (gc, rm, clear);
* ``version_change``: the model was compiled before with the same options, so something
  else in the key changed (nncc's version or code, numpy, a plugin, external data), or
  only under another nncc version;
* ``changed_options``: the model was compiled before by this nncc version, with other
  compile options;
* ``new_model``: no entry of these model bytes was ever seen.
"""

from __future__ import annotations

import json

from blake3 import blake3

from nncc._version import __version__
from nncc.cache.index import MISS_REASONS, IndexCorrupt, IndexUnavailable


def options_text(opts) -> str:
    """The compile options as the index records them (``entries.options``)."""
    return json.dumps(opts.as_dict(), sort_keys=True)


def record_hit(cache, entry, seconds: float) -> None:
    """Count a verified hit that took ``seconds`` (reading, verifying and parsing the
    entry) and avoided the entry's recorded compile time."""
    if cache.read_only:
        return  # statistics cannot be written there
    try:
        cache.index.record_hit(entry.token, seconds, entry.compile_seconds)
    except IndexUnavailable:
        pass  # statistics only: the verified hit is served all the same


def record_miss(cache, token: str, model_bytes: bytes, opts, rejected: bool, compile_seconds: float) -> str | None:
    """Count why ``token`` had to be compiled and how long the compile took; called once
    the new entry is stored. Returns the reason (None when it could not be recorded)."""
    model_hash = blake3(model_bytes).hexdigest()
    options = options_text(opts)

    def classify(conn) -> str:
        if rejected:
            return "tamper"
        row = conn.execute("SELECT why FROM history WHERE token = ?", (token,)).fetchone()
        if row is not None:
            return {"retired": "version_change", "corrupt": "tamper"}.get(row[0], "evicted")
        seen = conn.execute(
            "SELECT options, nncc_version FROM entries WHERE model_hash = ? AND token != ? UNION ALL "
            "SELECT options, nncc_version FROM history WHERE model_hash = ? AND token != ?",
            (model_hash, token, model_hash, token)).fetchall()
        if not seen:
            return "new_model"
        if any(o == options for o, _ in seen):
            return "version_change"
        if any(v == __version__ for _, v in seen):
            return "changed_options"
        return "version_change"

    try:
        return cache.index.record_miss(classify, compile_seconds)
    except (IndexUnavailable, IndexCorrupt):
        return None  # statistics only: the entry is stored all the same


def summary(counters: dict[str, int]) -> dict:
    """The "is it worth it" figures from the index counters (seconds; None where nothing
    was measured yet)."""
    def seconds(name):
        return counters[name] / 1e6

    hits, compiles = counters["timed_hits"], counters["timed_compiles"]
    hit_seconds = seconds("hit_microseconds")
    avoided = seconds("saved_microseconds")
    return {
        "time_saved_seconds": avoided - hit_seconds,
        "compile_seconds_avoided": avoided,
        "hit_seconds": hit_seconds,
        "average_hit_seconds": hit_seconds / hits if hits else None,
        "compile_seconds": seconds("compile_microseconds"),
        "average_compile_seconds": seconds("compile_microseconds") / compiles if compiles else None,
        "miss_reasons": {reason: counters[f"miss_{reason}"] for reason in MISS_REASONS},
    }
