"""The native backend's own compile options: the ISA its code is built for and how the C
compiler runs. Only this backend reads them; the compile options carry the record by the
backend's name (``CompileOptions.backend_options``), and the cache token sees them through
the backend's ``compile_facts`` (the toolchain's key: its compiler, flags and ISA)."""

from __future__ import annotations

from dataclasses import dataclass

from nncc.errors import OptionError

NAME = "native"  # the native backend's name, under which the compile options carry its record


@dataclass(frozen=True)
class NativeOptions:
    """How native code is built. ``target``: the --target flag (or ``target=``); the rest
    are settings the command resolves once (nncc.settings.build_settings), since the
    toolchain reads none itself."""

    target: str = "native"  # the ISA native code is built for (nncc.native.toolchain.TARGETS)
    sanitize: bool = False  # native.sanitize: in the token through the toolchain's key (its flags)
    cc_timeout: float | None = None  # native.cc_timeout, seconds per compiler run; None: the toolchain's default
    cc: str | None = None  # $CC: the compiler ("" names none; None: cc, gcc or clang), in the token by its file
    cc_jobs: int | None = None  # $NNCC_CC_JOBS, compiler runs at once; None: one per core (changes no code)

    def __post_init__(self):
        if not isinstance(self.sanitize, bool):
            raise OptionError(f"the sanitize mode must be True or False, not {self.sanitize!r}")
        if self.target != "native":  # the default needs no look-up: `nncc cache ls` makes this record too
            from nncc.native.toolchain import TARGETS  # lazy: start-up

            if not isinstance(self.target, str) or self.target not in TARGETS:
                raise OptionError(f"unknown target {self.target!r}; choose from {', '.join(TARGETS)}")
        timeout = self.cc_timeout
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0):
            raise OptionError(f"the C compiler's time-out must be a number of seconds above 0, not {timeout!r}")
        jobs = self.cc_jobs
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise OptionError(f"the compiler runs at once must be a whole number above 0, not {jobs!r}")
        if self.cc is not None and not isinstance(self.cc, str):
            raise OptionError(f"the C compiler must be named by a string, not {self.cc!r}")


def native_options(records) -> NativeOptions:
    """The native backend's record among backends' option records ((name, record) pairs,
    as nncc.settings.build_settings returns them), else the default one."""
    return dict(records).get(NAME) or NativeOptions()
