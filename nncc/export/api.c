/* The C API of an exported model (nncc export): open a weights file, run the model's one
 * native call on the caller's buffers, close. nncc/export/c_api.py writes the model's tables
 * and names before this text (NNX_* macros, nnx_* arrays, nnx_cpu_mask); every symbol but
 * the API's is made local when the library is linked, so two exported models link into
 * one program side by side. No abort, no printing: every failure is a code and a message. */

#define NNX_HEADER 128
#define NNX_PUBLIC __attribute__((visibility("default")))
#define NNX_MAGIC "NNCCWTS"  /* and a zero byte */
#define NNX_STATUS_SCRATCH 2  /* the generated code's status when a step's scratch could not be allocated */

struct NNX_STRUCT {
    const unsigned char *file;  /* the weights file's bytes: mapped, or the library's own */
    size_t size;
    int mapped;
    char *workspace;
    size_t workspace_bytes;  /* the workspace's mapping */
};

static pthread_mutex_t nnx_lock = PTHREAD_MUTEX_INITIALIZER;  /* one run at a time: the pool is shared */
static _Thread_local char nnx_message[512];

static int nnx_fail(int code, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(nnx_message, sizeof nnx_message, format, args);
    va_end(args);
    return code;
}

NNX_PUBLIC const char *NNX_API(last_error)(void) { return nnx_message; }
NNX_PUBLIC const char *NNX_API(batch_name)(void) { return nnx_batch_name; }
NNX_PUBLIC int NNX_API(input_count)(void) { return NNX_INPUTS; }
NNX_PUBLIC int NNX_API(output_count)(void) { return NNX_OUTPUTS; }
NNX_PUBLIC const char *NNX_API(input_name)(int i) { return i >= 0 && i < NNX_INPUTS ? nnx_input_names[i] : 0; }
NNX_PUBLIC const char *NNX_API(output_name)(int i) { return i >= 0 && i < NNX_OUTPUTS ? nnx_output_names[i] : 0; }
NNX_PUBLIC int NNX_API(input_type)(int i) { return i >= 0 && i < NNX_INPUTS ? NNX_PREFIXED_FLOAT32 : 0; }
NNX_PUBLIC int NNX_API(output_type)(int i) { return i >= 0 && i < NNX_OUTPUTS ? NNX_PREFIXED_FLOAT32 : 0; }
NNX_PUBLIC int NNX_API(input_rank)(int i) { return i >= 0 && i < NNX_INPUTS ? nnx_input_ranks[i] : -1; }
NNX_PUBLIC int NNX_API(output_rank)(int i) { return i >= 0 && i < NNX_OUTPUTS ? nnx_output_ranks[i] : -1; }
NNX_PUBLIC const int64_t *NNX_API(input_shape)(int i) { return i >= 0 && i < NNX_INPUTS ? nnx_input_shapes[i] : 0; }
NNX_PUBLIC const int64_t *NNX_API(output_shape)(int i) { return i >= 0 && i < NNX_OUTPUTS ? nnx_output_shapes[i] : 0; }
NNX_PUBLIC int64_t NNX_API(input_size)(int i) { return i >= 0 && i < NNX_INPUTS ? nnx_input_sizes[i] : -1; }
NNX_PUBLIC int64_t NNX_API(output_size)(int i) { return i >= 0 && i < NNX_OUTPUTS ? nnx_output_sizes[i] : -1; }
NNX_PUBLIC int NNX_API(input_batch_axis)(int i) { return i >= 0 && i < NNX_INPUTS ? nnx_input_batch_axes[i] : -1; }
NNX_PUBLIC int NNX_API(output_batch_axis)(int i) { return i >= 0 && i < NNX_OUTPUTS ? nnx_output_batch_axes[i] : -1; }

/* CRC-32 (zlib's), for the header's own check: a byte at a time, as the header is 88 bytes. */
static uint32_t nnx_crc32(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (; n; n--, p++) {
        c ^= *p;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
}

static uint32_t nnx_u32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t nnx_u64(const unsigned char *p) { return nnx_u32(p) | (uint64_t)nnx_u32(p + 4) << 32; }

static void nnx_feature_names(uint64_t bits, char *out, size_t room) {
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < NNX_FEATURE_COUNT && used + 1 < room; i++)
        if (bits >> i & 1)
            used += (size_t)snprintf(out + used, room - used, "%s%s", used ? " " : "", nnx_feature_table[i]);
}

/* The header and the data, checked against this build: every size is the library's own. */
static int nnx_check(const unsigned char *f, size_t size, const char *where, int threads) {
    if (size < NNX_HEADER || memcmp(f, NNX_MAGIC, 8) != 0)
        return nnx_fail(NNX_ERR(FORMAT), "%s is not an nncc weights file", where);
    if (nnx_u32(f + 8) != NNX_FORMAT || nnx_u32(f + 12) != NNX_HEADER)
        return nnx_fail(NNX_ERR(FORMAT), "%s has weights format %u; this library reads format %u", where,
                        (unsigned)nnx_u32(f + 8), (unsigned)NNX_FORMAT);
    int padding = 0;
    for (int i = 92; i < NNX_HEADER; i++) padding |= f[i];
    if (nnx_crc32(f, 88) != nnx_u32(f + 88) || padding)
        return nnx_fail(NNX_ERR(DAMAGED), "%s is damaged (its header does not match its checksum)", where);
    if (memcmp(f + 16, nnx_token, 16) != 0)
        return nnx_fail(NNX_ERR(MISMATCH), "%s belongs to another model or build (its token differs from this "
                        "library's)", where);
    if (nnx_u64(f + 32) != NNX_FEATURES)
        return nnx_fail(NNX_ERR(MISMATCH), "%s was made for other CPU features than this library", where);
    if (nnx_u64(f + 40) != NNX_HEADER || nnx_u64(f + 48) != NNX_DATA_BYTES || size != NNX_HEADER + NNX_DATA_BYTES)
        return nnx_fail(NNX_ERR(DAMAGED), "%s is damaged: %llu bytes where this model's weights take %llu",
                        where, (unsigned long long)size, (unsigned long long)(NNX_HEADER + NNX_DATA_BYTES));
    /* The digest compiled into this library is the reference, not the file's: data and header
     * rewritten together still differ from it. */
    if (memcmp(f + 56, nnx_digest, 32) != 0)
        return nnx_fail(NNX_ERR(DAMAGED), "%s is damaged or altered: its header's BLAKE3 of the data is not the "
                        "one built into this library", where);
    uint8_t digest[NN_BLAKE3_OUT_LEN];
    nn_blake3_threaded(f + NNX_HEADER, NNX_DATA_BYTES, threads, digest);  /* on the open's threads */
    if (memcmp(digest, nnx_digest, 32) != 0)
        return nnx_fail(NNX_ERR(DAMAGED), "%s is damaged or altered: its data's BLAKE3 differs from the one "
                        "built into this library", where);
    return 0;
}

static int nnx_map(const char *path, NNX_STRUCT_T *m, int threads) {
#if NNX_EMBEDDED
    (void)path;
    m->file = nnx_embedded_weights;
    m->size = NNX_HEADER + NNX_DATA_BYTES;
    return nnx_check(m->file, m->size, "the embedded weights", threads);
#else
    if (!path) return nnx_fail(NNX_ERR(ARGUMENT), "no weights file given (the path is NULL)");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nnx_fail(NNX_ERR(IO), "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return nnx_fail(NNX_ERR(IO), "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size < NNX_HEADER) {
        close(fd);
        return nnx_fail(NNX_ERR(FORMAT), "%s is not an nncc weights file (%lld bytes)", path, (long long)st.st_size);
    }
    void *p = mmap(0, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return nnx_fail(NNX_ERR(IO), "cannot map %s: %s", path, strerror(errno));
    m->file = p;
    m->size = (size_t)st.st_size;
    m->mapped = 1;
    return nnx_check(m->file, m->size, path, threads);
#endif
}

/* The workspace, mapped and faulted in at open rather than a page at a time by the first
 * run. One of 1 MiB or more is rounded up to whole 2 MiB pages (less than 2 MiB more, and
 * no more than its own size), starts on a 2 MiB boundary and asks for transparent huge
 * pages (granted where the system's setting allows them on request): faulting in a 2 MiB
 * page costs about what 60 pages of 4 KiB do, so its faults are a few instead of hundreds
 * or thousands, and the runs miss the TLB less. NULL when there is no memory. Under
 * AddressSanitizer it comes from the heap instead, where the sanitizer checks its bounds
 * to the byte. */
#define NNX_PAGE 4096u
#define NNX_HUGE_PAGE (2u << 20)
#define NNX_HUGE_FROM (1u << 20)

static char *nnx_workspace(size_t *bytes) {
#if defined(__SANITIZE_ADDRESS__)
    *bytes = 0;
    return aligned_alloc(64, NNX_WORKSPACE_BYTES);
#else
    int huge = NNX_WORKSPACE_BYTES >= NNX_HUGE_FROM;
    size_t unit = huge ? NNX_HUGE_PAGE : NNX_PAGE;
    size_t size = (NNX_WORKSPACE_BYTES + unit - 1) / unit * unit;
    size_t slack = huge ? NNX_HUGE_PAGE : 0;  /* room to move the start to a boundary */
    char *p = mmap(0, size + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 0;
    if (slack) {
        size_t head = (NNX_HUGE_PAGE - (uintptr_t)p % NNX_HUGE_PAGE) % NNX_HUGE_PAGE;
        if (head) munmap(p, head);
        if (slack - head) munmap(p + head + size, slack - head);
        p += head;
#ifdef MADV_HUGEPAGE
        madvise(p, size, MADV_HUGEPAGE);  /* advice only: without it the pages are 4 KiB */
#endif
    }
    for (size_t i = 0; i < size; i += NNX_PAGE) p[i] = 0;
    *bytes = size;
    return p;
#endif
}

static void nnx_release(NNX_STRUCT_T *m) {
    if (!m) return;
    if (m->mapped) munmap((void *)m->file, m->size);
    if (m->workspace_bytes) munmap(m->workspace, m->workspace_bytes);
    else free(m->workspace);
    free(m);
}

NNX_PUBLIC int NNX_API(open)(const char *weights, int threads, NNX_STRUCT_T **model) {
    if (!model) return nnx_fail(NNX_ERR(ARGUMENT), "the model pointer is NULL");
    *model = 0;
    uint64_t have = nnx_cpu_mask();
    if ((have & NNX_FEATURES) != NNX_FEATURES) {
        char lacks[256];
        nnx_feature_names(NNX_FEATURES & ~have, lacks, sizeof lacks);
        return nnx_fail(NNX_ERR(CPU), "this CPU lacks %s, which this library's code needs", lacks);
    }
    if (threads < 0) return nnx_fail(NNX_ERR(ARGUMENT), "threads must be 0 (one per core) or more, not %d", threads);
    if (threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > 0 ? (int)cores : 1;
    }
    NNX_STRUCT_T *m = calloc(1, sizeof *m);
    if (!m) return nnx_fail(NNX_ERR(MEMORY), "out of memory");
    int status = nnx_map(weights, m, threads);  /* the run lock is not held while the data is hashed */
    if (status) { nnx_release(m); return status; }
    m->workspace = nnx_workspace(&m->workspace_bytes);
    if (!m->workspace) { nnx_release(m); return nnx_fail(NNX_ERR(MEMORY), "out of memory for the workspace"); }
    pthread_mutex_lock(&nnx_lock);
    nncc_set_threads(threads);  /* the first open that asks for more than one thread makes the pool */
    pthread_mutex_unlock(&nnx_lock);
    *model = m;
    return 0;
}

/* n samples through the code compiled for one: a batched buffer moves on by its sample's
 * elements from one sample to the next; an unbatched input goes whole to each; an unbatched
 * output is the first sample's (the later ones write theirs into scratch). */
NNX_PUBLIC int NNX_API(run_batch)(NNX_STRUCT_T *model, int64_t n, const float *const *inputs,
                                  float *const *outputs) {
    if (!model) return nnx_fail(NNX_ERR(ARGUMENT), "the model is NULL");
    if (!inputs || !outputs) return nnx_fail(NNX_ERR(ARGUMENT), "the %s array is NULL", inputs ? "outputs" : "inputs");
    if (n < 1) return nnx_fail(NNX_ERR(ARGUMENT), "the batch size must be 1 or more, not %lld", (long long)n);
    if (!NNX_BATCHED && n != 1)
        return nnx_fail(NNX_ERR(ARGUMENT), "this library has no batch axis (every size was fixed at export): the "
                        "batch size must be 1, not %lld", (long long)n);
    if (n > PTRDIFF_MAX / (int64_t)sizeof(float) / NNX_LARGEST_SAMPLE)
        return nnx_fail(NNX_ERR(ARGUMENT), "a batch of %lld samples is too large: its buffers would not fit in the "
                        "address space", (long long)n);
    void *args[NNX_ARGS + 1];
    int64_t step[NNX_ARGS + 1];  /* elements from one sample to the next; 0: the same buffer */
    for (int a = 0; a < NNX_ARGS; a++) {
        int k = nnx_arg_index[a];
        step[a] = 0;
        if (nnx_arg_kind[a] == 0) {
            if (!inputs[k]) return nnx_fail(NNX_ERR(ARGUMENT), "input %d (%s) is NULL", k, nnx_input_names[k]);
            args[a] = (void *)inputs[k];
            if (nnx_input_batch_axes[k] >= 0) step[a] = nnx_input_sizes[k];
        } else if (nnx_arg_kind[a] == 1) {
            args[a] = (void *)(model->file + NNX_HEADER + nnx_constant_offsets[k]);
        } else {
            if (!outputs[k]) return nnx_fail(NNX_ERR(ARGUMENT), "output %d (%s) is NULL", k, nnx_output_names[k]);
            args[a] = outputs[k];
            if (nnx_output_batch_axes[k] >= 0) step[a] = nnx_output_sizes[k];
        }
    }
    float *scratch = 0;
    if (NNX_SCRATCH_FLOATS > 0 && n > 1 && !(scratch = malloc(NNX_SCRATCH_FLOATS * sizeof(float))))
        return nnx_fail(NNX_ERR(MEMORY), "out of memory for the batch's unbatched outputs");
    pthread_mutex_lock(&nnx_lock);
    int status = 0;
    int64_t b = 0;
    for (; b < n && !status; b++) {
        if (b == 1 && scratch) {  /* the unbatched outputs are written: the later samples' go to scratch */
            size_t used = 0;
            for (int a = 0; a < NNX_ARGS; a++)
                if (nnx_arg_kind[a] == 2 && nnx_output_batch_axes[nnx_arg_index[a]] < 0) {
                    args[a] = scratch + used;
                    used += (size_t)nnx_output_sizes[nnx_arg_index[a]];
                }
        }
        if (b > 0)
            for (int a = 0; a < NNX_ARGS; a++)
                if (step[a]) args[a] = (float *)args[a] + step[a];
        status = NNX_ENTRY(args, model->workspace);
    }
    pthread_mutex_unlock(&nnx_lock);
    free(scratch);
    if (status == NNX_STATUS_SCRATCH) {  /* the step computed nothing: not a result to hand back */
        if (n == 1) return nnx_fail(NNX_ERR(MEMORY), "out of memory for a step's scratch");
        return nnx_fail(NNX_ERR(MEMORY), "out of memory for a step's scratch on sample %lld of %lld",
                        (long long)(b - 1), (long long)n);
    }
    if (status) {
        if (n == 1) return nnx_fail(NNX_ERR(RUN), "the model's code failed with status %d", status);
        return nnx_fail(NNX_ERR(RUN), "the model's code failed with status %d on sample %lld of %lld", status,
                        (long long)(b - 1), (long long)n);
    }
    return 0;
}

NNX_PUBLIC int NNX_API(run)(NNX_STRUCT_T *model, const float *const *inputs, float *const *outputs) {
    return NNX_API(run_batch)(model, 1, inputs, outputs);
}

NNX_PUBLIC void NNX_API(close)(NNX_STRUCT_T *model) { nnx_release(model); }
