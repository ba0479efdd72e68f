"""Where a model's steady state spends its time inside the generated native code, by C
function, sampled by ``perf`` (no hardware counters needed: the cpu-clock software event).

    python benchmarks/profile_perf.py build/real-models/resnet18_int8_qop.onnx --threads 1

benchmarks/profile_native.py times each step from inside; this one says which loop of a step
the time goes to (the micro-kernel, its epilogue, the packing), and catches what is between
the steps (the thread pool's waits). The model is compiled in this process with the shared
object's bytes kept: nncc loads it from an anonymous memory file, which perf cannot read, so
its samples are addresses that the kept copy's symbol table (``nm``) turns into names. perf
is attached to this process for ``--seconds`` while it runs the model in a loop.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading


def _symbols(library: str) -> tuple[list[int], list[str]]:
    """(sorted start addresses, names) of the library's functions."""
    rows = []
    for line in subprocess.run(["nm", "-n", library], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            rows.append((int(parts[0], 16), parts[2]))
    return [a for a, _ in rows], [n for _, n in rows]


def _attribute(report: str, library: str) -> collections.Counter:
    """Percent of samples per function: the generated code's by name, the rest by object."""
    starts, names = _symbols(library)
    share: collections.Counter = collections.Counter()
    for line in report.splitlines():
        found = re.match(r"\s*([\d.]+)%\s+(.+?)\s+\[.\]\s+(\S+)", line)
        if not found:
            continue
        percent, dso, symbol = float(found.group(1)), found.group(2), found.group(3)
        if "memfd:nncc" in dso and symbol.startswith("0x"):
            at = bisect.bisect_right(starts, int(symbol, 16)) - 1
            name = names[at] if at >= 0 else symbol
            share["native: " + re.sub(r"\.(constprop|isra|part|cold)\.\d+$", "", name)] += percent  # GCC's clones
        else:
            share[f"{os.path.basename(dso)}: {symbol}"] += percent
    return share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0, help="how long perf samples (default 4)")
    parser.add_argument("--precision", default="f32", help="of products by constant weights: f32 or bf16")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    missing = [tool for tool in ("perf", "nm") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"profile_perf: error: needs {' and '.join(missing)} on PATH")

    import nncc  # lazy: only once the tools are found
    from nncc.native import build  # lazy: as above
    from nncc.runtime.random_inputs import random_feeds  # lazy: as above
    from nncc.util.threads import set_blas_threads  # lazy: as above

    set_blas_threads(args.threads)
    kept: list[bytes] = []
    original = build.build

    def keeping(*a, **k):
        code, keys = original(*a, **k)
        kept.append(code)
        return code, keys

    build.build = keeping  # the compile below links once: keep that shared object's bytes
    try:
        model = nncc.compile_model(args.model, **({"precision": args.precision} if args.precision != "f32" else {}))
    finally:
        build.build = original
    if not kept:
        sys.exit("profile_perf: error: the model has no native partition to profile")
    feeds = random_feeds(model.input_infos, 0, None)
    for _ in range(5):
        model.run(feeds)

    with tempfile.TemporaryDirectory() as tmp:
        library, data = os.path.join(tmp, "partitions.so"), os.path.join(tmp, "perf.data")
        with open(library, "wb") as f:
            f.write(kept[-1])
        done = threading.Event()
        recorder = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-p", str(os.getpid()),
                                     "-o", data, "--", "sleep", str(args.seconds)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=lambda: (recorder.wait(), done.set()), daemon=True).start()
        runs = 0
        while not done.is_set():
            model.run(feeds)
            runs += 1
        if recorder.returncode != 0:
            sys.exit(f"profile_perf: error: perf record failed: {recorder.stderr.read().strip()[:200]}")
        report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,sym", "--stdio"],
                                capture_output=True, text=True, check=False).stdout  # errors: no rows
        share = _attribute(report, library)
    print(f"{args.model}: {runs} runs sampled over {args.seconds:g} s, {args.threads} thread(s)")
    for name, percent in share.most_common(args.top):
        print(f"  {percent:6.2f}%  {name}")


if __name__ == "__main__":
    main()
