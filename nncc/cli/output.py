"""Rendering for the CLI: JSON on stdout for machines, rich tables for people."""

from __future__ import annotations

import json
import sys


def emit_json(payload) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


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
    out = console()
    out.print(table)
    out.print(
        f"prepared in {timing['prepare_seconds'] * 1000:.1f} ms, "
        f"ran in {timing['run_seconds'] * 1000:.1f} ms",
        style="dim",
    )


def _number(value) -> str:
    return "-" if value is None else f"{value:.6g}"
