"""`nncc inspect`: partitions, fallbacks, memory and constants of a model or artifact, and
whether the model, with these options, has a compilation cache entry (nncc/cli/inspect_cache.py)."""

from __future__ import annotations

import os

import click

from nncc.cli.cache_options import trust_option
from nncc.cli.options import (command_cache_dir, compile_options, dim_option, options_dict, parse_dims,
                              stage_option, verbosity_options, warn_compile_options_on_artifact)
from nncc.cli.output import emit_json
from nncc.compiler import CompileOptions
from nncc.settings import bound_memory, trust_key_file


@click.command()
@click.argument("path", type=click.Path(dir_okay=False))
@dim_option("Fix a symbolic input dimension to SIZE before compiling, to see the plan "
            "(and its memory) for that size. Repeatable.")
@compile_options
@stage_option(default="optimized", help_default="optimized, as nncc compile builds")
@click.option("--cache-dir", type=click.Path(), metavar="DIR", callback=command_cache_dir,
              help="The compilation cache to look the model up in (default: $NNCC_CACHE_DIR, else "
                   "cache.dir in the config file, else the user cache directory). Nothing is stored there.")
@trust_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@verbosity_options
def inspect(path, dim_specs, preference, opt_level, backends, plugins, target, precision, stage, cache_dir,
            trust_shared, as_json):
    """Show how PATH (.onnx, compiled on the fly, or .nncc) is partitioned and laid out.

    For an .onnx model, also whether the compilation cache holds an entry for it with these
    options (the one `nncc run` would use): its token, stage and origin."""
    from nncc.report import describe_plan  # lazy: start-up
    from nncc.util.files import read_source  # lazy: start-up

    dims = parse_dims(dim_specs)
    bound_memory()  # $NNCC_MAX_MEMORY, checked before anything is read
    source, artifact = read_source(path)  # read once: PATH may be a pipe
    if artifact:
        warn_compile_options_on_artifact(path)
        if dims:
            raise click.BadParameter(f"{path} is a compiled artifact: its shapes were fixed when it was "
                                     "compiled; inspect the .onnx model with --dim instead", param_hint="--dim")
        # the artifact may name plugin kernels: only the plugins the user names are loaded
        from nncc.backends.registry import load_plugin  # lazy: start-up

        for module in plugins:
            load_plugin(module)
        from nncc.model import read_artifact  # lazy: start-up

        # the plan alone: inspect describes constants, memory and native code; it never
        # expands, allocates or loads them
        plan, size = read_artifact(source, path), len(source)
    else:
        from nncc.cli.progress import live_progress  # lazy: start-up
        from nncc.model import compile_plan  # lazy: start-up
        from nncc.util import progress  # lazy: start-up

        options = options_dict(preference, opt_level, backends, plugins, target, dims, precision)
        cache_options = dict(options)  # the stage is not part of the token: the entry is found whatever it holds

        if stage == "quick":  # the portable plan a cache miss stores first
            options["backends"] = tuple(b for b in options.get("backends", CompileOptions.backends) if b != "native")
        with live_progress(), progress.task(f"compiling {os.path.basename(path)}"):
            plan = compile_plan(path, source, options)
        if stage == "quick":
            plan.options["stage"] = stage
        from nncc.plan.format import SEAL_BYTES, serialize  # lazy: start-up

        # the size nncc compile writes, room for its signature included (no key is read)
        size = len(serialize(plan, seal=lambda message: bytes(SEAL_BYTES)))
    from nncc.ir.opsets import warn_newer_opsets  # lazy: start-up

    warn_newer_opsets(plan.options.get("opsets") or {})
    report = describe_plan(plan, size)
    report["path"] = path
    from nncc.runtime.sample_axis import describe_sample_axes  # lazy: start-up

    report["sample_axes"] = describe_sample_axes(plan)  # which symbolic dims run natively at any size
    from nncc.cli.native_note import artifact_native_off, native_off  # lazy: start-up

    report["native_off"] = artifact_native_off(plan) if artifact else native_off(options.get("backends"), target)
    if artifact:  # who signed it, and whether that key's signature lets its native code run
        from nncc.trust.seal import describe  # lazy: start-up

        report["signature"] = describe(plan.seal, trust_key_file())
    else:
        report["signature"] = None  # compiled here: nothing signed it yet
    if artifact:
        report["cache"] = None  # an artifact is run as it is: the cache is not involved
    else:
        from nncc.cli.inspect_cache import cache_report  # lazy: start-up

        report["cache"] = cache_report(path, source, cache_options, cache_dir, trust_shared)
    if as_json:
        emit_json(report)
    else:
        from nncc.cli.render_inspect import print_report  # lazy: start-up

        print_report(report)
