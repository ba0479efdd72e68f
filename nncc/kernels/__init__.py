"""Built-in kernels, one module per op family; each module registers its kernels when
imported. ``load_all`` imports every family (compiling needs them all); a plan loaded
from the cache imports only the families it names (registry.by_key, catalog.py)."""

import importlib

FAMILIES = (
    "activation",
    "affine",
    "arithmetic",
    "attention",
    "attention_contrib",
    "bitwise",
    "control_flow",
    "conv",
    "detection",
    "fused",
    "fused_attention",
    "generators",
    "image",
    "indexing",
    "linalg",
    "logic",
    "loss",
    "ml",
    "normalization",
    "optional",
    "qimage",
    "pool",
    "qlinear_contrib",
    "quantize",
    "recurrent",
    "reduce",
    "resize",
    "sampling",
    "sequence",
    "signal",
    "strings",
    "tensor",
    "training",
    "trig",
)


def load_all() -> None:
    for name in FAMILIES:
        importlib.import_module(f"nncc.kernels.{name}")


def load_family(name: str) -> None:
    """Import one built-in family, by a name from FAMILIES only."""
    if name in FAMILIES:
        importlib.import_module(f"nncc.kernels.{name}")
