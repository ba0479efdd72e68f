#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
/* nncc native code, the part every translation unit starts with: the elementwise math that
 * kernels inline, and the runtime's helpers (runtime.c, compiled once into an object every
 * library links) that kernels call with literal shapes. float32 only; row-major; NCHW. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NN_EXPORT __attribute__((visibility("default")))

#include <time.h>
/* For step profiles (a benchmark aid): the calling thread's CPU time, so a profile stays
 * true on a busy machine (the caller waits for the pool by spinning, so a parallel step
 * still counts its whole span). */
static inline int64_t nn_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Vectorizable elementary functions: branch-free (selects, not branches) so the C compiler
 * turns whole loops into SIMD code, where libm's expf/tanhf/erff are scalar calls.
 * exp: exponent split n = round(x log2 e), a degree-7 polynomial on |r| <= ln2/2 (relative
 * error below 1e-8), times 2^n applied as two halves so results down to the smallest
 * denormal come out right; below that 0, above float's range inf, NaN stays NaN. */
static inline float nn_exp(float x) {
    float in = x;
    /* clamped so that NaN lands inside too (it fails both tests): converting a NaN or an
       out-of-range float to int32_t below would be undefined behaviour */
    x = x > -104.0f ? x : -104.0f;
    x = x < 88.72283f ? x : 88.72283f;
    float n = __builtin_roundf(x * 1.44269504f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.98412698e-4f;
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    union { float f; int32_t i; } s1, s2;
    s1.i = (n1 + 127) << 23;
    s2.i = (n2 + 127) << 23;
    float y = p * s1.f * s2.f;
    y = in < -104.0f ? 0.0f : (in > 88.72283f ? INFINITY : y);
    return in != in ? in : y;
}

static inline float nn_sigmoid(float x) { return 1.0f / (1.0f + nn_exp(-x)); }

/* tanh: an odd Taylor polynomial near 0 (no cancellation), 1 - 2/(e^2|x| + 1) elsewhere. */
static inline float nn_tanh(float x) {
    float a = fabsf(x), x2 = x * x;
    float small = x * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * (-0.0539682540f + x2 * 0.0218694885f))));
    float big = 1.0f - 2.0f / (nn_exp(2.0f * a) + 1.0f);
    big = x < 0.0f ? -big : big;
    return a < 0.125f ? small : big;
}

/* erf: its Taylor series below 0.5; above, 1 - erfc with the classic Chebyshev-fitted
 * erfc (fractional error below 1.2e-7). */
static inline float nn_erf(float x) {
    float a = fabsf(x), x2 = x * x;
    float small = 1.12837917f * x * (1.0f + x2 * (-0.333333333f + x2 * (0.1f + x2 * (-0.0238095238f
                  + x2 * (0.00462962963f + x2 * (-0.000757575758f + x2 * 0.000106837607f))))));
    float t = 1.0f / (1.0f + 0.5f * a);
    float poly = -a * a - 1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f
                 + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
    float big = 1.0f - t * nn_exp(poly);
    big = x < 0.0f ? -big : big;
    return a < 0.5f ? small : big;
}


/* GELU's erf form, 0.5 v (1 + erf(v / sqrt 2)), for a GEMM's epilogue: erf as one rational
   function x P(x^2) / Q(x^2) on [-4, 4], fitted to erf's relative error, and +-1 beyond (erf(4)
   is 1 to float32). No exp and one division: about three times nn_erf's speed, within
   3.2e-7 of erf (5.3 ulp) where nn_erf is within 1.6e-7 (2.6 ulp). */
static inline float nn_gelu_erf(float v) {
    float x = v * 0.707106781f;
    x = x < -4.0f ? -4.0f : x;  /* two steps: a vmaxps and a vminps, not compares and blends */
    x = x > 4.0f ? 4.0f : x;
    float t = x * x;
    float p = 1.128379095e+00f + t * (2.071049134e-01f + t * (5.152214941e-02f + t * (3.989674753e-03f + t * (1.472625705e-04f + t * (-1.942183456e-06f + t * (1.911075778e-08f))))));
    float q = 1.000000000e+00f + t * (5.168732071e-01f + t * (1.179622937e-01f + t * (1.495629467e-02f + t * (1.020886626e-03f))));
    float e = x * p / q;
    e = e < -1.0f ? -1.0f : e;
    e = e > 1.0f ? 1.0f : e;
    return 0.5f * v * (1.0f + e);
}

/* Activations applied in epilogues. */
NN_ACTIVATION_CODES /* nncc/native/activations.py writes the enumeration here */

static inline float nn_act(int act, float v, float p0, float p1) {
    switch (act) {
    case NN_RELU: return v < 0.0f ? 0.0f : v;  /* NaN stays NaN, as Relu defines */
    case NN_CLIP: v = v < p0 ? p0 : v; return v > p1 ? p1 : v;  /* sequential: a vmaxps and a vminps */
    case NN_SIGMOID: return nn_sigmoid(v);
    case NN_TANH: return nn_tanh(v);
    case NN_LEAKY: return v >= 0.0f ? v : v * p0;
    case NN_HSIGMOID: { float t = p0 * v + p1; return t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t); }
    case NN_HSWISH: { float t = v / 6.0f + 0.5f; t = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t); return v * t; }
    case NN_SILU: return v * nn_sigmoid(v);
    case NN_MISH: return v * nn_tanh(v > 20.0f ? v : log1pf(nn_exp(v)));  /* softplus(v) is v above 20 */
    default: return v;
    }
}

/* The runtime's thread pool (runtime.c): fn over [0, n), in chunks its threads claim. */
typedef void (*nn_task)(void *ctx, int64_t lo, int64_t hi);
void nn_parallel(int64_t n, int64_t work, nn_task fn, void *ctx);
int nn_thread_count(void);
/* Whether this process may use AMX tiles (runtime.c; nncc/native/amx.py): asked of the OS
 * once, on the first call; 0 when refused, when $NNCC_AMX turns them off, or off Linux. */
int nn_amx_permitted(void);
void nn_call_begin(int64_t *last_work);
void nn_call_end(int64_t *last_work);

/* Per-thread scratch (runtime.c): ``floats`` floats of the calling thread's buffer in slot
 * ``which``, kept for the thread's life (its contents are the last user's: write before
 * reading), or 0 when memory ran out. Then the kernel returns without its work: the entry
 * point checks nn_scratch_short after every step and returns nn_scratch_failed(step), which
 * is NN_STATUS_SCRATCH, so the call fails instead of handing back what was not computed. */
enum { NN_SCRATCH_PLANE, NN_SCRATCH_ACC, NN_SCRATCH_ATTENTION, NN_SCRATCH_SLOTS };
#define NN_STATUS_SCRATCH 2
float *nn_scratch(int which, int64_t floats);
extern __attribute__((visibility("hidden"))) int64_t nn_scratch_short;
int nn_scratch_failed(int step);

/* The runtime (runtime.c): GEMM through the BLAS numpy has loaded, convolution, pooling,
 * row-wise ops, each parallel over the runtime's one thread pool. */
void nn_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void nn_epilogue(float *y, const float *bias, const float *res, int64_t C, int64_t n, int act, float p0, float p1);
void nn_conv2d(const float *x, const float *w, const float *bias, const float *res, float *y, int64_t N, int64_t C,
               int64_t H, int64_t W, int64_t K, int64_t OH, int64_t OW, int64_t kh, int64_t kw, int64_t sh,
               int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group, int act, float p0,
               float p1, float *ws);
void nn_maxpool2d(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh,
                  int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw);
void nn_avgpool2d(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh,
                  int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t eh, int64_t ew, int include_pad);
void nn_mean_rows(const float *x, float *y, int64_t rows, int64_t n);
void nn_softmax_rows(const float *x, float *y, int64_t rows, int64_t n, int log);
void nn_transpose(const float *x, float *y, int rank, const int64_t *shape, const int64_t *strides);
