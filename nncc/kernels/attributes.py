"""The types of the standard ONNX attributes that nncc's kernels read, checked before
compiling: a float where an int belongs, or a string where a list belongs, is bad input
(the node and op named), not a TypeError inside a kernel.

Across the ONNX operator set an attribute name has one type (``axis`` is always an int,
``perm`` always a list of ints), with the few exceptions in ``_BY_OP``;
``tests/test_attribute_types.py`` checks this table against ONNX's own schemas for every
op nncc registers. Names not listed (and ops of other domains than nncc's fused kernels) are
not checked here.
"""

from __future__ import annotations

import numpy as np

INT, FLOAT, STRING, INTS, FLOATS, STRINGS, TENSOR = "int", "float", "string", "ints", "floats", "strings", "tensor"

_NAMES = {
    STRING: ("approximate", "auto_pad", "coordinate_transformation_mode", "direction", "equation",
             "keep_aspect_ratio_policy", "mode", "nearest_mode", "round_mode", "value_string"),
    INT: ("allowzero", "antialias", "axis", "blocksize", "broadcast", "ceil_mode", "count_include_pad",
          "dtype", "end", "exclude_outside", "exclusive", "fmod", "group", "hidden_size", "input_forget",
          "is_test", "k", "keepdims", "largest", "layout", "linear_before_reset", "noop_with_empty_axes",
          "num_outputs", "output_sequence", "reverse", "saturate", "select_last_index", "size",
          "sorted", "spatial", "start", "stash_type", "storage_order", "training_mode", "transA",
          "transB", "value_int"),
    FLOAT: ("alpha", "beta", "bias", "clip", "cubic_coeff_a", "epsilon", "extrapolation_value", "gamma",
            "max", "min", "momentum", "ratio", "value_float"),
    STRINGS: ("activations", "value_strings"),
    FLOATS: ("activation_alpha", "activation_beta", "value_floats"),
    INTS: ("axes", "consumed_inputs", "dilations", "ends", "kernel_shape", "output_padding", "output_shape",
           "paddings", "pads", "perm", "shape", "split", "starts", "strides", "value_ints"),
}
EXPECTED = {name: kind for kind, names in _NAMES.items() for name in names}
# names whose type depends on the op (or its version)
_BY_OP = {
    ("Constant", "value"): (TENSOR,),
    ("ConstantOfShape", "value"): (TENSOR,),
    ("Pad", "value"): (FLOAT,),
    ("Cast", "to"): (INT, STRING),  # a type name string before opset 6
}

# nncc's own kernels (nncc.kernels.fused, affine, fused_attention) carry their ONNX op's
# attributes, and these: a program from a foreign cache is read with the same checks
_FUSED = {"activation": (STRING,), "activation_alpha": (FLOAT,), "activation_beta": (FLOAT,),
          "activation_min": (FLOAT,), "activation_max": (FLOAT,), "activation_approximate": (STRING,),
          "onnx_opset": (INT,), "q_perm": (INTS,), "k_perm": (INTS,), "v_perm": (INTS,),
          "out_perm": (INTS,), "scale": (FLOAT,), "zero_hidden_rows": (INT,), "zero_nan_rows": (INT,),
          "head_group": (INT,)}


def _is(kind: str, value) -> bool:
    if kind == INT:
        return type(value) is int
    if kind == FLOAT:
        return type(value) is float
    if kind == STRING:
        return type(value) is str
    if kind == TENSOR:
        return isinstance(value, np.ndarray)
    item = {INTS: INT, FLOATS: FLOAT, STRINGS: STRING}[kind]
    return type(value) is list and all(_is(item, v) for v in value)


def attribute_problem(op_type: str, domain: str, name: str, value) -> str | None:
    """Why ``value`` cannot be attribute ``name`` of a standard op, or None."""
    fused = domain == "nncc"
    if domain not in ("", "ai.onnx") and not fused:
        return None
    kinds = (_FUSED.get(name) if fused else _BY_OP.get((op_type, name))) or (
        (EXPECTED[name],) if name in EXPECTED else ())
    if not kinds or any(_is(kind, value) for kind in kinds):
        return None
    got = type(value).__name__ if not isinstance(value, list) else "list of " + (
        ", ".join(sorted({type(v).__name__ for v in value})) or "nothing")
    return f"attribute {name!r} must be {' or '.join(_WORDS[k] for k in kinds)}, got {got}"


_WORDS = {INT: "an int", FLOAT: "a float", STRING: "a string", INTS: "a list of ints",
          FLOATS: "a list of floats", STRINGS: "a list of strings", TENSOR: "a tensor"}
