"""The remote tier's errors: a configuration error stops the command; a fault never does."""

from __future__ import annotations

from nncc.errors import NnccError


class RemoteConfigError(NnccError):
    """A remote URL nncc cannot use (unknown scheme, missing optional client)."""

    exit_code = 2


class RemoteFault(Exception):
    """The remote store failed: down, slow, black-holed, full, refused. The run goes on
    without the remote tier."""


class PoisonedEntry(Exception):
    """A remote entry that does not verify: never used; reported and counted."""


class RemoteTimeout(RemoteFault):
    """A remote operation did not finish within its deadline."""
