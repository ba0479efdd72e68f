"""The newest opset of each standard domain that nncc implements, and a warning for models
that import a newer one.

A kernel is chosen by the highest since-version not above the model's opset, so a model
from a newer ONNX still runs, with the definitions nncc knows. Where the newer opset
changed an operator the results may differ: that is said once, never left silent."""

from __future__ import annotations

from typing import Mapping

from nncc.ir.graph import normalize_domain
from nncc.util.notice import warn_once  # once per process: bench loads a model many times

KNOWN_OPSETS = {"": 28, "ai.onnx.ml": 5, "ai.onnx.preview": 1, "ai.onnx.preview.training": 1}



def newer_opsets(opsets: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """(domain, imported version, newest known) for each standard domain imported at a
    version newer than nncc implements. Custom domains are the plugins' business."""
    newer = []
    for domain, version in opsets.items():
        known = KNOWN_OPSETS.get(normalize_domain(domain))
        if known is not None and isinstance(version, int) and version > known:
            newer.append((normalize_domain(domain) or "ai.onnx", version, known))
    return newer


def warn_newer_opsets(opsets: Mapping[str, int], what: str = "the model") -> None:
    for domain, version, known in newer_opsets(opsets):
        warn_once(("opset", domain, version), f"{what} imports {domain} opset {version}, newer than the {known} this nncc implements: "
             f"its ops run with their opset-{known} (or older) definitions, and may differ where "
             f"opset {version} changed them; check the results, or update nncc")
