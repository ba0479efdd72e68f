/* A C program over an exported model's API (nncc export), built by tests/export_build.py
 * against each form of the library: -DPFX=NAME and -include NAME.h name the model.
 *
 *   driver run WEIGHTS IN OUT    inputs from IN (raw float32, one input after another),
 *                                outputs to OUT alike; WEIGHTS "-": the embedded weights
 *   driver open WEIGHTS...       open each file; print "CODE MESSAGE" per file
 *
 * Exit status 0 unless the program itself fails (a file it cannot read or write). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define API(n) CAT(PFX, n)

static const char *weights_arg(const char *arg) { return strcmp(arg, "-") == 0 ? NULL : arg; }

static int run(const char *weights, const char *in_path, const char *out_path) {
    API(model) *model;
    if (API(open)(weights_arg(weights), 2, &model) != 0) {
        fprintf(stderr, "open: %s\n", API(last_error)());
        return 3;
    }
    int n_in = API(input_count)(), n_out = API(output_count)();
    const float **inputs = calloc(n_in + 1, sizeof *inputs);
    float **outputs = calloc(n_out + 1, sizeof *outputs);
    FILE *in = fopen(in_path, "rb");
    if (!in || !inputs || !outputs) return 4;
    for (int i = 0; i < n_in; i++) {
        float *buffer = malloc(API(input_size)(i) * sizeof(float));
        if (!buffer || fread(buffer, sizeof(float), API(input_size)(i), in) != (size_t)API(input_size)(i)) return 4;
        inputs[i] = buffer;
    }
    fclose(in);
    for (int j = 0; j < n_out; j++) outputs[j] = malloc(API(output_size)(j) * sizeof(float));
    if (API(run)(model, inputs, outputs) != 0) {
        fprintf(stderr, "run: %s\n", API(last_error)());
        return 3;
    }
    FILE *out = fopen(out_path, "wb");
    if (!out) return 4;
    for (int j = 0; j < n_out; j++) fwrite(outputs[j], sizeof(float), API(output_size)(j), out);
    fclose(out);
    for (int i = 0; i < n_in; i++) free((void *)inputs[i]);
    for (int j = 0; j < n_out; j++) free(outputs[j]);
    free(inputs);
    free(outputs);
    API(close)(model);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "run") == 0) return run(argv[2], argv[3], argv[4]);
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
    fprintf(stderr, "usage: driver run WEIGHTS IN OUT | driver open WEIGHTS...\n");
    return 2;
}
