"""`nncc inspect`: partitions, fallbacks, memory and constants of a model or artifact."""

from __future__ import annotations

import click

from nncc.cli.options import compile_options, options_dict, stage_option, verbosity_options
from nncc.cli.output import emit_json


@click.command()
@click.argument("path", type=click.Path(dir_okay=False))
@compile_options
@stage_option(default="optimized", help_default="optimized, as nncc compile builds")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@verbosity_options
def inspect(path, preference, opt_level, backends, plugins, target, stage, as_json):
    """Show how PATH (.onnx, compiled on the fly, or .nncc) is partitioned and laid out."""
    from nncc.report import describe_plan
    from nncc.util.files import read_source

    source, artifact = read_source(path)  # read once: PATH may be a pipe
    if artifact:
        # the artifact may name plugin kernels: only the plugins the user names are loaded
        from nncc.backends.registry import load_plugin

        for module in plugins:
            load_plugin(module)
        from nncc.plan.format import deserialize

        # the plan alone: inspect describes constants, memory and native code; it never
        # expands, allocates or loads them
        plan, size = deserialize(source), len(source)
    else:
        import os

        from nncc.cli.progress import live_progress
        from nncc.model import compile_plan
        from nncc.util import progress

        options = options_dict(preference, opt_level, backends, plugins, target)
        from nncc.compiler import CompileOptions

        if stage == "quick":  # the portable plan a cache miss stores first
            options["backends"] = tuple(b for b in options.get("backends", CompileOptions.backends) if b != "native")
        with live_progress(), progress.task(f"compiling {os.path.basename(path)}"):
            plan = compile_plan(path, source, options)
        if stage == "quick":
            plan.options["stage"] = stage
        from nncc.plan.format import serialize

        size = len(serialize(plan))
    report = describe_plan(plan, size)
    report["path"] = path
    if as_json:
        emit_json(report)
    else:
        from nncc.cli.render_inspect import print_report

        print_report(report)
