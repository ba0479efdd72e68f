/* One vector type and its operations, for the ISA the code is built for: AVX-512 (16
 * floats), AVX2 with FMA (8), else GCC's generic vectors (4 floats: SSE, NEON, or scalar
 * code on anything else). The code generator picks the same width (nncc/native/isa.py)
 * for the blocked layout and the packed weights, and each kernel checks it with
 * NN_REQUIRE_VL, so a kernel never runs with a width it was not laid out for. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define NN_VL 16
typedef __m512 nn_v;
#define nn_vload(p) _mm512_loadu_ps(p)
#define nn_vstore(p, v) _mm512_storeu_ps((p), (v))
#define nn_vset1(s) _mm512_set1_ps(s)
#define nn_vzero() _mm512_setzero_ps()
#define nn_vfma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define nn_vadd(a, b) _mm512_add_ps((a), (b))
#define nn_vsub(a, b) _mm512_sub_ps((a), (b))
#define nn_vmul(a, b) _mm512_mul_ps((a), (b))
#define nn_vmax(a, b) _mm512_max_ps((a), (b))
#define nn_vmin(a, b) _mm512_min_ps((a), (b))
/* max that propagates a NaN from either side (x86 max returns its second operand) */
static inline nn_v nn_vmaxnan(nn_v acc, nn_v x) {
    return _mm512_mask_mov_ps(_mm512_max_ps(x, acc), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
static inline nn_v nn_vneg_select(nn_v v, nn_v when_negative) { /* v < 0 ? when_negative : v */
    return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ), when_negative);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NN_VL 8
typedef __m256 nn_v;
#define nn_vload(p) _mm256_loadu_ps(p)
#define nn_vstore(p, v) _mm256_storeu_ps((p), (v))
#define nn_vset1(s) _mm256_set1_ps(s)
#define nn_vzero() _mm256_setzero_ps()
#define nn_vfma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define nn_vadd(a, b) _mm256_add_ps((a), (b))
#define nn_vsub(a, b) _mm256_sub_ps((a), (b))
#define nn_vmul(a, b) _mm256_mul_ps((a), (b))
#define nn_vmax(a, b) _mm256_max_ps((a), (b))
#define nn_vmin(a, b) _mm256_min_ps((a), (b))
static inline nn_v nn_vmaxnan(nn_v acc, nn_v x) {
    return _mm256_blendv_ps(_mm256_max_ps(x, acc), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
static inline nn_v nn_vneg_select(nn_v v, nn_v when_negative) {
    return _mm256_blendv_ps(v, when_negative, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
}
#else
#define NN_VL 4
typedef float nn_v __attribute__((vector_size(16)));
typedef int32_t nn_vi __attribute__((vector_size(16)));
static inline nn_v nn_vload(const float *p) { nn_v v; memcpy(&v, p, sizeof v); return v; }
static inline void nn_vstore(float *p, nn_v v) { memcpy(p, &v, sizeof v); }
static inline nn_v nn_vset1(float s) { return (nn_v){s, s, s, s}; }
#define nn_vzero() ((nn_v){0.0f, 0.0f, 0.0f, 0.0f})
#define nn_vfma(a, b, c) ((a) * (b) + (c))
#define nn_vadd(a, b) ((a) + (b))
#define nn_vsub(a, b) ((a) - (b))
#define nn_vmul(a, b) ((a) * (b))
static inline nn_v nn_vselect(nn_vi m, nn_v a, nn_v b) { /* m ? a : b, lane by lane */
    nn_vi r = (m & (nn_vi)a) | (~m & (nn_vi)b);
    return (nn_v)r;
}
static inline nn_v nn_vmax(nn_v a, nn_v b) { return nn_vselect(a > b, a, b); }
static inline nn_v nn_vmin(nn_v a, nn_v b) { return nn_vselect(a < b, a, b); }
static inline nn_v nn_vmaxnan(nn_v acc, nn_v x) { return nn_vselect((x > acc) | (x != x), x, acc); }
static inline nn_v nn_vneg_select(nn_v v, nn_v when_negative) {
    return nn_vselect(v < nn_vzero(), when_negative, v);
}
#endif
#define NN_REQUIRE_VL(n) _Static_assert(NN_VL == (n), "built for another vector width than it was laid out for")

/* The epilogue activations (prelude.h's NN_* codes) on a vector; sigmoid and tanh are
 * applied lane by lane after the store (see nn_vact_needs_scalar). */
static inline nn_v nn_vact(int act, nn_v v, float p0, float p1) {
    switch (act) {
    case NN_RELU: return nn_vmax(v, nn_vzero());
    case NN_CLIP: return nn_vmin(nn_vmax(v, nn_vset1(p0)), nn_vset1(p1));
    case NN_LEAKY: return nn_vneg_select(v, nn_vmul(v, nn_vset1(p0)));
    case NN_HSIGMOID: return nn_vmin(nn_vmax(nn_vfma(v, nn_vset1(p0), nn_vset1(p1)), nn_vzero()), nn_vset1(1.0f));
    case NN_HSWISH: {
        nn_v t = nn_vmin(nn_vmax(nn_vfma(v, nn_vset1(1.0f / 6.0f), nn_vset1(0.5f)), nn_vzero()), nn_vset1(1.0f));
        return nn_vmul(v, t);
    }
    default: return v;
    }
}
#define nn_vact_needs_scalar(act) ((act) == NN_SIGMOID || (act) == NN_TANH)
