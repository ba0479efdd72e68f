"""nncc: ahead-of-time compiler, verified cache and numpy runtime for ONNX models.

The package stays cheap to import: heavy modules load on first use of what needs them.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load_onnx"]


def load_onnx(path):
    """Read an ONNX model and return an interpreter ready to ``run(feeds)``."""
    from nncc.frontend.onnx import load_model
    from nncc.runtime.interpreter import Interpreter

    return Interpreter(load_model(path))
