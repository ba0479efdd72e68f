"""The native int8 GEMM (nncc/native/int8_gemm_gen.py) for com.microsoft DynamicQuantizeMatMul,
for the host's ISA (vpdpbusd where the CPU has AVX-512 VNNI), for x86-64-v3 where the host
runs it (AVX2: vpmaddubsw over B's pairs bounded to |b0| + |b1| <= 128, the rest added
exactly) and for the baseline x86-64 target,
whose code is the plain C fallback: each must give the operator's exact result bit
for bit (DynamicQuantizeLinear, an exact integer product, then the float32 roundings), and
run as native code. The exact result is computed here in int64, and onnxruntime (told to
compute its integer products exactly, tests/oracle.py) is checked to agree with both.
tests/native_fuzz_cases.py covers many more geometries, sanitized too."""

from __future__ import annotations

import platform

import numpy as np
import onnx
from onnx import numpy_helper
import pytest

import nncc
from nncc.native.int8_gemm_gen import CHUNK, DENSE, NR, pack_b, remainder_capacity
from nncc.native.toolchain import find_toolchain, missing_features, required_features
from tests.models import dynamic_quantize_matmul
from tests.oracle import ort_session

pytestmark = pytest.mark.skipif(find_toolchain(sanitize=False) is None, reason="no C compiler")
X86 = platform.machine() in ("x86_64", "AMD64")
# x86-64-v3 is the AVX2 kernel whatever the host's own best is (one with VNNI takes vpdpbusd)
TARGETS = ["native"] + (["x86-64"] if X86 else []) + (
    ["x86-64-v3"] if X86 and not missing_features(required_features("x86-64-v3")) else [])
F32 = np.float32


def _exact(a, inits):
    """DynamicQuantizeMatMul as the operator defines it: a quantized to uint8 by
    DynamicQuantizeLinear (range widened to include 0, round half to even, saturate), the
    integer product exact in int64, then float32: the sum times (a_scale * b_scale), plus
    the bias."""
    low, high = min(F32(0), a.min()), max(F32(0), a.max())
    scale = F32((high - low) / F32(255))
    if scale == 0:
        q, zero = np.zeros(a.shape, np.int64), 0
    else:
        zero = int(np.clip(np.round(-low / scale), 0, 255))
        q = np.clip(np.round(a / scale) + zero, 0, 255).astype(np.int64)
    b = inits["b"].astype(np.int64) - inits["bz"].astype(np.int64) if "bz" in inits else inits["b"].astype(np.int64)
    y = np.matmul(q - zero, b).astype(F32) * (scale * inits["bs"].astype(F32))
    return y + inits["bias"] if "bias" in inits else y


# the baseline x86-64 build is another compile of the same kernels: slow
@pytest.mark.slow
@pytest.mark.parametrize("target", [t if t == "native" else pytest.param(t, marks=pytest.mark.slow) for t in TARGETS])
def test_int8_gemm_matches_onnxruntime_bit_for_bit(tmp_path, target):
    rng = np.random.default_rng(4)
    geometries = [((1, 64), 64, False, True, False), ((7, 33), 19, True, False, True),
                  ((2, 3, 13, 128), 130, True, True, True), ((200, 17), 65, False, True, False),
                  # a long K, its remainder entries' rows past 1024
                  ((9, 1030), 70, True, True, True)]
    for i, (shape, n, b_zero, bias, per_column) in enumerate(geometries):
        path = tmp_path / f"m{i}.onnx"
        proto = dynamic_quantize_matmul(rng, shape, n, b_zero, bias, per_column)
        onnx.save(proto, path)
        inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        model = nncc.compile_model(path, target=target)
        assert model.native_partitions == 1
        session = ort_session(path)
        feeds = []
        for scale in (4.0, 0.001):
            a = (rng.standard_normal(shape) * scale).astype(np.float32)
            feeds.append(np.abs(a) if scale < 1 else a)  # a range without negatives: zero point 0
        feeds.append(np.zeros(shape, np.float32))  # an all-zero input: no range at all
        for a in feeds:
            y = model.run({"a": a})["y"]
            np.testing.assert_array_equal(y, _exact(a, inits))
            np.testing.assert_array_equal(y, session.run(None, {"a": a})[0])


def _decode_slices(block, groups, panel, out):
    """Writes the bytes of one panel's four slices (byte (((slice * G + group) * 16 +
    column) * 4 + t of the panel) where they belong in ``out``: row 4 * group + t, column
    64 * panel + 16 * slice + column."""
    for index, value in enumerate(block.view(np.int8)):
        rest, t = divmod(index, 4)
        rest, column = divmod(rest, CHUNK)
        slice_, group = divmod(rest, groups)
        out[4 * group + t, NR * panel + CHUNK * slice_ + column] = value


@pytest.mark.parametrize("k, n, form", [(5, 3, "sparse"), (40, 64, "sparse"), (131, 130, "sparse"), (64, 200, "sparse"),
                                        (13, 130, "uniform"), (64, 200, "uniform")])
def test_pairs_layout_holds_each_weight_where_the_kernel_reads_it(k, n, form):
    """The pairs layout of the AVX2 kernel, byte by byte as int8_gemm_gen's docstring
    defines it: per panel, the main part's four slices, then the remainder's count, column
    mask and entries, or, where the entries would cost more than a second pass (uniform weights:
    a quarter of the pairs over the bound), the remainder's four slices instead. Main plus remainder give B
    back, and no pair of either can saturate vpmaddubsw on bytes up to 255."""
    rng = np.random.default_rng(k * n)
    if form == "uniform":
        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    else:  # mostly small, as trained weights: the pairs below the only ones over the bound
        b = np.clip(np.round(rng.standard_normal((k, n)) * 20), -60, 60).astype(np.int8)
    if n >= 4:  # pairs both extreme, at the bound, one over it
        b[:2, :4] = [[-128, -128, 127, 64], [-128, 0, 127, -65]]
    dense = remainder_capacity(b) == DENSE
    assert dense == (form == "uniform")
    packed = pack_b(b, pairs=True).view(np.uint8)
    groups, panels = -(-k // 4), -(-n // NR)
    part = groups * 4 * NR
    stride = packed.size // panels
    assert packed.size % panels == 0 and stride % 64 == 0
    assert stride == 2 * part if dense else stride >= part + 4
    main = np.zeros((groups * 4, panels * NR), np.int64)
    rest = np.zeros_like(main)
    for panel in range(panels):
        block = packed[panel * stride:(panel + 1) * stride]
        _decode_slices(block[:part], groups, panel, main)
        if dense:
            _decode_slices(block[part:], groups, panel, rest)
            continue
        words = block[part:].view(np.uint32)
        count, touched = int(words[0]), int(words[1]) | int(words[2]) << 32
        assert not words[3 + count:].any()  # zeros past the entries
        seen = set()
        for word in words[3:3 + count]:
            row, col, value = int(word) & 0xFFFF, (int(word) >> 16) & 63, np.uint8(int(word) >> 24).view(np.int8)
            assert (int(word) >> 23) & 1 == (col not in seen)  # the column's first entry sets, the others add
            seen.add(col)
            rest[row, panel * NR + col] += int(value)
        assert touched == sum(1 << col for col in seen)  # the mask of the columns with entries
    expected = np.zeros_like(main)
    expected[:k, :n] = b
    np.testing.assert_array_equal(main + rest, expected)
    for matrix in (main, rest):  # u8 bytes of A up to 255 times each pair stay within int16
        pairs = matrix.reshape(-1, 2, matrix.shape[1])
        highest = 255 * np.clip(pairs, 0, None).sum(axis=1).max()
        lowest = 255 * np.clip(pairs, None, 0).sum(axis=1).min()
        assert highest <= 2 ** 15 - 1 and lowest >= -2 ** 15
    if n >= 4:  # a same-sign pair over the bound keeps its larger weight whole, the other
        # shrinks to fit; a pair of opposite signs stays whole, however large
        assert list(main[:2, :4].T.reshape(-1)) == [-128, 0, -128, 0, 127, 1, 64, -65]
