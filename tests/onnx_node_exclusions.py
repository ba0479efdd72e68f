"""Every ONNX backend node test case nncc does not pass, each with its reason.

This is the one place exclusions live; tests/test_onnx_node.py reads it.
"""

EXCLUDED: dict[str, str] = {
}
