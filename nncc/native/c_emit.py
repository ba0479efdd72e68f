"""A small writer of C text: statements at the current depth, blocks that open and close
their braces, ``for`` and ``if``, preprocessor lines at column 0. Generators build C with
it instead of f-strings with doubled braces, so the nesting is the Python code's nesting.

    c = CWriter()
    with c.function("static void f(float *y)"):
        with c.loop("i", 8):
            c.line("y[i] = 0.0f;")
    c.text()  # "static void f(float *y) {\\n    for (int64_t i = 0; i < 8; i++) {\\n ..."
"""

from __future__ import annotations

from contextlib import contextmanager

INDENT = "    "


class CWriter:
    def __init__(self, depth: int = 0):
        self.lines: list[str] = []
        self.depth = depth

    def line(self, *statements: str) -> None:
        """Each statement on its own line at the current depth (an empty one: a blank line)."""
        for statement in statements:
            self.lines.append(INDENT * self.depth + statement if statement else "")

    def raw(self, text: str) -> None:
        """Text already laid out (a helper's C): each of its lines indented to the current depth."""
        for row in text.strip("\n").split("\n"):
            self.line(row)

    def directive(self, text: str) -> None:
        """A preprocessor line: always at column 0."""
        self.lines.append(text)

    def comment(self, text: str) -> None:
        self.line(f"/* {text} */")

    @contextmanager
    def block(self, head: str, tail: str = ""):
        """``head {``, the statements written inside, ``}tail`` (``tail``: e.g. ``" qm_job;"``)."""
        self.line(f"{head} {{" if head else "{")
        self.depth += 1
        try:
            yield self
        finally:
            self.depth -= 1
            self.line("}" + tail)

    def function(self, signature: str):
        return self.block(signature)

    def loop(self, var: str, stop, start=0, ctype: str = "int64_t"):
        """``for (ctype var = start; var < stop; var++) { ... }``."""
        return self.block(f"for ({ctype} {var} = {start}; {var} < {stop}; {var}++)")

    def when(self, condition: str):
        """``if (condition) { ... }``."""
        return self.block(f"if ({condition})")

    @contextmanager
    def otherwise(self):
        """``else { ... }``, joined to the ``}`` of the ``if`` just closed."""
        if not self.lines or self.lines[-1].strip() != "}":
            raise ValueError("otherwise() must follow a closed if block")
        self.lines.pop()
        with self.block("} else"):
            yield self

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
