/* BLAKE3 of one input on several threads: the digest nn_blake3 gives, made faster by
 * hashing the tree's subtrees side by side. An exported library checks its weights with it
 * on the threads its model is opened with. POSIX threads and one heap block per call, so
 * calls from several threads at once stay independent. */
#include "blake3.h"

#include <pthread.h>
#include <stdlib.h>

/* Below SPLIT_BYTES a thread costs more than it saves; at most MAX_PIECES chaining values
 * are kept, and MAX_THREADS threads hash. */
#define SPLIT_BYTES (1u << 20)
#define MAX_PIECES 64
#define MAX_THREADS 8
#define CHUNK 1024u

struct hash_job {
    nn_blake3_hasher mode;
    const unsigned char *data;
    uint64_t piece_chunks;
    int count, next;
    uint8_t cv[][NN_BLAKE3_OUT_LEN]; /* one chaining value per subtree: count of them */
};

/* Each thread claims the next subtree from the counter, so a thread the operating system
 * schedules late leaves its share to the others. */
static void *hash_pieces(void *arg)
{
    struct hash_job *job = arg;
    int i;
    while ((i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED)) < job->count)
        nn_blake3_subtree(&job->mode, job->data + (size_t)i * job->piece_chunks * CHUNK, job->piece_chunks * CHUNK,
                          (uint64_t)i * job->piece_chunks, job->cv[i]);
    return 0;
}

/* The input is cut into equal subtrees of a power-of-two count of chunks, at least four per
 * thread, with input after the last of them; their chaining values are joined in order and
 * the tail after them is hashed as usual, so the digest is the one-call hash's. Without
 * the memory for the job, or a thread, the calling thread hashes what is left alone. */
void nn_blake3_threaded(const void *input, size_t len, int threads, uint8_t out[NN_BLAKE3_OUT_LEN])
{
    const unsigned char *data = input;
    nn_blake3_hasher h;
    nn_blake3_init(&h);
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    struct hash_job *job = 0;
    uint64_t chunks = len / CHUNK, piece = 1;
    int count = 0;
    if (threads >= 2 && len >= SPLIT_BYTES) {
        while (piece * 2 * 4 * (uint64_t)threads <= chunks)
            piece *= 2;
        while ((len - 1) / (piece * CHUNK) > MAX_PIECES)
            piece *= 2;
        count = (int)((len - 1) / (piece * CHUNK)); /* a subtree has input after it: the tail is never empty */
        job = malloc(sizeof *job + (size_t)count * sizeof job->cv[0]);
    }
    if (!job) {
        nn_blake3_update(&h, data, len);
        nn_blake3_finalize(&h, out);
        return;
    }
    job->mode = h;
    job->data = data;
    job->piece_chunks = piece;
    job->count = count;
    job->next = 0;
    pthread_t helpers[MAX_THREADS];
    int started = 0;
    while (started < threads - 1 && pthread_create(&helpers[started], 0, hash_pieces, job) == 0)
        started++;
    hash_pieces(job); /* the caller claims subtrees too, all of them if no thread started */
    for (int t = 0; t < started; t++)
        pthread_join(helpers[t], 0);
    for (int i = 0; i < job->count; i++)
        nn_blake3_push_subtree(&h, job->cv[i], piece);
    size_t done = (size_t)job->count * piece * CHUNK;
    free(job);
    nn_blake3_update(&h, data + done, len - done);
    nn_blake3_finalize(&h, out);
}
