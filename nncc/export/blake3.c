/* BLAKE3 in portable C (libc only, C99), following the BLAKE3 specification: the input is
 * cut into 1024-byte chunks of 64-byte blocks; each chunk's blocks are compressed in turn
 * into the chunk's chaining value; chunk values are joined pairwise by parent nodes, every
 * left subtree complete and at least as big as its right sibling; the last compression of
 * the root (the only chunk, or the top parent) carries ROOT, and its first 32 bytes are
 * the hash. Scalar code, plus an AVX2 path for eight whole chunks at a time on x86-64
 * (chosen at run time; its rounds in inline assembly); no allocation, nothing mutable
 * outside the caller's hasher. */
#include "blake3.h"

#include <string.h>

/* On x86-64, eight whole chunks are hashed at once with AVX2 when the CPU and the operating
 * system allow it (checked at init), else one at a time; NN_BLAKE3_PORTABLE forces the
 * latter. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(NN_BLAKE3_PORTABLE)
#define NN_BLAKE3_AVX2 1
#include <cpuid.h>
#include <immintrin.h>
#endif

enum { CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8, KEYED_HASH = 16 };
enum { BLOCK_LEN = 64, CHUNK_LEN = 1024, BLOCKS_PER_CHUNK = CHUNK_LEN / BLOCK_LEN };

/* The unkeyed key, and the first words of every compression's second half: SHA-256's IV. */
static const uint32_t IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                               0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

/* The message words each round reads, in order. Row 0 is the identity; each next row is the
 * one before under the message permutation {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14,
 * 15, 8}: row[r + 1][i] = row[r][permutation[i]]. Reading through the table spares
 * permuting the words between rounds. */
static const uint8_t SCHEDULE[7][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8},
    {3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1},
    {10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6},
    {12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4},
    {9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7},
    {11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13}};

static uint32_t load32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store_words(uint8_t *p, const uint32_t *w, int n)
{
    for (int i = 0; i < n; i++) {
        p[4 * i] = (uint8_t)w[i];
        p[4 * i + 1] = (uint8_t)(w[i] >> 8);
        p[4 * i + 2] = (uint8_t)(w[i] >> 16);
        p[4 * i + 3] = (uint8_t)(w[i] >> 24);
    }
}

static void load_key(uint32_t key[8], const uint8_t *bytes)
{
    for (int i = 0; i < 8; i++)
        key[i] = load32(bytes + 4 * i);
}

static inline uint32_t rotr(uint32_t x, int n) { return x >> n | x << (32 - n); }

/* The quarter-round: mixes message words x and y into four state words. */
static inline void g(uint32_t v[16], int a, int b, int c, int d, uint32_t x, uint32_t y)
{
    v[a] += v[b] + x;
    v[d] = rotr(v[d] ^ v[a], 16);
    v[c] += v[d];
    v[b] = rotr(v[b] ^ v[c], 12);
    v[a] += v[b] + y;
    v[d] = rotr(v[d] ^ v[a], 8);
    v[c] += v[d];
    v[b] = rotr(v[b] ^ v[c], 7);
}

/* One compression of a 64-byte block (zero-padded past len) under chaining value cv. Only
 * the first 8 output words are kept: all a 32-byte hash needs. out may be cv. */
static void compress(const uint32_t cv[8], const uint8_t block[BLOCK_LEN], uint64_t counter, uint32_t len,
                     uint32_t flags, uint32_t out[8])
{
    uint32_t m[16], v[16];
    for (int i = 0; i < 16; i++)
        m[i] = load32(block + 4 * i);
    for (int i = 0; i < 8; i++)
        v[i] = cv[i];
    for (int i = 0; i < 4; i++)
        v[8 + i] = IV[i];
    v[12] = (uint32_t)counter;
    v[13] = (uint32_t)(counter >> 32);
    v[14] = len;
    v[15] = flags;
#pragma GCC unroll 7 /* every message index a constant: the portable hash 30% faster */
    for (int round = 0; round < 7; round++) {
        const uint8_t *s = SCHEDULE[round];
        g(v, 0, 4, 8, 12, m[s[0]], m[s[1]]); /* columns */
        g(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
        g(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
        g(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
        g(v, 0, 5, 10, 15, m[s[8]], m[s[9]]); /* diagonals */
        g(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
        g(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
        g(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        out[i] = v[i] ^ v[i + 8];
}

#ifdef NN_BLAKE3_AVX2
/* Eight chunks at once, as the BLAKE3 paper's SIMD section describes: the state is
 * transposed, so each of the 16 state words is one 256-bit register holding that word
 * for all eight chunks (one 32-bit lane each), and every step of G is one vector
 * instruction over the eight compressions. The chunks run in lock step through their 16
 * blocks; each block's message words are transposed the same way on load. */
#define AVX2 __attribute__((target("avx2")))

/* The seven rounds of eight compressions, written as assembly because the compiler, given
 * the same steps in C, keeps only part of the state in the 16 vector registers and moves
 * the rest to and from the stack at every step. Here state word k lives in ymm<k> for all
 * seven rounds; the message words are read from memory where an addition takes them (each
 * once per round, the order of the round's schedule row), the byte shuffles that rotate by
 * 16 and 8 read their patterns from memory too, and the rotations by 12 and 7, which need
 * a scratch register, borrow ymm8 (state word 8, saved in the message array's slot 16 and
 * loaded back: it is idle at that point of each half). */
#define Y(r) "%%ymm" #r
#define ADD_MSG(a, w) "vpaddd " #w "*32(%[m]), " Y(a) ", " Y(a) "\n\t"
#define ADD(dst, src) "vpaddd " Y(src) ", " Y(dst) ", " Y(dst) "\n\t"
#define XOR(dst, src) "vpxor " Y(src) ", " Y(dst) ", " Y(dst) "\n\t"
#define SHUFFLE(dst, at) "vpshufb " #at "(%[rot]), " Y(dst) ", " Y(dst) "\n\t"
#define ROTATE(dst, n, left) "vpsrld $" #n ", " Y(dst) ", %%ymm8\n\t" "vpslld $" #left ", " Y(dst) ", " Y(dst) "\n\t" \
                             "vpor %%ymm8, " Y(dst) ", " Y(dst) "\n\t"

/* Half of G on four (a, b, c, d) quadruples at once, with message words w0..w3: the first
 * half rotates d by 16 (the shuffle pattern at 0) and b by 12, the second by 8 (at 32)
 * and 7. */
#define HALF_G(a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3, w0, w1, w2, w3, at, n, left) \
    ADD_MSG(a0, w0) ADD_MSG(a1, w1) ADD_MSG(a2, w2) ADD_MSG(a3, w3)                                       \
    ADD(a0, b0) ADD(a1, b1) ADD(a2, b2) ADD(a3, b3)                                                       \
    XOR(d0, a0) XOR(d1, a1) XOR(d2, a2) XOR(d3, a3)                                                       \
    SHUFFLE(d0, at) SHUFFLE(d1, at) SHUFFLE(d2, at) SHUFFLE(d3, at)                                       \
    ADD(c0, d0) ADD(c1, d1) ADD(c2, d2) ADD(c3, d3)                                                       \
    XOR(b0, c0) XOR(b1, c1) XOR(b2, c2) XOR(b3, c3)                                                       \
    "vmovdqu %%ymm8, 16*32(%[m])\n\t"                                                                     \
    ROTATE(b0, n, left) ROTATE(b1, n, left) ROTATE(b2, n, left) ROTATE(b3, n, left)                       \
    "vmovdqu 16*32(%[m]), %%ymm8\n\t"

/* A round: G on the columns, then on the diagonals; s0..s15 is its row of SCHEDULE. */
#define ROUND(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15)                          \
    HALF_G(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, s0, s2, s4, s6, 0, 12, 20)                \
    HALF_G(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, s1, s3, s5, s7, 32, 7, 25)                \
    HALF_G(0, 1, 2, 3, 5, 6, 7, 4, 10, 11, 8, 9, 15, 12, 13, 14, s8, s10, s12, s14, 0, 12, 20)             \
    HALF_G(0, 1, 2, 3, 5, 6, 7, 4, 10, 11, 8, 9, 15, 12, 13, 14, s9, s11, s13, s15, 32, 7, 25)

/* Byte patterns for vpshufb: each 32-bit word rotated right by 16, then by 8. */
static const uint8_t ROTATE_BYTES[64] __attribute__((aligned(32))) = {
    2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13,
    1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12, 1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12};

/* v: the 16 state words in, the eight output words (v[i] ^ v[i + 8]) out in v[0..7]; m:
 * the 16 message words and a slot for ymm8. The rows below are SCHEDULE's. */
AVX2 static void rounds8(__m256i v[16], __m256i m[17])
{
    __asm__ volatile(
        "vmovdqu 0*32(%[v]), %%ymm0\n\t" "vmovdqu 1*32(%[v]), %%ymm1\n\t" "vmovdqu 2*32(%[v]), %%ymm2\n\t"
        "vmovdqu 3*32(%[v]), %%ymm3\n\t" "vmovdqu 4*32(%[v]), %%ymm4\n\t" "vmovdqu 5*32(%[v]), %%ymm5\n\t"
        "vmovdqu 6*32(%[v]), %%ymm6\n\t" "vmovdqu 7*32(%[v]), %%ymm7\n\t" "vmovdqu 8*32(%[v]), %%ymm8\n\t"
        "vmovdqu 9*32(%[v]), %%ymm9\n\t" "vmovdqu 10*32(%[v]), %%ymm10\n\t" "vmovdqu 11*32(%[v]), %%ymm11\n\t"
        "vmovdqu 12*32(%[v]), %%ymm12\n\t" "vmovdqu 13*32(%[v]), %%ymm13\n\t" "vmovdqu 14*32(%[v]), %%ymm14\n\t"
        "vmovdqu 15*32(%[v]), %%ymm15\n\t"
        ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
        ROUND(2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
        ROUND(3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1)
        ROUND(10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6)
        ROUND(12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4)
        ROUND(9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7)
        ROUND(11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13)
        XOR(0, 8) XOR(1, 9) XOR(2, 10) XOR(3, 11) XOR(4, 12) XOR(5, 13) XOR(6, 14) XOR(7, 15)
        "vmovdqu %%ymm0, 0*32(%[v])\n\t" "vmovdqu %%ymm1, 1*32(%[v])\n\t" "vmovdqu %%ymm2, 2*32(%[v])\n\t"
        "vmovdqu %%ymm3, 3*32(%[v])\n\t" "vmovdqu %%ymm4, 4*32(%[v])\n\t" "vmovdqu %%ymm5, 5*32(%[v])\n\t"
        "vmovdqu %%ymm6, 6*32(%[v])\n\t" "vmovdqu %%ymm7, 7*32(%[v])\n\t"
        :
        : [v] "r"(v), [m] "r"(m), [rot] "r"(ROTATE_BYTES)
        : "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15");
}
#undef Y
#undef ADD_MSG
#undef ADD
#undef XOR
#undef SHUFFLE
#undef ROTATE
#undef HALF_G
#undef ROUND

/* An 8x8 matrix of 32-bit words, rows in r[0..7], transposed in place. */
AVX2 static inline void transpose8(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);     /* words 0 1 | 4 5 of a row pair */
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]); /* words 2 3 | 6 7 */
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);     /* word 0 | 4 of four rows */
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]); /* word 1 | 5 */
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]); /* word 2 | 6 */
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]); /* word 3 | 7 */
    }
    for (int w = 0; w < 4; w++) {
        r[w] = _mm256_permute2x128_si256(u[w], u[4 + w], 0x20);
        r[w + 4] = _mm256_permute2x128_si256(u[w], u[4 + w], 0x31);
    }
}

/* Eight compressions of `blocks` blocks each: lane k's blocks follow each other from
 * input + k * stride, its counter is counter + k * step, and its first and last blocks
 * carry first and last besides flags. Every input is read before out is written, so out
 * may overlap it. */
AVX2 static void compress8(const uint32_t key[8], const uint8_t *input, size_t stride, int blocks, uint64_t counter,
                           uint64_t step, uint32_t flags, uint32_t first, uint32_t last, uint32_t out[8][8])
{
    __m256i v[16], m[17]; /* v[0..7]: the chaining values, which each block's rounds leave there */
    for (int i = 0; i < 8; i++)
        v[i] = _mm256_set1_epi32((int)key[i]);
    uint32_t lo[8], hi[8];
    for (int k = 0; k < 8; k++) {
        lo[k] = (uint32_t)(counter + (uint64_t)k * step);
        hi[k] = (uint32_t)((counter + (uint64_t)k * step) >> 32);
    }
    __m256i counter_lo = _mm256_loadu_si256((const __m256i *)(const void *)lo);
    __m256i counter_hi = _mm256_loadu_si256((const __m256i *)(const void *)hi);
    for (int b = 0; b < blocks; b++) {
        if (stride == CHUNK_LEN) /* the next eight chunks, a sixteenth at each of these 16 blocks */
            for (int k = 0; k < 8; k++)
                _mm_prefetch((const char *)input + 8 * CHUNK_LEN + (size_t)(8 * b + k) * BLOCK_LEN, _MM_HINT_T0);
        for (int half = 0; half < 2; half++) {
            for (int k = 0; k < 8; k++)
                m[8 * half + k] = _mm256_loadu_si256(
                    (const __m256i *)(const void *)(input + (size_t)k * stride + (size_t)b * BLOCK_LEN + 32 * half));
            transpose8(m + 8 * half);
        }
        uint32_t block_flags8 = flags | (b == 0 ? first : 0) | (b == blocks - 1 ? last : 0);
        for (int i = 0; i < 4; i++)
            v[8 + i] = _mm256_set1_epi32((int)IV[i]);
        v[12] = counter_lo;
        v[13] = counter_hi;
        v[14] = _mm256_set1_epi32(BLOCK_LEN);
        v[15] = _mm256_set1_epi32((int)block_flags8);
        rounds8(v, m);
    }
    transpose8(v); /* now v[k] holds lane k's eight words */
    for (int k = 0; k < 8; k++)
        _mm256_storeu_si256((__m256i *)(void *)out[k], v[k]);
}

/* The chaining values of the eight chunks at input, input + 1024, ..., the first of them
 * chunk number counter; none of them may be the root. */
AVX2 static void hash8_chunks(const uint32_t key[8], const uint8_t *input, uint64_t counter, uint32_t flags,
                              uint32_t out[8][8])
{
    compress8(key, input, CHUNK_LEN, BLOCKS_PER_CHUNK, counter, 1, flags, CHUNK_START, CHUNK_END, out);
}

/* Eight parents, none the root: parent k of children[2k] and children[2k + 1] (chaining
 * values as words; x86 is little-endian, so their bytes are the parent's block). */
AVX2 static void parents8(const uint32_t key[8], const uint32_t children[16][8], uint32_t flags, uint32_t out[8][8])
{
    compress8(key, (const uint8_t *)children, BLOCK_LEN, 1, 0, 0, flags | PARENT, 0, 0, out);
}

/* AVX2 usable: the CPU has it and the operating system saves the vector registers. */
static uint32_t simd_lanes(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX))
        return 1;
    unsigned xcr_lo, xcr_hi;
    __asm__("xgetbv" : "=a"(xcr_lo), "=d"(xcr_hi) : "c"(0));
    (void)xcr_hi;
    if ((xcr_lo & 6) != 6 || __get_cpuid_max(0, 0) < 7)
        return 1;
    __cpuid_count(7, 0, a, b, c, d);
    return b & bit_AVX2 ? 8 : 1;
}
#else
static uint32_t simd_lanes(void) { return 1; }
#endif

uint32_t nn_blake3_lanes(void) { return simd_lanes(); }

static void start_chunk(nn_blake3_hasher *h, uint64_t counter)
{
    memcpy(h->cv, h->key, sizeof h->cv);
    h->chunk_counter = counter;
    h->block_len = 0;
    h->blocks_done = 0;
}

/* The flags of the current chunk's next block, short of CHUNK_END and ROOT. */
static uint32_t block_flags(const nn_blake3_hasher *h)
{
    return h->flags | (h->blocks_done == 0 ? CHUNK_START : 0);
}

static void compress_block(nn_blake3_hasher *h, const uint8_t block[BLOCK_LEN])
{
    compress(h->cv, block, h->chunk_counter, BLOCK_LEN, block_flags(h), h->cv);
    h->blocks_done++;
}

static int popcount64(uint64_t x)
{
    int n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

/* Stacks a finished chunk's chaining value, chunks_done chunks having finished. Each entry
 * is a complete subtree and the subtrees' sizes are the powers of two that add up to
 * chunks_done, so the stack keeps one entry per 1-bit of it: the two on top merge into
 * their parent until it does. These parents are never the root, as more input follows. */
static void push_cv(nn_blake3_hasher *h, const uint8_t cv[32], uint64_t chunks_done)
{
    memcpy(h->stack[h->stack_len++], cv, 32);
    while (h->stack_len > (uint32_t)popcount64(chunks_done)) {
        uint8_t children[BLOCK_LEN];
        uint32_t parent[8];
        memcpy(children, h->stack[h->stack_len - 2], 32);
        memcpy(children + 32, h->stack[h->stack_len - 1], 32);
        compress(h->key, children, 0, BLOCK_LEN, h->flags | PARENT, parent);
        h->stack_len--;
        store_words(h->stack[h->stack_len - 1], parent, 8);
    }
}

static void push_chunk(nn_blake3_hasher *h, const uint32_t cv[8])
{
    uint8_t bytes[32];
    store_words(bytes, cv, 8);
    push_cv(h, bytes, h->chunk_counter + 1 - h->first_chunk);
}

#ifdef NN_BLAKE3_AVX2
/* 64 whole chunks at p, the hasher's count a multiple of 64 and nothing buffered: hashed
 * eight at a time, their parents too, eight at a time down to the one of all 64, which is
 * stacked (the top three levels leave lanes idle, yet cost less than seven parents
 * compressed one at a time). None of them may be the root. */
static void push64(nn_blake3_hasher *h, const uint8_t *p)
{
    uint32_t cvs[64][8];
    for (int b = 0; b < 8; b++)
        hash8_chunks(h->key, p + (size_t)b * 8 * CHUNK_LEN, h->chunk_counter + 8 * (uint64_t)b, h->flags, cvs + 8 * b);
    for (int n = 64; n > 1; n /= 2) /* n / 2 parents of n children; past eight, idle lanes read stale ones */
        for (int i = 0; i < n / 2; i += 8)
            parents8(h->key, (const uint32_t(*)[8])(cvs + 2 * i), h->flags, cvs + i);
    uint8_t bytes[32];
    store_words(bytes, cvs[0], 8);
    push_cv(h, bytes, h->chunk_counter + 64 - h->first_chunk);
    h->chunk_counter += 64;
}
#endif

static void init_with(nn_blake3_hasher *h, const uint32_t key[8], uint32_t flags)
{
    memcpy(h->key, key, sizeof h->key);
    h->flags = flags;
    h->lanes = simd_lanes();
    h->first_chunk = 0;
    h->stack_len = 0;
    start_chunk(h, 0);
}

void nn_blake3_init(nn_blake3_hasher *h) { init_with(h, IV, 0); }

void nn_blake3_init_keyed(nn_blake3_hasher *h, const uint8_t key[NN_BLAKE3_KEY_LEN])
{
    uint32_t words[8];
    load_key(words, key);
    init_with(h, words, KEYED_HASH);
}

/* A block or chunk is compressed only once a byte after it arrives: until then it may be
 * the last one, whose flags (CHUNK_END, ROOT) differ. */
void nn_blake3_update(nn_blake3_hasher *h, const void *data, size_t len)
{
    const uint8_t *p = (const uint8_t *)data;
    while (len > 0) {
        if (h->blocks_done == BLOCKS_PER_CHUNK - 1 && h->block_len == BLOCK_LEN) {
            uint32_t cv[8];
            compress(h->cv, h->block, h->chunk_counter, BLOCK_LEN, block_flags(h) | CHUNK_END, cv);
            push_chunk(h, cv);
            start_chunk(h, h->chunk_counter + 1);
        }
        if (h->block_len == BLOCK_LEN) {
            compress_block(h, h->block);
            h->block_len = 0;
        }
#ifdef NN_BLAKE3_AVX2
        /* Whole chunks straight from the input, eight at a time, while more input follows
         * them (so none of them is the root). Where 64 start at a multiple of 64, their
         * parents up to the eight subtrees of eight chunks are made eight at a time too. */
        while (h->lanes == 8 && h->blocks_done == 0 && h->block_len == 0 && len > 8 * CHUNK_LEN) {
            uint32_t cvs[64][8];
            if (len > 64 * CHUNK_LEN && ((h->chunk_counter - h->first_chunk) & 63) == 0) {
                push64(h, p);
                p += 64 * CHUNK_LEN;
                len -= 64 * CHUNK_LEN;
            } else {
                hash8_chunks(h->key, p, h->chunk_counter, h->flags, cvs);
                for (int k = 0; k < 8; k++) {
                    push_chunk(h, cvs[k]);
                    h->chunk_counter++;
                }
                p += 8 * CHUNK_LEN;
                len -= 8 * CHUNK_LEN;
            }
            start_chunk(h, h->chunk_counter);
        }
#endif
        /* Whole blocks straight from the input, short of the chunk's last block and the
         * input's last byte. */
        while (h->block_len == 0 && len > BLOCK_LEN && h->blocks_done < BLOCKS_PER_CHUNK - 1) {
            compress_block(h, p);
            p += BLOCK_LEN;
            len -= BLOCK_LEN;
        }
        size_t take = BLOCK_LEN - h->block_len < len ? BLOCK_LEN - h->block_len : len;
        memcpy(h->block + h->block_len, p, take);
        h->block_len += (uint32_t)take;
        p += take;
        len -= take;
    }
}

/* The pending node starts as the current chunk's last block; each stacked subtree, from
 * the right, becomes the left child of a parent over it. The last pending node is the
 * root. */
static void finish(const nn_blake3_hasher *h, uint32_t root, uint8_t out[NN_BLAKE3_OUT_LEN])
{
    uint32_t cv[8], child[8];
    uint8_t block[BLOCK_LEN];
    memcpy(cv, h->cv, sizeof cv);
    memcpy(block, h->block, h->block_len);
    memset(block + h->block_len, 0, BLOCK_LEN - h->block_len);
    uint64_t counter = h->chunk_counter;
    uint32_t len = h->block_len, flags = block_flags(h) | CHUNK_END;
    for (uint32_t i = h->stack_len; i-- > 0;) {
        compress(cv, block, counter, len, flags, child);
        memcpy(block, h->stack[i], 32);
        store_words(block + 32, child, 8);
        memcpy(cv, h->key, sizeof cv);
        counter = 0;
        len = BLOCK_LEN;
        flags = h->flags | PARENT;
    }
    compress(cv, block, counter, len, flags | root, child);
    store_words(out, child, 8);
}

void nn_blake3_finalize(const nn_blake3_hasher *h, uint8_t out[NN_BLAKE3_OUT_LEN]) { finish(h, ROOT, out); }

/* A hasher started at chunk first_chunk counts its chunks from there, so its stack holds
 * the subtree's own structure; its finish without ROOT is the subtree's chaining value. */
void nn_blake3_subtree(const nn_blake3_hasher *mode, const void *data, size_t len, uint64_t first_chunk,
                       uint8_t cv[NN_BLAKE3_OUT_LEN])
{
    nn_blake3_hasher h;
    init_with(&h, mode->key, mode->flags);
    h.first_chunk = first_chunk;
    start_chunk(&h, first_chunk);
#ifdef NN_BLAKE3_AVX2
    /* A subtree is never the root, so unlike update this may take its last 64 chunks in
     * eight lanes too; its size is a power of two, so the stack ends as one entry. */
    if (h.lanes == 8 && len >= 64 * CHUNK_LEN && len % (64 * CHUNK_LEN) == 0) {
        for (size_t at = 0; at < len; at += 64 * CHUNK_LEN)
            push64(&h, (const uint8_t *)data + at);
        memcpy(cv, h.stack[0], 32);
        return;
    }
#endif
    nn_blake3_update(&h, data, len);
    finish(&h, 0, cv);
}

/* The subtree's chaining value goes on the stack as a finished chunk's does: the subtree
 * is aligned, so the merges below it are the carries of adding its size to the count. */
void nn_blake3_push_subtree(nn_blake3_hasher *h, const uint8_t cv[NN_BLAKE3_OUT_LEN], uint64_t chunks)
{
    push_cv(h, cv, h->chunk_counter + chunks);
    start_chunk(h, h->chunk_counter + chunks);
}

void nn_blake3(const void *data, size_t len, uint8_t out[NN_BLAKE3_OUT_LEN])
{
    nn_blake3_hasher h;
    nn_blake3_init(&h);
    nn_blake3_update(&h, data, len);
    nn_blake3_finalize(&h, out);
}

void nn_blake3_keyed(const uint8_t key[NN_BLAKE3_KEY_LEN], const void *data, size_t len,
                     uint8_t out[NN_BLAKE3_OUT_LEN])
{
    nn_blake3_hasher h;
    nn_blake3_init_keyed(&h, key);
    nn_blake3_update(&h, data, len);
    nn_blake3_finalize(&h, out);
}
