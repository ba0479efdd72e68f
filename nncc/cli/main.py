"""Entry point: the `nncc` command group, lazy subcommand loading and error handling.

Subcommands are imported only when invoked, so `nncc --help` and shell completion stay
fast. NnccErrors become one line on stderr; NNCC_DEBUG=1 shows the traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from nncc import __version__

COMMANDS = {
    "bench": ("nncc.cli.bench", "bench", "Measure compile, cache-hit load and steady-state speed."),
    "cache": ("nncc.cli.cache", "cache", "Inspect, verify and garbage-collect the compilation cache."),
    "compile": ("nncc.cli.compile", "compile", "Compile an ONNX model ahead of time into an artifact."),
    "inspect": ("nncc.cli.inspect", "inspect", "Show partitions, fallbacks, memory and constants."),
    "run": ("nncc.cli.run", "run", "Run a model or artifact on the numpy CPU backend."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nncc")
def cli():
    """nncc compiles ONNX models ahead of time, caches the results and runs them."""


def main(argv: list[str] | None = None) -> None:
    from nncc.errors import NnccError

    try:
        cli.main(args=argv, prog_name="nncc", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("nncc: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except NnccError as exc:
        if os.environ.get("NNCC_DEBUG"):
            raise
        click.echo(f"nncc: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("nncc: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug in nncc: still one line, unless debugging
        if os.environ.get("NNCC_DEBUG"):
            raise
        click.echo(
            f"nncc: internal error: {type(exc).__name__}: {exc} (NNCC_DEBUG=1 shows the traceback)",
            err=True,
        )
        sys.exit(1)
    sys.exit(0)
