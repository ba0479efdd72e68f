import pytest

from nncc.util.units import format_bytes


@pytest.mark.parametrize("n, text", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
    (5 * 1024 ** 2, "5.0 MiB"), (3 * 1024 ** 4, "3072.0 GiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text
