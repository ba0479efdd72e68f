"""nncc.runtime.expansion: broadcast constants become dense, read-only copies in one block,
copied by a helper thread and the caller together when the block is large."""

import threading

import numpy as np
import pytest

from nncc.plan.memory import ALIGN
from nncc.runtime import expansion
from nncc.runtime.expansion import expanded, is_broadcast


def _constants(rng, big: bool):
    """Per-channel-scaled weights as BatchNormalization folding leaves them (stride 0 on
    the inner axes), a scalar fill, and dense constants that must pass through untouched."""
    channels = 512 if big else 4
    scale = rng.standard_normal(channels).astype(np.float32)
    per_channel = np.broadcast_to(scale[:, None, None, None], (channels, 256, 3, 3))
    fill = np.broadcast_to(np.float32(0.25), (channels, 32))
    dense = rng.standard_normal((7, 5)).astype(np.float32)
    single = np.ones(1, np.int64)
    return {3: per_channel, 5: fill, 8: dense, 9: single}


@pytest.mark.parametrize("big", [False, True], ids=["small-in-caller", "large-threaded"])
def test_broadcast_constants_become_dense_read_only_copies(big, monkeypatch):
    constants = _constants(np.random.default_rng(0), big)
    started = []
    real_thread = threading.Thread

    def counting_thread(*args, **kwargs):
        started.append(kwargs.get("name"))
        return real_thread(*args, **kwargs)

    monkeypatch.setattr(expansion.threading, "Thread", counting_thread)
    monkeypatch.setattr(expansion, "_cpus", lambda: 2)
    result = expanded(constants)

    total = sum(a.nbytes for a in constants.values() if is_broadcast(a))
    assert (total >= expansion.THREADED_MIN_BYTES) == big
    assert started == (["nncc-expand"] if big else [])
    for slot in (3, 5):
        dense = result[slot]
        assert dense.flags.c_contiguous and not dense.flags.writeable
        assert dense.ctypes.data % ALIGN == 0
        np.testing.assert_array_equal(dense, constants[slot])
    assert np.shares_memory(result[3].base, result[5].base)  # one block for all of them
    assert result[8] is constants[8] and result[9] is constants[9]


def test_one_cpu_copies_without_a_thread(monkeypatch):
    constants = _constants(np.random.default_rng(1), big=True)
    monkeypatch.setattr(expansion, "_cpus", lambda: 1)
    monkeypatch.setattr(expansion.threading, "Thread", None)  # any thread start would fail
    result = expanded(constants)
    np.testing.assert_array_equal(result[3], constants[3])


def test_a_failed_copy_is_raised_by_result(monkeypatch):
    constants = _constants(np.random.default_rng(2), big=True)
    monkeypatch.setattr(expansion, "_cpus", lambda: 2)

    def broken_copyto(dst, src):
        raise MemoryError("no pages left")

    monkeypatch.setattr(expansion.np, "copyto", broken_copyto)
    with pytest.raises(MemoryError, match="no pages left"):
        expanded(constants)


def test_no_broadcast_constants_means_no_block():
    dense = {1: np.arange(6, dtype=np.float32)}
    assert expanded(dense) == dense
