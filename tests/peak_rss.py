"""The peak resident memory of a command, measured in a fresh process: a small Python
parent runs the command as its only child and reports the largest RSS any of its children
reached (getrusage's RUSAGE_CHILDREN), so nothing else the test process ran counts."""

from __future__ import annotations

import subprocess
import sys

_PARENT = ("import resource, subprocess, sys\n"
           "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
           "sys.stderr.write(done.stderr)\n"
           "sys.exit(done.returncode)\n")


def run_measured(command: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, int]:
    """(the finished command: returncode and stderr, its peak RSS in bytes)."""
    done = subprocess.run([sys.executable, "-c", _PARENT, *command], capture_output=True, text=True, **kwargs)
    return done, int(done.stdout.strip().splitlines()[-1]) * 1024  # Linux reports KiB
