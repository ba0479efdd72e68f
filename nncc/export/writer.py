"""`nncc export`'s flow: compile through the cache as `nncc compile` does, check that the
plan stands alone, then write the library's files into a folder, each only when its bytes
change (so `make` redoes nothing downstream of an unchanged export).

    NAME.h           the C API
    libNAME.so       shared library: the native code, nncc's C runtime and the API
    libNAME.a        the same as a static archive (one object)
    NAME.weights     the packed constants (not with --embed-weights: they are in the library)
    NAME.pc          pkg-config file, relative to its own folder
    README           how to build against it, with a complete example program
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from nncc._version import __version__
from nncc.errors import FileAccessError, InputError
from nncc.export import c_api, cpu
from nncc.export.batch import find_batch
from nncc.export.link import link
from nncc.export.objects import Keeping, cached_objects, open_store
from nncc.export.standalone import NotExportable, standalone
from nncc.export.weights import data_bytes, digest, layout, token, weights_file
from nncc.native.toolchain import find_toolchain
from nncc.util.buildfiles import write_if_changed

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
RESERVED = ("nn", "nnx", "nncc")  # the prefixes of the runtime's and the API's own names


@dataclass
class Exported:
    name: str
    files: dict[str, int] = field(default_factory=dict)  # path -> bytes
    written: list[str] = field(default_factory=list)  # the paths whose content changed
    weights_bytes: int = 0
    outcome: object = None  # the cache outcome of the compile


def default_name(model: str) -> str:
    """The prefix a model's file name gives: lower case, other characters as '_'."""
    stem = os.path.splitext(os.path.basename(model))[0].lower()
    name = re.sub(r"[^a-z0-9_]", "_", stem) or "model"
    return ("m_" + name if name[0].isdigit() or name in RESERVED else name)[:64]


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InputError(f"--name {name!r} is not a C identifier (letters, digits and '_', "
                         "not starting with a digit, at most 64)")
    if name.lower() in RESERVED:
        raise InputError(f"--name {name!r} is taken by nncc's own C names; choose another")
    return name


def export(model: str, folder: str, name: str, prepare, native, embed_weights: bool = False,
           recompile=None, trust_shared: bool = False) -> Exported:
    """Export ``model`` into ``folder`` as library ``name``. ``prepare(objects, dims)``:
    the compile through the cache with the symbolic dimensions ``dims`` fixed besides the
    command's, ``(Prepared, CacheOutcome)``; one that compiles in this process (no cache)
    keeps its kernel objects in ``objects``; ``native``: how the command's settings build
    native code (nncc.backends.native_options); ``recompile(objects, dims)``: the same
    compile again in this process, keeping the objects it builds or finds in ``objects``
    (for when the cache lacks one); ``trust_shared``: the cache folder may be shared
    (--trust-shared-cache). A batch dimension left open (nncc.export.batch) is compiled at 1
    and taken at run time."""
    if find_toolchain(cc=native.cc) is None:  # the export is native code, built and linked by it
        raise NotExportable("no C compiler to build the library with (cc, gcc or clang on PATH, or $CC)")
    compiled = Keeping()
    prepared, outcome = prepare(compiled, {})
    batch = find_batch(prepared.plan)
    one = {batch.dim: 1} if batch is not None else {}
    if batch is not None:  # the general plan said which axes scale with the batch: the code is one sample's
        prepared, outcome = prepare(compiled, one)
    spec = standalone(prepared.plan, batch)
    objects = compiled.kept if all(key in compiled.kept for key in spec.objects) else None
    objects = objects or cached_objects(outcome.directory, spec.objects, trust_shared)
    if objects is None:
        store, cache = open_store(outcome.directory, trust_shared)
        keeping = Keeping(store)
        try:
            spec = standalone(recompile(keeping, one), batch)
        finally:
            if cache is not None:
                cache.close()
        objects = keeping.kept
        if any(key not in objects for key in spec.objects):
            raise NotExportable("the compiled native code's objects could not be found or rebuilt")
    target = (prepared.plan.options.get("native") or {}).get("target", "native")
    toolchain = find_toolchain(target, spec.sanitized, native.cc_timeout, native.cc, native.cc_jobs)
    if toolchain is None:
        raise NotExportable("no C compiler to link the library with")
    offsets, size = layout(spec.constants)
    data = data_bytes(spec.constants)
    features = cpu.mask(spec.features)
    tensors = [(t.name, t.shape, t.batch_axis) for t in spec.inputs + spec.outputs]
    description = repr((spec.symbol, spec.bindings, tensors, spec.workspace, features, spec.objects, offsets,
                        spec.sanitized))
    model_token = token(description, data)
    weights = weights_file(model_token, features, data)
    unit = c_api.unit(name, spec, offsets, size, model_token, digest(data), features, embed_weights)
    shared, archive = link(toolchain, [objects[k] for k in dict.fromkeys(spec.objects)], unit, c_api.hash_unit(),
                           name, c_api.exported_names(name), weights if embed_weights else None)
    files = {
        f"{name}.h": c_api.header(name, model, spec, embed_weights).encode(),
        f"lib{name}.so": shared,
        f"lib{name}.a": archive,
        f"{name}.pc": pkg_config(name, model, spec.sanitized).encode(),
        "README": readme(name, model, spec, embed_weights).encode(),
    }
    if not embed_weights:
        files[f"{name}.weights"] = weights
    result = Exported(name, weights_bytes=len(weights), outcome=outcome)
    try:
        os.makedirs(folder, exist_ok=True)
        for file, content in files.items():
            path = os.path.join(folder, file)
            result.files[path] = len(content)
            if write_if_changed(path, content):
                result.written.append(path)
    except OSError as exc:
        raise FileAccessError(f"cannot write the export into {folder}: {exc.strerror or exc}") from None
    return result


def check_folder(folder: str) -> None:
    """Before any work: ``folder`` is a writable folder, or can be made in one."""
    probe = os.path.abspath(folder)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise FileAccessError(f"cannot write the export into {folder}: "
                              f"{probe} is {'not writable' if os.path.isdir(probe) else 'not a folder'}")


def pkg_config(name: str, model: str, sanitized: bool) -> str:
    sanitize = " -fsanitize=address,undefined" if sanitized else ""
    return f"""prefix=${{pcfiledir}}
libdir=${{prefix}}
includedir=${{prefix}}

Name: {name}
Description: {os.path.basename(model)} compiled ahead of time by nncc export
Version: {__version__}
Libs: -L${{libdir}} -l{name}{sanitize}
Libs.private: -lm -lpthread
Cflags: -I${{includedir}}
"""


def example_program(name: str, embedded: bool) -> str:
    """A complete C program over the API: zeros in, the first values of each output out."""
    weights = "NULL" if embedded else f'argc > 1 ? argv[1] : "{name}.weights"'
    return f"""#include <stdio.h>
#include <stdlib.h>
#include "{name}.h"

int main(int argc, char **argv) {{
    {name}_model *model;
    if ({name}_open({weights}, 0, &model) != {name.upper()}_OK) {{
        fprintf(stderr, "open: %s\\n", {name}_last_error());
        return 1;
    }}
    const float *inputs[{name.upper()}_INPUTS];
    float *outputs[{name.upper()}_OUTPUTS];
    for (int i = 0; i < {name}_input_count(); i++) inputs[i] = calloc({name}_input_size(i), sizeof(float));
    for (int j = 0; j < {name}_output_count(); j++) outputs[j] = malloc({name}_output_size(j) * sizeof(float));
    if ({name}_run(model, inputs, outputs) != {name.upper()}_OK) {{
        fprintf(stderr, "run: %s\\n", {name}_last_error());
        return 1;
    }}
    for (int j = 0; j < {name}_output_count(); j++) {{
        printf("%s:", {name}_output_name(j));
        for (int64_t k = 0; k < {name}_output_size(j) && k < 4; k++) printf(" %g", outputs[j][k]);
        printf("\\n");
    }}
    for (int i = 0; i < {name}_input_count(); i++) free((void *)inputs[i]);
    for (int j = 0; j < {name}_output_count(); j++) free(outputs[j]);
    {name}_close(model);
    return 0;
}}
"""


def readme(name: str, model: str, spec, embedded: bool) -> str:
    tensors = "\n".join(f"  {kind} {t.name}: float32 [{c_api.shape_text(t, spec.batch)}]"
                        for kind, group in (("input ", spec.inputs), ("output", spec.outputs)) for t in group)
    if spec.batch is not None:
        tensors += (f"\n\n{spec.batch} is the batch, chosen at run time: {name}_run_batch runs n samples "
                    f"({name}_run one,\nas the example does).")
    weights = ("The weights are inside the library (--embed-weights): pass NULL to open." if embedded else
               f"{name}.weights holds the weights; the library maps it at open and checks that it is this\n"
               "build's, undamaged, and that the CPU has the features the code needs.")
    sanitized = ("\nThis library was built with AddressSanitizer and UBSan: link it with "
                 "-fsanitize=address,undefined.\n" if spec.sanitized else "")
    return f"""{name}: {os.path.basename(model)} compiled ahead of time by nncc {__version__} (nncc export)

{tensors}

{name}.h is the C API (open, run, close, last_error, and the tensors' names and shapes);
lib{name}.so and lib{name}.a hold the code and link only libc, libm and pthread.
{weights}
{sanitized}
Build the example below (example.c) against the shared library:

  cc example.c -o example -I. -L. -l{name} -Wl,-rpath,'$ORIGIN'

or the static one:

  cc example.c -o example -I. lib{name}.a -lm -lpthread

or with pkg-config:

  PKG_CONFIG_PATH=. cc example.c -o example $(pkg-config --cflags --libs {name})

---- example.c ----
{example_program(name, embedded)}"""
