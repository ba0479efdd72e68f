"""Rewrites catalog.py's FAMILY_OF from what the built-in families register: run
``python -m nncc.kernels.write_catalog`` after adding a kernel or moving one."""

from __future__ import annotations

import pathlib

from nncc.kernels.registry import builtin_families

_START = "FAMILY_OF = {"


def write_catalog() -> None:
    path = pathlib.Path(__file__).with_name("catalog.py")
    text = path.read_text()
    start = text.index(_START)
    end = text.index("\n}\n", start) + 3
    rows = "\n".join(f'    "{op}": "{family}",' for op, family in builtin_families().items())
    path.write_text(text[:start] + _START + '  # "domain::op_type" -> module in nncc/kernels/\n'
                    + rows + "\n}\n" + text[end:])


if __name__ == "__main__":
    write_catalog()
