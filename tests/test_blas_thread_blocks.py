"""one_blas_thread, the block a native call that calls BLAS runs in (BLAS at one thread
beside nncc's own pool), entered from several threads at once: BLAS's thread count is
process-wide, so it stays one until the last block has left, and is then restored."""

from __future__ import annotations

import threading

import pytest

from nncc.util.threads import blas_threads, limit_blas_threads, one_blas_thread

pytestmark = pytest.mark.skipif(blas_threads() is None,
                                reason="numpy's BLAS here has no known thread-count entry point to observe")


def test_blocks_on_two_threads_keep_blas_at_one_thread_until_the_last_one_leaves():
    with limit_blas_threads(3):  # a count to restore that is not one
        before = blas_threads()
        entered, leave_first, first_left = threading.Event(), threading.Event(), threading.Event()
        seen = {}

        def first():
            with one_blas_thread(True):
                entered.set()
                leave_first.wait()
            first_left.set()

        worker = threading.Thread(target=first)
        worker.start()
        entered.wait()
        with one_blas_thread(True):  # this thread's block, entered while the other's is open
            assert blas_threads() == 1
            leave_first.set()
            first_left.wait()
            seen["after the other left"] = blas_threads()
        worker.join()
        assert seen["after the other left"] == 1  # this block was still running BLAS calls
        assert blas_threads() == before


def test_an_inactive_block_changes_nothing():
    with limit_blas_threads(2):
        with one_blas_thread(False):
            assert blas_threads() == 2
