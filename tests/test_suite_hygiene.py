"""The suite's own rules, read from the test files' source: a package of the test extra (or
one of nncc's dependencies) is imported, never skipped for (tests/conftest.py fails the run
at once, saying how to install them, when one is missing); every skip says why; and tests
import what they need as packages, never by putting a folder on sys.path."""

from __future__ import annotations

import ast
import functools
import importlib.metadata

import pytest

from tests.conftest import ROOT, required_distributions

TEST_FILES = sorted((ROOT / "tests").rglob("*.py"))


@functools.lru_cache(maxsize=None)
def required_modules() -> frozenset[str]:
    """The top-level modules the test extra and nncc's dependencies install."""
    names = {r.name.lower().replace("_", "-") for r in required_distributions()}
    modules = set()
    for module, distributions in importlib.metadata.packages_distributions().items():
        if any(d.lower().replace("_", "-") in names for d in distributions):
            modules.add(module)
    return frozenset(modules)


def _dotted(node) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _has_reason(call: ast.Call, positional: bool) -> bool:
    """A reason given as reason=... (or, where the call takes it so, as the first argument)
    that is not an empty string."""
    given = [k.value for k in call.keywords if k.arg in ("reason", "msg")]
    if positional and call.args:
        given.append(call.args[0])
    return any(not (isinstance(v, ast.Constant) and not v.value) for v in given)


def violations(source: str, required: frozenset[str]) -> list[str]:
    """Each broken rule in ``source``, as "line N: what"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name == "pytest.importorskip":
                module = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else ""
                if module.split(".")[0] in required:
                    found.append(f"line {node.lineno}: importorskip of {module}, which the test extra installs "
                                 "(import it)")
                elif not _has_reason(node, positional=False):
                    found.append(f"line {node.lineno}: importorskip without reason=")
            elif name == "pytest.skip" and not _has_reason(node, positional=True):
                found.append(f"line {node.lineno}: pytest.skip without a reason")
            elif name in ("pytest.mark.skipif", "pytest.mark.skip") and not _has_reason(node, positional=False):
                found.append(f"line {node.lineno}: {name} without reason=")
            elif name in ("sys.path.insert", "sys.path.append"):
                found.append(f"line {node.lineno}: {name} (import from an importable place instead)")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found += [f"line {d.lineno}: a bare pytest.mark.skip" for d in node.decorator_list
                      if _dotted(d) == "pytest.mark.skip"]
    return sorted(found, key=lambda line: int(line.split()[1].rstrip(":")))


@pytest.mark.parametrize("path", TEST_FILES, ids=[str(p.relative_to(ROOT)) for p in TEST_FILES])
def test_the_test_file_keeps_the_suites_rules(path):
    assert violations(path.read_text(), required_modules()) == []


def test_the_finder_finds_each_broken_rule():
    source = '''
import sys
import pytest
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.quantization", reason="the oracle")
pytest.importorskip("not_required")
pytest.importorskip("not_required", reason="an optional plugin")
sys.path.insert(0, "benchmarks")
sys.path.append("examples")

@pytest.mark.skip
def test_a():
    pytest.skip()

@pytest.mark.skipif(sys.platform == "win32")
def test_b():
    pytest.skip("")

@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.skip(reason="kept")
def test_c():
    pytest.skip(f"no {sys.platform} compiler")
    pytest.skip(reason="no compiler")
'''
    assert violations(source, frozenset({"onnx", "onnxruntime"})) == [
        "line 4: importorskip of onnx, which the test extra installs (import it)",
        "line 5: importorskip of onnxruntime.quantization, which the test extra installs (import it)",
        "line 6: importorskip without reason=",
        "line 8: sys.path.insert (import from an importable place instead)",
        "line 9: sys.path.append (import from an importable place instead)",
        "line 11: a bare pytest.mark.skip",
        "line 13: pytest.skip without a reason",
        "line 15: pytest.mark.skipif without reason=",
        "line 17: pytest.skip without a reason",
    ]


def test_the_required_modules_are_the_test_extras():
    """The distribution-to-module mapping finds the packages whose import names differ."""
    assert {"onnx", "onnxruntime", "numpy", "PIL", "importlinter", "moto", "boto3", "ml_dtypes"} <= required_modules()
