"""nncc.kernels.workspace: kept buffers are cut from large shared slabs (so a first run
faults them in as huge pages), aligned, never overlapping, zeroed on request."""

import numpy as np
import pytest

import nncc
from nncc.kernels.workspace import SLAB, carve, kept
from tests.conftest import light_models_dir


def _owner(array):
    while array.base is not None:
        array = array.base
    return array


def test_carved_buffers_are_aligned_disjoint_and_share_slabs():
    ws: dict = {}
    small = [carve(ws, (n,), np.float32) for n in (1, 7, 1000, 4096)]
    big = carve(ws, (SLAB // 4 + 3,), np.float32)  # larger than a slab: a slab of its own
    for a in small + [big]:
        assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous
    for i, a in enumerate(small + [big]):
        for b in (small + [big])[i + 1:]:
            assert not np.shares_memory(a, b)
    assert len({id(_owner(a)) for a in small}) == 1  # the small ones came from one slab
    assert _owner(big) is not _owner(small[0])


def test_carve_zeroes_on_request_and_works_without_a_workspace():
    ws: dict = {}
    dirty = carve(ws, (64,), np.float64)
    dirty[:] = 7.0
    clean = carve(ws, (3, 5), np.float64, zero=True)
    assert clean.shape == (3, 5) and not clean.any()
    assert carve(None, (2, 2), np.int32, zero=True).tolist() == [[0, 0], [0, 0]]


def test_kept_returns_the_same_buffer_for_the_same_key():
    ws: dict = {}
    a = kept(ws, "tmp", (4, 4), np.float32)
    assert kept(ws, "tmp", (4, 4), np.float32) is a
    assert kept(ws, "tmp", (4, 4), np.float64) is not a
    assert kept(ws, "tmp", 16, np.float32).shape == (16,)


@pytest.mark.slow
def test_a_model_workspace_lives_in_a_few_slabs():
    model = nncc.compile_model(light_models_dir() / "light_resnet50.onnx", backends=["numpy"])  # numpy kernels
    feeds = {n: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], i.dtype)
             for n, i in model.input_infos.items()}
    model.run(feeds)
    workspace = next(step[1].workspace for step in model._executor.steps)
    arrays = [v for v in workspace.values() if isinstance(v, np.ndarray) and v.nbytes >= 4096]
    owners = {id(_owner(array)) for array in arrays}
    assert arrays and len(owners) <= 4, len(owners)
