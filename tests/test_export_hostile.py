"""An exported library under AddressSanitizer and UBSan: the library's code and the C
program built with them run clean and match onnxruntime, and weights files that are
truncated, damaged, another model's, made for other CPU features, or tampered with (data
edited and the header's checks recomputed to match) are refused with an error code and a
message, never a crash or a read out of bounds (one sanitized process opens every
mutation)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from blake3 import blake3

import nncc

from nncc.native.toolchain import host_features
from tests.export_build import block, compiler, convnet, driver, export, mlp, open_files, run_driver
from tests.oracle import ort_outputs

pytestmark = [pytest.mark.skipif(compiler() is None, reason="no C compiler: nothing can be exported or linked"),
              pytest.mark.slow]  # every test builds, links or runs a C library

SANITIZED = {"NNCC_NATIVE_SANITIZE": "1"}
# the header's codes (nncc/export/c_api.py's ERRORS)
FORMAT, DAMAGED, MISMATCH, CPU = 3, 4, 5, 6


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory):
    """(model, feeds, export folder, sanitized static driver) of the MLP, exported with
    its code built in the sanitize mode."""
    root = tmp_path_factory.mktemp("export-asan")
    model, feeds = mlp(root / "mlp.onnx")
    export(root / "mlp.onnx", root / "mlp", cache=root / "cache", env=SANITIZED)
    return model, feeds, root / "mlp", driver(root / "mlp", "mlp", "static", sanitize=True)


# slow: two more sanitized exports; the MLP's sanitized library and program stay quick below,
# and test_export runs both models' libraries (plain) against onnxruntime quickly
@pytest.mark.slow
@pytest.mark.parametrize("make", [convnet, block], ids=["convnet", "block"])
def test_sanitized_library_runs_clean_and_matches_onnxruntime(sanitized, make, tmp_path):
    """The convnet's blocked kernels and the block's GEMM of two run-time tensors (nncc's own
    loops in an export), checked by the sanitizers in the library and the program."""
    name = make.__name__
    model, feeds = make(tmp_path / f"{name}.onnx")
    export(tmp_path / f"{name}.onnx", tmp_path / name, cache=sanitized[2].parent / "cache", env=SANITIZED)
    exe = driver(tmp_path / name, name, "shared", sanitize=True)
    want = ort_outputs(model, feeds)[model.graph.output[0].name]
    (got,) = run_driver(exe, str(tmp_path / name / f"{name}.weights"), [feeds["x0"]], [want.size], tmp_path,
                        sanitize=True)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_sanitized_static_library_runs_clean(sanitized, tmp_path):
    model, feeds, folder, exe = sanitized
    want = ort_outputs(model, feeds)[model.graph.output[0].name]
    (got,) = run_driver(exe, str(folder / "mlp.weights"), [feeds["x0"]], [want.size], tmp_path, sanitize=True)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


def _with_header_checksum(data: bytearray) -> bytearray:
    """The header's own CRC made right again, so the check after it is the one that refuses."""
    data[88:92] = struct.pack("<I", zlib.crc32(bytes(data[:88])))
    return data


def _forged(data: bytearray) -> bytearray:
    """What an editor of the file can do: the header's BLAKE3 of the data and its CRC made
    to match the edited data, so only the digest built into the library can refuse it."""
    data[56:88] = blake3(bytes(data[128:])).digest()
    return _with_header_checksum(data)


def test_hostile_weights_files_are_refused_with_a_code_and_a_message(sanitized, tmp_path):
    model, _, folder, exe = sanitized
    good = (folder / "mlp.weights").read_bytes()
    rng = np.random.default_rng(7)
    cases: dict[str, tuple[bytes, set[int]]] = {"empty": (b"", {FORMAT}),
                                                 "header only": (good[:128], {DAMAGED}),
                                                 "one byte more": (good + b"\0", {DAMAGED}),
                                                 "not weights": (b"\x7fELF" + good[4:], {FORMAT})}
    for cut in sorted({1, 7, 8, 59, 64, 127, *rng.integers(129, len(good), 6).tolist(), len(good) - 1}):
        cases[f"truncated to {cut}"] = (good[:cut], {FORMAT, DAMAGED})
    for position in sorted({*range(0, 128, 3), *rng.integers(64, len(good), 40).tolist()}):
        flipped = bytearray(good)
        flipped[position] ^= 1 << int(rng.integers(8))
        cases[f"bit flipped at {position}"] = (bytes(flipped), {FORMAT, DAMAGED})
    version = bytearray(good)
    for number in (1, 3):  # 1: the format whose data was checked by CRC-32 only
        version[8] = number
        cases[f"format {number}"] = (bytes(_with_header_checksum(version)), {FORMAT})
    token = bytearray(good)
    token[20] ^= 0xFF
    cases["another token"] = (bytes(_with_header_checksum(token)), {MISMATCH})
    features = bytearray(good)
    features[32:40] = struct.pack("<Q", struct.unpack("<Q", good[32:40])[0] ^ (1 << 11))  # avx512f
    cases["other cpu features"] = (bytes(_with_header_checksum(features)), {MISMATCH})
    size = bytearray(good)
    size[48:56] = struct.pack("<Q", 1 << 62)
    cases["huge data size"] = (bytes(_with_header_checksum(size)), {DAMAGED})
    for position in sorted({128, len(good) - 1, *rng.integers(128, len(good), 4).tolist()}):
        edited = bytearray(good)
        edited[position] ^= 0x40
        cases[f"data edited at {position}, header CRC recomputed"] = (bytes(_with_header_checksum(edited)), {DAMAGED})
        cases[f"data edited at {position}, header digest and CRC rewritten"] = (bytes(_forged(edited)), {DAMAGED})
    scaled = bytearray(good)
    scaled[128:] = (np.frombuffer(good[128:], "<f4") * 2).astype("<f4").tobytes()
    cases["every weight doubled, header rewritten"] = (bytes(_forged(scaled)), {DAMAGED})
    other = tmp_path / "other"
    mlp(tmp_path / "other.onnx", seed=1)
    export(tmp_path / "other.onnx", other, cache=folder.parent / "cache", env=SANITIZED)
    cases["another model's file"] = ((other / "other.weights").read_bytes(), {MISMATCH})
    paths = [str(folder / "mlp.weights")]
    for i, (label, (data, _)) in enumerate(cases.items()):
        (tmp_path / f"case{i}").write_bytes(data)
        paths.append(str(tmp_path / f"case{i}"))
    paths.append(str(tmp_path / "no such file"))
    results = open_files(exe, paths, sanitize=True)
    assert results[0] == (0, "ok")
    for (label, (_, codes)), (code, message) in zip(cases.items(), results[1:-1]):
        assert code in codes and message, (label, code, message)
        if "edited" in label or "doubled" in label:
            assert "built into this library" in message, (label, message)
    assert results[-1][0] == 2 and "no such file" in results[-1][1].lower()


@pytest.mark.skipif("avx512f" in host_features(),
                    reason="this CPU has AVX-512: code built for x86-64-v4 runs here, so nothing to refuse")
def test_a_cpu_without_the_features_the_code_needs_is_refused(tmp_path):
    mlp(tmp_path / "mlp.onnx")
    export(tmp_path / "mlp.onnx", tmp_path / "v4", "--target", "x86-64-v4", cache=tmp_path / "cache")
    exe = driver(tmp_path / "v4", "mlp", "static")
    ((code, message),) = open_files(exe, [str(tmp_path / "v4" / "mlp.weights")])
    assert code == CPU and "avx512f" in message, message


def test_load_library_refuses_a_sanitized_library_in_a_plain_process(sanitized):
    """Loaded without the sanitizer runtime, the library would abort the process: refused."""
    from nncc.errors import InputError
    from nncc.native.toolchain import sanitizer_loaded

    if sanitizer_loaded():
        pytest.skip("this process runs with the sanitizer runtime: the library loads")
    with pytest.raises(InputError, match="AddressSanitizer"):
        nncc.load_library(sanitized[2])
