/* nncc native runtime, compiled after prelude.h into one object that every library links:
 * the BLAS hook and the thread pool (both set once when the library is loaded), and the
 * helpers kernels call. GEMM goes to the BLAS numpy has loaded (OpenBLAS), reached through
 * a function pointer set at load time; without one a plain loop nest is used. */

typedef void (*nn_sgemm64_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                             const float *, int64_t, float, float *, int64_t);
typedef void (*nn_sgemm32_t)(int, int, int, int32_t, int32_t, int32_t, float, const float *, int32_t,
                             const float *, int32_t, float, float *, int32_t);
static void *nn_sgemm_fn = 0;
static int nn_sgemm_ilp64 = 0;

NN_EXPORT int nncc_set_blas(void *fn, int ilp64) {
    nn_sgemm_fn = fn;
    nn_sgemm_ilp64 = ilp64;
    return 0;
}

/* One thread pool for everything the native code does. A job's range [0, n) is cut into
 * chunks that the caller and the workers claim one at a time, and the caller waits only
 * for chunks that were claimed: on a machine whose cores other processes keep busy, a
 * worker that has not been scheduled yet does not hold the caller up (a static split,
 * worker i taking the i-th slice, made every parallel step wait for the slowest thread to
 * be scheduled, and a loaded 2-core machine ran a convnet many times slower on 2 threads
 * than on 1). A claim is a compare-and-swap on one word holding the job's generation and
 * the chunks left, so a worker that wakes late can never claim a chunk of a later job with
 * an earlier job's fields: the fields are written before the word is published and stay
 * until every claimed chunk is done.
 * A worker that finds no job spins for the next one, then sleeps on a condition variable:
 * within a native call for up to NN_SPIN_NS (a partition issues many short parallel loops,
 * and waking a sleeping thread costs the caller a system call and the job tens of
 * microseconds before the worker runs), and after the call returns (nn_call_end) for
 * NN_LINGER_NS more, so a caller that runs the model again at once finds it awake; an idle
 * process pays at most NN_LINGER_NS of one core per worker after its last call, then the
 * workers take no core from the user's other work.
 * A job that finds the workers asleep wakes them for the jobs after it, but when its work
 * is under NN_WAKE_WORK the caller runs it alone: it would be done before a woken worker
 * ran, and a worker that claimed a chunk late would make the caller wait for it. A call
 * that begins with the workers asleep (the first after an idle spell, such as a process's
 * first run after reading its input) runs every job under NN_WAKE_WORK alone and wakes
 * the workers only as it returns, to linger for a call soon after: a worker woken in the
 * middle of it starts cold, often on the caller's own core, and the caller would wait on
 * the chunks it claimed (a small model's first run cost 2-3 steady ones on one core, 4-18
 * with the pool on a loaded 2-core machine).
 * A call whose previous run (each entry point records its own call's work) came to under
 * NN_SMALL_CALL_WORK runs every job on the caller, workers awake or not, and does not wake
 * them: sharing a call that small gained under a tenth (a 32-row MLP of 1.8M multiply-adds,
 * 26.5 against 28.8 us), and it split the call's constants between two cores' caches, so
 * that its run after an idle spell (the workers asleep, the call alone on the caller) read
 * half of them from the other core's and took 2.3x its steady time, against 1.2x when
 * every run is the caller's. A call whose work passes the bound (its inputs grew) shares
 * its later jobs as any other does. */
#define NN_MAX_THREADS 16
#define NN_SPIN_NS 200000
#define NN_LINGER_NS 100000
#define NN_WAKE_WORK (1 << 20)
#define NN_SMALL_CALL_WORK (1 << 22)
#define NN_WAIT_SPINS 4096  /* pauses (about 115 us here) the caller spins on a claimed chunk before yielding */
#define NN_CHUNKS_PER_THREAD 4
static int nn_threads = 1;
static pthread_mutex_t nn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t nn_go = PTHREAD_COND_INITIALIZER;
static nn_task nn_job_fn;
static void *nn_job_ctx;
static int64_t nn_job_n, nn_job_chunks, nn_job_done;
static uint64_t nn_job_claim;  /* generation << 32 | chunks not yet claimed */
static int nn_job_gen, nn_in_call;
static int nn_wakes;              /* wake-ups without a job (under nn_mu) */
static int nn_sleepers;           /* workers asleep on nn_go, or about to be */
static int nn_waking;             /* a wake-up is under way: no second system call for it */
static int64_t nn_linger_until;   /* CLOCK_MONOTONIC ns: after a call, workers spin until then */
static int64_t nn_call_work;      /* the running call's work so far (its jobs' work summed) */
static int nn_call_small;         /* the running call runs its jobs on the caller (NN_SMALL_CALL_WORK) */
static int64_t nn_jobs_shared;    /* jobs handed to the workers, for nncc_jobs_shared */
static int nn_call_alone;         /* the call began with the workers asleep: its small jobs run inline
                                     (atomic: calls from two threads may read and write it at once) */

static inline void nn_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static inline int64_t nn_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Claims and runs chunks of job ``gen`` until none is left (or another job is published). */
static void nn_run_chunks(uint32_t gen) {
    uint64_t w = __atomic_load_n(&nn_job_claim, __ATOMIC_ACQUIRE);
    while ((uint32_t)(w >> 32) == gen && (uint32_t)w != 0) {
        if (!__atomic_compare_exchange_n(&nn_job_claim, &w, w - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;  /* w now holds the word as it is */
        int64_t n = nn_job_n, c = nn_job_chunks, i = c - (int64_t)(uint32_t)w;
        nn_job_fn(nn_job_ctx, n * i / c, n * (i + 1) / c);
        __atomic_add_fetch(&nn_job_done, 1, __ATOMIC_RELEASE);
        w = __atomic_load_n(&nn_job_claim, __ATOMIC_ACQUIRE);
    }
}

/* Whether a worker that has waited since ``since`` keeps spinning. */
static int nn_keep_spinning(int64_t since) {
    int64_t now = nn_now_ns();
    if (__atomic_load_n(&nn_in_call, __ATOMIC_RELAXED)) return now - since < NN_SPIN_NS;
    return now < __atomic_load_n(&nn_linger_until, __ATOMIC_RELAXED);
}

static void *nn_worker(void *arg) {
    (void)arg;
    int seen = 0;
    for (;;) {
        int64_t since = nn_now_ns();
        unsigned spins = 0;
        while (__atomic_load_n(&nn_job_gen, __ATOMIC_ACQUIRE) == seen) {
            nn_relax();
            if (++spins % 64) continue;  /* the clock read every 64 pauses */
            if (nn_keep_spinning(since)) {
                sched_yield();  /* a caller sharing this core runs first (else it would wait for this spin) */
                continue;
            }
            pthread_mutex_lock(&nn_mu);
            int wakes = nn_wakes;
            /* sequentially consistent with nn_parallel's publish: either it sees this sleeper and
             * wakes it, or this load sees its job */
            __atomic_add_fetch(&nn_sleepers, 1, __ATOMIC_SEQ_CST);
            while (__atomic_load_n(&nn_job_gen, __ATOMIC_SEQ_CST) == seen && nn_wakes == wakes)
                pthread_cond_wait(&nn_go, &nn_mu);
            __atomic_sub_fetch(&nn_sleepers, 1, __ATOMIC_SEQ_CST);
            __atomic_store_n(&nn_waking, 0, __ATOMIC_RELAXED);
            pthread_mutex_unlock(&nn_mu);
            since = nn_now_ns();
        }
        seen = __atomic_load_n(&nn_job_gen, __ATOMIC_ACQUIRE);
        nn_run_chunks((uint32_t)seen);
    }
    return 0;
}

/* Set once, when the library is loaded (before any job): the pool's size. */
NN_EXPORT int nncc_set_threads(int want) {
    static int started = 1;
    if (want < 1) want = 1;
    if (want > NN_MAX_THREADS) want = NN_MAX_THREADS;
    if (started > 1) return nn_threads;  /* the pool is made once */
    while (started < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, nn_worker, (void *)(intptr_t)started) != 0) break;
        started++;
    }
    nn_threads = started;
    return nn_threads;
}

int nn_thread_count(void) { return nn_threads; }

/* How many jobs this library's pool has handed to its workers (the rest ran on the caller). */
NN_EXPORT int64_t nncc_jobs_shared(void) { return __atomic_load_n(&nn_jobs_shared, __ATOMIC_RELAXED); }

/* AMX tiles (nncc/native/amx.py): Linux lets a process use the tiles' register state only
 * after it asks (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the
 * first tile instruction is SIGILL). Asked once per library, by whichever thread first
 * wants the tiles; the grant is the whole process's. $NNCC_AMX = 0, off, no or false never
 * asks, so every kernel takes its path without tiles: a user's switch, like a BLAS's ISA
 * cap, read here because exported libraries run without nncc's Python. */
#if defined(__linux__) && defined(__x86_64__)
#include <strings.h>
#include <sys/syscall.h>
long syscall(long number, ...); /* unistd.h declares it only beyond _POSIX_C_SOURCE */
#define NN_ARCH_REQ_XCOMP_PERM 0x1023
#define NN_XFEATURE_XTILEDATA 18
#endif
static pthread_once_t nn_amx_once = PTHREAD_ONCE_INIT;
static int nn_amx_ok;
static void nn_amx_request(void) {
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    const char *off = getenv("NNCC_AMX");
    if (off && (!strcmp(off, "0") || !strcasecmp(off, "off") || !strcasecmp(off, "no") || !strcasecmp(off, "false")))
        return;
    nn_amx_ok = syscall(SYS_arch_prctl, NN_ARCH_REQ_XCOMP_PERM, NN_XFEATURE_XTILEDATA) == 0;
#endif
}
int nn_amx_permitted(void) {
    pthread_once(&nn_amx_once, nn_amx_request);
    return nn_amx_ok;
}

/* An entry point brackets its steps with these: workers spin between the jobs of a call,
 * and for NN_LINGER_NS after it. */
static void nn_wake(void);

void nn_call_begin(int64_t *last_work) {
    int64_t last = __atomic_load_n(last_work, __ATOMIC_RELAXED);
    int small = nn_threads > 1 && last > 0 && last < NN_SMALL_CALL_WORK;
    __atomic_store_n(&nn_call_work, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&nn_call_small, small, __ATOMIC_RELAXED);
    __atomic_store_n(&nn_call_alone, nn_threads > 1 && __atomic_load_n(&nn_sleepers, __ATOMIC_SEQ_CST) == nn_threads - 1,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&nn_in_call, 1, __ATOMIC_RELAXED);
}
void nn_call_end(int64_t *last_work) {
    __atomic_store_n(last_work, __atomic_load_n(&nn_call_work, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    int small = __atomic_exchange_n(&nn_call_small, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&nn_linger_until, nn_now_ns() + NN_LINGER_NS, __ATOMIC_RELAXED);
    __atomic_store_n(&nn_in_call, 0, __ATOMIC_RELAXED);
    if (__atomic_exchange_n(&nn_call_alone, 0, __ATOMIC_RELAXED) && !small) {  /* a call right after this one finds them spinning */
        nn_wake();
    }
}

/* Wakes the sleeping workers, to spin for the next job (or run one just published): one
 * system call, none while they all spin or a wake-up is already under way. */
static void nn_wake(void) {
    if (!__atomic_load_n(&nn_sleepers, __ATOMIC_SEQ_CST) || __atomic_exchange_n(&nn_waking, 1, __ATOMIC_ACQ_REL))
        return;
    pthread_mutex_lock(&nn_mu);
    nn_wakes++;
    pthread_cond_broadcast(&nn_go);
    pthread_mutex_unlock(&nn_mu);
}

/* fn over [0, n) in chunks the pool's threads claim, the caller among them; small jobs
 * (work: a rough count of operations) run inline, and so do every job of a small call
 * (NN_SMALL_CALL_WORK) and jobs under NN_WAKE_WORK that find the workers asleep (which
 * they wake for the next job). */
void nn_parallel(int64_t n, int64_t work, nn_task fn, void *ctx) {
    int t = nn_threads;
    int64_t so_far = __atomic_add_fetch(&nn_call_work, work, __ATOMIC_RELAXED);
    if (__atomic_load_n(&nn_call_small, __ATOMIC_RELAXED)) {
        if (so_far < NN_SMALL_CALL_WORK) { fn(ctx, 0, n); return; }
        __atomic_store_n(&nn_call_small, 0, __ATOMIC_RELAXED);
    }
    if (t <= 1 || n < 2 || work < 32768) { fn(ctx, 0, n); return; }
    if (work < NN_WAKE_WORK && __atomic_load_n(&nn_call_alone, __ATOMIC_RELAXED)) { fn(ctx, 0, n); return; }
    if (work < NN_WAKE_WORK && __atomic_load_n(&nn_sleepers, __ATOMIC_SEQ_CST) == t - 1) {
        nn_wake();
        fn(ctx, 0, n);
        return;
    }
    __atomic_store_n(&nn_call_alone, 0, __ATOMIC_RELAXED);  /* a large job wakes the workers: the call's later jobs share them */
    int64_t chunks = n < (int64_t)t * NN_CHUNKS_PER_THREAD ? n : (int64_t)t * NN_CHUNKS_PER_THREAD;
    uint32_t gen = (uint32_t)nn_job_gen + 1;
    nn_job_fn = fn; nn_job_ctx = ctx; nn_job_n = n; nn_job_chunks = chunks;
    __atomic_store_n(&nn_job_done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&nn_job_claim, (uint64_t)gen << 32 | (uint64_t)chunks, __ATOMIC_RELEASE);
    __atomic_store_n(&nn_job_gen, (int)gen, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&nn_jobs_shared, 1, __ATOMIC_RELAXED);
    nn_wake();
    nn_run_chunks(gen);
    /* a worker that claimed a chunk may share this core (the scheduler puts a new or woken
     * thread beside its waker until it balances them): past a short spin, yield it the core */
    for (int spins = 0; __atomic_load_n(&nn_job_done, __ATOMIC_ACQUIRE) != chunks;)
        if (++spins < NN_WAIT_SPINS) nn_relax(); else sched_yield();
}

/* C = alpha * op(A) @ op(B) + beta * C, row-major, in the calling thread. */
static void nn_gemm_serial(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (nn_sgemm_fn) {
        if (nn_sgemm_ilp64)
            ((nn_sgemm64_t)nn_sgemm_fn)(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, alpha, A, lda, B, ldb,
                                        beta, C, ldc);
        else
            ((nn_sgemm32_t)nn_sgemm_fn)(101, ta ? 112 : 111, tb ? 112 : 111, (int32_t)M, (int32_t)N,
                                        (int32_t)K, alpha, A, (int32_t)lda, B, (int32_t)ldb, beta, C,
                                        (int32_t)ldc);
        return;
    }
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (beta == 0.0f)
            for (int64_t j = 0; j < N; j++) c[j] = 0.0f;
        else if (beta != 1.0f)
            for (int64_t j = 0; j < N; j++) c[j] *= beta;
        for (int64_t k = 0; k < K; k++) {
            float a = alpha * (ta ? A[k * lda + i] : A[i * lda + k]);
            if (tb)
                for (int64_t j = 0; j < N; j++) c[j] += a * B[j * ldb + k];
            else
                for (int64_t j = 0; j < N; j++) c[j] += a * B[k * ldb + j];
        }
    }
}

/* GEMMs run on this pool too, BLAS single-threaded inside each share (the caller sets
 * BLAS to one thread around a native call): split into blocks of rows of C, or of columns
 * when there are few rows, so no thread of another pool spins between our loops. */
typedef struct { int ta, tb; int64_t M, N, K, lda, ldb, ldc, block; float alpha, beta; const float *A, *B; float *C;
                 int by_rows; } nn_gemm_job;

static void nn_gemm_task(void *p, int64_t lo, int64_t hi) {
    nn_gemm_job *g = p;
    int64_t a = lo * g->block, b = hi * g->block;
    if (g->by_rows) {
        if (b > g->M) b = g->M;
        if (a >= b) return;
        nn_gemm_serial(g->ta, g->tb, b - a, g->N, g->K, g->alpha, g->ta ? g->A + a : g->A + a * g->lda, g->lda,
                       g->B, g->ldb, g->beta, g->C + a * g->ldc, g->ldc);
    } else {
        if (b > g->N) b = g->N;
        if (a >= b) return;
        nn_gemm_serial(g->ta, g->tb, g->M, b - a, g->K, g->alpha, g->A, g->lda, g->tb ? g->B + a * g->ldb : g->B + a,
                       g->ldb, g->beta, g->C + a, g->ldc);
    }
}

/* One row times a matrix (a fully connected layer at batch 1): memory-bound, so a plain
 * loop is as fast as BLAS, and every column is summed in the same order, so equal
 * columns give equal results (BLAS's edge kernels round some columns differently). */
typedef struct { int ta, tb; int64_t N, K, lda, ldb; float alpha, beta; const float *A, *B; float *C; } nn_gemv_job;

static void nn_gemv_task(void *p, int64_t lo, int64_t hi) {
    nn_gemv_job *g = p;
    for (int64_t j = lo; j < hi; j++) {
        float s = 0.0f;
        if (g->tb) {
            const float *b = g->B + j * g->ldb;
            if (g->ta) for (int64_t k = 0; k < g->K; k++) s += g->A[k * g->lda] * b[k];
            else for (int64_t k = 0; k < g->K; k++) s += g->A[k] * b[k];
        } else {
            if (g->ta) for (int64_t k = 0; k < g->K; k++) s += g->A[k * g->lda] * g->B[k * g->ldb + j];
            else for (int64_t k = 0; k < g->K; k++) s += g->A[k] * g->B[k * g->ldb + j];
        }
        g->C[j] = g->alpha * s + (g->beta == 0.0f ? 0.0f : g->beta * g->C[j]);
    }
}

void nn_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t work = M * N * K;
    if (M == 1 && tb) {  /* rows of B contiguous: each column a unit-stride dot product */
        nn_gemv_job g = {ta, tb, N, K, lda, ldb, alpha, beta, A, B, C};
        nn_parallel(N, work, nn_gemv_task, &g);
        return;
    }
    if (nn_threads <= 1 || work < 262144) {
        nn_gemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* rows in blocks of 16 when there are enough of them, else columns in blocks of 64 */
    int by_rows = M >= 16 * nn_threads;
    int64_t block = by_rows ? 16 : 64, total = by_rows ? M : N;
    int64_t chunks = (total + block - 1) / block;
    nn_gemm_job g = {ta, tb, M, N, K, lda, ldb, ldc, block, alpha, beta, A, B, C, by_rows};
    nn_parallel(chunks, work, nn_gemm_task, &g);
}

/* y[c, i] = act(y[c, i] + bias[c] (+ res[c, i])) over C rows of n: one pass after a GEMM. */
static inline void nn_epilogue_serial(float *y, const float *bias, const float *res, int64_t C, int64_t n, int act,
                               float p0, float p1) {
    for (int64_t c = 0; c < C; c++) {
        float b = bias ? bias[c] : 0.0f;
        float *row = y + c * n;
        const float *r = res ? res + c * n : 0;
        if (act == NN_RELU) {
            if (r) for (int64_t i = 0; i < n; i++) { float v = row[i] + b + r[i]; row[i] = v < 0.0f ? 0.0f : v; }
            else for (int64_t i = 0; i < n; i++) { float v = row[i] + b; row[i] = v < 0.0f ? 0.0f : v; }
        } else if (act == NN_CLIP) {
            for (int64_t i = 0; i < n; i++) {
                float v = row[i] + b + (r ? r[i] : 0.0f);
                v = v < p0 ? p0 : v;
                row[i] = v > p1 ? p1 : v;
            }
        } else if (act == NN_NONE) {
            if (r) for (int64_t i = 0; i < n; i++) row[i] += b + r[i];
            else if (bias) for (int64_t i = 0; i < n; i++) row[i] += b;
        } else {
            for (int64_t i = 0; i < n; i++) row[i] = nn_act(act, row[i] + b + (r ? r[i] : 0.0f), p0, p1);
        }
    }
}

/* Columns for one group of a 2-D convolution: col[(c*kh + i)*kw + j][oh*OW + ow]. */
static void nn_im2col_serial(const float *x, float *col, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t OH,
                      int64_t OW) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
                float *dst = col + ((c * kh + i) * kw + j) * OH * OW;
                const float *src = x + c * H * W;
                for (int64_t oh = 0; oh < OH; oh++) {
                    int64_t ih = oh * sh - ph + i * dh;
                    float *d = dst + oh * OW;
                    if (ih < 0 || ih >= H) { memset(d, 0, OW * sizeof(float)); continue; }
                    const float *s = src + ih * W;
                    if (sw == 1) {
                        int64_t off = j * dw - pw;
                        int64_t lo = off < 0 ? -off : 0, hi = W - off < OW ? W - off : OW;
                        if (hi < lo) hi = lo;
                        for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0.0f;
                        memcpy(d + lo, s + lo + off, (hi - lo) * sizeof(float));
                        for (int64_t ow = hi; ow < OW; ow++) d[ow] = 0.0f;
                    } else {
                        for (int64_t ow = 0; ow < OW; ow++) {
                            int64_t iw = ow * sw - pw + j * dw;
                            d[ow] = (iw >= 0 && iw < W) ? s[iw] : 0.0f;
                        }
                    }
                }
            }
}

/* The output columns [lo, hi) whose input column ow*sw + off lies inside a row of W. */
static inline void nn_cols(int64_t off, int64_t sw, int64_t W, int64_t OW, int64_t *lo, int64_t *hi) {
    int64_t a = off >= 0 ? 0 : (-off + sw - 1) / sw;
    int64_t b = (W - 1 - off) >= 0 ? (W - 1 - off) / sw + 1 : 0;
    *lo = a;
    *hi = b < OW ? b : OW;
    if (*hi < *lo) *hi = *lo;
}

/* Activation over a row, one loop per kind so each loop vectorizes. */
static void nn_act_row(float *row, const float *res, int64_t n, int act, float p0, float p1) {
    if (res) for (int64_t i = 0; i < n; i++) row[i] += res[i];
    if (act == NN_RELU) for (int64_t i = 0; i < n; i++) row[i] = row[i] < 0.0f ? 0.0f : row[i];
    else if (act == NN_CLIP) for (int64_t i = 0; i < n; i++) { float v = row[i] < p0 ? p0 : row[i]; row[i] = v > p1 ? p1 : v; }
    else if (act != NN_NONE) for (int64_t i = 0; i < n; i++) row[i] = nn_act(act, row[i], p0, p1);
}

/* Scratch a kernel's tasks keep per thread: each thread, a pool worker or a caller, has one
 * buffer per slot (NN_SCRATCH_SLOTS, prelude.h) that grows (never shrinks), 64-byte aligned,
 * kept for the thread's life and freed when it exits, so a step allocates nothing once each
 * thread has run it (an allocation per task cost a memset and, in a worker's first one, a
 * new malloc arena). A request that cannot be met returns 0 and is recorded in
 * nn_scratch_short: the kernel skips its work, and the entry point, which checks after every
 * step, fails the call with NN_STATUS_SCRATCH (nncc raises a one-line error naming the
 * bytes), so no step computes on past it. In the sanitize mode every request gets a block of
 * exactly its size, so AddressSanitizer catches an access past what the kernel asked for. */
#if defined(__SANITIZE_ADDRESS__)
#define NN_SCRATCH_EXACT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NN_SCRATCH_EXACT 1
#endif
#endif
#ifndef NN_SCRATCH_EXACT
#define NN_SCRATCH_EXACT 0
#endif
typedef struct { void *buf[NN_SCRATCH_SLOTS]; int64_t cap[NN_SCRATCH_SLOTS]; } nn_scratch_set;
static _Thread_local nn_scratch_set *nn_my_scratch;
int64_t nn_scratch_short;             /* bytes of a request that failed in this step (0: none) */
static int64_t nn_scratch_failure[2];  /* the last failed call's (bytes, step), for nncc's message */

/* glibc's per-thread destructors (what C++ thread_local objects use): unlike a pthread key,
 * of which a process has 1024, one per library that is never unloaded would run out in a
 * process that loads many models. Without it (another libc) a caller thread that exits
 * leaves its buffers behind; the pool's workers never exit. */
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *obj, void *dso) __attribute__((weak));
extern void *__dso_handle;

static void nn_scratch_free(void *p) {
    nn_scratch_set *set = p;
    for (int i = 0; i < NN_SCRATCH_SLOTS; i++) free(set->buf[i]);
    free(set);
    nn_my_scratch = 0;
}

static float *nn_scratch_fail(int64_t bytes) {
    __atomic_store_n(&nn_scratch_short, bytes, __ATOMIC_RELAXED);
    return 0;
}

float *nn_scratch(int which, int64_t floats) {
    nn_scratch_set *set = nn_my_scratch;
    if (!set) {
        set = calloc(1, sizeof *set);
        if (!set) return nn_scratch_fail((int64_t)sizeof *set);
        if (__cxa_thread_atexit_impl) __cxa_thread_atexit_impl(nn_scratch_free, set, &__dso_handle);
        nn_my_scratch = set;
    }
    if (floats > set->cap[which] || (NN_SCRATCH_EXACT && floats != set->cap[which])) {
        size_t bytes = (size_t)floats * sizeof(float);
        if (!NN_SCRATCH_EXACT) bytes = (bytes + 63) / 64 * 64;
        free(set->buf[which]);
        set->buf[which] = 0;
        set->cap[which] = 0;
        if (posix_memalign(&set->buf[which], 64, bytes ? bytes : 64) != 0) {
            set->buf[which] = 0;
            return nn_scratch_fail((int64_t)bytes);
        }
        set->cap[which] = floats;
    }
    return set->buf[which];
}

int nn_scratch_failed(int step) {
    nn_scratch_failure[0] = __atomic_exchange_n(&nn_scratch_short, 0, __ATOMIC_RELAXED);
    nn_scratch_failure[1] = step;
    return NN_STATUS_SCRATCH;
}

/* (bytes, step) of the last call that failed for want of scratch memory (nncc's message). */
NN_EXPORT int nncc_scratch_failure(int64_t *out) {
    out[0] = nn_scratch_failure[0];
    out[1] = nn_scratch_failure[1];
    return 0;
}

/* Depthwise convolution (group == C == K). Each channel is copied into a zero-padded plane,
 * so no tap needs a bounds check. With stride 1 the output is accumulated in the padded
 * plane's row width: every tap is then one contiguous loop over the whole plane (a few
 * spare columns per row are computed and dropped), instead of a loop per row and tap. */
static void nn_depthwise_serial(const float *x, const float *w, const float *bias, const float *res, float *y,
                                int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t OH, int64_t OW, int act,
                                float p0, float p1) {
    int64_t Hp = (OH - 1) * sh + (kh - 1) * dh + 1, Wp = (OW - 1) * sw + (kw - 1) * dw + 1;
    float *xp = nn_scratch(NN_SCRATCH_PLANE, Hp * Wp);
    float *acc = nn_scratch(NN_SCRATCH_ACC, OH * Wp);
    if (!xp || !acc) return;  /* recorded: the call fails after this step */
    for (int64_t c = 0; c < C; c++) {
        const float *xc = x + c * H * W;
        const float *wc = w + c * kh * kw;
        float *yc = y + c * OH * OW;
        for (int64_t r = 0; r < Hp; r++) {
            float *dst = xp + r * Wp;
            int64_t ih = r - ph;
            if (ih < 0 || ih >= H) { memset(dst, 0, Wp * sizeof(float)); continue; }
            int64_t lo = pw < Wp ? pw : Wp, hi = pw + W < Wp ? pw + W : Wp;
            memset(dst, 0, lo * sizeof(float));
            if (hi > lo) memcpy(dst + lo, xc + ih * W, (hi - lo) * sizeof(float));
            if (hi < Wp) memset(dst + (hi > lo ? hi : lo), 0, (Wp - (hi > lo ? hi : lo)) * sizeof(float));
        }
        float b = bias ? bias[c] : 0.0f;
        if (sh == 1 && sw == 1) {
            int64_t span = (OH - 1) * Wp + OW;  /* last output element, in padded-row coordinates */
            for (int64_t t = 0; t < span; t++) acc[t] = b;
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++) {
                    const float *src = xp + i * dh * Wp + j * dw;
                    float wv = wc[i * kw + j];
                    for (int64_t t = 0; t < span; t++) acc[t] += wv * src[t];
                }
            for (int64_t oh = 0; oh < OH; oh++) memcpy(yc + oh * OW, acc + oh * Wp, OW * sizeof(float));
        } else {
            for (int64_t oh = 0; oh < OH; oh++) {
                float *row = yc + oh * OW;
                for (int64_t ow = 0; ow < OW; ow++) row[ow] = b;
                for (int64_t i = 0; i < kh; i++) {
                    const float *xr = xp + (oh * sh + i * dh) * Wp;
                    for (int64_t j = 0; j < kw; j++) {
                        const float *src = xr + j * dw;
                        float wv = wc[i * kw + j];
                        if (sw == 2)
                            for (int64_t ow = 0; ow < OW; ow++) row[ow] += wv * src[2 * ow];
                        else
                            for (int64_t ow = 0; ow < OW; ow++) row[ow] += wv * src[ow * sw];
                    }
                }
            }
        }
        nn_act_row(yc, res ? res + c * OH * OW : 0, OH * OW, act, p0, p1);
    }
}

/* Parallel front-ends: each splits its outer loop (channels or rows) over the pool. */
static void nn_maxpool2d_serial(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                                int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                                int64_t dw);
static void nn_avgpool2d_serial(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                                int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t eh,
                                int64_t ew, int include_pad);
typedef struct { const float *x, *w, *bias, *res; float *y; int64_t C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
                 int act; float p0, p1; int include_pad; int64_t eh, ew; } nn_args;

static void nn_depthwise_task(void *p, int64_t lo, int64_t hi) {
    nn_args *a = p;
    int64_t hw = a->H * a->W, ohw = a->OH * a->OW;
    nn_depthwise_serial(a->x + lo * hw, a->w + lo * a->kh * a->kw, a->bias ? a->bias + lo : 0,
                        a->res ? a->res + lo * ohw : 0, a->y + lo * ohw, hi - lo, a->H, a->W, a->kh, a->kw, a->sh,
                        a->sw, a->ph, a->pw, a->dh, a->dw, a->OH, a->OW, a->act, a->p0, a->p1);
}

static void nn_depthwise(const float *x, const float *w, const float *bias, const float *res, float *y, int64_t C,
                         int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                         int64_t pw, int64_t dh, int64_t dw, int64_t OH, int64_t OW, int act, float p0, float p1) {
    nn_args a = {x, w, bias, res, y, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, act, p0, p1, 0, 0, 0};
    nn_parallel(C, C * OH * OW * kh * kw, nn_depthwise_task, &a);
}

static void nn_maxpool_task(void *p, int64_t lo, int64_t hi) {
    nn_args *a = p;
    nn_maxpool2d_serial(a->x + lo * a->H * a->W, a->y + lo * a->OH * a->OW, hi - lo, a->H, a->W, a->OH, a->OW,
                        a->kh, a->kw, a->sh, a->sw, a->ph, a->pw, a->dh, a->dw);
}

void nn_maxpool2d(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                         int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                         int64_t dw) {
    nn_args a = {x, 0, 0, 0, y, NC, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, 0, 0.0f, 0.0f, 0, 0, 0};
    nn_parallel(NC, NC * OH * OW * kh * kw, nn_maxpool_task, &a);
}

static void nn_avgpool_task(void *p, int64_t lo, int64_t hi) {
    nn_args *a = p;
    nn_avgpool2d_serial(a->x + lo * a->H * a->W, a->y + lo * a->OH * a->OW, hi - lo, a->H, a->W, a->OH, a->OW,
                        a->kh, a->kw, a->sh, a->sw, a->ph, a->pw, a->eh, a->ew, a->include_pad);
}

void nn_avgpool2d(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                         int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t eh,
                         int64_t ew, int include_pad) {
    nn_args a = {x, 0, 0, 0, y, NC, H, W, kh, kw, sh, sw, ph, pw, 1, 1, OH, OW, 0, 0.0f, 0.0f, include_pad, eh, ew};
    nn_parallel(NC, NC * OH * OW * kh * kw, nn_avgpool_task, &a);
}

static void nn_epilogue_task(void *p, int64_t lo, int64_t hi) {
    nn_args *a = p;
    int64_t n = a->OW;
    nn_epilogue_serial(a->y + lo * n, a->bias ? a->bias + lo : 0, a->res ? a->res + lo * n : 0, hi - lo, n, a->act,
                       a->p0, a->p1);
}

void nn_epilogue(float *y, const float *bias, const float *res, int64_t C, int64_t n, int act, float p0,
                        float p1) {
    if (!bias && !res && act == NN_NONE) return;
    if (C == 1 && n >= 65536) { /* one long row (a flat activation): split it as rows of 4096 */
        int64_t rows = n / 4096, tail = n - rows * 4096;
        nn_args a = {0, 0, 0, res, y, rows, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4096, act, p0, p1, 0, 0, 0};
        if (bias) { nn_epilogue_serial(y, bias, res, C, n, act, p0, p1); return; }
        nn_parallel(rows, n, nn_epilogue_task, &a);
        if (tail) nn_epilogue_serial(y + rows * 4096, 0, res ? res + rows * 4096 : 0, 1, tail, act, p0, p1);
        return;
    }
    nn_args a = {0, 0, bias, res, y, C, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n, act, p0, p1, 0, 0, 0};
    nn_parallel(C, C * n, nn_epilogue_task, &a);
}

static void nn_im2col_task(void *p, int64_t lo, int64_t hi) {
    nn_args *a = p;
    nn_im2col_serial(a->x + lo * a->H * a->W, (float *)a->w + lo * a->kh * a->kw * a->OH * a->OW, hi - lo, a->H,
                     a->W, a->kh, a->kw, a->sh, a->sw, a->ph, a->pw, a->dh, a->dw, a->OH, a->OW);
}

static void nn_im2col(const float *x, float *col, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t OH, int64_t OW) {
    nn_args a = {x, col, 0, 0, 0, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, 0, 0.0f, 0.0f, 0, 0, 0};
    nn_parallel(C, C * kh * kw * OH * OW, nn_im2col_task, &a);
}

/* 2-D convolution of one image, NCHW, any groups: depthwise loop, direct GEMM for 1x1
 * stride-1 unpadded, else im2col (in `ws`) and GEMM per group; bias, residual and the
 * activation in one epilogue pass. */
void nn_conv2d(const float *x, const float *w, const float *bias, const float *res, float *y, int64_t N,
                      int64_t C, int64_t H, int64_t W, int64_t K, int64_t OH, int64_t OW, int64_t kh, int64_t kw,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group, int act,
                      float p0, float p1, float *ws) {
    int64_t cg = C / group, kg = K / group, n = OH * OW, kdim = cg * kh * kw;
    for (int64_t b = 0; b < N; b++) {
        const float *xb = x + b * C * H * W;
        float *yb = y + b * K * n;
        const float *rb = res ? res + b * K * n : 0;
        if (group == C && group == K) {
            nn_depthwise(xb, w, bias, rb, yb, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, act, p0, p1);
            continue;
        }
        for (int64_t g = 0; g < group; g++) {
            const float *xg = xb + g * cg * H * W;
            const float *src = xg;
            /* direct only when the output is the input itself: with end-only padding a 1x1
             * stride-1 output is larger than the input, and the GEMM would read past it */
            if (!(kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && OH == H && OW == W)) {
                nn_im2col(xg, ws, cg, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW);
                src = ws;
            }
            nn_gemm(0, 0, kg, n, kdim, 1.0f, w + g * kg * kdim, kdim, src, n, 0.0f, yb + g * kg * n, n);
        }
        nn_epilogue(yb, bias, rb, K, n, act, p0, p1);
    }
}

/* Max pooling row by row: each tap is a max over the output columns it reaches, so the
 * inner loops are plain (strided) vector maxima; NaN propagates as in the spec. */
#define NN_MAX_OR_NAN(v, r) (((v) > (r) || (v) != (v)) ? (v) : (r))  /* NaN wins, as max pooling defines */
#define NN_POOL_ROW 4096  /* image rows up to this long take the stride-2 path: its buffers live on the stack */

/* One output row of a stride-2 max pool: the window's rows reduced first (contiguous, whole
 * vectors), that row split into its even and odd columns, then every tap of the window a
 * contiguous read of one of the two (a stride-2 read vectorises poorly). */
static void nn_maxpool_row_s2(const float *xc, float *row, int64_t H, int64_t W, int64_t OW, int64_t ih0, int64_t kh,
                              int64_t kw, int64_t pw, int64_t dh, int64_t dw) {
    float m[NN_POOL_ROW], even[NN_POOL_ROW / 2 + 1], odd[NN_POOL_ROW / 2 + 1];
    for (int64_t iw = 0; iw < W; iw++) m[iw] = -INFINITY;
    for (int64_t i = 0; i < kh; i++) {
        int64_t ih = ih0 + i * dh;
        if (ih < 0 || ih >= H) continue;
        const float *xr = xc + ih * W;
        for (int64_t iw = 0; iw < W; iw++) m[iw] = NN_MAX_OR_NAN(xr[iw], m[iw]);
    }
    for (int64_t k = 0; k < W / 2; k++) { even[k] = m[2 * k]; odd[k] = m[2 * k + 1]; }
    if (W % 2) even[W / 2] = m[W - 1];
    for (int64_t j = 0; j < kw; j++) {
        int64_t off = j * dw - pw, lo, hi;
        nn_cols(off, 2, W, OW, &lo, &hi);
        int64_t parity = off & 1, half = (off - parity) / 2;  /* column 2 * ow + off of m */
        const float *src = parity ? odd : even;
        for (int64_t ow = lo; ow < hi; ow++) row[ow] = NN_MAX_OR_NAN(src[ow + half], row[ow]);
    }
}

static void nn_maxpool2d_serial(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                         int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                         int64_t dw) {
    for (int64_t c = 0; c < NC; c++) {
        const float *xc = x + c * H * W;
        float *yc = y + c * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            float *row = yc + oh * OW;
            for (int64_t ow = 0; ow < OW; ow++) row[ow] = -INFINITY;
            if (sw == 2 && W <= NN_POOL_ROW) {
                nn_maxpool_row_s2(xc, row, H, W, OW, oh * sh - ph, kh, kw, pw, dh, dw);
                continue;
            }
            for (int64_t i = 0; i < kh; i++) {
                int64_t ih = oh * sh - ph + i * dh;
                if (ih < 0 || ih >= H) continue;
                const float *xr = xc + ih * W;
                for (int64_t j = 0; j < kw; j++) {
                    int64_t off = j * dw - pw, lo, hi;
                    nn_cols(off, sw, W, OW, &lo, &hi);
                    const float *xs = xr + off;
                    if (sw == 1)
                        for (int64_t ow = lo; ow < hi; ow++) { float v = xs[ow]; row[ow] = NN_MAX_OR_NAN(v, row[ow]); }
                    else if (sw == 2)
                        for (int64_t ow = lo; ow < hi; ow++) { float v = xs[2 * ow]; row[ow] = NN_MAX_OR_NAN(v, row[ow]); }
                    else
                        for (int64_t ow = lo; ow < hi; ow++) { float v = xs[ow * sw]; row[ow] = NN_MAX_OR_NAN(v, row[ow]); }
                }
            }
        }
    }
}

static void nn_avgpool2d_serial(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                         int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t eh,
                         int64_t ew, int include_pad) {
    for (int64_t c = 0; c < NC; c++) {
        const float *xc = x + c * H * W;
        float *yc = y + c * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                float s = 0.0f;
                int64_t count = 0;
                for (int64_t i = 0; i < kh; i++) {
                    int64_t ih = oh * sh - ph + i;
                    for (int64_t j = 0; j < kw; j++) {
                        int64_t iw = ow * sw - pw + j;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) {
                            /* padding counts only where it lies inside the padded input,
                             * begin pads before it and end pads (eh, ew) after it */
                            if (include_pad && ih >= -ph && ih < H + eh && iw >= -pw && iw < W + ew) count++;
                            continue;
                        }
                        s += xc[ih * W + iw];
                        count++;
                    }
                }
                yc[oh * OW + ow] = count ? s / (float)count : 0.0f;
            }
    }
}

static void nn_mean_rows_serial(const float *x, float *y, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) s += xr[i];
        y[r] = (float)(s / (double)n);
    }
}

static void nn_softmax_rows_serial(const float *x, float *y, int64_t rows, int64_t n, int log) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float m = -INFINITY;
        for (int64_t i = 0; i < n; i++) m = xr[i] > m ? xr[i] : m;
        float s = 0.0f;
        if (log) {
            for (int64_t i = 0; i < n; i++) s += nn_exp(xr[i] - m);
            float l = logf(s);
            for (int64_t i = 0; i < n; i++) yr[i] = xr[i] - m - l;
        } else {
            for (int64_t i = 0; i < n; i++) { float e = nn_exp(xr[i] - m); yr[i] = e; s += e; }
            float inv = 1.0f / s;
            for (int64_t i = 0; i < n; i++) yr[i] *= inv;
        }
    }
}

/* y = x transposed: `shape` and `strides` (in elements, of x) are given in y's axis order. */
void nn_transpose(const float *x, float *y, int rank, const int64_t *shape, const int64_t *strides) {
    int64_t idx[8] = {0};
    int64_t total = 1;
    for (int d = 0; d < rank; d++) total *= shape[d];
    int64_t inner = shape[rank - 1], inner_stride = strides[rank - 1];
    int64_t off = 0;
    for (int64_t o = 0; o < total; o += inner) {
        const float *src = x + off;
        if (inner_stride == 1) memcpy(y + o, src, inner * sizeof(float));
        else for (int64_t i = 0; i < inner; i++) y[o + i] = src[i * inner_stride];
        for (int d = rank - 2; d >= 0; d--) {
            idx[d]++;
            off += strides[d];
            if (idx[d] < shape[d]) break;
            off -= strides[d] * shape[d];
            idx[d] = 0;
        }
    }
}

/* Row-wise front-ends. */
typedef struct { const float *x; float *y; int64_t n; int log; } nn_rows;

static void nn_softmax_task(void *p, int64_t lo, int64_t hi) {
    nn_rows *a = p;
    nn_softmax_rows_serial(a->x + lo * a->n, a->y + lo * a->n, hi - lo, a->n, a->log);
}

void nn_softmax_rows(const float *x, float *y, int64_t rows, int64_t n, int log) {
    nn_rows a = {x, y, n, log};
    nn_parallel(rows, rows * n * 4, nn_softmax_task, &a);
}

static void nn_mean_task(void *p, int64_t lo, int64_t hi) {
    nn_rows *a = p;
    nn_mean_rows_serial(a->x + lo * a->n, a->y + lo, hi - lo, a->n);
}

void nn_mean_rows(const float *x, float *y, int64_t rows, int64_t n) {
    nn_rows a = {x, y, n, 0};
    nn_parallel(rows, rows * n, nn_mean_task, &a);
}
