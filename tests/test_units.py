import pytest

from nncc.util.units import format_bytes


@pytest.mark.parametrize("n, text", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
    (5 * 1024 ** 2, "5.0 MiB"), (3 * 1024 ** 4, "3072.0 GiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_kernel_catalog_names_the_family_of_every_builtin_op():
    """catalog.FAMILY_OF (what a cache hit imports by) is what the families register:
    regenerate it with `python -m nncc.kernels.write_catalog` after adding a kernel."""
    import subprocess
    import sys

    script = ("import nncc.kernels, nncc.kernels.registry as r\n"
              "nncc.kernels.load_all()\n"
              "print(sorted(f'{d}::{op}={defs[0].fn.__module__}' for (d, op), defs in r._REGISTRY.items()))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    from nncc.kernels.catalog import FAMILY_OF

    assert done.stdout.strip() == str(sorted(f"{k}=nncc.kernels.{v}" for k, v in FAMILY_OF.items()))


@pytest.mark.slow
def test_a_cached_plan_imports_only_the_families_it_uses(tmp_path):
    """A hit on the MLP fixture (MatMul/Gemm and Relu) loads a few families, not all."""
    import subprocess
    import sys

    from tests.conftest import FIXTURES

    script = ("import sys, nncc\n"
              "nncc.prepare(sys.argv[1], cache_dir=sys.argv[2])\n"
              "from nncc.kernels import FAMILIES\n"
              "print(sum(f'nncc.kernels.{f}' in sys.modules for f in FAMILIES), len(FAMILIES))\n")
    args = [sys.executable, "-c", script, str(FIXTURES / "mlp.onnx"), str(tmp_path / "c")]
    subprocess.run(args, check=True, capture_output=True)  # the miss compiles: every family
    loaded, total = map(int, subprocess.run(args, check=True, capture_output=True, text=True).stdout.split())
    assert 0 < loaded <= 4 < total


@pytest.mark.parametrize("seconds, text", [
    (None, "-"), (0.00042, "0.42 ms"), (0.0512, "51.2 ms"), (0.1234, "123 ms"), (2.5, "2.5 s"),
    (75, "1 min 15 s"), (7500, "2 h 5 min"), (-0.0123, "-12.3 ms"),
])
def test_format_seconds(seconds, text):
    from nncc.util.units import format_seconds

    assert format_seconds(seconds) == text
