import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def light_models_dir() -> pathlib.Path:
    import onnx

    return pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # No test may touch the user's real nncc cache, nor read or write the user's config file.
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path_factory.mktemp("nncc-cache")))
    monkeypatch.setenv("NNCC_CONFIG_FILE", str(tmp_path_factory.mktemp("nncc-config") / "config.toml"))


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
