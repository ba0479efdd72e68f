"""Native plans for the input shapes a dynamic model runs with, built through the cache.

A model with dynamic input dimensions cannot get native code: its kernels are generated
for fixed sizes. Once a shape has run twice (nncc.runtime.specialize), the model prepared
through the cache asks for that shape's native plan: a background thread prepares the
model again with its symbolic dimensions fixed to those sizes (the ``--dim`` compile),
through the cache, at the optimized stage. The first time that is a native compile and a
new cache entry (its token includes the sizes); every later process finds the entry and
loads it. The runs in between use the portable plan for the shape, and the native one
takes over when it is ready.

Like a stage upgrade this is background work: it happens only where an upgrade would
(native code asked for, a C compiler, the cache.upgrade_after setting not off, not
low-power), never fails a run, and exiting waits for a build rather than tearing its
write. Each entry is an ordinary one, under the cache's size and age bounds. A cache folder
removed since the model was prepared (a temporary one) is not created again for this.
"""

from __future__ import annotations

import os
import threading

from nncc.util.notice import warn


def native_builder(path, prepare_args: dict, options: dict):
    """The builder for a model prepared from ``path`` with these arguments, or None when
    no native plan would be built for it."""
    from nncc.cache.stages import upgrade_after, wants_native
    from nncc.compiler import CompileOptions

    opts = CompileOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})
    if (opts.dims or not wants_native(opts) or opts.preference == "low-power" or upgrade_after() is None
            or opts.toolchain() is None):
        return None

    from nncc.settings import cache_dir

    directory = cache_dir(prepare_args.get("cache_dir"))
    prepare_args = dict(prepare_args, cache_dir=directory)

    def build(dims: dict[str, int], deliver) -> None:
        if not os.path.isdir(directory):  # removed since (a temporary cache): not re-created for this
            return
        thread = threading.Thread(target=_build, name="nncc-shape-" + "-".join(map(str, dims.values())),
                                  args=(path, prepare_args, dict(options, dims=dims), deliver))
        thread.start()  # not a daemon: exiting waits for the build rather than tearing its write

    return build


def _build(path, prepare_args: dict, options: dict, deliver) -> None:
    from nncc.cache.flows import prepare
    from nncc.errors import NnccError

    try:
        model, _ = prepare(path, stage="optimized", background=None, **prepare_args, **options)
    except NnccError as exc:  # the model file changed or went away since: the portable plan stays
        warn(f"no native plan for input sizes {options['dims']}: {exc}")
        return
    deliver(model)
