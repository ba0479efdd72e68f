/* A C program over an exported model's API (nncc export), built by tests/export_build.py
 * against each form of the library: -DPFX=NAME and -include NAME.h name the model.
 *
 *   driver run WEIGHTS IN OUT [N]  inputs from IN (raw float32, one input after another),
 *                                  outputs to OUT alike; WEIGHTS "-": the embedded weights;
 *                                  N: run_batch with N samples (a batched tensor's buffer
 *                                  holds N samples), else run
 *   driver open WEIGHTS...         open each file; print "CODE MESSAGE" per file
 *   driver batch WEIGHTS N...      run_batch with each N on buffers of one sample (for the
 *                                  sizes it refuses before reading any); print "CODE MESSAGE"
 *
 * Exit status 0 unless the program itself fails (a file it cannot read or write). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define API(n) CAT(PFX, n)

static const char *weights_arg(const char *arg) { return strcmp(arg, "-") == 0 ? NULL : arg; }

/* Elements of input (kind 0) or output (kind 1) i for a batch of n (n < 0: run, one sample). */
static int64_t elements(int kind, int i, int64_t n) {
    int64_t size = kind ? API(output_size)(i) : API(input_size)(i);
    int axis = kind ? API(output_batch_axis)(i) : API(input_batch_axis)(i);
    return axis >= 0 && n > 0 ? size * n : size;
}

/* The model opened on `threads` threads (NULL, said on stderr, when it cannot be), and
 * arrays for its input and output pointers. */
static API(model) *opened(const char *weights, int threads, const float ***inputs, float ***outputs) {
    API(model) *model;
    if (API(open)(weights_arg(weights), threads, &model) != 0) {
        fprintf(stderr, "open: %s\n", API(last_error)());
        return NULL;
    }
    *inputs = calloc(API(input_count)() + 1, sizeof **inputs);
    *outputs = calloc(API(output_count)() + 1, sizeof **outputs);
    return model;
}

/* Frees every buffer and the pointer arrays, closes the model: 0. */
static int closed(API(model) *model, const float **inputs, float **outputs) {
    for (int i = 0; i < API(input_count)(); i++) free((void *)inputs[i]);
    for (int j = 0; j < API(output_count)(); j++) free(outputs[j]);
    free(inputs);
    free(outputs);
    API(close)(model);
    return 0;
}

static int run(const char *weights, const char *in_path, const char *out_path, int64_t n) {
    const float **inputs;
    float **outputs;
    API(model) *model = opened(weights, 2, &inputs, &outputs);
    if (!model) return 3;
    int n_in = API(input_count)(), n_out = API(output_count)();
    FILE *in = fopen(in_path, "rb");
    if (!in || !inputs || !outputs) return 4;
    for (int i = 0; i < n_in; i++) {
        float *buffer = malloc(elements(0, i, n) * sizeof(float));
        if (!buffer || fread(buffer, sizeof(float), elements(0, i, n), in) != (size_t)elements(0, i, n)) return 4;
        inputs[i] = buffer;
    }
    fclose(in);
    for (int j = 0; j < n_out; j++) outputs[j] = malloc(elements(1, j, n) * sizeof(float));
    if ((n < 0 ? API(run)(model, inputs, outputs) : API(run_batch)(model, n, inputs, outputs)) != 0) {
        fprintf(stderr, "run: %s\n", API(last_error)());
        return 3;
    }
    FILE *out = fopen(out_path, "wb");
    if (!out) return 4;
    for (int j = 0; j < n_out; j++) fwrite(outputs[j], sizeof(float), elements(1, j, n), out);
    fclose(out);
    return closed(model, inputs, outputs);
}

static int refused_batches(const char *weights, int count, char **sizes) {
    const float **inputs;
    float **outputs;
    API(model) *model = opened(weights, 1, &inputs, &outputs);
    if (!model) return 3;
    int n_in = API(input_count)(), n_out = API(output_count)();
    if (!inputs || !outputs) return 4;
    for (int i = 0; i < n_in; i++) inputs[i] = calloc(API(input_size)(i), sizeof(float));
    for (int j = 0; j < n_out; j++) outputs[j] = calloc(API(output_size)(j), sizeof(float));
    for (int k = 0; k < count; k++) {
        int code = API(run_batch)(model, strtoll(sizes[k], NULL, 10), inputs, outputs);
        printf("%d %s\n", code, code ? API(last_error)() : "ok");
    }
    return closed(model, inputs, outputs);
}

int main(int argc, char **argv) {
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "run") == 0)
        return run(argv[2], argv[3], argv[4], argc == 6 ? strtoll(argv[5], NULL, 10) : -1);
    if (argc >= 3 && strcmp(argv[1], "batch") == 0) return refused_batches(argv[2], argc - 3, argv + 3);
    if (argc >= 2 && strcmp(argv[1], "open") == 0) {
        for (int i = 2; i < argc; i++) {
            API(model) *model = NULL;
            int code = API(open)(weights_arg(argv[i]), 1, &model);
            printf("%d %s\n", code, code ? API(last_error)() : "ok");
            if (code == 0) API(close)(model);
            else if (model != NULL) return 5;  /* a failed open leaves no model */
        }
        return 0;
    }
    fprintf(stderr, "usage: driver run WEIGHTS IN OUT [N] | driver open WEIGHTS... | driver batch WEIGHTS N...\n");
    return 2;
}
