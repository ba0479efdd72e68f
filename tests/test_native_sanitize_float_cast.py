"""The sanitize mode catches a float converted to an integer that cannot hold it (NaN, an
infinity, beyond the type's range): undefined behaviour in C, which GCC's
-fsanitize=undefined does not check, so the mode asks for -fsanitize=float-cast-overflow
too. A sanitized step converts its input to int32: a value in range runs and truncates, a
value outside ends the process with UBSan's report (tests/test_native_sanitize.py does the
same for a read past an input)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from nncc.native.toolchain import find_toolchain
from tests.test_native_sanitize import have_sanitizer_runtime, sanitized_env

pytestmark = [pytest.mark.skipif(find_toolchain(sanitize=False) is None,
                                 reason="no C compiler: there is no native code to sanitize"),
              pytest.mark.skipif(not have_sanitizer_runtime(),
                                 reason="the compiler has no ASan/UBSan runtime to preload")]

PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    from nncc.native.codegen import prelude
    from nncc.native.loader import Library
    from nncc.native.toolchain import find_toolchain
    from nncc.backends.native import NativeCall
    from nncc.backends.native_step import NativeStep

    toolchain = find_toolchain(sanitize=True)
    source = prelude() + '''
    NN_EXPORT int probe(void **args, char *ws) {
        const float *x = args[0]; float *y = args[1];
        volatile int32_t i = (int32_t)x[0];
        y[0] = (float)i;
        return 0;
    }'''
    step = NativeStep(Library(toolchain.link([toolchain.compile_object(source)])).function("probe"),
                      NativeCall(0, "probe", [0, 1], 1, 0), "probe", sanitized=True)
    for value in sys.argv[1:]:
        y = np.zeros(1, np.float32)
        step(None, np.array([float(value)], np.float32), out=[y])
        print("int32", value, float(y[0]), flush=True)
""")


@pytest.mark.slow  # a sanitized build
@pytest.mark.parametrize("bad", ["nan", "-inf", "3e9"])
def test_a_sanitized_step_catches_a_float_the_integer_cannot_hold(bad):
    done = subprocess.run([sys.executable, "-c", PROBE, "-2.75", bad], env=sanitized_env(),
                          capture_output=True, text=True)
    assert "int32 -2.75 -2.0" in done.stdout, done.stderr  # in range: runs, truncated toward zero
    assert f"int32 {bad}" not in done.stdout
    assert done.returncode != 0
    assert "runtime error:" in done.stderr and "is outside the range of representable values of type" in done.stderr
