"""Click options shared by the commands: compile options, and -q/-v on every command."""

from __future__ import annotations

import click
from click.core import ParameterSource

from nncc.settings import value
from nncc.settings import PRECISIONS, PREFERENCES  # the one lists the settings check too
TARGETS = ("native", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")  # as nncc.native.toolchain


def compile_options(command):
    """Decorate ``command`` with --preference, -O, --backend, --plugin, --target and --precision."""
    for decorator in reversed([
        click.option("--preference", type=click.Choice(PREFERENCES), default=None,
                     help="NNAPI-style execution preference; it changes what is compiled. "
                          "[default: run.preference in the config, else fast-single-answer]"),
        click.option("-O", "opt_level", type=click.IntRange(0, 2), default=2, show_default=True,
                     help="Optimization level: 0 none, 1 folding and cleanup, 2 fusions too."),
        click.option("--backend", "backends", multiple=True, metavar="NAME",
                     help="Backend to offer nodes to, in priority order (default: native, then numpy; "
                          "native needs a C compiler). Repeatable."),
        click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
                     help="Python module registering custom ops and backends. Repeatable."),
        click.option("--target", type=click.Choice(TARGETS), default="native", show_default=True,
                     help="ISA the native backend builds for: this CPU's own, or an x86-64 level."),
        click.option("--precision", type=click.Choice(PRECISIONS), default=None,
                     help="Arithmetic of native products by constant weights: f32 (exact), bf16 "
                          "(~3 significant digits: with AVX-512 BF16 inputs rounded to bfloat16, about "
                          "2x faster; elsewhere weights stored as bfloat16, half their bytes), or auto "
                          "(bf16, the layers that cost the most accuracy kept f32 within --tolerance). "
                          "[default: native.precision in the config, else f32]"),
    ]):
        command = decorator(command)
    return command


def precision_check_options(command):
    """Decorate ``command`` with --tolerance and --calibration: what a precision below
    float32 may cost, and the inputs it is measured on (nncc.preparing.calibration)."""
    for decorator in reversed([
        click.option("--tolerance", type=float, default=None, metavar="X",
                     help="Fail (exit 2) when an output deviates from float32 by more than X "
                          "(max |a-b| / max |a|); with --precision auto, the deviation layers "
                          "stay float32 to keep within. [default: none; 0.01 for auto]"),
        click.option("--calibration", type=click.Path(file_okay=False), default=None, metavar="DIR",
                     help="Measure the deviation on the .npz feeds in DIR (one per file, arrays "
                          "named as the inputs) instead of random inputs."),
    ]):
        command = decorator(command)
    return command


def options_dict(preference, opt_level, backends, plugins, target="native", dims=None, precision=None,
                 tolerance=None, calibration=None) -> dict:
    """The compile options; a --preference or --precision not given comes from the settings
    ($NNCC_PREFERENCE, else run.preference in the config file, else fast-single-answer;
    $NNCC_PRECISION, else native.precision, else f32)."""
    preference = value("run.preference", preference, "--preference")
    options = {"preference": preference, "opt_level": opt_level, "plugins": tuple(plugins), "target": target}
    precision = value("native.precision", precision, "--precision")
    if precision != "f32":  # else the library's default
        options["precision"] = precision
    if tolerance is not None:
        options["tolerance"] = tolerance
    if calibration is not None:
        options["calibration"] = calibration
    if backends:  # else the library's default: native where a compiler is found, then numpy
        options["backends"] = tuple(backends)
    if dims:  # fixed symbolic input dimensions: a different compile (and cache entry)
        options["dims"] = dict(dims)
    return options


def dim_option(help_text: str):
    return click.option("--dim", "dim_specs", multiple=True, metavar="NAME=SIZE", help=help_text)


def parse_dims(specs) -> dict[str, int]:
    """--dim NAME=SIZE options as a dict; a malformed one is a usage error."""
    dims = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        try:
            size = int(value)
        except ValueError:
            size = -1
        if not sep or not name or size < 0:
            raise click.BadParameter(f"expected NAME=SIZE with a non-negative SIZE, got {spec!r}",
                                     param_hint="--dim")
        dims[name] = size
    return dims


def parse_dim_lists(specs) -> dict[str, list[int]]:
    """``nncc compile``'s --dim NAME=SIZE[,SIZE...] options: each name with its sizes, whole
    numbers from 1 (a plan of a zero size plans nothing). A malformed one, or a name given
    twice, is a usage error naming the option."""
    dims: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, listed = spec.partition("=")
        name = name.strip()
        sizes = []
        for text in listed.split(","):
            text = text.strip()
            sizes.append(int(text) if text.isdecimal() else 0)  # isdecimal: no sign, no space, no '_'
        if not sep or not name or not listed.strip() or min(sizes) < 1:
            raise click.BadParameter(f"expected NAME=SIZE or NAME=SIZE,SIZE,... with sizes from 1, got {spec!r}",
                                     param_hint="--dim")
        if name in dims:
            raise click.BadParameter(f"dimension {name!r} is given twice; list its sizes in one --dim "
                                     f"(NAME=SIZE,SIZE,...)", param_hint="--dim")
        dims[name] = list(dict.fromkeys(sizes))
    return dims


# the compile options an artifact cannot honour: it is compiled already (--plugin still
# loads the modules its kernels may come from)
_COMPILE_ONLY = {"preference": "--preference", "opt_level": "-O", "backends": "--backend", "target": "--target",
                 "precision": "--precision"}


def warn_compile_options_on_artifact(path: str) -> None:
    """One warning naming the compile options given on the command line for an artifact,
    which ignores them (they were fixed when it was compiled). Defaults, wherever they
    come from, are not the user asking for anything."""
    from nncc.util.notice import warn  # lazy: start-up

    ctx = click.get_current_context()
    given = [flag for name, flag in _COMPILE_ONLY.items()
             if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]
    if given:
        warn(f"{', '.join(given)} ignored: {path} is a compiled artifact, its options were fixed "
             "when it was compiled; pass them to `nncc compile` with the .onnx model instead")


def stage_option(default=None, help_default="quick on a miss, whose optimized stage is then built in the "
                                            "background (cache.upgrade_after)"):
    """--stage quick|optimized: force a cache entry's stage (nncc/preparing/stages.py)."""
    def decorate(command):
        return click.option("--stage", type=click.Choice(["quick", "optimized"]), default=default,
                            help=f"Cache entry stage: quick (portable plan, no C compiler) or optimized "
                                 f"(native code, built now). Default: {help_default}.")(command)
    return decorate


def trust_native_option(command):
    return click.option("--trust-native", is_flag=True,
                        help="Run an artifact's native code even when it is not signed by your key "
                             "(it runs whoever built the file); without it such an artifact's "
                             "portable plan runs.")(command)


def _set_verbosity(level: int):
    def callback(ctx, param, value):
        if value:
            from nncc.cli.output import VERBOSITY_KEY  # lazy: start-up

            ctx.meta[VERBOSITY_KEY] = level  # ctx.meta is shared by the group and its commands
        return value

    return callback


CACHE_DIR_KEY = "nncc.cache_dir"  # in ctx.meta: `nncc --cache-dir DIR COMMAND ...`


def root_cache_dir_option(command):
    """--cache-dir before the command name: the default of every command's --cache-dir."""

    def remember(ctx, param, value):
        if value is not None:
            ctx.meta[CACHE_DIR_KEY] = value
        return value

    return click.option("--cache-dir", type=click.Path(), metavar="DIR", expose_value=False, callback=remember,
                        help="Compilation cache directory for the command (as its own --cache-dir).")(command)


def command_cache_dir(ctx, param, value):
    """A command's --cache-dir, else the one given before the command name."""
    return value if value is not None else ctx.meta.get(CACHE_DIR_KEY)


def verbosity_options(command):
    """Decorate a group or command with -q/--quiet and -v/--verbose.

    Both the root group and every command take them, so `nncc -q run ...` and
    `nncc run ... -q` mean the same; the option given last on the command line wins.
    """
    command = click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_set_verbosity(1),
                           help="Print more status detail on stderr.")(command)
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_verbosity(-1),
                        help="Print no status lines on stderr (only requested output, warnings, errors).")(command)
