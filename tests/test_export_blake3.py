"""The C BLAKE3 (nncc/export/blake3.c), which an exported library uses to check its weights
file without Python, against the ``blake3`` package nncc's cache hashes with: both its
paths, the portable one (built with NN_BLAKE3_PORTABLE) and the default build's, which
hashes eight chunks at once with AVX2 where the CPU has it.

The C file is built at test time with the system compiler into a driver program. For each
case the driver hashes the input in one call and again incrementally, in pieces of a given
size, finalizing half-way too (finalizing leaves the hasher as it was, so more input may
follow); all three must equal the package's digest. Every buffer the driver hands over is
its own exactly-sized heap block, so the sanitized build (AddressSanitizer and UBSan)
catches a read one byte past the input or a piece."""

from __future__ import annotations

import platform
import random
import shutil
import struct
import subprocess

import pytest
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from nncc.native.toolchain import SANITIZE_FLAGS, find_toolchain, host_features
from tests.conftest import ROOT
from tests.test_export_concurrent import tsan_works
from tests.test_native_sanitize import have_sanitizer_runtime

EXPORT = ROOT / "nncc" / "export"
TOOLCHAIN = find_toolchain(sanitize=False)
pytestmark = [pytest.mark.skipif(TOOLCHAIN is None, reason="no C compiler to build the C BLAKE3 with"),
              pytest.mark.slow]  # every test builds, links or runs a C library

STRICT = ("-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wcast-qual", "-Wconversion", "-Wstrict-prototypes",
          "-Werror")
# Around every block (64 bytes) and chunk (1024 bytes) edge, trees of 2, 3, 4, 8, 16, 31
# and 1024 chunks plus one, and a tree deeper than the stack of a few entries; around
# eight chunks (the AVX2 path's batch: it takes eight only while more input follows) and
# its multiples, with a partial batch after whole ones.
LENGTHS = (0, 1, 63, 64, 65, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 3073, 4096, 4097, 8191, 8192, 8193,
           9217, 16384, 16385, 24576 + 1, 31744 + 1, 65536, 65536 + 1024 * 7 + 1, (1 << 20) + 7, 3 << 20)
PIECES = (1, 7, 64, 65, 1000, 1024, 4101, 8192, 8193, 20000)  # % 9: subtrees of 1 to 256 chunks

# Reads records from stdin until it ends: a keyed flag (one byte), the key (32 bytes, when
# keyed), the input's length (8 bytes) and the piece size (4 bytes, both little-endian),
# then the input. Writes a line per record: the one-call digest, the incremental one, the
# byte count and digest of the half-way finalize, and the digest made of subtrees (2^(piece
# size % 9) chunks each, as a thread pool would hash them) and the rest.
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blake3.h"

static int read_exact(void *p, size_t n) { return n == 0 || fread(p, 1, n, stdin) == n; }

static unsigned long long read_le(int bytes)
{
    unsigned char b[8];
    unsigned long long v = 0;
    if (!read_exact(b, (size_t)bytes)) exit(3);
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static void print_hex(const uint8_t out[32], const char *end)
{
    for (int i = 0; i < 32; i++) printf("%02x", out[i]);
    fputs(end, stdout);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "lanes") == 0) {
        printf("%u\n", (unsigned)nn_blake3_lanes());
        return 0;
    }
    int flag;
    while ((flag = getchar()) != EOF) {
        uint8_t key[32], out[32];
        if (flag && !read_exact(key, 32)) return 3;
        size_t len = (size_t)read_le(8), piece = (size_t)read_le(4);
        uint8_t *data = len ? malloc(len) : NULL;
        if ((len && !data) || !read_exact(data, len) || piece == 0) return 3;

        if (flag) nn_blake3_keyed(key, data, len, out); else nn_blake3(data, len, out);
        print_hex(out, " ");

        nn_blake3_hasher h;
        if (flag) nn_blake3_init_keyed(&h, key); else nn_blake3_init(&h);
        size_t pieces = (len + piece - 1) / piece, half = 0;
        uint8_t mid[32];
        nn_blake3_finalize(&h, mid);
        for (size_t i = 0, at = 0; at < len; i++) {
            size_t n = len - at < piece ? len - at : piece;
            uint8_t *copy = malloc(n);
            if (!copy) return 3;
            memcpy(copy, data + at, n);
            nn_blake3_update(&h, copy, n);
            free(copy);
            at += n;
            if (i + 1 == pieces / 2) { nn_blake3_finalize(&h, mid); half = at; }
        }
        nn_blake3_finalize(&h, out);
        print_hex(out, " ");
        printf("%zu ", half);
        print_hex(mid, " ");

        /* subtrees of 2^(piece % 9) chunks while input follows them, then the rest */
        uint64_t chunks = (uint64_t)1 << (piece % 9);
        size_t size = (size_t)chunks * 1024, whole = len ? (len - 1) / size : 0;
        nn_blake3_hasher mode, tree;
        if (flag) nn_blake3_init_keyed(&mode, key); else nn_blake3_init(&mode);
        tree = mode;
        for (size_t i = 0; i < whole; i++) {
            uint8_t *copy = malloc(size), cv[32];
            if (!copy) return 3;
            memcpy(copy, data + i * size, size);
            nn_blake3_subtree(&mode, copy, size, i * chunks, cv);
            free(copy);
            nn_blake3_push_subtree(&tree, cv, chunks);
        }
        nn_blake3_update(&tree, data + whole * size, len - whole * size);
        nn_blake3_finalize(&tree, out);
        print_hex(out, "\n");
        free(data);
    }
    return 0;
}
"""


def _build(tmp_dir, name: str, flags=()) -> str:
    driver = tmp_dir / "driver.c"
    driver.write_text(DRIVER)
    exe = tmp_dir / name
    done = subprocess.run([TOOLCHAIN.path, "-std=c99", "-O2", *flags, "-I", str(EXPORT), str(driver),
                           str(EXPORT / "blake3.c"), "-o", str(exe)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return str(exe)


PATHS = {"default": (), "portable": ("-DNN_BLAKE3_PORTABLE",)}


@pytest.fixture(scope="module", params=list(PATHS))
def driver(request, tmp_path_factory):
    return _build(tmp_path_factory.mktemp("blake3"), "driver", PATHS[request.param])


# the portable path under sanitizers: slow (it is checked quickly unsanitized at every tree
# shape, and the default path stays quick under sanitizers)
@pytest.fixture(scope="module", params=["default", pytest.param("portable", marks=pytest.mark.slow)])
def sanitized_driver(request, tmp_path_factory):
    if not have_sanitizer_runtime():
        pytest.skip(reason="the C compiler has no ASan/UBSan runtime to link")
    flags = (*PATHS[request.param], *SANITIZE_FLAGS, "-g")
    return _build(tmp_path_factory.mktemp("blake3_sanitized"), "driver", flags)


def _lanes(exe: str) -> int:
    return int(subprocess.run([exe, "lanes"], capture_output=True, text=True, check=True).stdout)


def test_the_default_build_takes_the_avx2_path_where_the_cpu_has_it(tmp_path):
    """So the tests of the default build test the eight-chunk code on such a CPU."""
    default = _lanes(_build(tmp_path, "default"))
    portable = _lanes(_build(tmp_path, "portable", PATHS["portable"]))
    assert portable == 1
    assert default == (8 if platform.machine() == "x86_64" and "avx2" in host_features() else 1)


def _cases(seed: int):
    """(data, key or None, piece size) for every length, unkeyed and keyed, random bytes."""
    rng = random.Random(seed)
    cases = []
    for i, length in enumerate(LENGTHS):
        for keyed in (False, True):
            piece = PIECES[(2 * i + keyed) % len(PIECES)]
            cases.append((rng.randbytes(length), rng.randbytes(32) if keyed else None, piece))
    # updates of more than 64 chunks that start inside a chunk: the AVX2 path takes batches
    # of eight until the count reaches a multiple of 64, then joins 64 chunks at a time
    for keyed, piece in ((False, 70001), (True, 200003)):
        cases.append((rng.randbytes((2 << 20) + 12345), rng.randbytes(32) if keyed else None, piece))
    return cases


def _run(exe: str, cases, env=None) -> list[list[str]]:
    records = b"".join((b"\1" + key if key is not None else b"\0") + struct.pack("<QI", len(data), piece) + data
                       for data, key, piece in cases)
    done = subprocess.run([exe], input=records, capture_output=True, env=env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    lines = done.stdout.decode().splitlines()
    assert len(lines) == len(cases)
    return [line.split() for line in lines]


def _oracle(data: bytes, key: bytes | None) -> str:
    return (blake3(data, key=key) if key is not None else blake3(data)).hexdigest()


def _check(exe: str, cases, env=None):
    wrong = []
    for (data, key, piece), (whole, pieces, half, mid, tree) in zip(cases, _run(exe, cases, env)):
        expected = _oracle(data, key)
        what = f"{len(data)} bytes {'keyed' if key is not None else 'unkeyed'}, pieces of {piece}"
        if whole != expected:
            wrong.append(f"{what}: one call gives {whole}, blake3 {expected}")
        if pieces != expected:
            wrong.append(f"{what}: incrementally {pieces}, blake3 {expected}")
        if tree != expected:
            wrong.append(f"{what}: from subtrees of {1 << piece % 9} chunks {tree}, blake3 {expected}")
        if mid != _oracle(data[:int(half)], key):
            wrong.append(f"{what}: finalized after {half} bytes {mid}, blake3 {_oracle(data[:int(half)], key)}")
    assert not wrong, "\n".join(wrong)


def test_the_c_hash_is_blake3_at_every_tree_shape(driver):
    _check(driver, _cases(seed=20261128))


def test_the_c_hash_is_defined_under_sanitizers(sanitized_driver):
    """Out-of-bounds reads (past the input, a piece or a block) and undefined behaviour
    (shifts, overflow of signed values) stop the sanitized driver with a report."""
    env = {"PATH": "/usr/bin:/bin", "ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"}
    _check(sanitized_driver, _cases(seed=20261129), env)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 70000), st.booleans(), st.integers(1, 20000), st.integers(0, 2 ** 32)),
                min_size=1, max_size=12))
def test_random_lengths_and_pieces(driver, drawn):
    cases = []
    for length, keyed, piece, seed in drawn:
        rng = random.Random(seed)
        cases.append((rng.randbytes(length), rng.randbytes(32) if keyed else None, piece))
    _check(driver, cases)


# Reads the input's length (8 bytes, little-endian) and the input, then records of a thread
# count (4 bytes) and a length (8 bytes) until stdin ends: for each, hashes the input's
# first `length` bytes, copied into a heap block of exactly that size (so AddressSanitizer
# sees a read past it), with nn_blake3_threaded, and writes the digest on a line.
THREADED_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blake3.h"

static unsigned long long read_le(int bytes, int *ok)
{
    unsigned char b[8];
    unsigned long long v = 0;
    *ok = fread(b, 1, (size_t)bytes, stdin) == (size_t)bytes;
    for (int i = bytes; i-- > 0;) v = v << 8 | b[i];
    return v;
}

int main(void)
{
    int ok;
    size_t size = (size_t)read_le(8, &ok);
    unsigned char *data = malloc(size ? size : 1);
    if (!ok || !data || fread(data, 1, size, stdin) != size) return 3;
    for (;;) {
        int threads = (int)read_le(4, &ok);
        if (!ok) break;
        size_t len = (size_t)read_le(8, &ok);
        if (!ok || len > size) return 3;
        unsigned char *copy = malloc(len ? len : 1), out[32];
        if (!copy) return 3;
        memcpy(copy, data, len);
        nn_blake3_threaded(copy, len, threads, out);
        free(copy);
        for (int i = 0; i < 32; i++) printf("%02x", out[i]);
        printf("\n");
    }
    free(data);
    return 0;
}
"""

MIB = 1 << 20
# Below the split (1 MiB) and around it; 2^k chunks and a byte or a chunk either side,
# where the subtrees tile the input exactly but for the tail; sizes that cut unevenly
# into 2, 3 and 4 threads' subtrees, with what the equal subtrees leave cut into subtrees
# of its binary digits (6 MiB + 448 KiB: 256 + 128 + 64 chunks after twelve of 512); and
# the largest, where eight threads would make more than the 64 subtrees a call keeps, so
# the subtrees grow instead.
THREADED_LENGTHS = (0, 1, 1024, MIB - 1, MIB, MIB + 1, MIB + 1024, 2 * MIB - 1024, 2 * MIB - 1, 2 * MIB,
                    2 * MIB + 1, 2 * MIB + 1025, 3 * MIB + 12345, 4 * MIB - 1, 4 * MIB + 1, 5 * MIB + 777,
                    6 * MIB + 448 * 1024 + 100, 8 * MIB + 1)
THREADS = (1, 2, 3, 4, 5, 8, 16)  # 16: more than it starts, it uses eight


def _threaded_driver(tmp_path, flags=()) -> str:
    (tmp_path / "threaded.c").write_text(THREADED_DRIVER)
    exe = tmp_path / "threaded"
    done = subprocess.run([TOOLCHAIN.path, "-std=c99", "-O2", *flags, "-I", str(EXPORT), str(tmp_path / "threaded.c"),
                           str(EXPORT / "blake3.c"), str(EXPORT / "blake3_threads.c"), "-lpthread", "-o", str(exe)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return str(exe)


@pytest.mark.parametrize("mode", ["plain", "portable", "asan", "tsan"])
def test_the_hash_on_several_threads_is_the_one_call_hash(tmp_path, mode):
    """Each thread count, at each length, gives the blake3 package's digest of the input:
    the subtrees' chaining values joined in order equal the tree hashed in one call,
    however the length divides among the threads. Under AddressSanitizer and UBSan a read
    past the input stops the driver; under ThreadSanitizer, a race between the threads."""
    if mode == "asan" and not have_sanitizer_runtime():
        pytest.skip(reason="the C compiler has no ASan/UBSan runtime to link")
    if mode == "tsan" and not tsan_works():
        pytest.skip(reason="the C compiler cannot build with -fsanitize=thread")
    flags = {"plain": (), "portable": PATHS["portable"], "asan": (*SANITIZE_FLAGS, "-g"),
             "tsan": ("-fsanitize=thread", "-g")}[mode]
    exe = _threaded_driver(tmp_path, flags)
    data = random.Random(20261129).randbytes(max(THREADED_LENGTHS))
    cases = [(threads, length) for length in THREADED_LENGTHS for threads in THREADS]
    records = struct.pack("<Q", len(data)) + data + b"".join(struct.pack("<IQ", t, n) for t, n in cases)
    env = {"PATH": "/usr/bin:/bin", "ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1",
           "TSAN_OPTIONS": "halt_on_error=1"}
    done = subprocess.run([exe], input=records, capture_output=True, env=env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    assert not done.stderr, done.stderr.decode(errors="replace")[-3000:]
    digests = done.stdout.decode().split()
    assert len(digests) == len(cases)
    expected = {length: blake3(data[:length]).hexdigest() for length in THREADED_LENGTHS}
    wrong = [f"{length} bytes on {threads} threads: {got}, blake3 {expected[length]}"
             for (threads, length), got in zip(cases, digests) if got != expected[length]]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("std", ["c99", "c11"])
def test_it_compiles_without_warnings_under_strict_flags(tmp_path, std, path):
    done = subprocess.run([TOOLCHAIN.path, f"-std={std}", "-O2", *STRICT, *PATHS[path], "-c", str(EXPORT / "blake3.c"),
                           "-o", str(tmp_path / "blake3.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("nm") is None, reason="no nm (binutils) to list the object's symbols")
def test_it_needs_only_libc_memory_functions_and_holds_no_mutable_state(tmp_path):
    """Nothing writable at file scope (no data or bss symbol: the tables are constant), so
    threads share nothing; nothing called beyond libc's memcpy and memset (and the
    stack protector a distribution's compiler may add)."""
    obj = tmp_path / "blake3.o"
    subprocess.run([TOOLCHAIN.path, "-std=c99", "-O2", "-c", str(EXPORT / "blake3.c"), "-o", str(obj)], check=True)
    symbols = [line.split() for line in subprocess.run(["nm", str(obj)], capture_output=True, text=True,
                                                        check=True).stdout.splitlines()]
    writable = [s for s in symbols if len(s) == 3 and s[1] in "bBdDgGsS"]
    assert not writable, writable
    undefined = {s[-1] for s in symbols if s[-2] == "U"}
    assert undefined <= {"memcpy", "memset", "memmove", "__stack_chk_fail", "__memcpy_chk", "__memset_chk"}, undefined


CPP_USER = r"""
#include <cstdio>
#include "blake3.h"
int main()
{
    const char text[] = "weights";
    uint8_t out[32];
    nn_blake3(text, sizeof text - 1, out);
    for (int i = 0; i < 32; i++) std::printf("%02x", out[i]);
    return 0;
}
"""


@pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++", "clang++"))), reason="no C++ compiler")
def test_cxx_code_includes_the_header_and_links_the_c_object(tmp_path):
    cxx = next(filter(None, map(shutil.which, ("c++", "g++", "clang++"))))
    obj = tmp_path / "blake3.o"
    subprocess.run([TOOLCHAIN.path, "-std=c99", "-O2", "-c", str(EXPORT / "blake3.c"), "-o", str(obj)], check=True)
    (tmp_path / "user.cpp").write_text(CPP_USER)
    done = subprocess.run([cxx, "-Wall", "-Werror", "-I", str(EXPORT), str(tmp_path / "user.cpp"), str(obj),
                           "-o", str(tmp_path / "user")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    digest = subprocess.run([str(tmp_path / "user")], capture_output=True, text=True, check=True).stdout
    assert digest == blake3(b"weights").hexdigest()


def _exported(tmp_path, *defines) -> set[str]:
    lib = tmp_path / f"libb3{len(defines)}.so"
    subprocess.run([TOOLCHAIN.path, "-std=c99", "-O2", "-fPIC", "-shared", *defines, str(EXPORT / "blake3.c"),
                    "-o", str(lib)], check=True)
    listed = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in listed.stdout.splitlines() if line.strip()}


@pytest.mark.skipif(shutil.which("nm") is None, reason="no nm (binutils) to list the library's symbols")
def test_the_embedding_library_can_keep_the_functions_private(tmp_path):
    """NN_BLAKE3_API sets the functions' visibility, so a library that checks its weights
    with them need not export them into its user's symbol namespace."""
    names = {"nn_blake3", "nn_blake3_keyed", "nn_blake3_lanes", "nn_blake3_subtree", "nn_blake3_push_subtree", "nn_blake3_init", "nn_blake3_init_keyed", "nn_blake3_update",
             "nn_blake3_finalize"}
    assert names <= _exported(tmp_path)
    assert not names & _exported(tmp_path, "-DNN_BLAKE3_API=__attribute__((visibility(\"hidden\")))")
