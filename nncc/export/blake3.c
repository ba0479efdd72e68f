/* BLAKE3 in portable C (libc only, C99), following the BLAKE3 specification: the input is
 * cut into 1024-byte chunks of 64-byte blocks; each chunk's blocks are compressed in turn
 * into the chunk's chaining value; chunk values are joined pairwise by parent nodes, every
 * left subtree complete and at least as big as its right sibling; the last compression of
 * the root (the only chunk, or the top parent) carries ROOT, and its first 32 bytes are
 * the hash. Scalar code, no allocation, nothing mutable outside the caller's hasher. */
#include "blake3.h"

#include <string.h>

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
static void push_chunk(nn_blake3_hasher *h, const uint32_t cv[8], uint64_t chunks_done)
{
    store_words(h->stack[h->stack_len++], cv, 8);
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

static void init_with(nn_blake3_hasher *h, const uint32_t key[8], uint32_t flags)
{
    memcpy(h->key, key, sizeof h->key);
    h->flags = flags;
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
            push_chunk(h, cv, h->chunk_counter + 1);
            start_chunk(h, h->chunk_counter + 1);
        }
        if (h->block_len == BLOCK_LEN) {
            compress_block(h, h->block);
            h->block_len = 0;
        }
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
void nn_blake3_finalize(const nn_blake3_hasher *h, uint8_t out[NN_BLAKE3_OUT_LEN])
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
    compress(cv, block, counter, len, flags | ROOT, child);
    store_words(out, child, 8);
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
