"""What one corpus model is, and the manifest entry that records how to run it."""

from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass
class Feed:
    """One input as the corpus runs it: a concrete shape and dtype, which axes the model
    leaves dynamic, and for integer inputs the range its values come from (token ids
    below the vocabulary size, a mask of ones)."""

    name: str
    shape: list[int]
    dtype: str = "float32"
    low: int = 0
    high: int = 10  # exclusive; ignored for floats
    fill: float | None = None  # every element this value (an attention mask of ones)


@dataclasses.dataclass
class Spec:
    name: str
    description: str  # one line, with the reductions from the full-size model
    exporter: str  # "torchscript", "dynamo" or "onnx.helper"
    build: Callable[[str], list[Feed]]  # writes the .onnx file at the path given; its feeds

    def entry(self, file: str, feeds: list[Feed], dynamic: dict[str, list], opset: int, seconds: float,
              size: int) -> dict:
        """The manifest entry. ``dynamic``: per input, each axis's symbolic name or None,
        as the written file declares it."""
        dims = {}
        for feed in feeds:
            for axis, name in enumerate(dynamic.get(feed.name, [])):
                if name:
                    dims[name] = feed.shape[axis]
        return {"name": self.name, "file": file, "exporter": self.exporter, "opset": opset,
                "description": self.description,
                "inputs": [{"name": f.name, "shape": f.shape, "dtype": f.dtype, "dynamic_axes": dynamic.get(f.name, []),
                            **({"range": [f.low, f.high]} if not f.dtype.startswith("float") and f.fill is None
                               else {}),
                            **({"fill": f.fill} if f.fill is not None else {})} for f in feeds],
                "dims": dims, "export_s": round(seconds, 2), "bytes": size}
