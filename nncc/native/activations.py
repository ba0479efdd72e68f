"""The activations a fused epilogue applies, by the integer code the generated C passes to
prelude.h's ``nn_act`` and simd.h's ``nn_vact``: the one table of them. The prelude's
``NN_...`` names are written from it (``c_enum``), and every generator writes the codes
as literals from it, so the C and the Python cannot drift apart. A leaf module.
"""

from __future__ import annotations

# fused-node activation attribute -> (code, the C enumerator's name); order is the code
_TABLE = (
    ("", "NN_NONE"),
    ("Relu", "NN_RELU"),
    ("Clip", "NN_CLIP"),
    ("Sigmoid", "NN_SIGMOID"),
    ("Tanh", "NN_TANH"),
    ("LeakyRelu", "NN_LEAKY"),
    ("HardSigmoid", "NN_HSIGMOID"),
    ("HardSwish", "NN_HSWISH"),
    ("Silu", "NN_SILU"),  # x * sigmoid(x)
    ("Mish", "NN_MISH"),  # x * tanh(softplus(x))
)
CODES = {name: code for code, (name, _) in enumerate(_TABLE)}
# what nn_vact cannot compute on a vector: applied lane by lane after the store
SCALAR_ONLY = frozenset({CODES["Sigmoid"], CODES["Tanh"], CODES["Silu"], CODES["Mish"]})
VECTOR_CODES = {name: code for name, code in CODES.items() if code not in SCALAR_ONLY}


def c_enum() -> str:
    """The prelude's enumeration of the codes (``enum { NN_NONE = 0, NN_RELU, ... };``)."""
    return "enum { " + ", ".join(f"{c} = 0" if i == 0 else c for i, (_, c) in enumerate(_TABLE)) + " };"
