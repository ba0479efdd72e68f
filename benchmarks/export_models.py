"""`nncc export` over every benchmark model: which export, which are refused and why, and
whether each library computes what onnxruntime computes.

    python benchmarks/export_models.py [--model NAME ...] [--out build/export-models] [--json]

Models: benchmarks/real_models.py's (MODELS, resnet50 and bert_ort_fused; written on first
use into build/real-models) and the light models of the onnx wheel that `nncc bench`'s
scripts use (benchmarks/bench_peers.py's LIGHT, and light_vgg19). The dynamic transformers
are exported with their sequence fixed (--dim seq=128) and their batch left open, so their
libraries take the batch at run time. Each export runs the real command into OUT/NAME,
through one cache folder (OUT/cache: a second run exports from it). An exported library is
opened with nncc.load_library (one thread) and run on seeded normal inputs (a batch of 2
where the library takes one) next to onnxruntime (one intra-op thread); the largest
difference is reported relative to the output's largest magnitude. A refusal is reported
with its first line: a model that does not run entirely as native code is refused by
design. Also reports each library's size (libNAME.so, its weights in NAME.weights apart).
A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import numpy as np  # noqa: E402

import real_models  # noqa: E402
from bench_peers import LIGHT, light_dir  # noqa: E402

REAL = [*real_models.MODELS, "resnet50", *real_models.ORT_MODELS]
MODELS = REAL + [*LIGHT, "light_vgg19"]
DIMS = {"bert_dynamic": ["--dim", "seq=128"], "gpt2_dynamic": ["--dim", "seq=128"]}
RUN_BATCH = 2  # the batch a library that takes one at run time is run with
TOLERANCE = 1e-3  # of the output's largest magnitude: float32 sums in another order


def model_path(name: str, models: pathlib.Path) -> pathlib.Path | None:
    if name in REAL:
        return pathlib.Path(real_models.write_one(str(models), name))
    folder = light_dir()
    path = folder / f"{name}.onnx" if folder else None
    return path if path is not None and path.exists() else None


def export(path: pathlib.Path, out: pathlib.Path, name: str, cache: pathlib.Path) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of `nncc export`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "NNCC_UPGRADE_AFTER": "off"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "nncc", "export", str(path), "-o", str(out / name), "--name", "model",
                           "--cache-dir", str(cache), *DIMS.get(name, [])], capture_output=True, text=True, env=env)
    return done.returncode, done.stderr, time.perf_counter() - started


def check(path: pathlib.Path, folder: pathlib.Path) -> dict:
    """The library run next to onnxruntime on the same seeded inputs."""
    import nncc
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with nncc.load_library(folder, threads=1) as library:
        batch = RUN_BATCH if any(None in shape for _, shape in library.inputs) else None
        feeds = {name: rng.standard_normal([RUN_BATCH if d is None else d for d in shape]).astype(np.float32)
                 for name, shape in library.inputs}
        got = library.run(feeds)
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    worst = 0.0
    for key, value in want.items():
        scale = max(1.0, float(np.abs(value).max()))
        worst = max(worst, float(np.abs(got[key] - value).max()) / scale)
    return {"batch": batch, "relative_error": worst, "matches": worst <= TOLERANCE}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=MODELS, help="one model (repeatable); default: all")
    parser.add_argument("--out", default=str(ROOT / "build" / "export-models"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    rows = []
    for name in args.model or MODELS:
        path = model_path(name, ROOT / "build" / "real-models")
        if path is None:
            rows.append({"model": name, "exported": False, "why": "not installed (the onnx wheel's light models)"})
            continue
        code, stderr, seconds = export(path, out, name, out / "cache")
        row = {"model": name, "exported": code == 0, "export_seconds": round(seconds, 1)}
        if code == 0:
            folder = out / name
            row["library_bytes"] = (folder / "libmodel.so").stat().st_size
            row["weights_bytes"] = (folder / "model.weights").stat().st_size
            row.update(check(path, folder))
        else:
            lines = stderr.strip().splitlines()
            row["why"] = lines[0].removeprefix("nncc: error: ") if lines else f"exit {code}"
            row["nodes"] = lines[1:4]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for row in rows:
            if row["exported"]:
                batch = f", batch {row['batch']} at run time" if row["batch"] else ""
                print(f"{row['model']:20} exported: libmodel.so {row['library_bytes'] / 1024:.0f} KiB, weights "
                      f"{row['weights_bytes'] / 2**20:.1f} MiB; {'matches' if row['matches'] else 'DIFFERS from'} "
                      f"onnxruntime (largest difference {row['relative_error']:.1e} of the output's scale{batch})")
            else:
                print(f"{row['model']:20} refused: {row['why']}")
                for line in row.get("nodes", []):
                    print(f"{'':20} {line.strip()}")
    return 0 if all(r.get("matches", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
