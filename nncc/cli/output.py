"""Rendering for the CLI: JSON on stdout for machines, rich tables for people.

stdout carries only what was asked for (a table, a report, JSON); status lines go to
stderr through ``status`` (hidden by --quiet) and ``detail`` (shown only with --verbose).
Warnings and errors are never hidden.
"""

from __future__ import annotations

import json
import sys

VERBOSITY_KEY = "nncc.verbosity"  # in click's ctx.meta, shared by the group and its commands


def emit_json(payload) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def verbosity() -> int:
    """-1 with --quiet, 1 with --verbose, 0 otherwise (outside a click command: 0)."""
    import click

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
    from rich.console import Console

    return Console(stderr=stderr)


def print_outputs(model: str, rows: list[dict], timing: dict) -> None:
    from rich.table import Table

    table = Table(title=f"outputs of {model}", title_justify="left")
    for column in ("name", "shape", "dtype", "min", "max", "mean", "std"):
        table.add_column(column, justify="right" if column in ("min", "max", "mean", "std") else "left")
    for row in rows:
        table.add_row(
            row["name"],
            "[" + ", ".join(map(str, row["shape"])) + "]",
            row["dtype"],
            *(_number(row.get(k)) for k in ("min", "max", "mean", "std")),
        )
    console().print(table)
    status(f"nncc: prepared in {timing['prepare_seconds'] * 1000:.1f} ms, "
           f"ran in {timing['run_seconds'] * 1000:.1f} ms")


def _number(value) -> str:
    return "-" if value is None else f"{value:.6g}"
