"""Entry point: the `nncc` command group, lazy subcommand loading and error handling.

Subcommands are imported only when invoked, so `nncc --help` and shell completion stay
fast (completing a command name imports nothing). Every user error -- an NnccError or a
click usage error -- becomes one line `nncc: error: ...` on stderr, with a hint where one
helps; NNCC_DEBUG=1 shows the traceback instead.

Exit codes: 0 success, 1 failure (a problem found, an internal error), 2 usage or bad
input (a bad option, a missing or malformed file), 130 interrupted (SIGINT, Ctrl-C), 143
terminated (SIGTERM).

SIGTERM is turned into the same orderly exit as Ctrl-C: an exception that unwinds the
command, so temp files and half-written cache entries are removed and a progress display
gives the terminal its cursor back, as on any other exit path.
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import sys
import threading

import click

from nncc import __version__
from nncc.cli.options import root_cache_dir_option, verbosity_options
from nncc.errors import FileAccessError, NnccError

COMMANDS = {
    "bench": ("nncc.cli.bench", "bench", "Measure compile, cache-hit load and steady-state speed."),
    "cache": ("nncc.cli.cache", "cache", "Inspect, verify and garbage-collect the compilation cache."),
    "compile": ("nncc.cli.compile", "compile", "Compile an ONNX model ahead of time into an artifact."),
    "config": ("nncc.cli.config", "config", "Show and edit settings (config.toml, environment, defaults)."),
    "export": ("nncc.cli.export", "export", "Export a model as a C library (header, .so, .a, weights)."),
    "inspect": ("nncc.cli.inspect", "inspect", "Show partitions, fallbacks, memory and constants."),
    "run": ("nncc.cli.run", "run", "Run a model or artifact on the native and numpy backends."),
}


EXIT_CODES = ("Exit codes: 0 success, 1 failure, 2 usage error or bad input, 130 interrupted (Ctrl-C), "
              "143 terminated (SIGTERM).")


def _with_exit_codes(command):
    """Every command's --help ends with the exit codes (its own text may say more about 1
    and 2), so that 130 and 143 are documented where people look."""
    if command.epilog is None and "130" not in (command.help or ""):
        command.epilog = EXIT_CODES
    for sub in getattr(command, "commands", {}).values():
        _with_exit_codes(sub)
    return command


# click >= 8.2 raises this for a group called without a command; it shows the help.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:  # listed but not part of this installation
                return None
            raise
        return _with_exit_codes(getattr(loaded, attr))

    def shell_complete(self, ctx, incomplete):
        """Complete command names from the table (importing no command), then options."""
        from click.shell_completion import CompletionItem  # lazy: start-up

        items = [CompletionItem(name, help=COMMANDS[name][2]) for name in self.list_commands(ctx)
                 if name.startswith(incomplete)]
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nncc")
@verbosity_options
@root_cache_dir_option
def cli():
    """nncc compiles ONNX models ahead of time, caches the results and runs them.

    -q/--quiet, -v/--verbose and --cache-dir work before the command name (for every
    command) or after it. Exit codes: 0 success, 1 failure, 2 usage error or bad input, 130
    interrupted (Ctrl-C), 143 terminated (SIGTERM).
    """


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that every cleanup runs."""


def _terminate(signum, frame):
    raise Terminated()


class _sigterm_as_interrupt:
    """Install the SIGTERM handler for one main() call (the main thread only), and put the
    previous one back afterwards (in-process callers such as the tests keep theirs)."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, _terminate)

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def main(argv: list[str] | None = None) -> None:
    with _sigterm_as_interrupt():
        _main(argv)


def _main(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="nncc", standalone_mode=False)
    except Terminated:
        click.echo("nncc: terminated", err=True)
        sys.exit(143)
    except click.exceptions.Abort as exc:  # click turns an interrupt inside a command into Abort
        if isinstance(exc.__cause__, Terminated):
            click.echo("nncc: terminated", err=True)
            sys.exit(143)
        click.echo("nncc: interrupted" if isinstance(exc.__cause__, KeyboardInterrupt) else "nncc: aborted",
                   err=True)
        sys.exit(130)
    except _NO_ARGS_IS_HELP as exc:  # `nncc`, `nncc cache`: show the help
        exc.show()
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        if os.environ.get("NNCC_DEBUG"):
            raise
        hint = _usage_hint(exc, sys.argv[1:] if argv is None else argv)
        click.echo(f"nncc: error: {_usage_message(exc)}" + (f" (hint: {hint})" if hint else ""), err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except NnccError as exc:
        if os.environ.get("NNCC_DEBUG"):
            raise
        hint = _hint(exc)
        click.echo(f"nncc: error: {_one_line(str(exc))}" + (f" (hint: {hint})" if hint else ""), err=True)
        sys.exit(exc.exit_code)
    except Terminated:
        click.echo("nncc: terminated", err=True)
        sys.exit(143)
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


def program() -> None:
    """The ``nncc`` program (the console script and ``python -m nncc``): ``main()``, then
    exit without tearing the interpreter down. The commands close what they open (files,
    the cache index, mappings, progress displays); what is left is finalization, which
    only frees memory and unloads modules: 40-50 ms of every short run (a cache hit, a
    Makefile step). Before that fast exit, everything others may own is flushed as a normal
    exit would: threads that are not daemons are waited for, the ``atexit`` handlers run
    (plugins' finalizers, ``logging``'s flush), then stdout and stderr are flushed. With
    NNCC_DEBUG, or when an exception escapes (a traceback is wanted), Python exits as
    usual. ``main()`` itself is what in-process callers and tests use."""
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:  # pragma: no cover - main() always ends in sys.exit
        code = 0
    if os.environ.get("NNCC_DEBUG"):
        sys.exit(code)
    if not isinstance(code, int):
        if code is not None:
            sys.stderr.write(f"{code}\n")
        code = 0 if code is None else 1
    _finish_like_exit()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a reader that went away (`nncc ... | head`), a closed stream: nothing to add
    os._exit(code)


def _finish_like_exit() -> None:
    """What interpreter shutdown does before finalizing: join non-daemon threads, then
    run the atexit handlers (an exception in one is reported, as Python does, and the
    others still run)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _usage_message(exc: click.ClickException) -> str:
    """click's message in nncc's style: one line, lower-case start, no final period."""
    text = _one_line(exc.format_message())
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        text = text[0].lower() + text[1:]
    return text


def _usage_hint(exc: click.ClickException, argv: list[str]) -> str | None:
    if not isinstance(exc, click.UsageError):
        return None
    ctx = getattr(exc, "ctx", None)
    return f"see '{ctx.command_path if ctx is not None else _command_path(argv)} --help'"


def _command_path(argv: list[str]) -> str:
    """The command named on the command line (for errors click raises without a context:
    a parser error such as an option missing its value)."""
    path, command = ["nncc"], cli
    ctx = click.Context(cli, info_name="nncc")
    for arg in argv:
        if arg.startswith("-"):
            continue  # the groups take flags only
        sub = command.get_command(ctx, arg) if isinstance(command, click.Group) else None
        if sub is None:
            break
        path.append(arg)
        command = sub
    return " ".join(path)


def _hint(exc) -> str | None:
    """The error's own hint, or one derived from its kind."""
    if exc.hint:
        return exc.hint
    text = str(exc).lower()
    if isinstance(exc, FileAccessError) and "no such file" in text:
        return f"check the path; relative paths start at {os.getcwd()}"
    return None
