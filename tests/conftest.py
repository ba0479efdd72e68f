import importlib.metadata
import os
import pathlib
import tempfile
import tomllib

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def light_models_dir() -> pathlib.Path:
    import onnx

    return pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def required_distributions() -> list[Requirement]:
    """pyproject.toml's test extra: what the suite needs installed, besides nncc's own dependencies."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]


def missing_requirements() -> list[str]:
    missing = []
    for requirement in required_distributions():
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(str(requirement))
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{requirement} (found {version})")
    return missing


def marked_slow_as_a_whole(path: pathlib.Path) -> bool:
    """The test file says ``pytestmark = pytest.mark.slow`` (a comment after it may say why)."""
    return any(line.split("#")[0].strip() == "pytestmark = pytest.mark.slow" for line in path.read_text().splitlines())


def pytest_ignore_collect(collection_path, config):
    # The quick tier would deselect every test of such a file: not importing it saves its
    # collection (enumerating the ONNX node cases alone takes seconds).
    if config.option.markexpr.strip() == "not slow" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and marked_slow_as_a_whole(collection_path):
        return True
    return None


def pytest_configure(config):
    # The suite needs its test extra: without it, a test would fail on an import, or a
    # missing oracle would pass for a skip. One message instead, before any test runs.
    missing = missing_requirements()
    if missing:
        raise pytest.UsageError(f"the tests need {', '.join(missing)}: install them with pip install -e '.[test]'")
    # Code that runs before any fixture (module-level compiles, module-scoped fixtures)
    # must not sign with, nor create, the user's real key either.
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="nncc-test-config-")
    os.environ.pop("NNCC_TRUST_KEY_FILE", None)


@pytest.fixture(scope="session")
def isolation_root(tmp_path_factory) -> pathlib.Path:
    """The folder that holds every test's isolated cache and config. pytest finds the next
    number of a numbered folder by listing its parent: three of them per test beside each
    other made each new one a scan of all the others (seconds per thousand tests, growing
    with the square of the count); a random name in a folder of their own costs one mkdir."""
    return tmp_path_factory.mktemp("isolated")


def isolate(monkeypatch, root: pathlib.Path) -> None:
    """No test may touch the user's real nncc cache, nor sign with (or create) their key, nor
    read or write the user's config file."""
    folder = pathlib.Path(tempfile.mkdtemp(dir=root))
    for name in ("nncc-cache", "nncc-config", "nncc-config-file"):
        (folder / name).mkdir(mode=0o700)
    monkeypatch.setenv("NNCC_CACHE_DIR", str(folder / "nncc-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder / "nncc-config"))
    monkeypatch.delenv("NNCC_TRUST_KEY_FILE", raising=False)
    monkeypatch.setenv("NNCC_CONFIG_FILE", str(folder / "nncc-config-file" / "config.toml"))
    # No background build of a native stage behind a test's back (a detached worker would
    # outlive the test); tests of the stages turn it on themselves.
    monkeypatch.setenv("NNCC_UPGRADE_AFTER", "off")


@pytest.fixture(autouse=True)
def _isolated_cache(isolation_root, monkeypatch):
    isolate(monkeypatch, isolation_root)


@pytest.fixture(scope="module")
def module_isolated(isolation_root):
    """The same isolation for a module-scoped fixture that compiles once for a whole file
    (it is set up before any test's own isolation): a cache and config of the module's own."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        isolate(monkeypatch, isolation_root)
        yield


@pytest.fixture
def cli(capsys):
    """Run `nncc ARGS...` in-process: (exit code, stdout, stderr)."""
    from nncc.cli.main import main

    def invoke(*args):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in args])
        out, err = capsys.readouterr()
        return exc.value.code, out, err

    return invoke
