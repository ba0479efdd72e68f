"""`nncc export`: a model as a self-contained C library (header, shared and static library,
weights, pkg-config file) that a C or C++ build links without Python.

The compile goes through the cache as `nncc compile`'s does (optimized stage: the native
code is the point); every file is written only when its content changes; ``--depfile``
names the model and its external data as the prerequisites of every file written.
"""

from __future__ import annotations

import os
import sys
import time

import click

from nncc.cli.cache_options import cache_options, report_cache
from nncc.cli.options import compile_options, dim_option, options_dict, parse_dims, verbosity_options
from nncc.cli.output import detail, emit_json, status
from nncc.util.units import format_bytes

MAX_NODES = 20  # nodes listed when a model cannot stand alone


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", type=click.Path(file_okay=False), required=True, metavar="DIR",
              help="The folder to write the library's files into (made if missing).")
@click.option("--name", default=None, metavar="NAME",
              help="The C prefix of the API and the files' name (default: the model file's name).")
@click.option("--embed-weights", is_flag=True,
              help="Put the weights inside the library instead of NAME.weights (small models).")
@click.option("--depfile", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write a Make dependency file: the exported files depend on MODEL and the "
                   "external data files it may read.")
@dim_option("Fix a symbolic input dimension to SIZE (an exported library has static shapes). Repeatable.")
@compile_options
@cache_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@verbosity_options
def export(model, output, name, embed_weights, depfile, dim_specs, preference, opt_level, backends, plugins,
           target, precision, cache_dir, no_cache, trust_shared, hash_mode, remote_url, as_json):
    """Export MODEL (.onnx) as a C library in DIR: NAME.h, libNAME.so, libNAME.a,
    NAME.weights, NAME.pc and a README with an example program.

    Only a model that runs entirely as native code can stand alone; any other is refused
    with the nodes that keep it from doing so. Exit codes: 0 exported (or up to date), 1
    failure, 2 usage error or bad input (a model that cannot stand alone included), 130
    interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
    from nncc.backends.native_options import native_options  # lazy: start-up
    from nncc.cli.progress import live_progress  # lazy: start-up
    from nncc.cli.sources import read_onnx_source  # lazy: start-up
    from nncc.export.writer import check_folder, check_name, default_name, export as export_model  # lazy: start-up
    from nncc.export.objects import compile_keeping  # lazy: start-up
    from nncc.model import prepare_plan, resolve_settings  # lazy: start-up
    from nncc.util import progress  # lazy: start-up
    from nncc.util.writable import check_writable  # lazy: start-up

    start = time.perf_counter()
    dims = parse_dims(dim_specs)
    name = check_name(name) if name is not None else default_name(model)
    check_folder(output)  # before any compile: a typo costs no time
    if depfile:
        check_writable(depfile, "the depfile")
    source = read_onnx_source(model)
    options = options_dict(preference, opt_level, backends, plugins, target, dims, precision)
    settings = resolve_settings(cache_dir, hash_mode, not no_cache, remote_url)

    def fixing(more):  # the options with the sizes ``more`` fixed besides --dim's (the batch's, at 1)
        return dict(options, dims={**dims, **more}) if more else options

    def prepare(objects, more):
        if no_cache:  # compiled here, its kernel objects kept for the link; no cache read or written
            from nncc.preparing.outcome import CacheOutcome, Prepared  # lazy: start-up
            from nncc.settings import bound_memory  # lazy: start-up

            started = time.perf_counter()
            bound_memory()
            plan = compile_keeping(model, source, fixing(more), settings.backend_options, objects)
            return Prepared(plan), CacheOutcome("disabled", None, time.perf_counter() - started)
        return prepare_plan(model, cache_dir=cache_dir, use_cache=not no_cache, model_bytes=source,
                            trust_shared=trust_shared, hash_mode=hash_mode, stage="optimized", settings=settings,
                            **fixing(more))

    def recompile(objects, more):
        return compile_keeping(model, source, fixing(more), settings.backend_options, objects)

    from nncc.export.standalone import NotExportable  # lazy: start-up

    try:
        with live_progress(), progress.task(f"exporting {os.path.basename(model)}"):
            result = export_model(model, output, name, prepare, native_options(settings.backend_options), embed_weights, recompile,
                                  bool(trust_shared or settings.trust_shared))
    except NotExportable as exc:
        if not exc.nodes:
            raise
        click.echo(f"nncc: error: {exc}", err=True)  # one line, then the nodes, one each
        for line in exc.nodes[:MAX_NODES]:
            click.echo(f"  {line}", err=True)
        if len(exc.nodes) > MAX_NODES:
            click.echo(f"  ... and {len(exc.nodes) - MAX_NODES} more", err=True)
        sys.exit(exc.exit_code)
    report_cache(result.outcome)
    if depfile:
        _write_depfile(depfile, model, source, list(result.files), cache_dir)
    seconds = time.perf_counter() - start
    if as_json:
        emit_json({"model": model, "output": output, "name": name, "files": result.files,
                   "written": result.written, "depfile": depfile, "export_seconds": seconds,
                   "cache": result.outcome.as_dict()})
    elif result.written:
        status(f"nncc: exported {model} -> {output} as {name} ({len(result.written)} file(s) written, "
               f"weights {format_bytes(result.weights_bytes)}) in {seconds * 1000:.0f} ms")
    else:
        status(f"nncc: {output} is up to date ({name}; unchanged, nothing rewritten)")


def _write_depfile(path: str, model: str, model_bytes: bytes, targets: list[str], cache_dir: str | None) -> None:
    """Every exported file depends on MODEL and the files the cache token hashes as its
    external data (nncc.preparing.token.external_files)."""
    from nncc.preparing.token import external_files  # lazy: start-up
    from nncc.util.buildfiles import depfile, write_if_changed  # lazy: start-up

    folder = os.path.dirname(model)
    skip = (cache_dir,) if cache_dir else ()
    extra = [os.path.join(folder, rel) for rel, _ in external_files(model, model_bytes, skip)]
    text = depfile(targets[0], [model, *extra])
    head, _, rest = text.partition(":")
    text = " ".join([head] + [t.replace(" ", "\\ ") for t in targets[1:]]) + ":" + rest
    write_if_changed(path, text.encode())
    detail(f"nncc: wrote {path} ({1 + len(extra)} prerequisite(s))")
