/* One vector type and its operations, for the ISA the code is built for: 16 floats with
 * AVX-512, 8 with AVX2 and FMA, else 4 (SSE, NEON, or scalar code on anything else). The code generator picks the same width (nncc/native/isa.py)
 * for the blocked layout and the packed weights, and each kernel checks it with
 * NN_REQUIRE_VL, so a kernel never runs with a width it was not laid out for. */
#if defined(__AVX512F__)
#define NN_VL 16
#elif defined(__AVX2__) && defined(__FMA__)
#define NN_VL 8
#else
#define NN_VL 4
#endif
/* GCC's generic vectors rather than intrinsics: no header to parse (immintrin.h costs
 * about 0.1 s of compiler time in every translation unit), and the same text serves every
 * width. Multiply-adds contract to FMA instructions (-ffp-contract=fast). */
typedef float nn_v __attribute__((vector_size(NN_VL * 4)));
typedef int32_t nn_vi __attribute__((vector_size(NN_VL * 4)));
static inline nn_v nn_vload(const float *p) { nn_v v; memcpy(&v, p, sizeof v); return v; }
static inline void nn_vstore(float *p, nn_v v) { memcpy(p, &v, sizeof v); }
/* every lane s, spelled out so the compiler emits one broadcast: 0 + s costs an add per
 * call (it is not s for s = -0), and a loop over the lanes is vectorized into inserts */
#if NN_VL == 16
#define NN_SPLAT(s) {s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}
#elif NN_VL == 8
#define NN_SPLAT(s) {s, s, s, s, s, s, s, s}
#else
#define NN_SPLAT(s) {s, s, s, s}
#endif
static inline nn_v nn_vset1(float s) { return (nn_v)NN_SPLAT(s); }
#define nn_vzero() ((nn_v){0})
#define nn_vfma(a, b, c) ((a) * (b) + (c))
#define nn_vadd(a, b) ((a) + (b))
#define nn_vsub(a, b) ((a) - (b))
#define nn_vmul(a, b) ((a) * (b))
static inline nn_v nn_vselect(nn_vi m, nn_v a, nn_v b) { /* m ? a : b, lane by lane */
    return (nn_v)((m & (nn_vi)a) | (~m & (nn_vi)b));
}
/* max and min that keep a NaN in a (Relu, Clip and the hard activations pass NaN through) */
static inline nn_v nn_vmax(nn_v a, nn_v b) { return nn_vselect(b > a, b, a); }
static inline nn_v nn_vmin(nn_v a, nn_v b) { return nn_vselect(b < a, b, a); }
/* max that propagates a NaN from either side */
static inline nn_v nn_vmaxnan(nn_v acc, nn_v x) { return nn_vselect((x > acc) | (x != x), x, acc); }
static inline nn_v nn_vneg_select(nn_v v, nn_v when_negative) { /* v < 0 ? when_negative : v */
    return nn_vselect(v < nn_vzero(), when_negative, v);
}
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

/* e^u on a vector, for the epilogues that apply Sigmoid, SiLU or Mish after a store:
 * prelude.h's nn_exp in vector form, with the range checks they need only. u is clamped to
 * [-87, 88] (below, e^u is too small to matter to 1 + e^u), so 2^n is one normal float built
 * from its exponent bits; above 88 e^u is taken as infinite; a NaN stays NaN (the clamps keep
 * it). n = round(u log2 e) by the 1.5 * 2^23 trick, which leaves n in the low bits of the
 * sum, so no conversion instruction is needed. */
static inline nn_v nn_vexp(nn_v u) {
    const nn_v magic = nn_vset1(12582912.0f);
    nn_v x = nn_vmax(nn_vmin(u, nn_vset1(88.0f)), nn_vset1(-87.0f));
    nn_vi overflow = u > nn_vset1(88.0f);
    nn_v t = nn_vfma(x, nn_vset1(1.44269504f), magic);
    nn_v n = t - magic;
    nn_v r = x - n * nn_vset1(0.693359375f) + n * nn_vset1(2.12194440e-4f);
    nn_v p = nn_vset1(1.98412698e-4f);
    p = nn_vfma(p, r, nn_vset1(1.38888889e-3f));
    p = nn_vfma(p, r, nn_vset1(8.33333333e-3f));
    p = nn_vfma(p, r, nn_vset1(4.16666667e-2f));
    p = nn_vfma(p, r, nn_vset1(1.66666667e-1f));
    p = nn_vfma(p, r, nn_vset1(0.5f));
    p = nn_vfma(p, r, nn_vset1(1.0f));
    p = nn_vfma(p, r, nn_vset1(1.0f));
    nn_vi bits = ((nn_vi)t - (nn_vi)magic + 127) << 23;
    return nn_vselect(overflow, nn_vset1(INFINITY), p * (nn_v)bits);
}
/* e^u for a softmax's terms: 0 where u < -87 (e^-87 is 1.6e-38; a term that small moves a sum
 * of at least 1 by less than that), rather than a denormal: each denormal result costs a
 * microcode assist on Intel cores, and a mask of -100 (as Swin's shifted windows write it)
 * made every hidden term one, five times the cost of the step. */
static inline nn_v nn_vexp_normal(nn_v u) { return nn_vselect(u < nn_vset1(-87.0f), nn_vzero(), nn_vexp(u)); }
/* The logistic function, 1 / (1 + e^-v): a sigmoid of -inf is exactly 0 (SiLU of -inf is
 * then NaN, as onnxruntime's x * sigmoid(x)). */
static inline nn_v nn_vsigmoid(nn_v v) { return nn_vset1(1.0f) / (nn_vset1(1.0f) + nn_vexp(-v)); }
static inline nn_v nn_vsilu(nn_v v) { return v * nn_vsigmoid(v); }
/* Mish, v tanh(softplus(v)), with one exponential: for e = e^v, tanh(log(1 + e)) is
 * m / (m + 2) with m = e (e + 2), exact algebra without the cancellation of 1 + e near 1
 * (a small e keeps its digits in m). Above 20 it is v (tanh of softplus is 1 to float32, and
 * e^v would overflow m); below -87 the factor is 0 (e^v is below the smallest normal float),
 * so -inf gives NaN, and NaN stays NaN, as v * tanh(softplus(v)) does. */
static inline nn_v nn_vmish(nn_v v) {
    nn_v e = nn_vexp(nn_vmin(v, nn_vset1(20.0f)));
    nn_v m = e * (e + nn_vset1(2.0f));
    nn_v factor = nn_vselect(v < nn_vset1(-87.0f), nn_vzero(), m / (m + nn_vset1(2.0f)));
    return nn_vselect(v > nn_vset1(20.0f), v, v * factor);
}
/* GELU's erf form, prelude.h's nn_gelu_erf on a vector (the same rational erf, the same
 * clamps: NaN stays NaN, -inf gives NaN as -inf * 0 does). Written on vectors because the
 * compiler turned the scalar one's clamps into compare-and-blend chains twice as long. */
static inline nn_v nn_vgelu_erf(nn_v v) {
    nn_v x = nn_vmin(nn_vmax(v * nn_vset1(0.707106781f), nn_vset1(-4.0f)), nn_vset1(4.0f));
    nn_v t = x * x;
    nn_v p = nn_vset1(1.911075778e-08f);
    p = nn_vfma(p, t, nn_vset1(-1.942183456e-06f));
    p = nn_vfma(p, t, nn_vset1(1.472625705e-04f));
    p = nn_vfma(p, t, nn_vset1(3.989674753e-03f));
    p = nn_vfma(p, t, nn_vset1(5.152214941e-02f));
    p = nn_vfma(p, t, nn_vset1(2.071049134e-01f));
    p = nn_vfma(p, t, nn_vset1(1.128379095e+00f));
    nn_v q = nn_vset1(1.020886626e-03f);
    q = nn_vfma(q, t, nn_vset1(1.495629467e-02f));
    q = nn_vfma(q, t, nn_vset1(1.179622937e-01f));
    q = nn_vfma(q, t, nn_vset1(5.168732071e-01f));
    q = nn_vfma(q, t, nn_vset1(1.0f));
    nn_v e = nn_vmin(nn_vmax(x * p / q, nn_vset1(-1.0f)), nn_vset1(1.0f));
    return nn_vset1(0.5f) * v * (nn_vset1(1.0f) + e);
}
/* GELU's tanh form, 0.5 v (1 + tanh(u)) with u = sqrt(2/pi) (v + 0.044715 v^3), computed as
 * v / (1 + e^(-2u)) (1 + tanh(u) is 2 sigmoid(2u)): one exponential and one division, and no
 * cancellation where tanh(u) is near -1, so a negative v's small result keeps its digits.
 * +inf gives +inf, -inf NaN (-inf / inf, as the tanh form's -inf * 0), NaN stays NaN. */
static inline nn_v nn_vgelu_tanh(nn_v v) {
    nn_v u2 = v * nn_vfma(v * v, nn_vset1(-0.0713548162f), nn_vset1(-1.59576912f));  /* -2u */
    return v / (nn_vset1(1.0f) + nn_vexp(u2));
}
/* Lane permutes with literal lanes (GCC 12 and later, clang): a reorder between layouts
 * transposes vl x vl tiles in registers with them; without, it moves lane by lane. */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector) && !defined(NN_SHUFFLE)
#define NN_SHUFFLE 1
#endif
#endif
