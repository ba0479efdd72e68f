import pytest

from nncc.util.units import format_bytes


@pytest.mark.parametrize("n, text", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
    (5 * 1024 ** 2, "5.0 MiB"), (3 * 1024 ** 4, "3072.0 GiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("seconds, text", [
    (None, "-"), (0.00042, "0.42 ms"), (0.0512, "51.2 ms"), (0.1234, "123 ms"), (2.5, "2.5 s"),
    (75, "1 min 15 s"), (7500, "2 h 5 min"), (-0.0123, "-12.3 ms"),
])
def test_format_seconds(seconds, text):
    from nncc.util.units import format_seconds

    assert format_seconds(seconds) == text
