/* Page faults of an exported model's first run and of its second (nncc export), built by
 * tests/test_export_open.py with -DPFX=NAME and -include NAME.h: the buffers are touched
 * before the open, so a fault in a run is the library's own. Also the open's own faults, and
 * how much of the process's anonymous memory the open added in transparent huge pages (the
 * kernel's count in /proc/self/smaps_rollup; -1 where the kernel does not give it).
 *
 *   first_run_faults WEIGHTS    prints "FIRST SECOND OPEN HUGE_KIB" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static long huge_kib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

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
    long huge_before = huge_kib(), open_faults = faults();
    if (API(open)(argv[1], 1, &model) != 0) {
        fprintf(stderr, "open: %s\n", API(last_error)());
        return 3;
    }
    long counts[3];
    counts[0] = faults();
    open_faults = counts[0] - open_faults;
    long huge_after = huge_kib();
    for (int k = 1; k < 3; k++) {
        if (API(run)(model, inputs, outputs) != 0) {
            fprintf(stderr, "run: %s\n", API(last_error)());
            return 3;
        }
        counts[k] = faults();
    }
    printf("%ld %ld %ld %ld\n", counts[1] - counts[0], counts[2] - counts[1], open_faults,
           huge_before < 0 || huge_after < 0 ? -1 : huge_after - huge_before);
    API(close)(model);
    return 0;
}
