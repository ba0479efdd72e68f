"""The CPU features an exported library checks with cpuid when a model is opened.

Each entry names a feature as /proc/cpuinfo does (nncc.native.toolchain.required_features)
and the C condition that finds it: the cpuid bit, and for vector features the operating
system's consent (XGETBV: it saves those registers on a context switch). The order is the
bit order of the weights file's feature mask. Features outside this table (an ARM
machine's) are left to the build: the check covers x86-64.
"""

from __future__ import annotations

# (name, C condition over the registers nnx_cpu_mask reads: c1/d1 from leaf 1, b7/c7/d7
# from leaf 7, a71 from leaf 7 subleaf 1; ymm/zmm/amx: the OS saves that state)
FEATURES = (
    ("sse2", "d1 >> 26 & 1"),
    ("ssse3", "c1 >> 9 & 1"),
    ("sse4_1", "c1 >> 19 & 1"),
    ("sse4_2", "c1 >> 20 & 1"),
    ("popcnt", "c1 >> 23 & 1"),
    ("avx", "(c1 >> 28 & 1) && ymm"),
    ("avx2", "(b7 >> 5 & 1) && ymm"),
    ("fma", "(c1 >> 12 & 1) && ymm"),
    ("f16c", "(c1 >> 29 & 1) && ymm"),
    ("bmi1", "b7 >> 3 & 1"),
    ("bmi2", "b7 >> 8 & 1"),
    ("avx512f", "(b7 >> 16 & 1) && zmm"),
    ("avx512dq", "(b7 >> 17 & 1) && zmm"),
    ("avx512cd", "(b7 >> 28 & 1) && zmm"),
    ("avx512bw", "(b7 >> 30 & 1) && zmm"),
    ("avx512vl", "(b7 >> 31 & 1) && zmm"),
    ("avx512_vnni", "(c7 >> 11 & 1) && zmm"),
    ("avx512_bf16", "(a71 >> 5 & 1) && zmm"),
    ("amx_tile", "(d7 >> 24 & 1) && amx"),
)


def mask(features) -> int:
    """The bits of ``features`` this table knows."""
    names = [name for name, _ in FEATURES]
    return sum(1 << names.index(f) for f in set(features) if f in names)


def names(bits: int) -> list[str]:
    return [name for i, (name, _) in enumerate(FEATURES) if bits >> i & 1]


def c_function() -> str:
    """``static uint64_t nnx_cpu_mask(void)``: this CPU's bits of FEATURES (x86-64; elsewhere
    every bit, the build having chosen the ISA)."""
    tests = "\n".join(f"    if ({cond}) m |= (uint64_t)1 << {i};  /* {name} */"
                      for i, (name, cond) in enumerate(FEATURES))
    return f"""#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static uint64_t nnx_cpu_mask(void) {{
    unsigned a, b, c, d, c1 = 0, d1 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    uint64_t m = 0, xcr0 = 0;
    unsigned top = __get_cpuid_max(0, 0);
    if (top < 1) return 0;
    __cpuid(1, a, b, c, d); c1 = c; d1 = d;
    if (top >= 7) {{
        __cpuid_count(7, 0, a, b, c, d); b7 = b; c7 = c; d7 = d;
        if (a >= 1) {{ __cpuid_count(7, 1, a, b, c, d); a71 = a; }}
    }}
    if (c1 >> 27 & 1) {{  /* OSXSAVE: XGETBV says which register state the OS saves */
        unsigned lo, hi;
        __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = (uint64_t)hi << 32 | lo;
    }}
    int ymm = (xcr0 & 6) == 6, zmm = ymm && (xcr0 & 0xe0) == 0xe0, amx = (xcr0 & 0x60000) == 0x60000;
    (void)ymm; (void)zmm; (void)amx;
{tests}
    return m;
}}
#else
static uint64_t nnx_cpu_mask(void) {{ return ~(uint64_t)0; }}
#endif
"""
