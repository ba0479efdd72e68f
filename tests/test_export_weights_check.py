"""The exported library's weights check with its thread pool: opened with more than one
thread, a library hashes the aligned subtrees of its weights on the pool and joins them.
The digest it must reach is the one the ``blake3`` package computed at export (in the
header and built into the library), so accepting the file checks the joined hash against
that oracle, and the output against onnxruntime; edited data is refused on either path."""

from __future__ import annotations

import shutil
import struct
import zlib

import numpy as np
import pytest

import nncc
from nncc.export.ctypes_library import LibraryError
from tests.export_build import compiler, export, mlp
from tests.oracle import ort_outputs

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler: nothing can be exported or linked")

HEADER, SUBTREE = 128, 64 * 1024  # nncc/export/api.c: the pool hashes subtrees of 64 chunks
DAMAGED = 4


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """An MLP whose weights span several of the pool's subtrees, exported."""
    root = tmp_path_factory.mktemp("export-wide")
    model, feeds = mlp(root / "wide.onnx", width=1024)
    export(root / "wide.onnx", root / "wide", cache=root / "cache")
    data = (root / "wide" / "wide.weights").stat().st_size - HEADER
    assert (data - 1) // SUBTREE >= 3, "the weights must span several subtrees to test the pool's path"
    return model, feeds, root / "wide"


@pytest.mark.parametrize("threads", [1, 2])
def test_the_pool_hashed_weights_are_accepted_and_the_model_runs(wide, threads):
    """One thread first: the library's pool is made by the first open that asks for more,
    and from then on every open of that library hashes on it."""
    model, feeds, folder = wide
    want = ort_outputs(model, feeds)
    with nncc.load_library(folder, threads=threads) as library:
        got = library.run(feeds)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(value).max()))


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize("where", [HEADER, HEADER + SUBTREE + 5, HEADER + 2 * SUBTREE, -1],
                         ids=["first byte", "inside the second subtree", "third subtree's start", "last byte"])
def test_edited_data_is_refused_on_the_pool_and_serial_paths(wide, tmp_path, threads, where):
    """Each case is a copy of the export (its own library, so its own pool): one data byte
    changed and the header's CRC made right, so only the data's BLAKE3 can refuse it."""
    _, _, folder = wide
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    weights = bytearray((copy / "wide.weights").read_bytes())
    weights[where] ^= 0x10
    weights[88:92] = struct.pack("<I", zlib.crc32(bytes(weights[:88])))
    (copy / "wide.weights").write_bytes(bytes(weights))
    with pytest.raises(LibraryError) as refused:
        nncc.load_library(copy, threads=threads)
    assert refused.value.code == DAMAGED and "built into this library" in str(refused.value)
