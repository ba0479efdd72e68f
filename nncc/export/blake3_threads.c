/* BLAKE3 of one input on several threads: the digest nn_blake3 gives, made faster by
 * hashing the tree's subtrees side by side. An exported library checks its weights with it
 * on the threads its model is opened with. POSIX threads and one heap block per call, so
 * calls from several threads at once stay independent. An exported library compiles this
 * text after blake3.c's in one translation unit: no file-scope name here may be one of its. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getcpu, CPU_SET and pthread_attr_setaffinity_np, before any header */
#endif
#include "blake3.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

/* Below SPLIT_BYTES a thread costs more than it saves; at most MAX_PIECES equal subtrees
 * are cut, and MAX_THREADS threads hash. A subtree smaller than SMALLEST chunks is left to
 * the calling thread's tail. */
#define SPLIT_BYTES (1u << 20)
#define MAX_PIECES 64
#define MAX_THREADS 8
#define SMALLEST 64u
#define CHUNK 1024u

struct piece {
    uint64_t first, chunks; /* its first chunk's number and its size, a power of two dividing first */
    uint8_t cv[NN_BLAKE3_OUT_LEN];
};

struct hash_job {
    nn_blake3_hasher mode;
    const unsigned char *data;
    int count, next;
    struct piece pieces[]; /* count of them, in the input's order, the largest first */
};

/* Each thread claims the next subtree from the counter, so a thread the operating system
 * schedules late leaves its share to the others, and the smaller ones at the end even out
 * the threads' finishing times. */
static void *hash_pieces(void *arg)
{
    struct hash_job *job = arg;
    int i;
    while ((i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED)) < job->count) {
        struct piece *p = &job->pieces[i];
        nn_blake3_subtree(&job->mode, job->data + p->first * CHUNK, p->chunks * CHUNK, p->first, p->cv);
    }
    return 0;
}

/* The helpers start on the CPUs the process may use other than the caller's: Linux tends to
 * start a thread on its creator's core and to move it only milliseconds later, which on a
 * quiet two-core machine made the open's hash run on one core about half the time. */
static void start_apart(pthread_attr_t *attr)
{
#ifdef __linux__
    cpu_set_t set;
    int cpu = sched_getcpu();
    if (cpu >= 0 && sched_getaffinity(0, sizeof set, &set) == 0 && CPU_ISSET(cpu, &set) && CPU_COUNT(&set) > 1) {
        CPU_CLR(cpu, &set);
        pthread_attr_setaffinity_np(attr, sizeof set, &set);
    }
#else
    (void)attr;
#endif
}

/* The whole chunks that have input after them are cut into equal subtrees of a power-of-two
 * count of chunks, at least four per thread, and what is left of them into the subtrees of
 * its binary digits (each aligned: the count before it is a multiple of its size), down to
 * SMALLEST chunks. Their chaining values are joined in order and the tail after them is
 * hashed as usual, so the digest is the one-call hash's. Without the memory for the job, or
 * a thread, the calling thread hashes what is left alone. */
void nn_blake3_threaded(const void *input, size_t len, int threads, uint8_t out[NN_BLAKE3_OUT_LEN])
{
    const unsigned char *data = input;
    nn_blake3_hasher h;
    nn_blake3_init(&h);
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    struct hash_job *job = 0;
    uint64_t whole = len ? (len - 1) / CHUNK : 0, piece = 1, equal = 0, rest = 0;
    if (threads >= 2 && len >= SPLIT_BYTES) {
        while (piece * 2 * 4 * (uint64_t)threads <= len / CHUNK)
            piece *= 2;
        while (whole / piece > MAX_PIECES)
            piece *= 2;
        equal = whole / piece;
        rest = (whole - equal * piece) / SMALLEST * SMALLEST;
        job = malloc(sizeof *job + (size_t)(equal + (uint64_t)__builtin_popcountll(rest)) * sizeof job->pieces[0]);
    }
    if (!job) {
        nn_blake3_update(&h, data, len);
        nn_blake3_finalize(&h, out);
        return;
    }
    job->mode = h;
    job->data = data;
    job->count = 0;
    job->next = 0;
    uint64_t done = 0; /* chunks */
    for (uint64_t i = 0; i < equal; i++, done += piece)
        job->pieces[job->count++] = (struct piece){.first = done, .chunks = piece};
    for (uint64_t size = piece; size >= SMALLEST; size /= 2)
        if (rest & size) {
            job->pieces[job->count++] = (struct piece){.first = done, .chunks = size};
            done += size;
        }
    pthread_t helpers[MAX_THREADS];
    pthread_attr_t attr;
    int started = 0, placed = pthread_attr_init(&attr) == 0;
    if (placed)
        start_apart(&attr);
    while (started < threads - 1 && pthread_create(&helpers[started], placed ? &attr : 0, hash_pieces, job) == 0)
        started++;
    if (placed)
        pthread_attr_destroy(&attr);
    hash_pieces(job); /* the caller claims subtrees too, all of them if no thread started */
    for (int t = 0; t < started; t++)
        pthread_join(helpers[t], 0);
    for (int i = 0; i < job->count; i++)
        nn_blake3_push_subtree(&h, job->pieces[i].cv, job->pieces[i].chunks);
    free(job);
    nn_blake3_update(&h, data + done * CHUNK, len - done * CHUNK);
    nn_blake3_finalize(&h, out);
}
