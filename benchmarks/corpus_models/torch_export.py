"""Exporting a torch module as users do: torch.onnx.export with the TorchScript exporter
(``dynamo=False``) or the dynamo exporter (``dynamo=True``), dynamic axes named, at the
opset each exporter writes by default. Weights are random, seeded before each model is
built, so a rebuild writes the same numbers."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings

import torch

from corpus_models.spec import Feed

TORCH_DTYPES = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


def seeded(seed: int = 0) -> None:
    torch.manual_seed(seed)


def example(feed: Feed) -> torch.Tensor:
    """A tensor of the feed's shape to trace with (values in the feed's range)."""
    dtype = TORCH_DTYPES[feed.dtype]
    if feed.fill is not None:
        return torch.full(feed.shape, feed.fill, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(feed.shape, dtype=dtype)
    return torch.randint(feed.low, feed.high, feed.shape, dtype=dtype)


def export(module: torch.nn.Module, feeds: list[Feed], path: str, outputs: list[str],
           dynamic: dict[str, dict[int, str]], dynamo: bool = False) -> list[Feed]:
    """Write ``module`` to ``path`` and return its feeds. ``dynamic``: per input, axis ->
    the dimension's name."""
    calibrate_batchnorm(module, feeds)
    module.eval()
    args = tuple(example(f) for f in feeds)
    names = [f.name for f in feeds]
    quiet = io.StringIO()
    # torch's fused encoder-layer fast path has no ONNX form: exporting users switch it off
    torch.backends.mha.set_fastpath_enabled(False)
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(quiet):
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(module, args, path, input_names=names, output_names=outputs,
                              dynamic_shapes=_dynamic_shapes(feeds, dynamic), dynamo=True,
                              external_data=False, optimize=True)
        else:
            torch.onnx.export(module, args, path, input_names=names, output_names=outputs,
                              dynamic_axes=dynamic, dynamo=False)
    return feeds


def calibrate_batchnorm(module: torch.nn.Module, feeds: list[Feed], batch: int = 8, steps: int = 4) -> None:
    """Running statistics as training leaves them: a freshly initialised network keeps
    mean 0 and variance 1 in every BatchNorm, its activations shrink layer after layer,
    and a deep one (MobileNet, EfficientNet) answers the same for every input, which
    makes a match against onnxruntime say nothing. A few training-mode passes over random
    batches set each layer's statistics to what reaches it (batch on axis 0)."""
    norms = [m for m in module.modules() if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d))]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a plain average over the passes
    module.train()
    with torch.no_grad():
        for _ in range(steps):
            module(*(example(dataclasses.replace(f, shape=[batch] + f.shape[1:])) for f in feeds))
    module.eval()


def _dynamic_shapes(feeds: list[Feed], dynamic: dict[str, dict[int, str]]):
    """torch.export's form of the dynamic axes: one Dim per name, shared where two inputs
    name the same dimension (batch, sequence)."""
    dims: dict[str, torch.export.Dim] = {}
    shapes = []
    for feed in feeds:
        axes = {}
        for axis, name in dynamic.get(feed.name, {}).items():
            if name not in dims:
                dims[name] = torch.export.Dim.DYNAMIC
            axes[axis] = dims[name]
        shapes.append(axes or None)
    return tuple(shapes)
