"""Signal kernels (DFT, STFT, Hann/Hamming/Blackman windows, MelWeightMatrix) against
onnxruntime on shapes and attributes beyond ONNX's node cases, through both nncc routes.
Where onnxruntime's answer is not used, the oracle is stated at the test."""

from __future__ import annotations

import numpy as np
import pytest

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from tests.one_node import check_against, check_against_ort

rng = np.random.default_rng(7)


def i64(v):
    return np.array(v, dtype=np.int64)


def signal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- DFT


@pytest.mark.parametrize("shape,axis", [((3, 16, 1), 1), ((2, 5, 7, 2), 2), ((2, 5, 7, 2), -3),
                                        ((4, 9, 2), -2), ((1, 6, 3, 4, 1), 0)])
@pytest.mark.parametrize("onesided", [0, 1])
def test_dft20_forward_matches_onnxruntime(shape, axis, onesided):
    x = signal(*shape)
    if onesided and shape[-1] == 2:
        pytest.skip("onesided forward DFT is defined for real input only")
    check_against_ort("DFT", [x, None, i64(axis)], 20, {"onesided": onesided},
                      constant=(2,), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length", [5, 12, 16])
def test_dft20_dft_length_trims_or_pads(length):
    x = signal(2, 12, 3, 1)
    check_against_ort("DFT", [x, i64(length), i64(1)], 20, {}, constant=(1, 2),
                      rtol=1e-4, atol=1e-4)


def test_dft20_inverse_of_complex_input_and_runtime_axis():
    x = signal(3, 10, 2)
    # axis fed at run time: the output shape is unknown when compiling
    check_against_ort("DFT", [x, None, i64(1)], 20, {"inverse": 1}, rtol=1e-4, atol=1e-5)


def test_dft17_axis_attribute_and_float64():
    x = signal(2, 8, 6, 2, dtype=np.float64)
    check_against_ort("DFT", [x, i64(6)], 17, {"axis": 2}, constant=(1,), rtol=1e-10, atol=1e-10)


def test_irfft_inverts_rfft():
    """Oracle: the signal itself. A one-sided forward DFT followed by the one-sided inverse
    of the same length gives the real signal back, for even and odd lengths."""
    for n in (10, 11):
        x = signal(4, n, 1, dtype=np.float64)
        spectrum = check_against_ort("DFT", [x, None, i64(1)], 20, {"onesided": 1},
                                     constant=(2,), rtol=1e-9, atol=1e-9)[0]
        check_against([x], "DFT", [spectrum, i64(n), i64(1)], 20,
                      {"onesided": 1, "inverse": 1}, constant=(1, 2), rtol=1e-9, atol=1e-9)


def test_dft_rejects_the_complex_axis():
    x = TensorInfo(np.dtype(np.float32), (2, 8, 2))
    with pytest.raises(ShapeInferenceError, match="axis"):
        resolve("DFT", "", 20).shape(Ctx({}, 20), x, None, TensorInfo.of(i64(-1)))
    with pytest.raises(KernelError, match="last axis must be 1"):
        resolve("DFT", "", 20).fn(Ctx({}, 20), signal(2, 8, 3), None, i64(1))


# --------------------------------------------------------------------------- STFT


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("step,length", [(4, 16), (7, 20), (32, 32)])
def test_stft_with_window_matches_onnxruntime(onesided, step, length):
    x = signal(3, 100, 1)
    window = np.hanning(length).astype(np.float32)
    check_against_ort("STFT", [x, i64(step), window], 17, {"onesided": onesided},
                      constant=(1, 2), rtol=1e-4, atol=1e-4)


def test_stft_frame_length_without_window_at_run_time():
    x = signal(2, 64, 1)
    check_against_ort("STFT", [x, i64(5), None, i64(12)], 17, {}, rtol=1e-4, atol=1e-4)


def test_stft_complex_signal_two_sided():
    x = signal(2, 40, 2, dtype=np.float64)
    window = np.hamming(8)
    check_against_ort("STFT", [x, i64(3), window, i64(8)], 17, {"onesided": 0},
                      constant=(1, 2, 3), rtol=1e-10, atol=1e-10)


def test_stft_window_length_must_match_frame_length():
    with pytest.raises(KernelError, match="differs from the window length"):
        resolve("STFT", "", 17).fn(Ctx({}, 17), signal(1, 40, 1), i64(4),
                                   np.ones(8, np.float32), i64(10))


# --------------------------------------------------------------------------- windows


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("size", [1, 2, 9, 64])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_onnxruntime(op, size, periodic):
    if size == 1 and not periodic:
        pytest.skip("onnxruntime answers NaN (the formula's 0/0); see the test below")
    check_against_ort(op, [i64(size)], 17, {"periodic": periodic}, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op,numpy_window", [("HannWindow", np.hanning),
                                              ("HammingWindow", np.hamming),
                                              ("BlackmanWindow", np.blackman)])
@pytest.mark.parametrize("size", [1, 2, 17])
def test_symmetric_windows_match_numpy(op, numpy_window, size):
    """Oracle: numpy's symmetric windows. A one-point symmetric window is the formula's 0/0;
    numpy (like SciPy and PyTorch) defines it as [1], where onnxruntime gives NaN.
    numpy's Hamming uses 0.54/0.46 where ONNX uses 25/46 and 21/46: only one point compares."""
    if op == "HammingWindow" and size > 1:
        pytest.skip("numpy's Hamming coefficients differ from ONNX's beyond one point")
    expected = numpy_window(size).astype(np.float32)
    check_against([expected], op, [i64(size)], 17, {"periodic": 0}, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("datatype,dtype", [(11, np.float64), (10, np.float16), (6, np.int32),
                                            (2, np.uint8)])
def test_window_output_datatype(datatype, dtype):
    for op in ("HannWindow", "BlackmanWindow"):
        expected = check_against_ort(op, [i64(10)], 17, {"output_datatype": datatype},
                                     constant=(0,), rtol=1e-3, atol=1e-3)
        assert expected[0].dtype == dtype


# --------------------------------------------------------------------------- MelWeightMatrix


@pytest.mark.parametrize("bins,dft,rate,low,high", [
    (8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 20.0, 8000.0), (40, 512, 16000, 0.0, 8000.0),
    (13, 255, 22050, 300.0, 5000.0)])
def test_mel_weight_matrix_matches_onnxruntime(bins, dft, rate, low, high):
    inputs = [i64(bins), i64(dft), i64(rate), np.array(low, np.float32),
              np.array(high, np.float32)]
    check_against_ort("MelWeightMatrix", inputs, 17, {}, rtol=1e-6, atol=1e-7)
    check_against_ort("MelWeightMatrix", inputs, 17, {"output_datatype": 11},
                      constant=(0, 1, 2, 3, 4), rtol=1e-6, atol=1e-7)
