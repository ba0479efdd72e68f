"""Where a small model's run goes outside its kernels: the same run timed at each layer,
from ``model.run`` down to the raw C entry point, in one process, the layers alternating.

    python benchmarks/run_layers.py build/corpus tabular_mlp_dynamo [--threads 1] [--cache DIR]

The model is a corpus entry (benchmarks/corpus.py; its manifest gives the input shapes),
prepared as a user's later process has it: through a cache that an earlier process
warmed (prepared at the optimized stage, dynamic dimensions left as exported, run until
the plan of its input shape was built), then run from a fresh prepare. Each layer is
timed in blocks of 20 calls, the blocks of all layers interleaved 300 times, and the
median per call printed in microseconds; the difference between two rows is what that
layer adds. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from corpus import model_inputs  # this directory's: run as a script from benchmarks/

WARM = """
import sys, threading
import numpy as np
import nncc
path, cache, feeds_path = sys.argv[1:4]
with np.load(feeds_path) as saved:
    feeds = {k: saved[k] for k in saved.files}
model, _ = nncc.prepare(path, cache_dir=cache, stage="optimized")
for _ in range(3):
    model.run(feeds)
    for thread in [t for t in threading.enumerate() if t.name.startswith("nncc-shape-")]:
        thread.join()
"""


def corpus_feeds(corpus: pathlib.Path, name: str) -> tuple[str, dict[str, np.ndarray]]:
    """The model's path and its inputs at the manifest's shapes, drawn as corpus.py draws them."""
    manifest = json.loads((corpus / "manifest.json").read_text())
    entry = next(m for m in manifest["models"] if m["name"] == name)
    return str(corpus / entry["file"]), model_inputs(entry)


def layers(model, feeds) -> dict:
    """name -> a call of that layer, outermost last (a model of one native call only)."""
    from nncc.runtime.executor import _outputs_for  # lazy: after the checkout's nncc is on the path

    executor = model._last
    if getattr(executor, "_one_call", None) is None:
        raise SystemExit("the plan that runs is not one native call: nothing to peel")
    _, ctx, arguments, planned, _ = executor._one_call
    step = executor.steps[0][0]
    if not hasattr(step, "workspace_address"):
        raise SystemExit("the one call is not native code")
    args = [feeds[name] if name is not None else constant for name, constant in arguments]
    same = _outputs_for(planned, None)
    arrays = dict(feeds)
    return {
        "C entry point (ctypes)": lambda: step.fn(step.table, step.workspace_address),
        "native step, last outputs": lambda: step(ctx, *args, out=same),
        "native step, fresh outputs": lambda: step(ctx, *args, out=_outputs_for(planned, None)),
        "executor, checked feeds": lambda: executor._run_one_call(arrays),
        "executor.run": lambda: executor.run(feeds),
        "model.run": lambda: model.run(feeds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=pathlib.Path, help="the built corpus folder (manifest.json)")
    parser.add_argument("model", help="a corpus entry's name")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", help="a cache folder to warm and prepare from (default: a temporary one)")
    args = parser.parse_args()
    import nncc  # lazy: as above
    from nncc.util.threads import set_blas_threads  # lazy: as above

    path, feeds = corpus_feeds(args.corpus, args.model)
    with tempfile.TemporaryDirectory() as work:
        cache = args.cache or str(pathlib.Path(work) / "cache")
        np.savez(pathlib.Path(work) / "feeds.npz", **feeds)
        subprocess.run([sys.executable, "-c", WARM, path, cache, str(pathlib.Path(work) / "feeds.npz")], check=True)
        set_blas_threads(args.threads)
        model, outcome = nncc.prepare(path, cache_dir=cache)
        for _ in range(20):
            model.run(feeds)
        calls = layers(model, feeds)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(300):
            for name, call in calls.items():
                for _ in range(20):
                    start = time.perf_counter()
                    call()
                    times[name].append(time.perf_counter() - start)
    print(f"{args.model}: prepared from a cache {outcome.outcome}, {args.threads} thread(s), "
          f"{model.last_run_native_partitions} native partition(s); median us per call (and what the layer adds)")
    previous = None
    for name, values in times.items():
        us = statistics.median(values) * 1e6
        added = "" if previous is None else f"  (+{us - previous:.2f})"
        print(f"  {name:28s} {us:9.2f}{added}")
        previous = us


if __name__ == "__main__":
    main()
