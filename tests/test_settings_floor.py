"""No floor below nncc.settings reads the environment: settings.py resolves every setting
(flag > environment > config file > default) once per command, and the floors below get
the values as parameters and records. The one exception is named here: the C toolchain
looks at the process's own LD_PRELOAD (is the sanitizer runtime preloaded?) to start the
compiler without it; that is the process's state, not a setting."""

from __future__ import annotations

import ast
import pathlib
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# (module file, function) where the environment may be read, and the only variable it may name
EXCEPTION = ("nncc/native/toolchain.py", "_compiler_env")
EXCEPTION_VARIABLE = "LD_PRELOAD"


def floors_below_settings() -> list[str]:
    """The packages and modules below nncc.settings in the floors contract (pyproject.toml),
    so a floor added there is checked here too."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "floors")
    layers = contract["layers"]
    return layers[layers.index("nncc.settings") + 1:]


def files_of(layer: str) -> list[pathlib.Path]:
    path = ROOT / layer.replace(".", "/")
    if path.is_dir():
        return sorted(path.rglob("*.py"))
    return [path.with_suffix(".py")]


def _is_environ(node) -> bool:
    """``os.environ`` / ``os.environb``, or a bare ``environ`` imported from os."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("environ", "environb") and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id in ("environ", "environb")


def environment_reads(source: str) -> list[tuple[int, str | None, str | None]]:
    """(line, enclosing function, the variable named when it is a constant) of every read
    of the environment: os.environ (any use), os.getenv, os.environ.get, a bare environ or
    getenv imported from os."""
    found = []

    def visit(node, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.ImportFrom) and child.module == "os":
                found.extend((child.lineno, function, None) for alias in child.names
                             if alias.name in ("environ", "environb", "getenv", "getenvb"))
            elif isinstance(child, ast.Call) and (
                    (isinstance(child.func, ast.Attribute) and child.func.attr in ("getenv", "getenvb")
                     and isinstance(child.func.value, ast.Name) and child.func.value.id == "os")
                    or (isinstance(child.func, ast.Name) and child.func.id in ("getenv", "getenvb"))
                    or (isinstance(child.func, ast.Attribute) and child.func.attr == "get"
                        and _is_environ(child.func.value))):
                first = child.args[0] if child.args else None
                name = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
                found.append((child.lineno, function, name))
                for arg in [*child.args, *(k.value for k in child.keywords)]:
                    visit(arg, inner)  # the call itself is counted once, not again for its os.environ
                continue
            elif _is_environ(child):
                found.append((child.lineno, function, None))
            visit(child, inner)

    visit(ast.parse(source), None)
    return found


def test_the_finder_finds_every_way_of_reading_the_environment():
    source = ("import os\nfrom os import environ, getenv\n\n"
              "def f():\n    a = os.environ.get('CC')\n    b = os.getenv('X')\n    c = os.environ['Y']\n"
              "    d = 'Z' in os.environ\n    e = environ.get('W', '')\n    return getenv('V')\n"
              "LIMIT = os.environ.get('NNCC_MAX_MEMORY', '')\n")
    assert environment_reads(source) == [(2, None, None), (2, None, None), (5, "f", "CC"), (6, "f", "X"),
                                         (7, "f", None), (8, "f", None), (9, "f", "W"), (10, "f", "V"),
                                         (11, None, "NNCC_MAX_MEMORY")]
    assert environment_reads("import os\n\ndef f(path):\n    return os.path.join(path, 'x')\n") == []


def test_the_floors_below_settings_are_the_ones_the_contract_names():
    below = floors_below_settings()
    assert {"nncc.cache", "nncc.native", "nncc.trust", "nncc.util", "nncc.compiler"} <= set(below)
    assert "nncc.preparing" not in below and "nncc.settings" not in below


@pytest.mark.slow
def test_no_module_below_settings_reads_the_environment():
    wrong = []
    for layer in floors_below_settings():
        for path in files_of(layer):
            relative = path.relative_to(ROOT).as_posix()
            for line, function, name in environment_reads(path.read_text(encoding="utf-8")):
                if (relative, function) == EXCEPTION and name in (EXCEPTION_VARIABLE, None):
                    continue
                wrong.append(f"{relative}:{line} reads the environment" + (f" ({name})" if name else ""))
    assert wrong == [], "resolve it in nncc/settings.py and pass the value down"


def test_the_exception_reads_only_ld_preload():
    """The named exception stays what it is: the sanitizer runtime's LD_PRELOAD, nothing else."""
    path, function = EXCEPTION
    reads = [(line, name) for line, where, name in environment_reads((ROOT / path).read_text(encoding="utf-8"))
             if where == function]
    assert reads, f"{path} no longer reads LD_PRELOAD in {function}: remove the exception"
    assert {name for _, name in reads} <= {EXCEPTION_VARIABLE, None}
    assert EXCEPTION_VARIABLE in {name for _, name in reads}
