"""Human-readable sizes for reports."""

from __future__ import annotations


def format_bytes(n: int | float | None) -> str:
    """1536 -> '1.5 KiB'; None -> '-'."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
