"""ImageDecoder (opset 20): encoded image bytes to an (H, W, C) uint8 array, decoded by
Pillow.

Pillow is an optional extra (nncc[image]), imported only when an ImageDecoder runs, so
models without one never need it. Only the formats the operator lists are opened (BMP,
JPEG, JPEG 2000, TIFF, PNG, WebP and PNM): Pillow's other plugins, some of which hand the
stream to outside programs, never see an untrusted model's bytes.

Colors follow ONNX's reference evaluator, which decodes with Pillow too: RGB and BGR are
Pillow's RGB conversion (alpha dropped, palettes expanded), Grayscale its L conversion
(ITU-R 601-2 luma). Samples wider than 8 bits keep their high byte. A stream that is not
a well-formed image in one of those formats yields an empty (0, 0, C) image, as the
operator specifies; so does one whose header claims more pixels than Pillow's
decompression-bomb limit, before anything of that size is allocated.
"""

from __future__ import annotations

import io

import numpy as np

from nncc.errors import KernelError, MissingDependencyError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel

_FORMATS = ("RGB", "BGR", "Grayscale")
# Pillow's names for the formats the operator lists (PPM also reads PBM and PGM)
_PILLOW_FORMATS = ("BMP", "JPEG", "JPEG2000", "TIFF", "PNG", "WEBP", "PPM")
# Pillow modes of 16-bit grays (older Pillows open them as 32-bit "I")
_WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _pillow():
    try:
        from PIL import Image  # lazy: optional extra
    except ImportError:
        raise MissingDependencyError(
            "this model decodes images (ImageDecoder), which needs Pillow: "
            "pip install 'nncc[image]'") from None
    return Image


def _narrowed(image, Image):
    """An image Pillow converts to RGB or L as it is: wider samples become their high
    byte, and a palette with transparency goes through RGBA (as Pillow asks, warning)."""
    if image.mode == "P" and "transparency" in image.info:
        return image.convert("RGBA")
    if image.mode not in _WIDE_MODES:
        return image
    samples = np.asarray(image).astype(np.int64) >> 8
    return Image.fromarray(np.clip(samples, 0, 255).astype(np.uint8), "L")


def decode_image(data: bytes, pixel_format: str) -> np.ndarray | None:
    """(H, W, C) uint8 pixels in `pixel_format`, or None when `data` is not a well-formed
    image in one of the operator's formats."""
    Image = _pillow()
    try:
        with Image.open(io.BytesIO(data), formats=_PILLOW_FORMATS) as image:
            image = _narrowed(image, Image)
            pixels = np.asarray(image.convert("L" if pixel_format == "Grayscale" else "RGB"))
    except Exception:  # noqa: BLE001 - whatever Pillow raises, these bytes are no image
        return None
    if pixel_format == "Grayscale":
        return pixels[..., None]
    return pixels[..., ::-1] if pixel_format == "BGR" else pixels


def _pixel_format(ctx, err) -> str:
    pixel_format = ctx.get("pixel_format", "RGB")
    if pixel_format not in _FORMATS:
        raise err(f"ImageDecoder: unknown pixel_format {pixel_format!r} "
                  f"(expected one of {', '.join(_FORMATS)})")
    return pixel_format


def _decoder_shape(ctx, encoded):
    pixel_format = _pixel_format(ctx, ShapeInferenceError)
    if encoded.shape is not None and len(encoded.shape) != 1:
        raise ShapeInferenceError(f"ImageDecoder expects a 1-D stream, got {encoded.shape}")
    return [TensorInfo(np.dtype(np.uint8), (None, None, 1 if pixel_format == "Grayscale" else 3))]


@kernel("ImageDecoder", since=20, shape=_decoder_shape)
def image_decoder(ctx, encoded):
    pixel_format = _pixel_format(ctx, KernelError)
    if encoded.dtype != np.uint8 or encoded.ndim != 1:
        raise KernelError(f"ImageDecoder expects a 1-D uint8 stream, got "
                          f"{encoded.dtype}{list(encoded.shape)}")
    pixels = decode_image(encoded.tobytes(), pixel_format)
    if pixels is None:
        return np.zeros((0, 0, 1 if pixel_format == "Grayscale" else 3), dtype=np.uint8)
    return np.ascontiguousarray(pixels)
