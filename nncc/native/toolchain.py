"""The system C compiler that builds native partitions: finding it, naming it, running it.

nncc works without a compiler: ``find_toolchain()`` returns None and every partition stays
on the portable numpy plan. The compiler's identity, the flags and the ISA go into the
cache token, so a compiler update or another ``--target`` misses the cache, as a driver
update does for a device's compilation cache. Each translation unit is compiled to an
object on its own and the objects are linked into one shared object (nncc/native/build.py
decides which units need compiling).
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile

from blake3 import blake3

from nncc.errors import NnccError

# Named ISA levels: the x86-64 micro-architecture levels, and "native" for the host's own.
# Each names the CPU features the code may use, checked against the host before loading.
TARGETS = {
    "native": ("-march=native",),
    "x86-64": ("-march=x86-64",),
    "x86-64-v2": ("-march=x86-64-v2",),
    "x86-64-v3": ("-march=x86-64-v3",),
    "x86-64-v4": ("-march=x86-64-v4",),
}
# CPU features (as /proc/cpuinfo names them) each level requires.
_LEVEL_FEATURES = {
    "x86-64": ("sse2",),
    "x86-64-v2": ("sse2", "ssse3", "sse4_1", "sse4_2", "popcnt"),
    "x86-64-v3": ("sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2"),
    "x86-64-v4": ("sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2",
                  "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
# The features of the host that matter to generated code: enough to tell CPUs apart for
# "-march=native" without making the token change with unrelated flags.
_RELEVANT = ("sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2",
             "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
             "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")
BASE_FLAGS = ("-O3", "-std=c11", "-fPIC", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast",
              "-fvisibility=hidden", "-Wno-unused-function", "-Wno-unused-variable")
LINK_FLAGS = ("-shared",)
# The sanitize mode (native.sanitize, $NNCC_NATIVE_SANITIZE): the same -O3 code, checked for
# out-of-bounds accesses and undefined behaviour, stopping at the first one. GCC's
# "undefined" leaves out a float converted to an integer that cannot hold it (NaN, an
# infinity, out of range), the undefined behaviour kernels fed non-finite values risk most.
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fsanitize=float-cast-overflow", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer")
DEFAULT_TIMEOUT = 300.0  # seconds one compiler run may take, unless the caller says (= native.cc_timeout's default)


class NativeBuildError(NnccError):
    """The C compiler failed or timed out; the portable plan is used instead."""


class Toolchain:
    """A compiler named by its resolved path and the size and mtime of that file: a stat,
    not a run, so the cache token stays cheap on every hit (ccache's default compiler
    check). Updating the compiler package changes the file and so the token. The caller
    gives the sanitize mode, the time-out and how many compiler runs go at once (the
    command resolved them): none is read here."""

    def __init__(self, path: str, target: str, sanitize: bool = False, timeout: float | None = None,
                 jobs: int | None = None):
        self.path = path
        self.target = target
        self.sanitize = sanitize
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout  # not in the key: it changes no code
        # compiler processes at once (not in the key either); None: one per core this process may use
        self.jobs = jobs if jobs else max(1, len(os.sched_getaffinity(0)))
        st = os.stat(path)
        self.stamp = (st.st_size, st.st_mtime_ns)

    @property
    def flags(self) -> tuple[str, ...]:
        """What every translation unit is compiled with (``-c``: linking is separate)."""
        return BASE_FLAGS + TARGETS[self.target] + (SANITIZE_FLAGS if self.sanitize else ())

    @property
    def link_flags(self) -> tuple[str, ...]:
        return LINK_FLAGS + (SANITIZE_FLAGS if self.sanitize else ())

    def key(self) -> dict:
        """What the cache token covers: compiler file, flags and the ISA the code needs
        (so sanitized code never stands in for plain code, nor the other way round)."""
        return {"compiler": self.path, "stamp": list(self.stamp), "target": self.target,
                "flags": list(self.flags), "link": list(self.link_flags),
                "features": list(required_features(self.target))}

    def identity(self) -> dict:
        """What an artifact records of its code's origin (runs the compiler once)."""
        return dict(self.key(), version=_banner(self.path))

    def object_key(self, source: str) -> str:
        """The name of ``source``'s object file: the source, the compiler's file and its
        version banner, the flags and the target. Equal keys mean interchangeable objects."""
        return blake3(repr((self.identity(), source)).encode()).hexdigest()

    def compile_object(self, source: str) -> bytes:
        """Compile one translation unit to an object file and return its bytes."""
        with tempfile.TemporaryDirectory(prefix="nncc-cc-") as tmp:
            src = os.path.join(tmp, "unit.c")
            out = os.path.join(tmp, "unit.o")
            with open(src, "w") as f:
                f.write(source)
            self._run([self.path, *self.flags, "-c", src, "-o", out])
            with open(out, "rb") as f:
                return f.read()

    def link(self, objects: list[bytes]) -> bytes:
        """Link object files (given as bytes, already verified) into one shared object."""
        with tempfile.TemporaryDirectory(prefix="nncc-ld-") as tmp:
            paths = []
            for i, data in enumerate(objects):
                paths.append(os.path.join(tmp, f"u{i}.o"))
                with open(paths[-1], "wb") as f:
                    f.write(data)
            out = os.path.join(tmp, "code.so")
            self._run([self.path, *self.link_flags, *paths, "-o", out, "-lm"])
            with open(out, "rb") as f:
                return f.read()

    def _run(self, cmd: list[str]) -> None:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout,
                                  stdin=subprocess.DEVNULL, env=_compiler_env())
        except subprocess.TimeoutExpired:
            raise NativeBuildError(f"the C compiler {self.path} timed out after {self.timeout:g} s "
                                   "(NNCC_CC_TIMEOUT or native.cc_timeout)") from None
        except OSError as exc:
            raise NativeBuildError(f"cannot run the C compiler {self.path}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            lines = done.stderr.splitlines()
            first = next((line for line in lines if "error" in line), lines[0] if lines else "no message")
            raise NativeBuildError(f"the C compiler {self.path} failed: {first[:300]}")


def _compiler_env() -> dict | None:
    """The compiler runs without the sanitizer runtimes a sanitize-mode process preloads
    (they would only slow every compiler process down). The process's own LD_PRELOAD is
    not a setting: it is the one environment read below nncc.settings."""
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):
        return None
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


@functools.lru_cache(maxsize=8)
def _banner(path: str) -> str:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (done.stdout.splitlines() or ["unknown"])[0].strip()


def host_features() -> frozenset[str]:
    return _host_features()


@functools.lru_cache(maxsize=1)
def _host_features() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def required_features(target: str) -> tuple[str, ...]:
    """The CPU features code built for ``target`` needs; for "native", the host's own."""
    if target == "native":
        return tuple(f for f in _RELEVANT if f in _host_features())
    return _LEVEL_FEATURES.get(target, ())


def missing_features(required) -> list[str]:
    have = _host_features()
    return [f for f in required if f not in have] if have else []


def _candidates(cc: str | None) -> list[str]:
    if cc is not None:  # an explicit choice is never silently replaced by another compiler
        return [cc] if cc else []
    return ["cc", "gcc", "clang"]


def _resolve(name: str) -> str | None:
    path = shutil.which(name) if os.sep not in name else name
    if path is None or not os.access(path, os.X_OK) or not os.path.isfile(path):
        return None
    return os.path.realpath(path)


def find_toolchain(target: str = "native", sanitize: bool = False, timeout: float | None = None,
                   cc: str | None = None, jobs: int | None = None) -> Toolchain | None:
    """The compiler ``cc`` names (the command's $CC; "" names none), else the first of cc,
    gcc, clang on PATH; None when there is none. ``sanitize``: build in the sanitize mode;
    ``timeout``: seconds one compiler run may take (None: DEFAULT_TIMEOUT); ``jobs``:
    compiler runs at once (None: one per core). The compile options carry them all
    (CompileOptions), from the command's resolved settings."""
    if target not in TARGETS:
        raise NativeBuildError(f"unknown target {target!r}; choose from {', '.join(TARGETS)}")
    for name in _candidates(cc):
        path = _resolve(name)
        if path is not None:
            return Toolchain(path, target, sanitize, timeout, jobs)
    return None


def why_no_native(target: str = "native", cc: str | None = None) -> str | None:
    """Why this machine builds or runs no native code for ``target`` (one clause), or None.
    ``cc``: the command's $CC. The native backend then takes nothing, or its code runs
    nowhere but on other CPUs."""
    if cc is not None and not cc.strip():
        return "no C compiler: $CC is set but empty"
    if cc is not None and _resolve(cc) is None:
        return f"no C compiler: $CC is {cc!r}, which is not an executable file"
    if cc is None and not any(_resolve(name) for name in _candidates(None)):
        return "no C compiler: none of cc, gcc or clang is on PATH (set $CC to one)"
    missing = missing_features(required_features(target)) if target in TARGETS else []
    if missing:
        return f"this CPU lacks {', '.join(missing[:4])}, which --target {target} needs: its code cannot run here"
    return None


def explicit_compiler_missing(cc: str | None) -> bool:
    """``cc`` (the command's $CC) names a compiler that is not there: the user's own
    choice, so worth a warning."""
    return bool(cc and cc.strip()) and _resolve(cc) is None


def is_sanitized(identity) -> bool:
    """Whether code with this recorded identity (``Toolchain.identity()``) was built in
    the sanitize mode."""
    flags = identity.get("flags") if isinstance(identity, dict) else None
    return isinstance(flags, list) and SANITIZE_FLAGS[0] in flags


def sanitizer_loaded() -> bool:
    """Whether this process started with the AddressSanitizer runtime. Sanitized code
    only loads into such a process: dlopen'ed on its own, the runtime aborts the process
    ("ASan runtime does not come first in initial library list")."""
    return hasattr(ctypes.CDLL(None), "__asan_init")


def sanitizer_preload(compiler: str | None = None) -> str:
    """The LD_PRELOAD value that loads the compiler's ASan and UBSan runtimes first."""
    compiler = compiler or next((p for p in map(_resolve, _candidates(None)) if p), "cc")
    found = []
    for lib in ("libasan.so", "libubsan.so"):
        try:
            done = subprocess.run([compiler, f"-print-file-name={lib}"], capture_output=True, text=True,
                                  timeout=20, stdin=subprocess.DEVNULL)
            path = done.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            path = ""
        found.append(path if os.path.isabs(path) and os.path.exists(path) else lib)
    return " ".join(found)
