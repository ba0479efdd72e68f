/* Two exported models (nncc export --name first / --name second) linked into one C program,
 * opened on three threads at once, ROUNDS times over: the first model's weights on one, a
 * damaged copy of them on another (one library, two opens at once: the copy must be refused
 * every time, the good file never), the second model's weights on the third (two libraries
 * side by side). A barrier releases the three opens together, so they hash at the same time;
 * each good open runs its model once.
 *
 *   two_models THREADS WEIGHTS_1 IN_1 OUT_1 DAMAGED_1 WEIGHTS_2 IN_2 OUT_2
 *
 * IN: the model's one input (raw float32); OUT: its one output from the last round. Built by
 * tests/test_export_concurrent.py, plain and under the sanitizers. Every failure is said on
 * stderr with a nonzero exit status. */
#define _POSIX_C_SOURCE 200809L  /* pthread barriers under -std=c11 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "first.h"
#include "second.h"

#define ROUNDS 8
#define THREADS 3

static pthread_barrier_t start;
static int threads;

struct job {
    const char *weights, *in, *out;  /* out NULL: the weights are damaged, and every open must refuse them */
    char failed[600];  /* empty, or what failed (copied: an error message is its thread's) */
};

static void fail(struct job *job, const char *what) { snprintf(job->failed, sizeof job->failed, "%s", what); }

/* Reads n floats of `path` into a new buffer (NULL when it cannot). */
static float *read_floats(const char *path, int64_t n) {
    FILE *f = fopen(path, "rb");
    float *data = malloc((size_t)n * sizeof(float));
    if (!f || !data || fread(data, sizeof(float), (size_t)n, f) != (size_t)n) {
        if (f) fclose(f);
        free(data);
        return NULL;
    }
    fclose(f);
    return data;
}

static void write_floats(struct job *job, const float *data, int64_t n) {
    FILE *f = fopen(job->out, "wb");
    if (!f || fwrite(data, sizeof(float), (size_t)n, f) != (size_t)n) fail(job, "writing the output");
    if (f) fclose(f);
}

/* The thread of model PFX: ROUNDS times open, run, close; the last round's output written. */
#define WORKER(PFX, UPPER)                                                                      \
static void *work_##PFX(void *arg) {                                                            \
    struct job *job = arg;                                                                      \
    float *in = read_floats(job->in, PFX##_input_size(0));                                      \
    float *out = malloc((size_t)PFX##_output_size(0) * sizeof(float));                          \
    if (!in || !out) fail(job, "reading the input");                                            \
    for (int round = 0; round < ROUNDS; round++) {                                              \
        pthread_barrier_wait(&start); /* every thread waits every round, whatever failed */     \
        if (job->failed[0]) continue;                                                           \
        PFX##_model *model = NULL;                                                              \
        int code = PFX##_open(job->weights, threads, &model);                                   \
        if (!job->out) {                                                                        \
            if (code != UPPER##_ERR_DAMAGED) fail(job, "the damaged weights were not refused"); \
            if (model) PFX##_close(model);                                                      \
            continue;                                                                           \
        }                                                                                       \
        if (code != 0) {                                                                        \
            fail(job, PFX##_last_error());                                                      \
            continue;                                                                           \
        }                                                                                       \
        const float *inputs[1] = {in};                                                          \
        float *outputs[1] = {out};                                                              \
        if (PFX##_run(model, inputs, outputs) != 0) fail(job, PFX##_last_error());              \
        PFX##_close(model);                                                                     \
    }                                                                                           \
    if (!job->failed[0] && job->out) write_floats(job, out, PFX##_output_size(0));              \
    free(in);                                                                                   \
    free(out);                                                                                  \
    return NULL;                                                                                \
}

WORKER(first, FIRST)
WORKER(second, SECOND)

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: two_models THREADS WEIGHTS_1 IN_1 OUT_1 DAMAGED_1 WEIGHTS_2 IN_2 OUT_2\n");
        return 2;
    }
    threads = atoi(argv[1]);
    if (first_input_count() != 1 || first_output_count() != 1 || second_input_count() != 1 ||
        second_output_count() != 1) {
        fprintf(stderr, "each model must have one input and one output\n");
        return 2;
    }
    struct job jobs[THREADS] = {
        {argv[2], argv[3], argv[4], ""}, {argv[5], argv[3], NULL, ""}, {argv[6], argv[7], argv[8], ""}};
    void *(*work[THREADS])(void *) = {work_first, work_first, work_second};
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t others[THREADS];
    for (int i = 1; i < THREADS; i++)
        if (pthread_create(&others[i], NULL, work[i], &jobs[i]) != 0) {
            fprintf(stderr, "cannot start a thread\n");
            return 3;
        }
    work[0](&jobs[0]);
    for (int i = 1; i < THREADS; i++) pthread_join(others[i], NULL);
    pthread_barrier_destroy(&start);
    int status = 0;
    for (int i = 0; i < THREADS; i++)
        if (jobs[i].failed[0]) {
            fprintf(stderr, "thread %d: %s\n", i + 1, jobs[i].failed);
            status = 1;
        }
    return status;
}
