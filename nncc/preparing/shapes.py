"""Native plans for the input shapes a dynamic model runs with, found in and built through
the cache.

A model with dynamic input dimensions cannot get native code: its kernels are generated
for fixed sizes. A plan for fixed sizes is an ordinary cache entry: the model prepared
again with its symbolic dimensions fixed (``prepare(path, stage="optimized", dims=...)``,
what ``nncc compile --dim`` stores), whose token includes the sizes. So the first time a
model prepared through the cache meets an input shape (nncc.runtime.specialize):

1. ``find`` looks that entry up, without compiling: a verified optimized entry is loaded
   and runs from this very run (a hit costs a lookup and loading its code; a miss nothing
   but the lookup).
2. When there is none, ``build`` starts building it in the background, where a stage
   upgrade would happen (native code asked for, a C compiler, the cache.upgrade_after
   setting not off, not low-power): a thread for the Python API, which hands the plan to
   the running model when ready (exiting waits for it rather than tearing its write), or
   for a command that exits at once (``nncc run``), a detached worker process
   (``python -m nncc.preparing.shapes``) that outlives it, so that the next process finds
   the entry (one worker per model and sizes: one started while another builds leaves at
   once). Background work never fails a run.

Each entry is an ordinary one, under the cache's size and age bounds. A cache folder
removed since the model was prepared (a temporary one) is neither read nor created again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading

from nncc.cache.direct import find as find_direct
from nncc.cache.folder import CacheUnavailable
from nncc.cache.index import IndexCorrupt, IndexUnavailable
from nncc.cache.locking import try_lock
from nncc.cache.store import Cache
from nncc.errors import NnccError
from nncc.preparing.compiling import compile_options
from nncc.preparing.flows import prepare, resolve_settings
from nncc.preparing.stages import OPTIMIZED, upgrade_lock_path, upgrades_wanted
from nncc.preparing.storage import Storage
from nncc.preparing.token import model_subject, token_context, token_of
from nncc.settings import bound_memory
from nncc.util.files import read_model_file
from nncc.util.notice import warn


class NativeShapes:
    """The cache entries of one model's fixed-size plans: ``find`` one, ``build`` one.
    ``path``: the model file; ``prepare_args``: trust_shared and hash_mode as the model
    was prepared; ``options``: its compile options; ``settings``: the resolved settings;
    ``background``: "thread" or "process" (see the module's docstring)."""

    def __init__(self, path, prepare_args: dict, options: dict, settings, background: str = "thread"):
        self.path = path
        self.directory = settings.directory
        self.settings = settings
        self.prepare_args = dict(prepare_args, cache_dir=self.directory, settings=settings)
        self.options = options
        self.background = background
        self._wanted: bool | None = None  # decided on the first build (finding a C compiler costs time)

    def options_for(self, dims: dict[str, int]) -> dict:
        """The compile options of the entry for these sizes: the model's own, with these
        dimensions fixed beside any it already fixes (``--dim``)."""
        fixed = dict(self.options.get("dims") or {})
        return dict(self.options, dims=fixed | dict(dims))

    def find(self, dims: dict[str, int]):
        """The verified optimized entry for these sizes (a Prepared), or None. Compiles
        nothing and never fails a run: a cache that cannot be read is a miss."""
        if not os.path.isdir(self.directory):
            return None
        opts = compile_options(self.options_for(dims), self.settings.backend_options)
        trust_shared = self.prepare_args.get("trust_shared")
        if trust_shared is None:
            trust_shared = self.settings.trust_shared
        try:
            with Cache.open(self.directory, create=False, read_only_ok=True, trust_shared=trust_shared) as cache:
                context = token_context(opts, cache.index)
                token = None
                if self.settings.hash_mode == "direct":
                    token = find_direct(cache.index, self.path, context)
                if token is None:
                    subject = model_subject(self.path, read_model_file(self.path), (self.directory,))
                    token = token_of(subject, context).hex()
                entry = cache.index.get(token)
                if entry is None or entry.stage != OPTIMIZED:
                    return None
                prepared, _ = Storage(cache, self.settings).get(token)
                return prepared
        except (CacheUnavailable, IndexUnavailable, IndexCorrupt, NnccError, OSError):
            return None

    def seen_sizes(self, most: int) -> list[dict[str, int]]:
        """The sizes of this model's fixed-size optimized entries, most recently used first
        (at most ``most``): the input shapes its earlier processes ran, worth loading before
        a run asks for them. Only the index is read, so this is a guess that ``find``
        verifies (another compile's options at the same sizes, say, is a miss there); the
        dimensions the model's own options fix are left out, as a run's sizes leave them.
        Never fails: a cache that cannot be read has seen nothing."""
        if most < 1 or not os.path.isdir(self.directory):
            return []
        own = dict(self.options.get("dims") or {})
        path = os.path.abspath(os.fspath(self.path))
        trust_shared = self.prepare_args.get("trust_shared")
        try:
            with Cache.open(self.directory, create=False, read_only_ok=True,
                            trust_shared=self.settings.trust_shared if trust_shared is None else trust_shared) as cache:
                entries = [e for e in cache.index.entries() if e.source_path == path and e.stage == OPTIMIZED]
        except (CacheUnavailable, IndexUnavailable, IndexCorrupt, NnccError, OSError):
            return []
        found: list[dict[str, int]] = []
        for entry in entries:  # most recently used first
            dims = _entry_dims(entry.options)
            if dims is None or any(dims.get(name) != size for name, size in own.items()):
                continue
            sizes = {name: size for name, size in dims.items() if name not in own}
            if sizes and sizes not in found:
                found.append(sizes)
                if len(found) == most:
                    break
        return found

    def wanted(self) -> bool:
        """Whether a fixed-size native plan is ever built in the background here."""
        if self._wanted is None:
            opts = compile_options(self.options, self.settings.backend_options)
            self._wanted = upgrades_wanted(opts, self.settings.upgrade_after)
        return self._wanted

    def build(self, dims: dict[str, int], deliver) -> str | None:
        """Start building the entry for these sizes; a thread hands the Prepared result to
        ``deliver``, a detached worker only stores it. Returns what was started, or None."""
        if not self.wanted() or not os.path.isdir(self.directory):  # removed since (a temporary cache)
            return None
        options = self.options_for(dims)
        if self.background == "process":
            if not os.path.isfile(self.path):
                return None  # the worker reads the model file itself
            spawn_shape_worker(self.directory, os.path.abspath(os.fspath(self.path)), options,
                               self.prepare_args.get("trust_shared"), self.prepare_args.get("hash_mode"))
            return "process"
        args = {k: v for k, v in self.prepare_args.items()}
        thread = threading.Thread(target=_build, name="nncc-shape-" + "-".join(map(str, dims.values())),
                                  args=(self.path, args, options, deliver))
        thread.start()  # not a daemon: exiting waits for the build rather than tearing its write
        return "thread"


def _entry_dims(options: str | None) -> dict[str, int] | None:
    """The fixed dimension sizes an index row's options record, or None (none, or not a
    mapping of names to sizes)."""
    try:
        dims = json.loads(options or "{}").get("dims")
    except (ValueError, AttributeError):
        return None
    if not isinstance(dims, dict) or not dims:
        return None
    if not all(isinstance(k, str) and type(v) is int and v > 0 for k, v in dims.items()):
        return None
    return dims


def _build(path, prepare_args: dict, options: dict, deliver) -> None:
    try:
        prepared, _ = prepare(path, stage=OPTIMIZED, background=None, **prepare_args, **options)
    except NnccError as exc:  # the model file changed or went away since: the portable plan stays
        warn(f"no native plan for input sizes {options['dims']}: {exc}")
        return
    deliver(prepared)


def spawn_shape_worker(directory: str, model_path: str, options: dict, trust_shared: bool | None = None,
                       hash_mode: str | None = None):
    """``python -m nncc.preparing.shapes``, in its own session, detached from this terminal."""
    cmd = [sys.executable, "-m", "nncc.preparing.shapes", "--cache-dir", directory, "--model", model_path,
           "--options", json.dumps(options)]
    if trust_shared:
        cmd.append("--trust-shared")
    if hash_mode:
        cmd += ["--hash-mode", hash_mode]
    with open(os.devnull, "r+b") as null:
        return subprocess.Popen(cmd, stdin=null, stdout=null, stderr=null, start_new_session=True,
                                close_fds=True)


def worker_lock_path(directory: str, model_path: str, options_json: str) -> str:
    """Held by the worker building this model at these options (their JSON form): an upgrade
    lock's name (64 hex digits), so that gc removes one a killed worker left."""
    key = hashlib.sha256(json.dumps([os.path.abspath(model_path), options_json]).encode()).hexdigest()
    return upgrade_lock_path(directory, key)


def main(argv=None) -> int:
    import argparse  # lazy: start-up (only the worker parses arguments)

    parser = argparse.ArgumentParser(prog="python -m nncc.preparing.shapes",
                                     description="Build the optimized cache entry of a model at fixed input sizes.")
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--options", required=True, help="the compile options as JSON, dims included")
    parser.add_argument("--trust-shared", action="store_true", help="the cache folder may be shared")
    parser.add_argument("--hash-mode", choices=("direct", "content"))
    args = parser.parse_args(argv)
    bound_memory()  # a command of its own: it resolves its settings itself
    # one worker per model and sizes: the `nncc run`s that start while it builds leave at once
    # (an upgrade lock's name, so that gc removes one a killed worker left)
    try:
        held = try_lock(worker_lock_path(args.cache_dir, args.model, args.options))
        if held is None:
            return 0
    except OSError:  # no lock to take (prepare says what is wrong with the folder): build all the same
        held = None
    settings = resolve_settings(args.cache_dir, args.hash_mode, True)
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(args.options).items()}
    try:
        prepare(args.model, cache_dir=args.cache_dir, trust_shared=True if args.trust_shared else None,
                hash_mode=args.hash_mode, stage=OPTIMIZED, background=None, settings=settings, **options)
    except NnccError as exc:
        warn(f"no native plan for input sizes {options.get('dims')}: {exc}")
        return 1
    finally:
        if held is not None:
            held.unlink()
            held.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
