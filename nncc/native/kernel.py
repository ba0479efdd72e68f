"""A step's kernel described as data: a C function whose interface is declared, not read
back from its text.

A step names the buffers it reads and writes (and the C type of each: a buffer it reads is
``const float *``, one it writes ``float *``, a table of integers a ``const struct ... *``),
the bytes of scratch it needs, and whether it calls the runtime's BLAS-backed helpers. The
parameters follow that declaration: reads first, then writes, then ``char *scratch``. The
step's code refers to a buffer through ``marker(index)`` (what the writer's ``ptr`` returns),
which becomes the buffer's parameter name here; a marker left over is a buffer the step used
without declaring, a bug reported when the kernel is made.

The name is the hash of the full text (support, signature and body), so the same layer in
another model, partition or compile is the same function, built once into the object cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from blake3 import blake3

READ = "const float *"
WRITE = "float *"
SCRATCH = "scratch"  # the parameter a step's code names for its scratch, when it asks for some
_MARK = "@"  # not C: a marker that survives into a kernel's text cannot compile


def marker(index: int) -> str:
    """How a step's code refers to the partition's buffer ``index`` (bound to a parameter
    when the kernel is made)."""
    return f"{_MARK}{index}{_MARK}"


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str  # "const float *", "float *", "const struct nn_x *", "int64_t", ...

    def render(self) -> str:
        return f"{self.ctype}{self.name}" if self.ctype.endswith("*") else f"{self.ctype} {self.name}"

    @property
    def struct(self) -> str | None:
        """The struct tag of a struct pointer (which the calling unit must declare)."""
        words = self.ctype.replace("*", " ").split()
        return words[words.index("struct") + 1] if "struct" in words else None


@dataclass(frozen=True)
class Kernel:
    """One step as a C function: shapes, attributes and the scalars that shape the code are
    literals in ``body``; every tensor, weights included, and the scratch are parameters."""

    params: tuple[Param, ...]
    body: str
    support: str = ""  # file-scope C the body calls (micro-kernels, parallel tasks, structs)
    scratch: int = 0  # bytes of per-step workspace; 0: no scratch parameter
    blas: bool = False  # calls nn_gemm / nn_conv2d, which reach numpy's BLAS (kept at one thread then)

    @property
    def signature(self) -> str:
        params = [p.render() for p in self.params] + ([f"char *{SCRATCH}"] if self.scratch else [])
        return f"({', '.join(params) or 'void'})"

    def _text(self, name: str) -> str:
        body = self.body.replace("\n", "\n  ")
        return f"{self.support}void {name}{self.signature} {{\n  {body}\n}}\n"

    @cached_property  # hashed once: the partition's entry point names it per call
    def name(self) -> str:
        return "nnk_" + blake3(self._text("NN_KERNEL").encode()).hexdigest()[:24]

    @property
    def definition(self) -> str:
        return self._text(self.name)

    @property
    def declaration(self) -> str:
        """What a calling unit needs: its struct tags, then the prototype."""
        tags = sorted({p.struct for p in self.params if p.struct})
        return "".join(f"struct {t};\n" for t in tags) + f"void {self.name}{self.signature};"


def bind(body: str, buffers: list[tuple[int, str]], label: str = "") -> tuple[str, tuple[Param, ...]]:
    """``body`` with each declared buffer's marker replaced by its parameter (``p0``, ``p1``,
    ... in the order declared), and the parameters. ``buffers``: (buffer index, C type)."""
    params = []
    for i, (index, ctype) in enumerate(buffers):
        params.append(Param(f"p{i}", ctype))
        body = body.replace(marker(index), f"p{i}")
    if _MARK in body:
        raise AssertionError(f"step {label!r} uses a buffer it does not declare: {body[:200]!r}")
    return body, tuple(params)


def scratch_arg(nbytes: int) -> str:
    """The scratch pointer for a call in a step's code: null when the step has none (an
    empty tensor's step asks for no bytes, and then has no scratch parameter)."""
    return SCRATCH if nbytes else "0"
