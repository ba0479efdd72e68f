/* BLAKE3 in portable C: the default (unkeyed) hash and the keyed hash, 32-byte output,
 * whole buffers or incrementally. libc only, C99; no allocation and no mutable global
 * state, so any number of threads may hash at once, each with its own hasher. On x86-64
 * with GCC or Clang, large inputs take an AVX2 path when the CPU allows it (the same
 * digest, several times faster); NN_BLAKE3_PORTABLE leaves it out. */
#ifndef NN_BLAKE3_H
#define NN_BLAKE3_H

#include <stddef.h>
#include <stdint.h>

/* Prefix for every function below: define it before including this header to change their
 * linkage or visibility (static, a visibility attribute) in the code that embeds them. */
#ifndef NN_BLAKE3_API
#define NN_BLAKE3_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define NN_BLAKE3_OUT_LEN 32
#define NN_BLAKE3_KEY_LEN 32
/* 2^64 bytes are at most 2^54 chunks: one stack entry per 1-bit of the count of finished
 * chunks, plus the one just pushed before it is merged. */
#define NN_BLAKE3_MAX_DEPTH 55

/* A hash in progress: a plain value owned by the caller (about 1.9 KB); copying it forks
 * the hash. The fields are internal. */
typedef struct nn_blake3_hasher {
    uint32_t key[8];          /* the key words: the IV unkeyed, the caller's key keyed */
    uint32_t cv[8];           /* the current chunk's chaining value so far */
    uint8_t block[64];        /* the current chunk's buffered block */
    uint64_t chunk_counter;   /* the current chunk's index in the input */
    uint32_t block_len;       /* bytes in block */
    uint32_t blocks_done;     /* blocks of the current chunk already compressed */
    uint32_t flags;           /* the mode's flag (KEYED_HASH or none) */
    uint32_t lanes;           /* chunks hashed at once on this CPU: 8 (AVX2) or 1 */
    uint64_t first_chunk;     /* where the chunks counted start: 0, or a subtree's first chunk */
    uint32_t stack_len;
    uint8_t stack[NN_BLAKE3_MAX_DEPTH][32]; /* chaining values of complete subtrees, left to right */
} nn_blake3_hasher;

NN_BLAKE3_API void nn_blake3_init(nn_blake3_hasher *h);
NN_BLAKE3_API void nn_blake3_init_keyed(nn_blake3_hasher *h, const uint8_t key[NN_BLAKE3_KEY_LEN]);
/* data may be NULL when len is 0. */
NN_BLAKE3_API void nn_blake3_update(nn_blake3_hasher *h, const void *data, size_t len);
/* The hash of everything given so far; h is left as it was, so more input may follow. */
NN_BLAKE3_API void nn_blake3_finalize(const nn_blake3_hasher *h, uint8_t out[NN_BLAKE3_OUT_LEN]);

/* Subtrees, to hash one input on several threads. A subtree is 2^k whole chunks (1024
 * bytes each) starting at a chunk number that is a multiple of 2^k, with more input after
 * it. nn_blake3_subtree gives its chaining value, in the mode of `mode` (a hasher just
 * initialized, plain or keyed); nn_blake3_push_subtree adds it to a hasher in the same
 * mode that has taken nothing but whole subtrees so far, in order, each aligned as said
 * (its chunk count a multiple of `chunks`). The input after the last subtree then goes to
 * nn_blake3_update, and the digest is the one-call hash's. */
NN_BLAKE3_API void nn_blake3_subtree(const nn_blake3_hasher *mode, const void *data, size_t len,
                                     uint64_t first_chunk, uint8_t cv[NN_BLAKE3_OUT_LEN]);
NN_BLAKE3_API void nn_blake3_push_subtree(nn_blake3_hasher *h, const uint8_t cv[NN_BLAKE3_OUT_LEN],
                                          uint64_t chunks);

/* The one-call hash (unkeyed) on up to `threads` threads (at most eight), for inputs of 1 MiB
 * or more: the same digest. In blake3_threads.c, which needs POSIX threads and allocates one
 * heap block per call (without it, or without a thread, the caller hashes alone). */
NN_BLAKE3_API void nn_blake3_threaded(const void *data, size_t len, int threads, uint8_t out[NN_BLAKE3_OUT_LEN]);

/* How many whole chunks this build hashes at once on this CPU: 8 where AVX2 is usable (the
 * CPU has it and the operating system saves its registers), else 1. The digest is the same
 * either way. */
NN_BLAKE3_API uint32_t nn_blake3_lanes(void);

/* One-shot forms of the above. */
NN_BLAKE3_API void nn_blake3(const void *data, size_t len, uint8_t out[NN_BLAKE3_OUT_LEN]);
NN_BLAKE3_API void nn_blake3_keyed(const uint8_t key[NN_BLAKE3_KEY_LEN], const void *data, size_t len,
                                   uint8_t out[NN_BLAKE3_OUT_LEN]);

#ifdef __cplusplus
}
#endif

#endif /* NN_BLAKE3_H */
