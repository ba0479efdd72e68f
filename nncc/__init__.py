"""nncc: ahead-of-time compiler, verified cache and numpy runtime for ONNX models.

    import nncc
    model = nncc.compile_model("model.onnx", preference="sustained-speed")
    model.save("model.nncc")
    outputs = nncc.load("model.nncc").run({"x": x})

The package stays cheap to import: heavy modules load on first use of what needs them.
"""

from nncc._version import __version__

__all__ = ["__version__", "compile_model", "load", "load_library", "load_onnx", "prepare", "CompiledModel"]


def load_onnx(path):
    """Read an ONNX model and return an interpreter ready to ``run(feeds)`` (no compile)."""
    from nncc.frontend.onnx import load_model  # lazy: onnx
    from nncc.runtime.interpreter import Interpreter  # lazy: start-up

    return Interpreter(load_model(path))


def load_library(directory, name=None, threads: int = 0):
    """Open a model `nncc export` wrote into ``directory`` and run it through its C API:
    ``load_library(dir).run({"x": x})`` (nncc.export.ctypes_library)."""
    from nncc.export.ctypes_library import load_library as load  # lazy: start-up

    return load(directory, name, threads)


def __getattr__(name):
    if name in ("compile_model", "load", "prepare", "CompiledModel"):
        from nncc import model  # lazy: start-up

        return getattr(model, name)
    raise AttributeError(f"module 'nncc' has no attribute {name!r}")
