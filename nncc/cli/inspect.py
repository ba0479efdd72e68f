"""`nncc inspect`: partitions, fallbacks, memory and constants of a model or artifact."""

from __future__ import annotations

import click

from nncc.cli.options import compile_options, options_dict, verbosity_options
from nncc.cli.output import emit_json


@click.command()
@click.argument("path", type=click.Path(dir_okay=False))
@compile_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@verbosity_options
def inspect(path, preference, opt_level, backends, plugins, target, as_json):
    """Show how PATH (.onnx, compiled on the fly, or .nncc) is partitioned and laid out."""
    import os

    import nncc
    from nncc.report import describe_plan
    from nncc.cli.sources import is_artifact

    if is_artifact(path):
        # the artifact may name plugin kernels: only the plugins the user names are loaded
        from nncc.backends.registry import load_plugin

        for module in plugins:
            load_plugin(module)
        from nncc.model import read_artifact

        plan, size = read_artifact(path), os.path.getsize(path)  # described, never run
    else:
        from nncc.cli.progress import live_progress
        from nncc.util import progress

        with live_progress(), progress.task(f"compiling {os.path.basename(path)}"):
            model = nncc.compile_model(path, **options_dict(preference, opt_level, backends, plugins, target))
        plan, size = model.plan, len(model.to_bytes())
    report = describe_plan(plan, size)
    report["path"] = path
    if as_json:
        emit_json(report)
    else:
        from nncc.cli.render_inspect import print_report

        print_report(report)
