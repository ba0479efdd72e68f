"""An exported C library against onnxruntime from a cold process: time to the first answer.

    python benchmarks/bench_export.py                       # MobileNetV2, real weights
    python benchmarks/bench_export.py --model MODEL.onnx [--runs 5] [--dim N=1 ...]
    python benchmarks/bench_export.py --model MODEL.onnx --sizes-only    # the libraries' sizes, no timing

Exports MODEL with `nncc export` (through a fresh cache folder), builds a C program over
its API (the README's example: zeros in, the first values of each output out) against the
static library, and times, as the median of --runs fresh processes each, the four taking
turns in a rotating order:
- the C program, from process start to its first answer (open: map and check the
  weights; one run; exit), with one thread and with one per core;
- `python -c` importing onnxruntime and numpy, making a session and running once on
  zeros, with one intra-op thread and at its defaults (one per core);
each C form compared with onnxruntime's like it.
It also splits the C program's time into the open, the first run and a second run (in one
thread: process CPU time and page faults; with one thread per core: wall and CPU time;
medians of --runs processes), and times the open's
weights check alone: the C BLAKE3 over the weights file's data, in
its default build (eight chunks at once with AVX2 where the CPU has it), its portable
one, and on one thread per core (nn_blake3_threaded, as an open with that many threads
hashes), best of 9 in one process, as wall and CPU time (the CPU time is the steadier figure
on a shared machine). It also reports the library sizes: libNAME.so and libNAME.a without the weights, the
weights file, and libNAME.so with --embed-weights. The model file is in the page cache
for both (each is run once before timing). Without --model the model is
benchmarks/real_models.py's mobilenetv2(), written once into build/real-models/. A script,
not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(cmd: list[str], env=None) -> tuple[float, float]:
    """(wall, CPU) seconds of one process: the CPU time, its threads' user and system time
    together, is the steadier figure on a shared machine."""
    start = time.perf_counter()
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, cmd)
    return seconds, usage.ru_utime + usage.ru_stime


def alternating(runs: int, commands: dict) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of ``runs`` processes of each command (name -> (argv,
    env)), run in turn, each round starting one further along, so drift on a shared
    machine falls on all of them alike."""
    names = list(commands)
    for argv, env in commands.values():
        timed(argv, env)  # the files into the page cache
    times = {name: [] for name in names}
    for round_ in range(runs):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            times[name].append(timed(*commands[name]))
    return {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for name, t in times.items()}


HASH_TIMER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "blake3.h"

static double now(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    FILE *f = fopen(argv[1], "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0) return 2;
    long size = ftell(f) - 128;  /* the data after the header */
    unsigned char *data = malloc((size_t)size);
    if (!data || fseek(f, 128, SEEK_SET) != 0 || fread(data, 1, (size_t)size, f) != (size_t)size) return 2;
    double wall = 1e9, cpu = 1e9;
    uint8_t out[32];
    for (int i = 0; i < 9; i++) {
        double w = now(CLOCK_MONOTONIC), c = now(CLOCK_PROCESS_CPUTIME_ID);
#ifdef THREADS
        nn_blake3_threaded(data, (size_t)size, THREADS, out);
#else
        nn_blake3(data, (size_t)size, out);
#endif
        c = now(CLOCK_PROCESS_CPUTIME_ID) - c;
        w = now(CLOCK_MONOTONIC) - w;
        wall = w < wall ? w : wall;
        cpu = c < cpu ? c : cpu;
    }
    printf("%u %ld %.6f %.6f\n", (unsigned)nn_blake3_lanes(), size, wall, cpu);
    return out[0] == 0 && out[1] == 0 && out[2] == 0 && out[3] == 0;  /* keeps the hash */
}
"""


STAGES = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/resource.h>

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define API(n) CAT(PFX, n)

static double clock_seconds(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu(void) { return clock_seconds(CLOCK_PROCESS_CPUTIME_ID); }

static long faults(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt + r.ru_majflt;
}

/* One line: CPU seconds and page faults of the open, the first run and the second, then
 * the wall seconds of the three. */
int main(int argc, char **argv)
{
    double t[4], w[4];
    long f[4];
    API(model) *model;
    const float **inputs = calloc(API(input_count)(), sizeof *inputs);
    float **outputs = calloc(API(output_count)(), sizeof *outputs);
    for (int i = 0; i < API(input_count)(); i++) inputs[i] = calloc(API(input_size)(i), sizeof(float));
    for (int j = 0; j < API(output_count)(); j++) outputs[j] = calloc(API(output_size)(j), sizeof(float));
    t[0] = cpu(), f[0] = faults(), w[0] = clock_seconds(CLOCK_MONOTONIC);
    if (argc != 3 || API(open)(argv[1], atoi(argv[2]), &model) != 0) return 2;
    t[1] = cpu(), f[1] = faults(), w[1] = clock_seconds(CLOCK_MONOTONIC);
    for (int k = 2; k < 4; k++) {
        if (API(run)(model, inputs, outputs) != 0) return 2;
        t[k] = cpu(), f[k] = faults(), w[k] = clock_seconds(CLOCK_MONOTONIC);
    }
    printf("%.6f %ld %.6f %ld %.6f %ld %.6f %.6f %.6f\n", t[1] - t[0], f[1] - f[0], t[2] - t[1], f[2] - f[1],
           t[3] - t[2], f[3] - f[2], w[1] - w[0], w[2] - w[1], w[3] - w[2]);
    return 0;
}
"""


def stages(work: pathlib.Path, name: str, runs: int, cc: str) -> str:
    """The first answer's parts, medians of ``runs`` processes: the open (map, hash,
    workspace), the first run and a second one (the steady state). In one thread, as process
    CPU time (steadier than wall time on a shared machine) and page faults; with one thread
    per core (the open hashes on all of them), as wall and CPU time."""
    source = work / "stages.c"
    source.write_text(STAGES)
    exe = work / "stages"
    subprocess.run([cc, "-O2", f"-DPFX={name}", "-include", str(work / "lib" / f"{name}.h"), str(source),
                    str(work / "lib" / f"lib{name}.a"), "-lm", "-lpthread", "-o", str(exe)], check=True)
    lines = []
    for threads in ("1", "0"):
        cmd = [str(exe), str(work / "lib" / f"{name}.weights"), threads]
        rows = [[float(v) for v in subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()]
                for _ in range(runs)]
        open_s, open_f, first_s, first_f, second_s, second_f, open_w, first_w, second_w = (
            statistics.median(c) for c in zip(*rows))
        if threads == "1":
            lines.append(f"the parts, 1 thread, process CPU time (median of {runs}): open {open_s * 1000:.1f} ms "
                         f"({open_f:.0f} page faults), first run {first_s * 1000:.1f} ms ({first_f:.0f}), second "
                         f"run {second_s * 1000:.1f} ms ({second_f:.0f})")
        else:
            lines.append(f"the parts, 1 thread per core, wall / CPU (median of {runs}): open {open_w * 1000:.1f} / "
                         f"{open_s * 1000:.1f} ms, first run {first_w * 1000:.1f} / {first_s * 1000:.1f} ms, second "
                         f"run {second_w * 1000:.1f} / {second_s * 1000:.1f} ms")
    return "\n".join(lines)


def hash_times(weights: pathlib.Path, work: pathlib.Path, cc: str) -> list[str]:
    """One line per build of the C BLAKE3: its time over the weights' data, on one thread, and
    on one per core as an open with as many hashes."""
    source = work / "hash_timer.c"
    source.write_text(HASH_TIMER)
    export = ROOT / "nncc" / "export"
    lines = []
    cores = os.cpu_count() or 1
    threaded = [f"-DTHREADS={cores}", str(export / "blake3_threads.c"), "-lpthread"]
    for label, flags in (("default", []), ("portable", ["-DNN_BLAKE3_PORTABLE"]), (f"{cores} threads", threaded)):
        exe = work / f"hash_{label.replace(' ', '_')}"
        subprocess.run([cc, "-O3", f"-I{export}", str(source), str(export / "blake3.c"), *flags, "-o", str(exe)],
                       check=True)
        lanes, size, wall_s, cpu_s = subprocess.run([str(exe), str(weights)], capture_output=True, text=True,
                                                    check=True).stdout.split()
        mb = int(size) / 1e6
        lanes = f"{lanes} chunks at once" if lanes != "1" else "1 chunk at a time"
        lines.append(f"  {label:8} ({lanes}): {float(wall_s) * 1000:6.1f} ms wall, "
                     f"{float(cpu_s) * 1000:6.1f} ms CPU ({mb / float(cpu_s):.0f} MB/s)")
    return lines


def sizes(work: pathlib.Path, name: str) -> str:
    """The exported files' sizes, and the shared library's code and read-only data apart
    (binutils' size, when installed)."""
    size = {f: (work / "lib" / f).stat().st_size for f in (f"lib{name}.so", f"lib{name}.a", f"{name}.weights")}
    embedded = (work / "embedded" / f"lib{name}.so").stat().st_size
    text = (f"sizes: lib{name}.so {size[f'lib{name}.so'] / 1024:.0f} KiB, lib{name}.a "
            f"{size[f'lib{name}.a'] / 1024:.0f} KiB (without weights); {name}.weights "
            f"{size[f'{name}.weights'] / 1024:.0f} KiB; lib{name}.so with --embed-weights {embedded / 1024:.0f} KiB")
    if shutil.which("size"):
        rows = subprocess.run(["size", "-A", str(work / "lib" / f"lib{name}.so")], capture_output=True, text=True,
                              check=True).stdout.splitlines()
        sections = {r.split()[0]: int(r.split()[1]) for r in rows if r.startswith(".") and len(r.split()) >= 2}
        text += "\n  lib{}.so: .text {:.0f} KiB, .rodata {:.0f} KiB, .data {:.0f} KiB".format(
            name, *(sections.get(s, 0) / 1024 for s in (".text", ".rodata", ".data")))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="ONNX model (default: real_models.py's mobilenetv2)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dim", action="append", default=[], help="NAME=SIZE, as nncc export takes it")
    parser.add_argument("--sizes-only", action="store_true", help="export and report the sizes, time nothing")
    args = parser.parse_args()
    if args.model is None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from real_models import write_one

        args.model = write_one(str(ROOT / "build" / "real-models"), "mobilenetv2")
    from nncc.export.writer import default_name, example_program
    from nncc.native.toolchain import find_toolchain

    name = default_name(args.model)
    work = pathlib.Path(tempfile.mkdtemp(prefix="nncc-bench-export-"))
    try:
        dims = [a for d in args.dim for a in ("--dim", d)]
        base = [sys.executable, "-m", "nncc", "export", args.model, "--cache-dir", str(work / "cache"), *dims]
        subprocess.run(base + ["-o", str(work / "lib")], check=True)
        subprocess.run(base + ["-o", str(work / "embedded"), "--embed-weights"], check=True)
        if args.sizes_only:
            print(f"model {args.model} ({name}):")
            print(sizes(work, name))
            return
        program = work / "example.c"
        program.write_text(example_program(name, embedded=False))
        exe = work / "example"
        subprocess.run([find_toolchain().path, "-O2", str(program), "-o", str(exe), f"-I{work / 'lib'}",
                        str(work / "lib" / f"lib{name}.a"), "-lm", "-lpthread"], check=True)
        import onnx

        graph = onnx.load(args.model, load_external_data=False).graph
        fixed = dict(d.split("=") for d in args.dim)
        feeds = {i.name: [int(fixed.get(d.dim_param, d.dim_value or 1)) for d in i.type.tensor_type.shape.dim]
                 for i in graph.input if i.name not in {t.name for t in graph.initializer}}
        zeros = f"s.run(None, {{k: np.zeros(v, np.float32) for k, v in {feeds!r}.items()}})\n"
        session = f"s = ort.InferenceSession({args.model!r}, o, providers=['CPUExecutionProvider'])\n"
        ort_one = ("import numpy as np, onnxruntime as ort\n"
                   "o = ort.SessionOptions(); o.intra_op_num_threads = 1\n" + session + zeros)
        ort_cores = "import numpy as np, onnxruntime as ort\no = ort.SessionOptions()\n" + session + zeros
        weights = str(work / "lib" / f"{name}.weights")
        exe_one = work / "example_one_thread"  # the C program opens with 0 threads (one per core)
        program.write_text(example_program(name, embedded=False).replace(", 0, &model)", ", 1, &model)"))
        subprocess.run([find_toolchain().path, "-O2", str(program), "-o", str(exe_one), f"-I{work / 'lib'}",
                        str(work / "lib" / f"lib{name}.a"), "-lm", "-lpthread"], check=True)
        python_env = dict(os.environ)
        python_env.pop("PYTHONDONTWRITEBYTECODE", None)  # byte code written and reused, as installed
        commands = {"c_one": ([str(exe_one), weights], dict(os.environ)),
                    "c_cores": ([str(exe), weights], dict(os.environ)),
                    "ort_one": ([sys.executable, "-c", ort_one], python_env),
                    "ort_cores": ([sys.executable, "-c", ort_cores], python_env)}
        took = alternating(args.runs, commands)
        print(f"model {args.model} ({name}), median of {args.runs} processes each, the four in turn "
              "(a rotating order), first answer (wall, CPU):")
        for key, label in (("c_one", "C program (static library), 1 thread"),
                           ("c_cores", "C program (static library), 1 per core"),
                           ("ort_one", "python -c onnxruntime, 1 intra-op thread"),
                           ("ort_cores", "python -c onnxruntime, at its defaults")):
            print(f"  {label + ':':43}{took[key][0] * 1000:8.1f} ms {took[key][1] * 1000:8.1f} ms")
        print(f"  C / onnxruntime, like for like: 1 thread {took['c_one'][0] / took['ort_one'][0]:.3f} "
              f"(CPU {took['c_one'][1] / took['ort_one'][1]:.3f}), 1 per core against its defaults "
              f"{took['c_cores'][0] / took['ort_cores'][0]:.3f} (CPU {took['c_cores'][1] / took['ort_cores'][1]:.3f})")
        print(stages(work, name, args.runs, find_toolchain().path))
        print(f"the open's BLAKE3 over {name}.weights' data, best of 9:")
        print("\n".join(hash_times(work / "lib" / f"{name}.weights", work, find_toolchain().path)))
        print(sizes(work, name))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
