"""A name that starts with `_` is private to the module that defines it: no nncc module
imports one from another nncc module (`from nncc.x import _y`, relative imports and
function-local imports included) or reaches one through a module it imported
(`import nncc.x as x; x._y`). A helper two modules share is public, or lives in a small
module of its own. The check reads the source with `ast`, so it sees every import,
whichever branch or function it sits in."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nncc"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: pathlib.Path, package_root: pathlib.Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_submodule(module: str, package_root: pathlib.Path) -> bool:
    """A `_module` file is private to its package, and every nncc module is inside nncc."""
    relative = pathlib.Path(*module.split(".")[1:]) if "." in module else pathlib.Path()
    here = package_root / relative
    return here.with_suffix(".py").is_file() or (here / "__init__.py").is_file()


def private_imports(source: str, importer: str, is_package: bool, package_root: pathlib.Path,
                    top: str = "nncc") -> list[str]:
    """Every private name `importer` takes from another module of package `top`."""
    tree = ast.parse(source)
    found = []
    modules = {}  # local name -> the nncc module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source_module = _resolve(importer, is_package, node)
            if source_module != top and not source_module.startswith(top + "."):
                continue
            for alias in node.names:
                if _is_submodule(f"{source_module}.{alias.name}", package_root):
                    modules[alias.asname or alias.name] = f"{source_module}.{alias.name}"
                    continue
                if source_module != importer and _is_private(alias.name):
                    found.append((node.lineno, f"from {source_module} import {alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == top or alias.name.startswith(top + "."):
                    # `import a.b` binds `a`; `import a.b as c` binds `c` to a.b
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else alias.name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                # walk down the dotted chain through submodules; the private step is the one flagged
                owner = modules[value.id]
                for attr in reversed(chain[1:]):
                    if not _is_submodule(f"{owner}.{attr}", package_root):
                        break
                    owner = f"{owner}.{attr}"
                else:
                    if owner != importer:
                        found.append((node.lineno, f"{owner}.{node.attr}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def _offenders(package_root: pathlib.Path, top: str = "nncc") -> list[str]:
    offenders = []
    for path in sorted(package_root.rglob("*.py")):
        importer = _module_name(path, package_root)
        for finding in private_imports(path.read_text(encoding="utf-8"), importer,
                                       path.name == "__init__.py", package_root, top):
            offenders.append(f"{path.relative_to(package_root.parent)} {finding}")
    return offenders


@pytest.mark.slow
def test_no_module_imports_a_private_name_from_another():
    offenders = _offenders(PACKAGE)
    assert offenders == [], "private names used across modules:\n" + "\n".join(offenders)


def test_the_check_finds_each_kind_of_private_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_version.py").write_text("VERSION = '1'\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "home.py").write_text("def _helper(): pass\ndef public(): pass\n")
    (package / "sub" / "user.py").write_text(
        "from pkg import _version\n"                     # a private module inside its own package: fine
        "from pkg.sub.home import public, _helper\n"      # absolute
        "from .home import _helper as h\n"                # relative
        "def f():\n"
        "    from pkg.sub.home import _helper\n"          # function-local
        "    import pkg.sub.home as home\n"
        "    return home._helper, home.__name__\n"        # attribute through a module; dunder is fine
        "import pkg.sub.home\n"
        "pkg.sub.home._helper()\n"                        # attribute through a dotted import
        "from typing import _SpecialForm\n"               # not this package's business
    )
    (package / "sub" / "home2.py").write_text("from pkg.sub.home import _helper\n")
    (package / "sub" / "own.py").write_text("def _mine(): pass\nfrom pkg.sub.own import _mine\n")
    assert _offenders(package, "pkg") == [
        "pkg/sub/home2.py line 1: from pkg.sub.home import _helper",
        "pkg/sub/user.py line 2: from pkg.sub.home import _helper",
        "pkg/sub/user.py line 3: from pkg.sub.home import _helper",
        "pkg/sub/user.py line 5: from pkg.sub.home import _helper",
        "pkg/sub/user.py line 7: pkg.sub.home._helper",
        "pkg/sub/user.py line 9: pkg.sub.home._helper",
    ]
