"""Signal-processing kernels: DFT (opsets 17, 20), STFT, the Hann, Hamming and Blackman
windows and MelWeightMatrix (opset 17).

Complex values travel as a trailing axis of 2 (real, imaginary); a trailing axis of 1 is a
real signal. Transforms use numpy.fft in double precision and cast back to the input type.
STFT frames the signal with one strided view and transforms every frame in one call.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.dtypes import onnx_type_name, to_numpy
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import known_value


def _scalar_int(value, what: str, err) -> int:
    value = np.asarray(value)
    if value.size != 1:
        raise err(f"{what} must be a scalar, got shape {value.shape}")
    if value.dtype.kind not in "iu":
        raise err(f"{what} must be an integer, got {value.dtype}")
    return int(value.reshape(-1)[0])


def _known_int(info, what: str):
    """The compile-time value of a scalar integer input, or None when unknown or omitted."""
    value = known_value(info)
    return None if value is None else _scalar_int(value, what, ShapeInferenceError)


def _to_complex(x: np.ndarray, what: str, err) -> np.ndarray:
    """Trailing axis 1 (real) or 2 (real, imaginary) to a complex128 array without it."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise err(f"{what}: the last axis must be 1 (real) or 2 (complex), got shape {x.shape}")
    if x.shape[-1] == 1:
        return x[..., 0].astype(np.complex128)
    return x[..., 0].astype(np.float64) + 1j * x[..., 1].astype(np.float64)


def _from_complex(z: np.ndarray, dtype) -> np.ndarray:
    out = np.empty(z.shape + (2,), dtype=dtype)
    out[..., 0] = z.real
    out[..., 1] = z.imag
    return out


# --------------------------------------------------------------------------- DFT


def _dft_axis(ctx, rank: int, axis_value, err) -> int:
    if ctx.opset >= 20:
        axis = -2 if axis_value is None else axis_value
    else:
        axis = int(ctx.get("axis", 1))
    # the last axis holds the real/imaginary parts and cannot be transformed
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise err(f"DFT: axis {axis} is out of range for an input of rank {rank} "
                  f"(the last axis holds real/imaginary parts)")
    return axis + rank if axis < 0 else axis


def _dft_flags(ctx):
    return bool(ctx.get("inverse", 0)), bool(ctx.get("onesided", 0))


def _dft_shape(ctx, x, dft_length=None, axis=None):
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    rank = len(x.shape)
    axis_value = _known_int(axis, "DFT axis") if axis is not None else None
    if ctx.opset >= 20 and axis is not None and axis_value is None:
        return [TensorInfo(x.dtype, (None,) * rank)]
    if rank < 2:
        raise ShapeInferenceError(f"DFT needs an input of rank >= 2, got {x.shape}")
    if isinstance(x.shape[-1], int) and x.shape[-1] not in (1, 2):
        raise ShapeInferenceError(f"DFT: the last axis must be 1 (real) or 2 (complex), "
                                  f"got shape {x.shape}")
    a = _dft_axis(ctx, rank, axis_value, ShapeInferenceError)
    inverse, onesided = _dft_flags(ctx)
    n = x.shape[a] if isinstance(x.shape[a], int) else None
    if dft_length is not None:
        n = _known_int(dft_length, "DFT dft_length")
        if n is not None and n <= 0:
            raise ShapeInferenceError(f"DFT: dft_length must be positive, got {n}")
    elif inverse and onesided and n is not None:
        n = 2 * (n - 1)
    shape = list(x.shape)
    if inverse and onesided:
        shape[a], shape[-1] = n, 1
    else:
        shape[a] = n // 2 + 1 if (onesided and n is not None) else n
        shape[-1] = 2
    return [TensorInfo(x.dtype, tuple(shape))]


def _dft(ctx, x, dft_length, axis_value):
    a = _dft_axis(ctx, x.ndim, axis_value, KernelError)
    inverse, onesided = _dft_flags(ctx)
    z = _to_complex(x, "DFT", KernelError)
    if dft_length is not None:
        n = _scalar_int(dft_length, "DFT dft_length", KernelError)
        if n <= 0:
            raise KernelError(f"DFT: dft_length must be positive, got {n}")
    else:
        n = 2 * (x.shape[a] - 1) if inverse and onesided else x.shape[a]
    if inverse and onesided:  # one-sided spectrum to a real signal
        return np.fft.irfft(z, n=n, axis=a)[..., None].astype(x.dtype)
    if inverse:
        y = np.fft.ifft(z, n=n, axis=a)
    else:
        y = np.fft.fft(z, n=n, axis=a)
        if onesided:
            y = y.take(np.arange(n // 2 + 1), axis=a)
    return _from_complex(y, x.dtype)


@kernel("DFT", since=17, shape=_dft_shape)
def dft_v17(ctx, x, dft_length=None):
    return _dft(ctx, x, dft_length, None)


@kernel("DFT", since=20, shape=_dft_shape)
def dft_v20(ctx, x, dft_length=None, axis=None):
    axis_value = None if axis is None else _scalar_int(axis, "DFT axis", KernelError)
    return _dft(ctx, x, dft_length, axis_value)


# --------------------------------------------------------------------------- STFT


def _stft_geometry(signal_len, step, window_len, frame_length, err):
    """(frame length, frame count); any input may be None when unknown."""
    if step is not None and step <= 0:
        raise err(f"STFT: frame_step must be positive, got {step}")
    if frame_length is not None and window_len is not None and frame_length != window_len:
        raise err(f"STFT: frame_length {frame_length} differs from the window length {window_len}")
    length = frame_length if frame_length is not None else window_len
    if length is None and frame_length is None and window_len is None:
        length = signal_len
    if length is not None and length <= 0:
        raise err(f"STFT: frame_length must be positive, got {length}")
    if length is None or signal_len is None or step is None:
        return length, None
    if length > signal_len:
        raise err(f"STFT: frame_length {length} is longer than the signal ({signal_len})")
    return length, (signal_len - length) // step + 1


def _stft_shape(ctx, signal, frame_step, window=None, frame_length=None):
    if signal.shape is not None and len(signal.shape) != 3:
        raise ShapeInferenceError(f"STFT expects a signal of rank 3, got {signal.shape}")
    if window is not None and window.shape is not None and len(window.shape) != 1:
        raise ShapeInferenceError(f"STFT expects a 1-D window, got {window.shape}")
    sig = signal.shape if signal.shape is not None else (None, None, None)
    signal_len = sig[1] if isinstance(sig[1], int) else None
    window_len = None
    if window is not None:
        window_len = window.shape[0] if window.shape and isinstance(window.shape[0], int) else None
        window_known = window.shape is not None and window_len is not None
    else:
        window_known = True
    step = _known_int(frame_step, "STFT frame_step")
    length = _known_int(frame_length, "STFT frame_length") if frame_length is not None else None
    length_known = frame_length is None or length is not None
    if not (window_known and length_known):
        return [TensorInfo(signal.dtype, (sig[0], None, None, 2))]
    if frame_length is None and window is None and signal_len is None:
        return [TensorInfo(signal.dtype, (sig[0], None, None, 2))]
    n, frames = _stft_geometry(signal_len, step, window_len, length, ShapeInferenceError)
    onesided = bool(ctx.get("onesided", 1))
    bins = None if n is None else (n // 2 + 1 if onesided else n)
    return [TensorInfo(signal.dtype, (sig[0], frames, bins, 2))]


@kernel("STFT", since=17, shape=_stft_shape)
def stft(ctx, signal, frame_step, window=None, frame_length=None):
    if signal.ndim != 3:
        raise KernelError(f"STFT expects a signal of rank 3, got {signal.shape}")
    if window is not None and window.ndim != 1:
        raise KernelError(f"STFT expects a 1-D window, got {window.shape}")
    step = _scalar_int(frame_step, "STFT frame_step", KernelError)
    length = None if frame_length is None else _scalar_int(frame_length, "STFT frame_length",
                                                           KernelError)
    n, frames = _stft_geometry(signal.shape[1], step, None if window is None else window.shape[0],
                               length, KernelError)
    z = _to_complex(signal, "STFT", KernelError)  # (batch, signal_len)
    # (batch, frames, n): frame f starts at f * step
    framed = np.lib.stride_tricks.sliding_window_view(z, n, axis=1)[:, ::step][:, :frames]
    if window is not None:
        framed = framed * window.astype(np.float64)
    spectrum = np.fft.fft(framed, n=n, axis=-1)
    if ctx.get("onesided", 1):
        spectrum = spectrum[..., : n // 2 + 1]
    return _from_complex(spectrum, signal.dtype)


# --------------------------------------------------------------------------- windows


def _output_dtype(ctx, what: str, err, default: int = 1) -> np.dtype:
    code = int(ctx.get("output_datatype", default))
    dtype = to_numpy(code)
    if dtype is None or dtype.kind not in "iuf":
        raise err(f"{what}: output_datatype {onnx_type_name(code)} is not supported")
    return dtype


def _window_shape(what):
    def shape(ctx, size):
        dtype = _output_dtype(ctx, what, ShapeInferenceError)
        n = _known_int(size, f"{what} size")
        if n is not None and n < 0:
            raise ShapeInferenceError(f"{what}: size must be non-negative, got {n}")
        return [TensorInfo(dtype, (n,))]
    return shape


def _cosine_window(ctx, size, what: str, coefficients) -> np.ndarray:
    """sum_k (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric)."""
    dtype = _output_dtype(ctx, what, KernelError)
    n = _scalar_int(size, f"{what} size", KernelError)
    if n < 0:
        raise KernelError(f"{what}: size must be non-negative, got {n}")
    denominator = n if ctx.get("periodic", 1) else n - 1
    if denominator <= 0:  # a one-point symmetric window: the formula's 0/0 limit is the peak
        return np.ones(n, dtype=dtype)
    phase = 2 * np.pi * np.arange(n, dtype=np.float64) / denominator
    w = np.zeros(n, dtype=np.float64)
    for k, a in enumerate(coefficients):
        w += (-1) ** k * a * np.cos(k * phase)
    if dtype.kind in "iu":
        # integer windows truncate: go through float32 first, so that the peak of 1 that
        # float64 rounding leaves at 0.999... still truncates to 1, as onnxruntime has it
        return w.astype(np.float32).astype(dtype)
    return w.astype(dtype)


@kernel("HannWindow", since=17, shape=_window_shape("HannWindow"))
def hann_window(ctx, size):
    return _cosine_window(ctx, size, "HannWindow", (0.5, 0.5))


@kernel("HammingWindow", since=17, shape=_window_shape("HammingWindow"))
def hamming_window(ctx, size):
    return _cosine_window(ctx, size, "HammingWindow", (25 / 46, 21 / 46))


@kernel("BlackmanWindow", since=17, shape=_window_shape("BlackmanWindow"))
def blackman_window(ctx, size):
    return _cosine_window(ctx, size, "BlackmanWindow", (0.42, 0.5, 0.08))


# --------------------------------------------------------------------------- MelWeightMatrix


def _mel_shape(ctx, num_mel_bins, dft_length, sample_rate, lower, upper):
    dtype = _output_dtype(ctx, "MelWeightMatrix", ShapeInferenceError)
    bins = _known_int(num_mel_bins, "MelWeightMatrix num_mel_bins")
    n = _known_int(dft_length, "MelWeightMatrix dft_length")
    return [TensorInfo(dtype, (None if n is None else n // 2 + 1, bins))]


def _scalar_float(value, what: str) -> np.ndarray:
    value = np.asarray(value)
    if value.size != 1 or value.dtype.kind != "f":
        raise KernelError(f"{what} must be a floating-point scalar, got {value.dtype}{list(value.shape)}")
    return value.reshape(-1)[0]


@kernel("MelWeightMatrix", since=17, shape=_mel_shape)
def mel_weight_matrix(ctx, num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                      upper_edge_hertz):
    dtype = _output_dtype(ctx, "MelWeightMatrix", KernelError)
    bins = _scalar_int(num_mel_bins, "MelWeightMatrix num_mel_bins", KernelError)
    n = _scalar_int(dft_length, "MelWeightMatrix dft_length", KernelError)
    rate = _scalar_int(sample_rate, "MelWeightMatrix sample_rate", KernelError)
    if bins <= 0 or n <= 0 or rate <= 0:
        raise KernelError(f"MelWeightMatrix: num_mel_bins ({bins}), dft_length ({n}) and "
                          f"sample_rate ({rate}) must be positive")
    lower = _scalar_float(lower_edge_hertz, "MelWeightMatrix lower_edge_hertz")
    upper = _scalar_float(upper_edge_hertz, "MelWeightMatrix upper_edge_hertz")
    if not 0 <= lower < upper:
        raise KernelError(f"MelWeightMatrix: need 0 <= lower_edge_hertz < upper_edge_hertz, "
                          f"got {lower} and {upper}")
    # Band edges: num_mel_bins + 2 points evenly spaced on the mel scale (the step divides
    # the range by the point count, as ONNX's definition does), mapped to spectrogram bins.
    # The mel edges are computed in the edges' own precision, as ONNX's definition does.
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    points = np.arange(bins + 2)
    mel = points * ((high_mel - low_mel) / (bins + 2)) + low_mel
    hertz = 700 * np.expm1(mel / 2595 * np.log(10))
    edges = ((n + 1) * hertz // rate).astype(np.int64)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(n // 2 + 1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rising = (j - left) / (center - left)
        falling = (right - j) / (right - center)
    out = np.zeros((n // 2 + 1, bins), dtype=np.float64)
    out = np.where((j >= left) & (j <= center) & (center > left), rising, out)
    out = np.where((j == center) & (center == left), 1.0, out)
    out = np.where((j >= center) & (j < right), falling, out)
    return out.astype(dtype)
