"""`nncc cache`: list, inspect, verify, garbage-collect and empty the compilation cache.
The subcommands live in cache_listing, cache_housekeeping and cache_transfer; this module
gathers them into the group."""

from __future__ import annotations

import click

from nncc.cli.cache_common import WholeSummaries
from nncc.cli.cache_housekeeping import clear, gc, rm, verify, zero_stats
from nncc.cli.cache_listing import info, ls
from nncc.cli.cache_transfer import pull, push, remote
from nncc.cli.options import verbosity_options


@click.group(cls=WholeSummaries)
@verbosity_options
def cache():
    """Inspect, verify and garbage-collect the compilation cache."""


for _command in (ls, info, zero_stats, verify, gc, push, remote, pull, rm, clear):
    cache.add_command(_command)
