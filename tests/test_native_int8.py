"""The native int8 GEMM (nncc/native/int8_gemm_gen.py) for com.microsoft DynamicQuantizeMatMul,
for the host's ISA (vpdpbusd where the CPU has AVX-512 VNNI), for x86-64-v3 where the host
runs it (AVX2: vpmaddwd over B packed as int16 pairs) and for the baseline x86-64 target,
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
from nncc.native.int8_gemm_gen import CHUNK, NR, pack_b
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
                  # K past two of the AVX2 kernel's blocks of A widened at a time (int8_gemm_gen.PAIR_BLOCK)
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


@pytest.mark.parametrize("k, n", [(5, 3), (8, 64), (13, 130)])
def test_pairs_layout_holds_each_weight_where_the_kernel_reads_it(k, n):
    """The int16 pairs layout of the AVX2 kernel, element by element as int8_gemm_gen's
    docstring defines it: (((panel * 4 + slice) * KP/2 + pair) * 16 + column) * 2 + t holds
    B[2 * pair + t, 64 * panel + 16 * slice + column], 0 past B."""
    b = np.random.default_rng(k * n).integers(-128, 128, (k, n)).astype(np.int8)
    packed = pack_b(b, pairs=True)
    kp, panels = -(-k // 4) * 4, -(-n // NR)
    assert packed.dtype == np.int16 and packed.size == kp * panels * NR
    for index, value in enumerate(packed):
        rest, t = divmod(index, 2)
        rest, column = divmod(rest, CHUNK)
        rest, pair = divmod(rest, kp // 2)
        panel, slice_ = divmod(rest, NR // CHUNK)
        row, col = 2 * pair + t, NR * panel + CHUNK * slice_ + column
        assert value == (b[row, col] if row < k and col < n else 0), (index, row, col)
