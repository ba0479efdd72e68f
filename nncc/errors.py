"""Every error nncc raises on purpose derives from NnccError.

The CLI turns these into one-line messages; anything else is a bug and keeps its
traceback. `exit_code` follows the documented convention: 1 failure, 2 usage or bad input.
"""


class NnccError(Exception):
    exit_code = 1
    hint: str | None = None  # a short suggestion the CLI appends to the one-line message

    def __init__(self, *args, hint: str | None = None):
        super().__init__(*args)
        if hint is not None:
            self.hint = hint


class OptionError(NnccError):
    """A compile option (or a backend's own option) is wrong."""

    exit_code = 2


class ModelFormatError(NnccError):
    """The model file is not a well-formed ONNX model."""

    exit_code = 2


class UnsupportedOpError(NnccError):
    """No kernel is registered for an (op, domain, opset) combination."""

    exit_code = 2

    def __init__(self, op_type: str, domain: str, opset: int, detail: str = ""):
        self.op_type, self.domain, self.opset = op_type, domain, opset
        where = domain or "ai.onnx"
        msg = f"unsupported op {op_type!r} (domain {where!r}, opset {opset})"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        if where not in ("ai.onnx", "ai.onnx.ml"):
            self.hint = f"a plugin may register {where} ops: pass --plugin MODULE"


class InputError(NnccError):
    """Feeds given to a model do not match what it declares."""

    exit_code = 2


class ShapeInferenceError(NnccError):
    """A node's inputs are inconsistent with its operator's rules."""

    exit_code = 2


class KernelError(NnccError):
    """A kernel failed on the values it was given at run time."""

    exit_code = 1


class IndexRangeError(KernelError):
    """An index a run was fed (or computed from its feeds) lies outside the axis it picks
    from, such as an id outside its embedding table: bad input, never read past the data."""

    exit_code = 2


class FileAccessError(NnccError):
    """A file named by the user is missing or cannot be read."""

    exit_code = 2


class PlanFormatError(NnccError):
    """A compiled artifact is malformed, tampered with, or from another format version."""

    exit_code = 2


class MissingDependencyError(NnccError):
    """The model needs an optional package that is not installed."""

    exit_code = 2


class TrustKeyError(NnccError):
    """The key that signs and verifies artifacts is missing, malformed, or not private."""

    exit_code = 2
