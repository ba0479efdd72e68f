"""The C text of an exported model: its header (NAME.h) and the API's translation unit
(the model's tables, then nncc/export/api.c), linked with the partition's objects.

Every name the API exports starts with the library's prefix, so two exported models link
into one program side by side; the error codes and the element type are the prefix in
capitals.
"""

from __future__ import annotations

import math
import os

from nncc._version import __version__
from nncc.export import cpu
from nncc.export.standalone import Standalone
from nncc.export.weights import FORMAT

ERRORS = (  # (name, value, meaning): the header's enumeration, in this order
    ("OK", 0, "success"),
    ("ERR_ARGUMENT", 1, "a NULL pointer or a bad argument"),
    ("ERR_IO", 2, "the weights file cannot be opened, read or mapped"),
    ("ERR_FORMAT", 3, "not an nncc weights file, or another format version"),
    ("ERR_DAMAGED", 4, "the weights file is truncated, damaged or altered (not this library's BLAKE3)"),
    ("ERR_MISMATCH", 5, "the weights file belongs to another model or build"),
    ("ERR_CPU", 6, "this CPU lacks a feature the library's code needs"),
    ("ERR_MEMORY", 7, "out of memory"),
    ("ERR_RUN", 8, "the model's code reported a failure"),
)
FLOAT32 = 1  # ONNX's code for float32


def header(prefix: str, model: str, spec: Standalone, embedded: bool) -> str:
    upper = prefix.upper()
    tensors = "\n".join(f" *   {kind} {i}: {_in_comment(t.name)} float32 [{shape_text(t, spec.batch)}]"
                        for kind, group in (("input", spec.inputs), ("output", spec.outputs))
                        for i, t in enumerate(group))
    batch = (f" *\n * {_in_comment(spec.batch)} is the batch, chosen at run time: {prefix}_run_batch runs n samples, "
             f"n on each batched\n * tensor's axis {prefix}_input_batch_axis(i) (or _output_), which _shape gives "
             "as -1; _size counts\n * one sample's elements.\n" if spec.batch is not None else
             f" *\n * Every size was fixed at export: {prefix}_run_batch takes n = 1 only.\n")
    errors = "\n".join(f"    {upper}_{name} = {value},  /* {meaning} */" for name, value, meaning in ERRORS)
    weights = ("NULL: the weights are inside the library (--embed-weights)" if embedded else
               f"the path of {prefix}.weights, which is mapped read-only until close")
    return f"""/* {prefix}: {_in_comment(os.path.basename(model))} compiled ahead of time by nncc {__version__} (`nncc export`).
 *
{tensors}
{batch} *
 * Every tensor is dense, row-major float32. Functions return {upper}_OK (0) or an error code;
 * {prefix}_last_error() then says why, in this thread. Nothing aborts and nothing prints.
 *
 * Threads: any thread may call any function. Runs of this library take one lock (they share
 * one thread pool), so two runs never overlap, whichever models they use; open and close
 * may run at any time but close must not overlap a run of the same model.
 */
#ifndef {upper}_H
#define {upper}_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

typedef struct {prefix}_model {prefix}_model;

enum {{
{errors}
}};

#define {upper}_FLOAT32 {FLOAT32}  /* the element type of every tensor (ONNX's code) */
#define {upper}_INPUTS {len(spec.inputs)}
#define {upper}_OUTPUTS {len(spec.outputs)}

/* Open the model: weights is {weights}.
 * threads: the size of the library's thread pool (0: one per core); the first open that asks
 * for more than one thread makes the pool, later opens share it. */
int {prefix}_open(const char *weights, int threads, {prefix}_model **model);
/* Run one sample: inputs[i] holds input i's {prefix}_input_size(i) floats, outputs[j] receives
 * output j's {prefix}_output_size(j) floats. Buffers are the caller's; outputs must not overlap
 * inputs. The same as {prefix}_run_batch with n = 1. */
int {prefix}_run({prefix}_model *model, const float *const *inputs, float *const *outputs);
/* Run n samples (n >= 1): a batched tensor's buffer holds n times its _size floats, sample after
 * sample; an unbatched input is read whole by every sample, an unbatched output written once. */
int {prefix}_run_batch({prefix}_model *model, int64_t n, const float *const *inputs, float *const *outputs);
void {prefix}_close({prefix}_model *model);
/* Why the last call that failed in this thread failed (empty if none did). */
const char *{prefix}_last_error(void);

int {prefix}_input_count(void);
int {prefix}_output_count(void);
const char *{prefix}_input_name(int i);
const char *{prefix}_output_name(int i);
int {prefix}_input_type(int i);  /* {upper}_FLOAT32 */
int {prefix}_output_type(int i);
int {prefix}_input_rank(int i);
int {prefix}_output_rank(int i);
const int64_t *{prefix}_input_shape(int i);  /* rank dimensions; -1: the batch's */
const int64_t *{prefix}_output_shape(int i);
int64_t {prefix}_input_size(int i);  /* elements (of one sample) */
int64_t {prefix}_output_size(int i);
int {prefix}_input_batch_axis(int i);  /* the axis that holds the batch; -1: the same for every sample */
int {prefix}_output_batch_axis(int i);
const char *{prefix}_batch_name(void);  /* the batch's dimension name; NULL: every size fixed */

#ifdef __cplusplus
}}
#endif

#endif
"""


def shape_text(tensor, batch: str | None) -> str:
    """A tensor's dimensions for the header and the README, the batch's by its name."""
    return ", ".join(batch if a == tensor.batch_axis else str(d) for a, d in enumerate(tensor.shape))


def exported_names(prefix: str) -> list[str]:
    """Every symbol the library exports."""
    names = ["open", "run", "run_batch", "close", "last_error", "batch_name", "input_count", "output_count"]
    names += [f"{kind}_{what}" for kind in ("input", "output")
              for what in ("name", "type", "rank", "shape", "size", "batch_axis")]
    return [f"{prefix}_{name}" for name in names]


WEIGHTS_MARK = "@WEIGHTS@"  # the embedded weights file's path, which the linker's caller writes in


def unit(prefix: str, spec: Standalone, offsets: list[int], data_size: int, token: bytes, digest: bytes,
         features: int, embedded: bool) -> str:
    """The API's translation unit: the model's tables, then api.c. ``digest``: the data's
    BLAKE3, which open checks the file against; ``embedded``: the weights are assembled
    into it from the file WEIGHTS_MARK stands for."""
    upper = prefix.upper()

    def strings(values):
        return "{" + ", ".join(_c_string(v) for v in values) + "}"

    def rows(tensors):  # the shapes, -1 on a batch axis
        width = max([len(t.shape) for t in tensors] + [1])
        return "{" + ", ".join("{" + ", ".join(str(-1 if a == t.batch_axis else d) for a, d in enumerate(
            t.shape + (0,) * (width - len(t.shape)))) + "}" for t in tensors) + "}", width

    def axes(tensors):
        return "{" + ", ".join(str(-1 if t.batch_axis is None else t.batch_axis) for t in tensors) + "}"

    batched = [math.prod(t.shape) for t in spec.inputs + spec.outputs if t.batch_axis is not None]
    scratch = sum(math.prod(t.shape) for t in spec.outputs if t.batch_axis is None) if batched else 0

    in_shapes, in_width = rows(spec.inputs)
    out_shapes, out_width = rows(spec.outputs)
    lines = [
        "#define _POSIX_C_SOURCE 200809L",
        "#define _DEFAULT_SOURCE",  # anonymous mappings and madvise's advice
        "#include <errno.h>", "#include <fcntl.h>", "#include <pthread.h>", "#include <stdarg.h>",
        "#include <stdint.h>", "#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>",
        "#include <sys/mman.h>", "#include <sys/stat.h>", "#include <unistd.h>",
        f"#define NNX_API(name) {prefix}_##name",
        f"#define NNX_ERR(name) {upper}_ERR_##name",
        f"#define NNX_STRUCT {prefix}_model",
        f"#define NNX_STRUCT_T struct {prefix}_model",
        f"#define NNX_PREFIXED_FLOAT32 {FLOAT32}",
        f"enum {{ {', '.join(f'{upper}_{name} = {value}' for name, value, _ in ERRORS)} }};",
        f"#define NNX_INPUTS {len(spec.inputs)}",
        f"#define NNX_OUTPUTS {len(spec.outputs)}",
        f"#define NNX_ARGS {len(spec.bindings)}",
        f"#define NNX_FORMAT {FORMAT}u",
        f"#define NNX_FEATURES UINT64_C({features})",
        f"#define NNX_FEATURE_COUNT {len(cpu.FEATURES)}",
        f"#define NNX_DATA_BYTES UINT64_C({data_size})",
        f"#define NNX_WORKSPACE_BYTES {max(64, (spec.workspace + 63) // 64 * 64)}",
        f"#define NNX_EMBEDDED {int(embedded)}",
        f"#define NNX_ENTRY {spec.symbol}",
        f"int {spec.symbol}(void **args, char *ws);",
        "int nncc_set_threads(int want);",
        f"static const unsigned char nnx_token[16] = {{{', '.join(str(b) for b in token)}}};",
        f"static const unsigned char nnx_digest[32] = {{{', '.join(str(b) for b in digest)}}};",
        f"static const char *const nnx_feature_table[] = {strings(name for name, _ in cpu.FEATURES)};",
        f"static const char *const nnx_input_names[] = {strings(t.name for t in spec.inputs)};",
        f"static const char *const nnx_output_names[] = {strings(t.name for t in spec.outputs)};",
        f"static const int nnx_input_ranks[] = {{{', '.join(str(len(t.shape)) for t in spec.inputs)}}};",
        f"static const int nnx_output_ranks[] = {{{', '.join(str(len(t.shape)) for t in spec.outputs)}}};",
        f"static const int64_t nnx_input_shapes[][{in_width}] = {in_shapes};",
        f"static const int64_t nnx_output_shapes[][{out_width}] = {out_shapes};",
        f"static const int64_t nnx_input_sizes[] = {{{', '.join(str(math.prod(t.shape)) for t in spec.inputs)}}};",
        f"static const int64_t nnx_output_sizes[] = {{{', '.join(str(math.prod(t.shape)) for t in spec.outputs)}}};",
        f"static const int nnx_input_batch_axes[] = {axes(spec.inputs)};",
        f"static const int nnx_output_batch_axes[] = {axes(spec.outputs)};",
        f"static const char *const nnx_batch_name = {_c_string(spec.batch) if spec.batch is not None else '0'};",
        f"#define NNX_BATCHED {int(bool(batched))}",
        f"#define NNX_LARGEST_SAMPLE INT64_C({max(batched + [1])})  /* elements: bounds the batch size */",
        f"#define NNX_SCRATCH_FLOATS {scratch}  /* the unbatched outputs of the samples after the first */",
        f"static const signed char nnx_arg_kind[] = {{{', '.join(str(kind) for kind, _ in spec.bindings)}}};",
        f"static const int nnx_arg_index[] = {{{', '.join(str(index) for _, index in spec.bindings)}}};",
        f"static const uint64_t nnx_constant_offsets[] = {{{', '.join(map(str, offsets)) or '0'}}};",
    ]
    if embedded:
        lines += [
            "__asm__(\".section .rodata.nnx_weights,\\\"a\\\"\\n.balign 64\\nnnx_embedded_weights:\\n"
            f".incbin \\\"{WEIGHTS_MARK}\\\"\\n.previous\\n\");",
            "extern const unsigned char nnx_embedded_weights[] __attribute__((visibility(\"hidden\")));",
        ]
    return "\n".join(lines) + "\n" + _blake3_header() + cpu.c_function() + "\n" + _text("api.c")


def hash_unit() -> str:
    """blake3.c and blake3_threads.c as a translation unit of their own, their functions
    hidden from the library's users (the link makes them local too); _GNU_SOURCE before
    any header, for the CPU affinity of blake3_threads.c's helpers."""
    return "#define _GNU_SOURCE\n" + _blake3_header() + "".join(line for name in ("blake3.c", "blake3_threads.c")
                                      for line in _text(name).splitlines(keepends=True)
                                      if line.strip() != '#include "blake3.h"')


def _blake3_header() -> str:
    """blake3.h with hidden functions: the compiler sees the text, not the file."""
    return '#define NN_BLAKE3_API __attribute__((visibility("hidden")))\n' + _text("blake3.h") + "\n"


def _text(name: str) -> str:
    with open(os.path.join(os.path.dirname(__file__), name)) as f:
        return f.read()


def _in_comment(text: str) -> str:
    """``text`` (a model's name for something: anything may be in it) inside a C comment."""
    return "".join(c if c.isprintable() else "?" for c in text).replace("*/", "*?/")


def _c_string(text: str) -> str:
    """A C string literal of ``text`` (names come from the model: anything may be in them)."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= byte < 127 and ch != "?":
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'
