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


def test_every_attribute_nnccs_passes_write_on_their_own_ops_is_type_checked():
    """A program read from a foreign cache carries nncc's own ops (fused convolutions,
    attention, ScaleShift); each attribute the passes give them must be in the table, so a
    mistyped one is refused as bad input when the program is read, not met as a TypeError
    inside a kernel. The model is the native fuzzer's batch of every case kind."""
    from nncc.frontend.onnx import parse_model
    from nncc.kernels.attributes import attribute_problem
    from nncc.passes.pipeline import run_passes
    from tests import native_fuzz_cases as F

    cases = F.make_cases(seed=5, start=0, count=60)
    graph = run_passes(parse_model(F.batch_model(cases).SerializeToString()), 2)
    seen = set()
    for node in graph.nodes:
        if node.domain != "nncc":
            continue
        for name, value in node.attrs.items():
            seen.add((node.op_type, name))
            assert attribute_problem(node.op_type, node.domain, name, value) is None, (node.op_type, name)
            assert attribute_problem(node.op_type, node.domain, name, object()) is not None, (node.op_type, name)
    ops = {op for op, _ in seen}
    assert {"FusedAttention", "FusedConv"} <= ops, ops  # the batch exercised the passes that write them
