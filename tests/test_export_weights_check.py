"""The exported library's weights check on weights of many chunks (several of the AVX2
path's eight-chunk batches), opened with one thread and with two (which hash the data's
subtrees side by side and join them): the file the
export wrote is accepted, which means the library's BLAKE3 of it equals the digest the
``blake3`` package computed at export (built into the library), and the model then
matches onnxruntime; a byte edited anywhere in the data, with the header's CRC made right,
is refused."""

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

pytestmark = [pytest.mark.skipif(compiler() is None, reason="no C compiler: nothing can be exported or linked"),
              pytest.mark.slow]  # every test builds, links or runs a C library

HEADER, SPAN = 128, 64 * 1024  # edits at 64 KiB steps: each in another part of BLAKE3's tree
DAMAGED = 4


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """An MLP whose weights span more than 2 MiB, exported."""
    root = tmp_path_factory.mktemp("export-wide")
    model, feeds = mlp(root / "wide.onnx", width=12288)
    export(root / "wide.onnx", root / "wide", cache=root / "cache")
    data = (root / "wide" / "wide.weights").stat().st_size - HEADER
    assert data > 3 * SPAN, "the weights must span the places the edits are made"
    # and, opened with two threads, be hashed on both (the library splits data from 1 MiB)
    assert data > 2 * 2**20
    return model, feeds, root / "wide"


@pytest.mark.parametrize("threads", [1, 2])
def test_the_exported_weights_are_accepted_and_the_model_runs(wide, threads):
    model, feeds, folder = wide
    want = ort_outputs(model, feeds)
    with nncc.load_library(folder, threads=threads) as library:
        got = library.run(feeds)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(value).max()))


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize("where", [HEADER, HEADER + SPAN + 5, HEADER + 2 * SPAN, HEADER + 3 * 2**19 + 7, -1],
                         ids=["first byte", "inside the second 64 KiB", "at 128 KiB", "at 1.5 MiB", "last byte"])
def test_edited_data_is_refused_with_any_thread_count(wide, tmp_path, threads, where):
    """Each case is a copy of the export (its own library): one data byte
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
