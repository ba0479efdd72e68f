"""Rendering for the CLI: JSON on stdout for machines, rich tables at a terminal, plain
aligned columns when stdout is piped (which also keeps rich off a scripted start-up).

stdout carries only what was asked for (a table, a report, JSON); status lines go to
stderr through ``status`` (hidden by --quiet) and ``detail`` (shown only with --verbose).
Warnings and errors are never hidden.
"""

from __future__ import annotations

import json
import sys

import click

VERBOSITY_KEY = "nncc.verbosity"  # in click's ctx.meta, shared by the group and its commands


def emit_json(payload) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def verbosity() -> int:
    """-1 with --quiet, 1 with --verbose, 0 otherwise (outside a click command: 0)."""
    ctx = click.get_current_context(silent=True)
    return 0 if ctx is None else ctx.meta.get(VERBOSITY_KEY, 0)


def status(message: str) -> None:
    """A status line on stderr (what was done, how long it took); --quiet hides it."""
    if verbosity() >= 0:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def detail(message: str) -> None:
    """An extra line on stderr, shown only with --verbose."""
    if verbosity() > 0:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def console(stderr: bool = False):
    from rich.console import Console  # lazy: rich

    return Console(stderr=stderr)


def print_outputs(model: str, rows: list[dict], timing: dict) -> None:
    columns = ("name", "shape", "dtype", "min", "max", "mean", "std")
    numeric = {"min", "max", "mean", "std"}
    cells = [[row["name"], "[" + ", ".join(map(str, row["shape"])) + "]", row["dtype"],
              *(_number(row.get(k)) for k in ("min", "max", "mean", "std"))] for row in rows]
    if sys.stdout.isatty():
        from rich.table import Table  # lazy: rich

        table = Table(title=f"outputs of {model}", title_justify="left")
        for column in columns:
            table.add_column(column, justify="right" if column in numeric else "left")
        for line in cells:
            table.add_row(*line)
        console().print(table)
    else:
        # piped or redirected: plain aligned columns, and no rich import on the start-up path
        print(f"outputs of {model}")
        print(_plain_table(columns, cells, numeric))
    status(f"nncc: prepared in {timing['prepare_seconds'] * 1000:.1f} ms, "
           f"ran in {timing['run_seconds'] * 1000:.1f} ms")


def _plain_table(columns, cells, right: set) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(columns, *cells)]
    lines = []
    for line in [list(columns), *cells]:
        lines.append("  ".join(str(v).rjust(w) if name in right else str(v).ljust(w)
                               for name, v, w in zip(columns, line, widths)).rstrip())
    return "\n".join(lines)


def _number(value) -> str:
    return "-" if value is None else f"{value:.6g}"
