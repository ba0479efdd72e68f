/* Page faults of an exported model's first run and of its second (nncc export), built by
 * tests/test_export_open.py with -DPFX=NAME and -include NAME.h: the buffers are touched
 * before the open, so a fault in a run is the library's own.
 *
 *   first_run_faults WEIGHTS    prints "FIRST SECOND" (faults of each run) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define API(n) CAT(PFX, n)

static long faults(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt + r.ru_majflt;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const float **inputs = calloc(API(input_count)(), sizeof *inputs);
    float **outputs = calloc(API(output_count)(), sizeof *outputs);
    for (int i = 0; i < API(input_count)(); i++) {
        float *buffer = malloc(API(input_size)(i) * sizeof(float));
        memset(buffer, 0, API(input_size)(i) * sizeof(float));
        inputs[i] = buffer;
    }
    for (int j = 0; j < API(output_count)(); j++) {
        outputs[j] = malloc(API(output_size)(j) * sizeof(float));
        memset(outputs[j], 0, API(output_size)(j) * sizeof(float));
    }
    API(model) *model;
    if (API(open)(argv[1], 1, &model) != 0) {
        fprintf(stderr, "open: %s\n", API(last_error)());
        return 3;
    }
    long counts[3];
    counts[0] = faults();
    for (int k = 1; k < 3; k++) {
        if (API(run)(model, inputs, outputs) != 0) {
            fprintf(stderr, "run: %s\n", API(last_error)());
            return 3;
        }
        counts[k] = faults();
    }
    printf("%ld %ld\n", counts[1] - counts[0], counts[2] - counts[1]);
    API(close)(model);
    return 0;
}
