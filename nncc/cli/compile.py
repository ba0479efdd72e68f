"""`nncc compile`: compile an ONNX model into one self-contained artifact.

Make-friendly: the artifact is written (atomically) only when its content changes, so an
unchanged recompile leaves the file and its mtime alone (``--force`` rewrites it anyway);
``--depfile FILE`` writes a Make dependency file; stdout carries nothing but ``--json``.
"""

from __future__ import annotations

import os
import time

import click

from nncc.cli.cache_options import cache_options, report_cache
from nncc.cli.options import (compile_options, dim_option, options_dict, parse_dim_lists, precision_check_options,
                               stage_option, verbosity_options)
from nncc.cli.output import detail, emit_json, status
from nncc.compiler import CompileOptions
from nncc.preparing.deviation import PLAN_KEY, summary
from nncc.settings import cache_dir as resolve_cache_dir
from nncc.util.units import format_bytes


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
              metavar="OUT.nncc", help="Where to write the compiled artifact (required, except with a --dim "
                                       "that lists several sizes, whose plans go to the cache only).")
@click.option("--depfile", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write a Make dependency file: OUT.nncc depends on MODEL and the external "
                   "data files it may read.")
@dim_option("Fix a symbolic input dimension to SIZE: the artifact is compiled for that size "
            "(static shapes plan ahead and run faster). NAME=SIZE,SIZE,... lists sizes: every "
            "combination of the listed sizes is compiled into the cache (no -o), as a run at that "
            "shape or a prepare with those dims finds it. Repeatable, one per name.")
@click.option("--force", is_flag=True,
              help="Rewrite OUT.nncc even when its content is unchanged (gives it a new mtime).")
@compile_options
@precision_check_options
@stage_option(default="optimized", help_default="optimized")
@cache_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@verbosity_options
def compile(model, output, depfile, force, dim_specs, preference, opt_level, backends, plugins, target, precision,
            tolerance, calibration, stage, cache_dir,
            no_cache, trust_shared, hash_mode, remote_url, as_json):
    """Compile MODEL (.onnx) ahead of time into OUT.nncc (plan + constants + call info).

    The compilation cache is used (and filled) unless --no-cache is given. OUT.nncc is
    written only when its content changes, so `make` does not redo what depends on it.
    Exit codes: 0 compiled (or up to date), 1 failure, 2 usage error or bad input, 130
    interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
    from nncc.cli.progress import live_progress  # lazy: start-up
    from nncc.cli.sources import read_onnx_source  # lazy: start-up
    from nncc.model import artifact_bytes, prepare_plan, refuse_unloadable, resolve_settings  # lazy: start-up
    from nncc.util import progress  # lazy: start-up
    from nncc.util.buildfiles import write_if_changed  # lazy: start-up
    from nncc.util.writable import check_writable  # lazy: start-up

    start = time.perf_counter()
    lists = parse_dim_lists(dim_specs)
    if any(len(sizes) > 1 for sizes in lists.values()):
        return _compile_size_lists(model, lists, output, depfile, force, no_cache, as_json, start, stage,
                                   dict(cache_dir=cache_dir, trust_shared=trust_shared, hash_mode=hash_mode),
                                   remote_url, options_dict(preference, opt_level, backends, plugins, target, None,
                                                            precision, tolerance, calibration))
    if output is None:
        raise click.MissingParameter(ctx=click.get_current_context(), param_type="option",
                                     param_hint="'-o' / '--output'")
    dims = {name: sizes[0] for name, sizes in lists.items()}
    check_writable(output, "the artifact")  # before any compile: a typo costs no time
    if depfile:
        check_writable(depfile, "the depfile")
    source = read_onnx_source(model)  # read once: MODEL may be a pipe
    _refuse_clobbering(model, source, output, depfile, cache_dir)
    options = options_dict(preference, opt_level, backends, plugins, target, dims, precision, tolerance, calibration)

    detail(f"nncc: options: preference={options['preference']} -O{opt_level} "
           f"backends={','.join(backends or CompileOptions.backends)} target={target}"
           + (f" precision={options['precision']}" if "precision" in options else "")
           + (f" plugins={','.join(plugins)}" if plugins else "")
           + (f" dims={','.join(f'{k}={v}' for k, v in dims.items())}" if dims else ""))
    from nncc.cli.native_note import say_why_native_is_off  # lazy: start-up

    say_why_native_is_off(backends, target)
    settings = resolve_settings(cache_dir, hash_mode, not no_cache, remote_url)  # once, flags first
    with live_progress(), progress.task(f"compiling {os.path.basename(model)}"):
        # the plan is written, never built to run: no native code is loaded, nothing allocated
        prepared, outcome = prepare_plan(model, cache_dir=cache_dir, use_cache=not no_cache, model_bytes=source,
                                         trust_shared=trust_shared, hash_mode=hash_mode, stage=stage,
                                         settings=settings, **options)
        refuse_unloadable(prepared, prepared.origin)
        data = artifact_bytes(prepared)
    report_cache(outcome)
    written = write_if_changed(output, data, force=force)
    if depfile:
        _write_depfile(depfile, model, source, output, outcome.directory)
    seconds = time.perf_counter() - start
    check = prepared.plan.options.get(PLAN_KEY)
    if as_json:
        emit_json({"model": model, "output": output, "bytes": len(data), "written": written,
                   "depfile": depfile, "compile_seconds": seconds, "cache": outcome.as_dict(),
                   **({"precision_check": check} if check else {})})
        return
    if check:
        status(f"nncc: {summary(check)}")
    if written:
        status(f"nncc: compiled {model} -> {output} ({format_bytes(len(data))}) in {seconds * 1000:.0f} ms")
    else:
        status(f"nncc: {output} is up to date ({format_bytes(len(data))}, unchanged; not rewritten)")


def _compile_size_lists(model, lists: dict, output, depfile, force, no_cache, as_json, start, stage,
                        cache_args: dict, remote_url, options: dict) -> None:
    """--dim NAME=SIZE,SIZE,...: one cache entry per combination of the listed sizes, each
    the one ``nncc.prepare(MODEL, stage="optimized", dims=combination)`` builds; no artifact
    is written (which one would it be?), so -o, --depfile, --force and --no-cache are
    refused before any work."""
    from nncc.cli.progress import live_progress  # lazy: start-up
    from nncc.cli.sources import read_onnx_source  # lazy: start-up
    from nncc.model import prepare_plan, resolve_settings  # lazy: start-up
    from nncc.preparing.size_lists import combinations, prepare_each  # lazy: start-up
    from nncc.util import progress  # lazy: start-up

    for given, flag in ((output, "-o"), (depfile, "--depfile"), (force, "--force"), (no_cache, "--no-cache")):
        if given:
            raise click.UsageError(f"{flag} cannot be used with a --dim that lists several sizes: their plans "
                                   f"go to the cache, one entry per combination (compile one size to write "
                                   f"an artifact)")
    source = read_onnx_source(model)  # read once: MODEL may be a pipe
    settings = resolve_settings(cache_args["cache_dir"], cache_args["hash_mode"], True, remote_url)
    count = len(combinations(lists))
    detail(f"nncc: {count} plan(s) for " + " ".join(f"{n}={','.join(map(str, s))}" for n, s in lists.items()))
    entries = []

    def prepare_one(path, **kwargs):
        shown = " ".join(f"{n}={v}" for n, v in kwargs["dims"].items())
        began = time.perf_counter()
        with progress.task(f"compiling {os.path.basename(model)} for {shown}"):
            prepared, outcome = prepare_plan(path, **kwargs)
        status(f"nncc: {shown}: {_described(outcome)} in {(time.perf_counter() - began) * 1000:.0f} ms")
        entries.append({"dims": dict(kwargs["dims"]), "cache": outcome.as_dict()})
        return prepared, outcome

    with live_progress():
        prepare_each(model, lists, prepare_one, model_bytes=source, settings=settings,
                     **({"stage": stage} if stage else {}), **cache_args, **options)
    seconds = time.perf_counter() - start
    if as_json:
        emit_json({"model": model, "output": None, "entries": entries, "compile_seconds": seconds})
    else:
        status(f"nncc: {len(entries)} plan(s) of {model} in the cache in {seconds * 1000:.0f} ms")


def _described(outcome) -> str:
    """One entry's cache outcome in a few words: "cache miss (optimized stage), token 0123456789ab"."""
    what = {"hit": "cache hit", "miss": "cache miss, compiled and stored", "remote hit": "remote hit",
            "recompiled": "entry rejected, recompiled and stored"}.get(outcome.outcome, f"cache {outcome.outcome}")
    stage = f" ({outcome.stage} stage)" if outcome.stage else ""
    token = f", token {outcome.token[:12]}" if outcome.token else ""
    return what + stage + token


def _refuse_clobbering(model: str, model_bytes: bytes, output: str, depfile: str | None, cache_dir) -> None:
    """Before any work: neither output may be the model, one of its external data files,
    or the other output."""
    from nncc.preparing.token import external_files  # lazy: start-up
    from nncc.util.clobber import refuse_clobbering  # lazy: start-up

    folder = os.path.dirname(model)
    extra = [os.path.join(folder, rel) for rel, _ in
             external_files(model, model_bytes, (resolve_cache_dir(cache_dir),))]
    refuse_clobbering([("the model", model)] + [("the external data file", p) for p in extra],
                      [("the output", output)] + ([("the depfile", depfile)] if depfile else []))


def _write_depfile(path: str, model: str, model_bytes: bytes, output: str, cache_dir: str | None) -> None:
    """OUT.nncc depends on MODEL and every file that can change it as external data: the
    same files the cache token hashes (nncc.preparing.token.external_files)."""
    from nncc.preparing.token import external_files  # lazy: start-up
    from nncc.util.buildfiles import depfile, write_if_changed  # lazy: start-up

    folder = os.path.dirname(model)
    skip = (cache_dir,) if cache_dir else ()
    extra = [os.path.join(folder, rel) for rel, _ in external_files(model, model_bytes, skip)]
    write_if_changed(path, depfile(output, [model, *extra]).encode())
    detail(f"nncc: wrote {path} ({1 + len(extra)} prerequisite(s))")
