"""Build the corpus of model exports that benchmarks/corpus.py measures: real
architectures exported the way their users export them, plus hand-made graphs in other
exporters' idioms, into build/corpus/ with a manifest saying how to run each.

    python benchmarks/build_corpus.py                  # every model (a few minutes on 2 cores)
    python benchmarks/build_corpus.py --model bert --model unet
    python benchmarks/build_corpus.py --no-torch       # the hand-made graphs only (onnx alone)

Offline and deterministic: weights are random from fixed seeds, transformers models are
built from configs (nothing is downloaded). torch and transformers are benchmark-only
dependencies (benchmarks/requirements-corpus.txt); nncc never imports them.

The manifest (build/corpus/manifest.json) has one entry per model: its file, exporter,
opset, a one-line description, its inputs with the concrete shape and dtype the corpus
runs them at and each axis's dynamic dimension name (null where the axis is fixed, ""
where it is dynamic but unnamed), the dimension sizes to fix them to (``dims``, what
``nncc --dim`` takes), how long the export took, and how much onnxruntime's outputs
change between two random feeds (``input_sensitivity``: near 0, a degenerate model that
no comparison can test). A model whose export fails is listed under ``failed`` with the
error's first line, and the others are built.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
DEFAULT_OUT = ROOT / "build" / "corpus"
TORCH_FAMILIES = ("vision", "vision_tasks", "sequence", "transformer_models")


def specs(with_torch: bool) -> list:
    import importlib  # lazy: with the families below

    from corpus_models import handmade  # lazy: imports onnx

    found = []
    if with_torch:
        for family in TORCH_FAMILIES:
            found += importlib.import_module(f"corpus_models.{family}").MODELS
    return found + handmade.MODELS


def declared_axes(path: str) -> tuple[dict[str, list], int]:
    """Per graph input, each axis's dimension name as nncc reads it (None: a fixed size; a
    placeholder such as "?", a missing or a negative size: ``<input>:<axis>``, the name nncc
    gives such an axis), and the default domain's opset."""
    import onnx  # lazy: --help needs no onnx

    from nncc.frontend.dim_names import is_placeholder  # lazy: as onnx

    model = onnx.load(path, load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    axes = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        # a placeholder name ("?") or no name at all is one dimension per input axis, named as nncc names it
        axes[value.name] = [(f"{value.name}:{axis}" if is_placeholder(d.dim_param) else d.dim_param)
                            if d.HasField("dim_param") else
                            None if d.HasField("dim_value") and d.dim_value >= 0 else f"{value.name}:{axis}"
                            for axis, d in enumerate(dims)]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return axes, opset


def build_one(spec, out: pathlib.Path) -> dict:
    path = out / f"{spec.name}.onnx"
    start = time.perf_counter()
    feeds = spec.build(str(path))
    seconds = time.perf_counter() - start
    axes, opset = declared_axes(str(path))
    entry = spec.entry(path.name, feeds, axes, opset, seconds, path.stat().st_size)
    entry["input_sensitivity"] = input_sensitivity(str(path), entry["inputs"])
    if entry["input_sensitivity"] is not None and entry["input_sensitivity"] < 1e-3:
        print(f"build_corpus: {spec.name}: warning: its outputs barely depend on its inputs "
              f"({entry['input_sensitivity']:.1e}): a match against a peer says little", file=sys.stderr)
    return entry


def input_sensitivity(path: str, inputs: list[dict]) -> float | None:
    """How much onnxruntime's outputs change between two random feeds, relative to their
    scale (smallest over the outputs): near 0, the model is degenerate (activations that
    vanished, an output equal to a bias), and comparing runtimes on it proves nothing.
    None without onnxruntime."""
    try:
        import onnxruntime  # lazy: optional here, the check is skipped without it
    except ImportError:
        return None
    import numpy as np  # lazy: with onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    runs = []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        feeds = {}
        for spec in inputs:
            if "fill" in spec:
                feeds[spec["name"]] = np.full(spec["shape"], spec["fill"], spec["dtype"])
            elif spec["dtype"].startswith("float"):
                feeds[spec["name"]] = rng.standard_normal(spec["shape"]).astype(spec["dtype"])
            else:
                feeds[spec["name"]] = rng.integers(*spec["range"], size=spec["shape"]).astype(spec["dtype"])
        runs.append(session.run(None, feeds))
    changes = [float(np.abs(a.astype(np.float64) - b).max() / max(float(np.abs(b).max()), 1e-30))
               for a, b in zip(*runs) if b.size and b.dtype.kind == "f"]
    return min(changes) if changes else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--model", action="append", metavar="NAME", help="build only these (repeatable)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--no-torch", action="store_true", help="only the hand-made graphs (no torch needed)")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        chosen = specs(not args.no_torch)
    except ImportError as exc:
        print(f"build_corpus: error: {exc} (pip install -r benchmarks/requirements-corpus.txt, "
              "or --no-torch for the hand-made graphs)", file=sys.stderr)
        return 2
    if args.model:
        unknown = set(args.model) - {s.name for s in chosen}
        if unknown:
            print(f"build_corpus: error: no model {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        chosen = [s for s in chosen if s.name in args.model]
    manifest_path = out / "manifest.json"
    manifest = {"models": [], "failed": []}
    if args.model and manifest_path.exists():  # a partial rebuild keeps the other entries
        manifest = json.loads(manifest_path.read_text())
        manifest["models"] = [m for m in manifest["models"] if m["name"] not in args.model]
        manifest["failed"] = [m for m in manifest.get("failed", []) if m["name"] not in args.model]
    for spec in chosen:
        try:
            entry = build_one(spec, out)
        except Exception as exc:  # an exporter that refuses a model: recorded, the others go on
            lines = str(exc).strip().splitlines()
            first = f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
            manifest["failed"].append({"name": spec.name, "exporter": spec.exporter, "error": first})
            print(f"build_corpus: {spec.name}: FAILED ({first})", file=sys.stderr)
            continue
        manifest["models"].append(entry)
        print(f"build_corpus: {spec.name}: {entry['bytes'] / 1e6:.1f} MB, opset {entry['opset']}, "
              f"{entry['export_s']:.1f} s", file=sys.stderr)
    order = {s.name: i for i, s in enumerate(specs(not args.no_torch))}
    manifest["models"].sort(key=lambda m: order.get(m["name"], len(order)))
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, manifest_path)
    print(f"build_corpus: {len(manifest['models'])} models in {out} ({len(manifest['failed'])} failed)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
