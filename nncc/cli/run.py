"""`nncc run`: execute a model on given, file-loaded or random inputs."""

from __future__ import annotations

import os
import time
from itertools import repeat

import click

import nncc
from nncc.cli.cache_options import cache_options, report_cache
from nncc.cli.options import (compile_options, dim_option, options_dict, parse_dims, stage_option,
                              trust_native_option, verbosity_options, warn_compile_options_on_artifact)
from nncc.cli.output import detail, emit_json, print_outputs, status
from nncc.settings import bound_memory, cache_dir as resolve_cache_dir, value as setting


@click.command()
@click.argument("model", type=click.Path())  # a directory or missing file: nncc says so itself
@click.option("--input", "-i", "input_specs", multiple=True, metavar="NAME=FILE.npy",
              help="Feed input NAME from a .npy file (memory-mapped). Repeatable.")
@click.option("--inputs", "npz", type=click.Path(dir_okay=False), metavar="FILE.npz",
              help="Feed inputs from an .npz archive, by array name.")
@click.option("--random-inputs", is_flag=True, help="Feed seeded random values to inputs not given.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random-inputs.")
@click.option("--output", "-o", "output_path", type=click.Path(dir_okay=False), metavar="OUT.npz",
              help="Write all outputs to an .npz archive.")
@click.option("--output-dir", "output_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Write each output as DIR/NAME.npy (large static outputs are written in place, memory-mapped).")
@click.option("--bind", "binds", multiple=True, metavar="OUT=IN",
              help="Stateful run: output OUT of step k feeds input IN of step k+1. Repeatable.")
@click.option("--steps", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many steps to run (with --bind).")
@click.option("--inputs-per-step", "per_step_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="A folder with one .npz of inputs per step, in name order (step_000.npz, ...).")
@dim_option("Fix a symbolic input dimension: the model is compiled for that size, and "
            "--random-inputs makes inputs of it (default 1). Repeatable.")
@compile_options
@click.option("--threads", metavar="N",
              help="BLAS and native threads (default: run.threads in the config, else auto: the BLAS "
                   "library's own count). --preference low-power always runs on one.")
@stage_option()
@trust_native_option
@cache_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@verbosity_options
def run(model, input_specs, npz, random_inputs, seed, output_path, output_dir, binds, steps, per_step_dir,
        dim_specs, preference, opt_level, backends, plugins, target, precision, threads, stage, trust_native, cache_dir,
        no_cache, trust_shared, hash_mode, remote_url, as_json):
    """Run MODEL (an .onnx model, compiled on the fly through the cache, a compiled
    .nncc artifact, or a folder `nncc export` wrote)."""
    start = time.perf_counter()
    bound_memory()  # $NNCC_MAX_MEMORY bounds every input, model and plan this command reads
    # every argument is checked, and every input file read, before anything is compiled
    named_inputs, bound, dims = _check_arguments(input_specs, binds, dim_specs, steps, per_step_dir, output_path)
    _apply_threads(threads)  # before preparing: the native pool is sized like BLAS
    library = os.path.isdir(model)  # a folder nncc export wrote: its library runs as it was built
    source, artifact, inputs = (None, False, []) if library else _read_model(model, npz, input_specs, per_step_dir,
                                                                             cache_dir, output_path, output_dir)
    feeds, per_step = _load_feeds(npz, named_inputs, per_step_dir)
    outcome = None
    if library:
        session = nncc.load_library(model)
    elif artifact:
        session = _load_artifact(model, source, plugins, trust_native, dims)
    else:
        session, outcome = _prepare_model(model, source, preference, opt_level, backends, plugins, target, precision,
                                          dims, stage, cache_dir, no_cache, trust_shared, hash_mode, remote_url)
    if output_dir is not None:  # the output names are known now; nothing is written yet
        _refuse_clobbering(inputs, output_path, output_dir, session.output_names)
    prepared = time.perf_counter()
    stateful = bool(bound) or steps > 1 or per_step_dir is not None
    if random_inputs:
        _add_random_inputs(session, feeds, bound, per_step, seed, dims)
    for name, value in feeds.items():
        detail(f"nncc: input {name}: {getattr(value, 'dtype', '?')}{list(getattr(value, 'shape', ()))}")
    outputs = _execute(session, feeds, bound, steps, per_step, stateful, output_dir)
    finished = time.perf_counter()
    _write_outputs(session, outputs, output_path, output_dir, stateful)
    timing = {"prepare_seconds": prepared - start, "run_seconds": finished - prepared}
    if as_json:
        emit_json({"model": model, "outputs": summarize(outputs), "timing": timing,
                   "cache": outcome.as_dict() if outcome else None, "steps": steps,
                   "native_partitions": session.native_partitions,
                   "run_native_partitions": session.last_run_native_partitions})
    else:
        print_outputs(model, summarize(outputs), timing)


def _check_arguments(input_specs, binds, dim_specs, steps, per_step_dir, output_path):
    """The --input, --bind and --dim specs parsed, --steps and --output checked: (named
    inputs, bound states, dims)."""
    named_inputs = _parse_input_specs(input_specs)
    bound = _parse_binds(binds)
    dims = parse_dims(dim_specs)
    if steps > 1 and not bound and per_step_dir is None:
        raise click.BadParameter(f"{steps} steps without --bind would run the same inputs {steps} times; "
                                 "add --bind OUT=IN to carry state from step to step "
                                 "(or --inputs-per-step DIR)", param_hint="--steps")
    if output_path:
        from nncc.util.writable import check_writable  # lazy: start-up

        check_writable(output_path, "the --output file")
    return named_inputs, bound, dims


def _read_model(model, npz, input_specs, per_step_dir, cache_dir, output_path, output_dir):
    """MODEL's bytes (None while the cache may know it) and whether it is an artifact, and
    the files the run reads, once no output is found to overwrite one of them."""
    from nncc.util.files import read_source  # lazy: start-up

    # read once (MODEL may be a pipe), and a model file not at all when the cache knows it
    source, artifact = read_source(model, lazy_model=True)
    writes = bool(output_path) or output_dir is not None  # otherwise nothing can be overwritten
    if writes and source is None:
        source, artifact = read_source(model)
    inputs = _input_files(model, source, artifact, npz, input_specs, per_step_dir, cache_dir) if writes else []
    _refuse_clobbering(inputs, output_path, output_dir, None)
    return source, artifact, inputs


def _load_feeds(npz, named_inputs, per_step_dir):
    """The feeds given by --inputs and --input, and a lazy iterator over the step files."""
    from nncc.runtime.arrays_io import load_npy, load_npz  # lazy: start-up

    feeds = load_npz(npz) if npz else {}
    for name, path in named_inputs:
        feeds[name] = load_npy(path)
    per_step = None
    if per_step_dir is not None:
        from nncc.runtime.stepping import step_files  # lazy: start-up

        files = step_files(per_step_dir)
        per_step = (load_npz(path) for path in files)
    return feeds, per_step


def _load_artifact(model, source, plugins, trust_native, dims):
    warn_compile_options_on_artifact(model)
    # an artifact may name plugin kernels: only the plugins the user names are loaded
    from nncc.backends.registry import load_plugin  # lazy: start-up

    for module in plugins:
        load_plugin(module)
    session = nncc.load(source, trust_native=trust_native, name=model)
    if dims:  # the artifact is compiled: --dim sizes its symbolic inputs (random ones)
        from nncc.ir.dims import check_dim_names  # lazy: start-up

        check_dim_names(dims, session.input_infos, model)
    return session


def _prepare_model(model, source, preference, opt_level, backends, plugins, target, precision, dims, stage, cache_dir,
                   no_cache, trust_shared, hash_mode, remote_url):
    """An .onnx model compiled, or found in the cache: (session, cache outcome)."""
    from nncc.model import prepare, resolve_settings  # lazy: start-up
    from nncc.cli.progress import live_progress  # lazy: start-up
    from nncc.util import progress  # lazy: start-up

    from nncc.cli.native_note import say_why_native_is_off  # lazy: start-up

    options = options_dict(preference, opt_level, backends, plugins, target, dims, precision)
    say_why_native_is_off(backends, target)
    settings = resolve_settings(cache_dir, hash_mode, not no_cache, remote_url)  # once, flags first
    with live_progress(), progress.task(f"preparing {os.path.basename(model)}"):
        # the native stage, when due, is built by a detached worker that outlives this command
        session, outcome = prepare(model, cache_dir=cache_dir, use_cache=not no_cache, model_bytes=source,
                                   trust_shared=trust_shared, hash_mode=hash_mode, stage=stage,
                                   background="process", settings=settings, **options)
    report_cache(outcome)
    return session, outcome


def _add_random_inputs(session, feeds, bound, per_step, seed, dims) -> None:
    """--random-inputs: seeded values for the declared inputs nothing else provides."""
    from nncc.runtime.random_inputs import random_feeds  # lazy: start-up

    declared = session.input_infos
    state_inputs = set(bound.values())  # states start at zeros unless given
    missing = {k: v for k, v in declared.items() if k not in feeds and k not in state_inputs}
    if per_step is not None:
        missing = {}  # the step files provide them
    _report_default_dims(missing, dims)
    feeds.update(random_feeds(missing, seed, dims))


def _execute(session, feeds, bound, steps, per_step, stateful, output_dir):
    """The outputs of one run, or of the last step of a stateful one; a single run with
    --output-dir writes straight into its files."""
    if stateful:
        from nncc.runtime.stepping import run_steps  # lazy: start-up

        return run_steps(session, bound, steps, feeds, per_step if per_step is not None else repeat({}))
    if output_dir is not None:
        from nncc.runtime.arrays_io import OutputDir  # lazy: start-up

        with OutputDir(output_dir, session) as targets:
            outputs = session.run(feeds, outputs=targets.buffers)
            targets.finish(outputs)
        return outputs
    return session.run(feeds)


def _write_outputs(session, outputs, output_path, output_dir, stateful) -> None:
    """--output's archive; --output-dir's files when the steps did not write them in place."""
    if output_path:
        from nncc.runtime.arrays_io import save_npz  # lazy: start-up

        save_npz(output_path, outputs)
    if output_dir is not None and stateful:
        from nncc.runtime.arrays_io import OutputDir  # lazy: start-up

        with OutputDir(output_dir, session, mapped=False) as targets:
            targets.finish(outputs)


def _apply_threads(flag) -> None:
    """--threads, else $NNCC_THREADS, else run.threads: BLAS's count for this process."""
    count = setting("run.threads", flag, "--threads")
    if count:
        from nncc.util.threads import set_blas_threads  # lazy: start-up

        set_blas_threads(count)


def _input_files(model, source, artifact, npz, input_specs, per_step_dir, cache_dir) -> list[tuple[str, str]]:
    """Every file the run reads: the model (and its external data), the feeds."""
    from nncc.preparing.token import external_files  # lazy: start-up

    files = [("the model", model)]
    if not artifact:
        folder = os.path.dirname(model)
        files += [("the external data file", os.path.join(folder, rel)) for rel, _ in
                  external_files(model, source, (resolve_cache_dir(cache_dir),))]
    if npz:
        files.append(("the --inputs file", npz))
    for spec in input_specs:
        name, sep, path = spec.partition("=")
        if sep and path:
            files.append((f"the input {name}", path))
    if per_step_dir is not None and os.path.isdir(per_step_dir):
        files += [("the step inputs", os.path.join(per_step_dir, n)) for n in sorted(os.listdir(per_step_dir))]
    return files


def _refuse_clobbering(inputs, output_path, output_dir, output_names) -> None:
    """No output file may be an input, nor another output (``output_names``: the files
    --output-dir will write, once the model is known)."""
    from nncc.runtime.arrays_io import output_paths  # lazy: start-up
    from nncc.util.clobber import refuse_clobbering  # lazy: start-up

    outputs = [("the output", output_path)] if output_path else []
    if output_dir is not None and output_names is not None:
        outputs += [(f"the --output-dir file for {name}", path)
                    for name, path in output_paths(output_dir, output_names).items()]
    refuse_clobbering(inputs, outputs)


def _parse_input_specs(specs) -> list[tuple[str, str]]:
    named = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"expected NAME=FILE.npy, got {spec!r}", param_hint="--input")
        named.append((name, path))
    return named


def _report_default_dims(missing, dims) -> None:
    """Say which symbolic dimensions the random inputs take at their default size 1."""
    from nncc.ir.dims import symbolic_dims  # lazy: start-up

    defaulted = [d for d in symbolic_dims(missing) if d not in dims]
    if defaulted:
        names = ", ".join(defaulted)
        status(f"nncc: random inputs: symbolic dimension{'s' if len(defaulted) > 1 else ''} {names} "
               f"set to 1 (choose with --dim NAME=SIZE)")


def _parse_binds(binds) -> dict[str, str]:
    bound = {}
    for spec in binds:
        out, sep, inp = spec.partition("=")
        if not sep or not out or not inp:
            raise click.BadParameter(f"expected OUT=IN, got {spec!r}", param_hint="--bind")
        bound[out] = inp
    return bound


SUMMARY_CHUNK = 1 << 20  # elements converted to float64 at a time: the peak stays near the output's size

def summarize(outputs):
    import numpy as np  # lazy: start-up

    from nncc.ir.low_precision import widen  # lazy: start-up

    rows = []
    for name, value in outputs.items():
        if not isinstance(value, np.ndarray):  # a sequence: its length, and its elements' stats
            if value is None:
                rows.append({"name": name, "shape": [], "dtype": "optional (empty)"})
                continue
            dtypes = sorted({str(v.dtype) for v in value})
            flat = [v.reshape(-1) for v in value if v.dtype.kind in "fiub"]
            value_stats = np.concatenate(flat) if flat and len(flat) == len(value) else np.zeros(0)
            row = {"name": name, "shape": [len(value)], "dtype": f"sequence of {'/'.join(dtypes) or '?'}"}
            row.update(_statistics(value_stats) if value_stats.size else {})
            rows.append(row)
            continue
        row = {"name": name, "shape": list(value.shape), "dtype": str(value.dtype)}
        value = widen(value)  # bfloat16, float8, int4...: their values in a numpy type
        if value.size and value.dtype.kind in "fiub":
            row.update(_statistics(value))
        rows.append(row)
    return rows


def _statistics(value) -> dict:
    """min, max, mean and std of the finite values (float64), and how many are not finite;
    made a chunk at a time, so a 1 GiB output does not cost several GiB of float64 copies."""
    import numpy as np  # lazy: start-up

    flat = value.reshape(-1)
    chunks = [flat[i:i + SUMMARY_CHUNK] for i in range(0, flat.size, SUMMARY_CHUNK)]

    def finite(chunk):
        data = chunk.astype(np.float64)
        return data[np.isfinite(data)]

    if len(chunks) == 1:  # one pass, exactly as numpy computes it
        values = finite(flat)
        count, total, low, high = values.size, None, None, None
    else:
        count, total, low, high = 0, 0.0, np.inf, -np.inf
        for chunk in chunks:
            values = finite(chunk)
            if values.size:
                count += values.size
                total += float(values.sum())
                low, high = min(low, float(values.min())), max(high, float(values.max()))
    if not count:
        return dict(min=None, max=None, mean=None, std=None, nonfinite=int(flat.size))
    if total is None:
        return dict(min=float(values.min()), max=float(values.max()), mean=float(values.mean()),
                    std=float(values.std()), nonfinite=int(flat.size - count))
    mean = total / count
    squares = sum(float(np.square(finite(chunk) - mean).sum()) for chunk in chunks)
    return dict(min=low, max=high, mean=mean, std=(squares / count) ** 0.5, nonfinite=int(flat.size - count))
