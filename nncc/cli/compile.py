"""`nncc compile`: compile an ONNX model into one self-contained artifact."""

from __future__ import annotations

import time

import click

from nncc.cli.options import compile_options, options_dict
from nncc.cli.output import emit_json


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), required=True,
              metavar="OUT.nncc", help="Where to write the compiled artifact.")
@compile_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
def compile(model, output, preference, opt_level, backends, plugins, as_json):
    """Compile MODEL (.onnx) ahead of time into OUT.nncc (plan + constants + call info)."""
    import nncc

    start = time.perf_counter()
    compiled = nncc.compile_model(model, **options_dict(preference, opt_level, backends, plugins))
    data = compiled.to_bytes()
    compiled.save(output)
    seconds = time.perf_counter() - start
    if as_json:
        emit_json({"model": model, "output": output, "bytes": len(data), "compile_seconds": seconds})
    else:
        click.echo(f"compiled {model} -> {output} ({len(data):,} bytes) in {seconds * 1000:.0f} ms", err=True)
