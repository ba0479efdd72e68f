"""The blocked direct convolution of nncc/native/blocked_conv.py in bfloat16 (``precision=
"bf16"`` on CPUs with AVX-512 BF16): its weights, the rounding of its input, and the
multiply-add of its micro-kernel.

``vdpbf16ps`` multiplies pairs: each 32-bit lane holds two bfloat16 values, and the
instruction adds both exact products of a lane to its float32 sum. The convolution pairs
consecutive input channels of a block: the weights are rounded to bfloat16 at compile time
(to nearest, ties to even) and packed as the float32 kernel's [OCG][ICB][KH][KW][LB][OCB*VL]
with LB halved, word p of a lane holding channels 2p (low half) and 2p + 1 (high half).
At run time the step first rounds its input, a blocked [N, C/VL, H, W, VL] activation,
into its scratch as [N, C/VL, H, W, VL/2] words (one ``vcvtneps2bf16`` per pixel and
block, the lanes past the last real channel zeroed, so a padded block's garbage never
meets a zero weight). The micro-kernel then broadcasts one word (two channels of a pixel)
where the float32 one broadcast one channel, and its ``vdpbf16ps`` does the work of two
multiply-adds: half the instructions and half the bytes of weights and input. The tiling,
threading, partial sums and epilogue (bias, residual, activation) are the float32 ones.

Each product sees its inputs rounded to 8 significant bits (each off by at most 2^-8 of
itself, so the product by about 2^-7) and sums in float32: per output the error is at
most about 2^-7 * sum |x * w| plus float32 summation's (docs/native.md)."""

from __future__ import annotations

import numpy as np

from nncc.native.gemm_bf16_gen import to_bf16

PIXELS_PER_TASK = 1024  # of the rounding pass: (image, block, chunk of pixels) tasks


def pack_weights(packed: np.ndarray) -> np.ndarray:
    """The float32 direct convolution's packed weights [OCG][ICB][KH][KW][LB][OCB*VL] (LB
    even: a blocked input's VL) as bfloat16 pairs of LB: [...][LB/2][OCB*VL] words, carried
    as float32 like every constant the entry point takes."""
    if packed.shape[4] % 2:
        raise ValueError("bfloat16 pairs need an even count of lanes per block")
    halves = to_bf16(packed).astype(np.uint32)
    words = halves[..., 0::2, :] | (halves[..., 1::2, :] << 16)
    return np.ascontiguousarray(words).view(np.float32)


def scratch_bytes(n: int, c: int, h: int, w: int, vl: int) -> int:
    """Bytes of the rounded input: [N, C/VL, H, W, VL/2] words."""
    return n * -(-c // vl) * h * w * vl * 2


def convert(n: int, c: int, h: int, w: int, vl: int) -> tuple[str, str]:
    """(support C, call) rounding a blocked [N, C, H, W] input to bfloat16 pairs: the call
    reads the input at ``cvt_in[0]`` and writes the pairs at ``cvt_in[1]``, a C array of two
    pointers the caller declares around it (blocked_conv.direct_conv)."""
    icb = -(-c // vl)
    last = c - (icb - 1) * vl
    pixels = h * w
    chunks = -(-pixels // PIXELS_PER_TASK)
    support = f"""
static void cvt_task(void *p, int64_t lo, int64_t hi) {{
  const float *const *a = p;
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t q = t % {chunks}, b = t / {chunks};
    const __mmask16 keep = b % {icb} == {icb - 1} ? (__mmask16){(1 << last) - 1} : (__mmask16)0xFFFF;
    const float *s = a[0] + b * {pixels * vl};
    uint32_t *d = (uint32_t *)a[1] + b * {pixels * vl // 2};
    const int64_t p1 = (q + 1) * {PIXELS_PER_TASK} < {pixels} ? (q + 1) * {PIXELS_PER_TASK} : {pixels};
    for (int64_t i = q * {PIXELS_PER_TASK}; i < p1; i++) {{
      __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(keep, s + i * {vl}));
      _mm256_storeu_si256((__m256i *)(d + i * {vl // 2}), (__m256i)v);
    }}
  }}
}}
"""
    return support, f"nn_parallel({n * icb * chunks}, {n * icb * pixels * vl}, cvt_task, (void *)cvt_in);"


HEADER = ("#include <immintrin.h>\n#ifndef __AVX512BF16__\n#error \"bfloat16 convolution built without AVX-512 "
          "BF16\"\n#endif\n")


def fma(acc: str, x: str, w: str) -> str:
    """C adding the two products of each lane of bfloat16 pairs ``x`` and ``w`` (float
    vectors holding words) to ``acc``."""
    return f"{acc} = (nn_v)_mm512_dpbf16_ps((__m512){acc}, (__m512bh){x}, (__m512bh){w});"
