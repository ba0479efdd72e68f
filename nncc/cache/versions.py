"""Which nncc wrote an entry: one check, wherever an entry's version is looked at (the
index row, the plan's own header, a remote manifest). An entry another nncc wrote is
stale: never used, kept until gc retires it."""

from __future__ import annotations

from nncc import _version


def stale_writer(nncc_version, format_version=None) -> str | None:
    """Why an entry written by nncc ``nncc_version`` (in plan format ``format_version``,
    when known) is stale for this nncc, or None when it is this nncc's."""
    if nncc_version != _version.__version__ or (format_version is not None
                                                 and format_version != _version.FORMAT_VERSION):
        shown = f"nncc {nncc_version}" + (f" (format {format_version})" if format_version is not None else "")
        return f"written by {shown}"
    return None
