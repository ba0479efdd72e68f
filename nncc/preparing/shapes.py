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

from nncc.errors import NnccError
from nncc.preparing.compiling import compile_options
from nncc.preparing.flows import prepare
from nncc.preparing.stages import upgrades_wanted
from nncc.util.notice import warn


def native_builder(path, prepare_args: dict, options: dict, settings):
    """The builder for a model prepared from ``path`` with these arguments and resolved
    ``settings``: ``build(dims, deliver)`` starts a background build of the plan for
    those sizes and hands the Prepared result to ``deliver``. Whether a native plan would
    be built at all is decided on its first call (finding the C compiler costs time, and
    only a model with dynamic inputs ever calls it): it does nothing when none would."""
    directory = settings.directory
    prepare_args = dict(prepare_args, cache_dir=directory, settings=settings)
    wanted: list[bool] = []

    def build(dims: dict[str, int], deliver) -> None:
        if not wanted:
            opts = compile_options(options, settings.build)
            wanted.append(not opts.dims and upgrades_wanted(opts, settings.upgrade_after))
        if not wanted[0] or not os.path.isdir(directory):  # removed since (a temporary cache): not re-created
            return
        thread = threading.Thread(target=_build, name="nncc-shape-" + "-".join(map(str, dims.values())),
                                  args=(path, prepare_args, dict(options, dims=dims), deliver))
        thread.start()  # not a daemon: exiting waits for the build rather than tearing its write

    return build


def _build(path, prepare_args: dict, options: dict, deliver) -> None:
    try:
        prepared, _ = prepare(path, stage="optimized", background=None, **prepare_args, **options)
    except NnccError as exc:  # the model file changed or went away since: the portable plan stays
        warn(f"no native plan for input sizes {options['dims']}: {exc}")
        return
    deliver(prepared)
