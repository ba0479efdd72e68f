"""How much memory one model may make nncc allocate, checked before allocating.

A model or artifact is untrusted input: a few bytes can declare a tensor of 2**40
elements. Every size nncc derives from one (a plan's arena, expanded constants, a folded
constant, a random input, a model read from a pipe) is checked here first, and a size that
cannot fit is reported as bad input instead of ending in a MemoryError or the kernel's
OOM killer.

The bound is the one the command resolved (``$NNCC_MAX_MEMORY``: ``500M``, ``8G``, ...;
nncc.settings reads it and hands it here with ``set_memory_limit``), else the machine's
physical memory, or the process's address-space limit (``ulimit -v``) when that is lower.
This module reads no environment: every size check deep in a kernel sees the one bound
its command chose.
"""

from __future__ import annotations

import os

from nncc.errors import NnccError

ENV_MAX_MEMORY = "NNCC_MAX_MEMORY"  # where users set the bound, for messages (nncc.settings reads it)
MAX_RANK = 32  # numpy's limit before numpy 2 (64 since): no ONNX model needs more dims
PIPE_LIMIT = 2 << 30  # a model or artifact read from a pipe (ONNX's own protobuf limit is 2 GiB)


class LimitError(NnccError):
    """A model or artifact needs more memory than nncc may allocate (bad input)."""

    exit_code = 2
    hint = f"raise the bound with {ENV_MAX_MEMORY}=SIZE if the machine really has the memory"


_chosen: int | None = None  # the command's bound, in bytes; None: the machine's


def set_memory_limit(nbytes: int | None) -> None:
    """The bound of this process's allocations from here on, as the command resolved it
    (None: the machine's). Process-wide on purpose: every thread of a command, a kernel's
    included, checks against the same bound."""
    global _chosen
    _chosen = nbytes


def memory_limit() -> int:
    """The most bytes one model may allocate: the command's bound, else physical memory
    (or the address-space limit when lower)."""
    return _machine_limit() if _chosen is None else _chosen


def _machine_limit() -> int:
    limit = 1 << 62
    try:
        limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not POSIX: no physical bound known
        pass
    try:
        import resource  # lazy: Unix only

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY and soft > 0:
            limit = min(limit, soft)
    except (ImportError, OSError, ValueError):
        pass
    return limit


def element_count(shape) -> int:
    """The product of a static shape's dims, as a Python int (never overflows)."""
    count = 1
    for d in shape:
        count *= int(d)
    return count


def check_bytes(nbytes: int, what: str, error: type[NnccError] = LimitError) -> int:
    """``nbytes`` if it fits in the bound, else ``error`` naming ``what``."""
    limit = memory_limit()
    if nbytes > limit:
        raise error(f"{what} needs {_size(nbytes)}, more than the {_size(limit)} nncc may allocate "
                    f"({ENV_MAX_MEMORY})")
    return nbytes


def check_shape(shape, itemsize: int, what: str, error: type[NnccError] = LimitError) -> int:
    """The byte size of a static shape, checked: rank at most MAX_RANK, no negative dim,
    and the bytes within the bound. Raises ``error`` otherwise."""
    shape = tuple(shape)
    if len(shape) > MAX_RANK:
        raise error(f"{what} has rank {len(shape)}; at most {MAX_RANK} dimensions are supported")
    if any(int(d) < 0 for d in shape):
        raise error(f"{what} has a negative dimension {list(shape)}")
    return check_bytes(element_count(shape) * itemsize, what, error)


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
