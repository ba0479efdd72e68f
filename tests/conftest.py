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
    # No test may touch the user's real nncc cache.
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path_factory.mktemp("nncc-cache")))
