"""How busy the rest of the machine was while a benchmark's child process ran: the CPU
time all processes took (/proc/stat) less what our own children took, per wall second.
A shared machine's noise, measured, so a table can say how much to trust its row."""

from __future__ import annotations

import os
import resource


def busy_seconds() -> float:
    """CPU time the whole machine has spent busy (/proc/stat), in seconds; 0 if unknown."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def other_load(busy: float, ours: float, wall: float) -> float:
    """Cores other processes kept busy since ``busy`` and ``ours`` were read."""
    return max(0.0, (busy_seconds() - busy) - (children_cpu() - ours)) / wall if wall > 0 else 0.0
