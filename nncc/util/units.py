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


def format_seconds(seconds: float | None) -> str:
    """0.00042 -> '0.42 ms', 0.1234 -> '123 ms', 75 -> '1 min 15 s'; None -> '-'."""
    if seconds is None:
        return "-"
    sign, s = ("-", -seconds) if seconds < 0 else ("", seconds)
    if s < 0.01:
        text = f"{s * 1000:.2f} ms"
    elif s < 1:
        text = f"{s * 1000:.1f} ms" if s < 0.1 else f"{s * 1000:.0f} ms"
    elif s < 60:
        text = f"{s:.1f} s"
    elif s < 3600:
        text = f"{int(s // 60)} min {int(s % 60)} s"
    else:
        text = f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return sign + text
