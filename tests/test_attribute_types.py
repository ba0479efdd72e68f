"""nncc's table of standard attribute types (nncc/kernels/attributes.py) against ONNX's own
operator schemas (the oracle), for every op and version nncc registers a kernel for."""

from __future__ import annotations

from onnx import AttributeProto, defs

from nncc.kernels.attributes import _BY_OP, EXPECTED, FLOAT, FLOATS, INT, INTS, STRING, STRINGS, TENSOR
from nncc.kernels.registry import registered_ops

KINDS = {AttributeProto.INT: INT, AttributeProto.FLOAT: FLOAT, AttributeProto.STRING: STRING,
         AttributeProto.INTS: INTS, AttributeProto.FLOATS: FLOATS, AttributeProto.STRINGS: STRINGS,
         AttributeProto.TENSOR: TENSOR}


def test_every_listed_attribute_has_the_type_onnx_gives_it():
    ops = {op for domain, op, _ in registered_ops() if domain == ""}
    checked = 0
    for schema in defs.get_all_schemas_with_history():
        if schema.domain not in ("", "ai.onnx") or schema.name not in ops:
            continue
        for attr in schema.attributes.values():
            kinds = _BY_OP.get((schema.name, attr.name)) or (
                (EXPECTED[attr.name],) if attr.name in EXPECTED else None)
            if kinds is None or attr.type not in KINDS:
                continue  # not checked by nncc (graphs, sparse tensors, names nncc does not list)
            assert KINDS[attr.type] in kinds, (schema.name, schema.since_version, attr.name)
            checked += 1
    assert checked > 300  # the table is actually exercised


def test_the_table_names_only_attributes_onnx_has():
    names = {a.name for s in defs.get_all_schemas_with_history() for a in s.attributes.values()}
    assert set(EXPECTED) <= names and {name for _, name in _BY_OP} <= names
