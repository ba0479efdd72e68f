"""The arithmetic of native products by constant weights: what a target can do of what the
compile options ask.

``precision="bf16"`` has three arithmetics. Where the target has AVX-512 BF16 both inputs
of a product are rounded to bfloat16 and ``vdpbf16ps`` multiplies them ("bf16": half the
instructions and half the weight bytes); where it also has AMX (amx_tile, amx_bf16) the
same roundings are multiplied on AMX tiles ("bf16amx", nncc/native/gemm_amx_gen.py: the
same bound, and the vdpbf16ps code where the OS refuses the tiles). Everywhere else only the weights are stored as
bfloat16 and widened to float32 in registers ("bf16w": half the weight bytes the
micro-kernel streams, float32 products and sums). Only a plan without native code (no C
compiler) computes everything in float32, and the user is told so once per process.

Without a bfloat16 dot product the weights are widened on every read, so a layer keeps
bfloat16 weights only where that pays (``weights_pay``); the others stay float32 and the
plan's record names them with the reason (``WIDENING_COSTS``)."""

from __future__ import annotations

from nncc.native import amx
from nncc.native.toolchain import required_features
from nncc.util.notice import warn_once

FEATURE = "avx512_bf16"  # as /proc/cpuinfo names it
# the arithmetic of each kind, as the native backend's identity names it
ARITHMETICS = {"f32": "float32", "bf16": "bfloat16 products (vdpbf16ps)",
               "bf16amx": "bfloat16 products on AMX tiles (tdpbf16ps; vdpbf16ps where the OS refuses the tiles)",
               "bf16w": "bfloat16 weights widened to float32"}


# Widened bfloat16 weights pay where reading the weights bounds a product: few rows of A,
# each packed panel of B streamed once. With many rows each panel is read again from cache
# by every tile of rows and widened again each time (a shift and a mask per two vectors),
# which costs the micro-kernel more issue slots than the halved bytes save. Measured with
# benchmarks/bench_gemm.py --precision bf16 --threads 1 --stat best on the AVX2 EPYC, K and
# N 512 or 2048, on a busy machine: up to 64 rows the widened GEMM ran 0.98-1.53x as fast
# as float32's, at 256 rows 0.89-1.10x, at 1024 and 3136 rows 0.76-1.03x. The boundary is
# between 64 and 256 rows; 128 keeps one-row decoding, small batches and a 128-token
# sequence (where whole transformers gained) in bfloat16.
WIDENED_ROWS_MAX = 128
WIDENING_COSTS = "no bf16 dot product on this CPU: widening costs more than it saves"


def weights_pay(kind: str, rows: int) -> bool:
    """Whether a product by constant weights with ``rows`` rows of A per weight matrix
    keeps its weights below float32 under arithmetic ``kind`` (an ARITHMETICS key): always with
    a bfloat16 dot product, with widened weights only up to WIDENED_ROWS_MAX rows."""
    return kind != "bf16w" or rows <= WIDENED_ROWS_MAX


# The blocked convolutions (nncc/native/conv_bf16.py) multiply in bfloat16 only where
# vdpbf16ps outruns float32's FMAs. On AMD's Zen 4 the bfloat16 GEMM ran at about twice
# float32's (nncc/native/gemm_bf16_gen.py); on Intel's Sapphire Rapids family (the CPUs
# with AMX tiles) it issues at a quarter of the FMA's rate, so half its arithmetic:
# measured on such a Xeon, 1.5-1.7 vdpbf16ps a nanosecond against 4.4-6.2 FMAs, and
# light_resnet50's direct convolutions took 1.1-1.9x their float32 time in bfloat16.
# There they run on AMX tiles instead where the compile's arithmetic is bf16amx
# (nncc/native/conv_amx.py, chosen in layout.blocked_conv), else stay float32.
SLOW_DOT = "amx_tile"


def convolutions_in_bf16(kind: str) -> bool:
    """Whether the blocked convolutions compute in bfloat16 under arithmetic ``kind`` (an
    ARITHMETICS key) on this host (only "native" code has AVX-512 BF16: SLOW_DOT)."""
    return kind == "bf16" and SLOW_DOT not in required_features("native")


def why_not_bf16(target: str) -> str | None:
    """Why code for ``target`` cannot multiply in bfloat16 (one clause), or None: it then
    keeps its weights in bfloat16 and multiplies in float32 (``arithmetic``)."""
    if FEATURE in required_features(target):
        return None
    if target == "native":
        return f"this CPU lacks {FEATURE}"
    return f"--target {target} does not include {FEATURE}"


def arithmetic(precision: str, target: str) -> str:
    """The arithmetic (an ARITHMETICS key) native code for ``target`` computes products by
    constant weights in when ``precision`` is asked for."""
    if precision == "f32":
        return "f32"  # auto is bf16 with some layers kept float32 (CompileOptions.keep_f32)
    if why_not_bf16(target) is not None:
        return "bf16w"
    return "bf16amx" if amx.usable(target, "amx_bf16") else "bf16"


def say_if_unavailable(precision: str, has_compiler: bool) -> None:
    """One warning per process and precision when no native code can honour it."""
    if precision != "f32" and not has_compiler:
        warn_once(("precision", precision),
                  f"precision {precision} ignored: no C compiler, so no native code; the portable plan computes "
                  "in float32")
