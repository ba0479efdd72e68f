"""`nncc compile`: compile an ONNX model into one self-contained artifact."""

from __future__ import annotations

import time

import click

from nncc.cli.cache import cache_options, report_cache
from nncc.cli.options import compile_options, options_dict
from nncc.cli.output import emit_json


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), required=True,
              metavar="OUT.nncc", help="Where to write the compiled artifact.")
@compile_options
@cache_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
def compile(model, output, preference, opt_level, backends, plugins, cache_dir, no_cache, as_json):
    """Compile MODEL (.onnx) ahead of time into OUT.nncc (plan + constants + call info).
    The compilation cache is used (and filled) unless --no-cache is given."""
    from nncc.cache.store import artifact_bytes
    from nncc.model import prepare
    from nncc.util.atomic import write_atomic

    start = time.perf_counter()
    options = options_dict(preference, opt_level, backends, plugins)
    compiled, outcome = prepare(model, cache_dir=cache_dir, use_cache=not no_cache, **options)
    report_cache(outcome)
    data = artifact_bytes(compiled)
    write_atomic(output, data)
    seconds = time.perf_counter() - start
    if as_json:
        emit_json({"model": model, "output": output, "bytes": len(data), "compile_seconds": seconds,
                   "cache": outcome.as_dict()})
    else:
        click.echo(f"compiled {model} -> {output} ({len(data):,} bytes) in {seconds * 1000:.0f} ms", err=True)
