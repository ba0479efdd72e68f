"""nncc's floors hold: the layer contract in pyproject.toml (import-linter), and no import
cycle between any two of nncc's modules, function-local imports included (a cycle hidden
inside a function is a cycle all the same); and an import stays inside a function only for a
reason it states (start-up cost or an optional dependency)."""

from __future__ import annotations

import ast
import pathlib
import re

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_floors_contract_is_kept(capsys):
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0, capsys.readouterr().out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    graph = grimp.build_graph("nncc")
    # a package's __init__ re-exporting its own modules is not a cycle of its design
    edges = {m: {d for d in graph.find_modules_directly_imported_by(m) if not m.startswith(d + ".")}
             for m in graph.modules}
    assert _cycles(edges) == []


LAZY_REASON = re.compile(r"#\s*lazy:\s*\S")


def _unexplained_local_imports(source: str) -> list[int]:
    """The line of each import inside a function that does not say why with a trailing
    ``# lazy: <reason>`` (start-up cost or an optional dependency: any other import
    belongs at the top of its module)."""
    lines = source.splitlines()
    found = []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                statement = lines[child.lineno - 1:child.end_lineno]
                if not any(LAZY_REASON.search(line) for line in statement):
                    found.append(child.lineno)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def test_the_lazy_reason_finder_finds_an_unexplained_import():
    source = ("import os\n\n\ndef f():\n    import json\n    from a import (b,\n                   c)  # lazy: start-up\n"
              "    import rich  # lazy: rich\n\n    class C:\n        def g(self):\n            import re\n"
              "            import onnx  #lazy:onnx\n")
    assert _unexplained_local_imports(source) == [5, 12]
    assert _unexplained_local_imports("def f():\n    import x  # lazy:\n") == [2]  # a reason, not just the tag


@pytest.mark.slow
def test_every_function_local_import_says_why():
    unexplained = []
    for path in sorted((ROOT / "nncc").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        unexplained += [f"{relative}:{line}" for line in _unexplained_local_imports(path.read_text(encoding="utf-8"))]
    assert unexplained == [], "move these imports to the module top, or say why not with '# lazy: <reason>'"
