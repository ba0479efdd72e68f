"""Click options shared by the commands: compile options, and -q/-v on every command."""

from __future__ import annotations

import click

PREFERENCES = ("fast-single-answer", "sustained-speed", "low-power")
TARGETS = ("native", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")  # as nncc.native.toolchain


def compile_options(command):
    """Decorate ``command`` with --preference, -O, --backend and --plugin."""
    for decorator in reversed([
        click.option("--preference", type=click.Choice(PREFERENCES), default="fast-single-answer",
                     show_default=True, help="NNAPI-style execution preference; it changes what is compiled."),
        click.option("-O", "opt_level", type=click.IntRange(0, 2), default=2, show_default=True,
                     help="Optimization level: 0 none, 1 folding and cleanup, 2 fusions too."),
        click.option("--backend", "backends", multiple=True, metavar="NAME",
                     help="Backend to offer nodes to, in priority order (default: native, then numpy; "
                          "native needs a C compiler). Repeatable."),
        click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
                     help="Python module registering custom ops and backends. Repeatable."),
        click.option("--target", type=click.Choice(TARGETS), default="native", show_default=True,
                     help="ISA the native backend builds for: this CPU's own, or an x86-64 level."),
    ]):
        command = decorator(command)
    return command


def options_dict(preference, opt_level, backends, plugins, target="native") -> dict:
    options = {"preference": preference, "opt_level": opt_level, "plugins": tuple(plugins), "target": target}
    if backends:  # else the library's default: native where a compiler is found, then numpy
        options["backends"] = tuple(backends)
    return options


def stage_option(default=None, help_default="quick on a miss, optimized in the background once used often"):
    """--stage quick|optimized: force a cache entry's stage (nncc/cache/stages.py)."""
    def decorate(command):
        return click.option("--stage", type=click.Choice(["quick", "optimized"]), default=default,
                            help=f"Cache entry stage: quick (portable plan, no C compiler) or optimized "
                                 f"(native code, built now). Default: {help_default}.")(command)
    return decorate


def trust_native_option(command):
    return click.option("--trust-native", is_flag=True,
                        help="Run an artifact's native code (it runs whoever built the file); "
                             "without it the artifact's portable plan runs.")(command)


def _set_verbosity(level: int):
    def callback(ctx, param, value):
        if value:
            from nncc.cli.output import VERBOSITY_KEY

            ctx.meta[VERBOSITY_KEY] = level  # ctx.meta is shared by the group and its commands
        return value

    return callback


def verbosity_options(command):
    """Decorate a group or command with -q/--quiet and -v/--verbose.

    Both the root group and every command take them, so `nncc -q run ...` and
    `nncc run ... -q` mean the same; the option given last on the command line wins.
    """
    command = click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_set_verbosity(1),
                           help="Print more status detail on stderr.")(command)
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_verbosity(-1),
                        help="Print no status lines on stderr (only requested output, warnings, errors).")(command)
