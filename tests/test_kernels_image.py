"""ImageDecoder: images encoded here, by small writers that follow each format's
specification, must decode to the very pixels that were written (the oracle), through
both nncc routes. ONNX's node cases cover files written by other encoders.

onnxruntime has no ImageDecoder kernel, and nncc decodes with Pillow, as ONNX's reference
evaluator does; so the oracle is never Pillow's decoding but the pixels written, for the
lossless formats, and libjpeg-turbo's djpeg's decoding of the streams in tests/data/jpeg.
Where a stream is damaged, the reference evaluator is the oracle.
"""

from __future__ import annotations

import io
import os
import pathlib
import struct
import subprocess
import sys
import sysconfig
import zlib

import numpy as np
import pytest

from nncc.errors import ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from tests.one_node import check_against  # skips this module where onnx is missing

from onnx.reference.ops.op_image_decoder import ImageDecoder as ReferenceImageDecoder  # noqa: E402
from PIL import Image  # noqa: E402 - writes the streams no small writer here makes

rng = np.random.default_rng(3)


def decode(data: bytes, pixel_format="RGB"):
    return resolve("ImageDecoder", "", 20).fn(Ctx({"pixel_format": pixel_format}, 20),
                                              np.frombuffer(data, dtype=np.uint8).copy())


def check(data: bytes, expected: np.ndarray, pixel_format="RGB"):
    stream = np.frombuffer(data, dtype=np.uint8).copy()
    check_against([expected], "ImageDecoder", [stream], 20, {"pixel_format": pixel_format})


def smooth_image(h, w, c, top=255):
    """Gradients plus noise: neighbouring pixels are close, as the row filters expect."""
    y, x = np.mgrid[0:h, 0:w]
    base = (x[..., None] * 7 + y[..., None] * 5 + np.arange(c) * 40) % (top + 1)
    noise = rng.integers(0, 4, (h, w, c))
    return np.minimum(base + noise, top)


# --------------------------------------------------------------------------- PNG writer


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def _filter_rows(rows: np.ndarray, bpp: int, filters) -> bytes:
    """Apply PNG filter filters[y % len] to each row of raw bytes (rows, row_bytes)."""
    out = []
    prior = np.zeros(rows.shape[1], dtype=np.int32)
    for y, row in enumerate(rows.astype(np.int32)):
        kind = filters[y % len(filters)]
        left = np.concatenate([np.zeros(bpp, np.int32), row[:-bpp]])
        upleft = np.concatenate([np.zeros(bpp, np.int32), prior[:-bpp]])
        predictor = {0: 0, 1: left, 2: prior, 3: (left + prior) // 2,
                     4: _paeth(left, prior, upleft)}[kind]
        out.append(bytes([kind]) + ((row - predictor) % 256).astype(np.uint8).tobytes())
        prior = row
    return b"".join(out)


def _raw_rows(samples: np.ndarray, depth: int) -> np.ndarray:
    h, w, c = samples.shape
    if depth == 8:
        return samples.reshape(h, w * c).astype(np.uint8)
    if depth == 16:
        return samples.astype(">u2").view(np.uint8).reshape(h, w * c * 2)
    bits = (samples.reshape(h, w * c)[..., None] >> np.arange(depth - 1, -1, -1)) & 1
    return np.packbits(bits.reshape(h, -1).astype(np.uint8), axis=1)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2))


def write_png(samples, color, depth, filters=(0, 1, 2, 3, 4), interlace=0, palette=None,
              split_idat=False):
    h, w, c = samples.shape
    bpp = max(1, c * depth // 8)
    if interlace:
        data = b"".join(_filter_rows(_raw_rows(samples[y0::dy, x0::dx], depth), bpp, filters)
                        for x0, y0, dx, dy in ADAM7 if x0 < w and y0 < h)
    else:
        data = _filter_rows(_raw_rows(samples, depth), bpp, filters)
    compressed = zlib.compress(data)
    png = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, 0,
                                                             0, interlace))
    if palette is not None:
        png += _chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    if split_idat:
        half = len(compressed) // 2
        png += _chunk(b"IDAT", compressed[:half]) + _chunk(b"IDAT", compressed[half:])
    else:
        png += _chunk(b"IDAT", compressed)
    return png + _chunk(b"IEND", b"")


# --------------------------------------------------------------------------- PNG


@pytest.mark.parametrize("filters", [(0,), (1,), (2,), (3,), (4,), (4, 4, 1, 2, 3, 0)])
@pytest.mark.parametrize("interlace", [0, 1])
def test_png_rgb_every_filter(filters, interlace):
    image = smooth_image(13, 11, 3).astype(np.uint8)
    check(write_png(image, 2, 8, filters, interlace, split_idat=True), image)
    check(write_png(image, 2, 8, filters, interlace), image[..., ::-1], "BGR")


@pytest.mark.parametrize("depth", [1, 2, 4, 8, 16])
def test_png_gray_depths(depth):
    top = (1 << depth) - 1
    samples = smooth_image(9, 13, 1, top)
    expected = samples >> 8 if depth == 16 else samples * (255 // top)
    data = write_png(samples, 0, depth, interlace=depth % 2)
    check(data, expected.astype(np.uint8), "Grayscale")
    check(data, np.repeat(expected, 3, axis=-1).astype(np.uint8), "RGB")


@pytest.mark.parametrize("depth", [1, 2, 4, 8])
def test_png_palette(depth):
    palette = rng.integers(0, 256, (1 << depth, 3))
    index = rng.integers(0, 1 << depth, (7, 10, 1))
    check(write_png(index, 3, depth, palette=palette), palette[index[..., 0]].astype(np.uint8))


@pytest.mark.parametrize("color,channels", [(4, 2), (6, 4), (2, 3)])
def test_png_alpha_dropped_and_16_bit_color(color, channels):
    samples = smooth_image(6, 5, channels, 65535 if color == 2 else 255)
    depth = 16 if color == 2 else 8
    expected = (samples >> 8 if depth == 16 else samples)[..., :1 if color == 4 else 3]
    if color == 4:
        expected = np.repeat(expected, 3, axis=-1)
    check(write_png(samples, color, depth), expected.astype(np.uint8))


def test_grayscale_from_color_uses_601_luma():
    image = rng.integers(0, 256, (8, 9, 3)).astype(np.uint8)
    got = decode(write_png(image, 2, 8), "Grayscale")
    luma = image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert got.shape == (8, 9, 1) and got.dtype == np.uint8
    # fixed-point rounding may differ from the real-valued formula by one level
    assert np.abs(got[..., 0].astype(int) - np.rint(luma).astype(int)).max() <= 1


def test_corrupt_png_gives_an_empty_image():
    data = bytearray(write_png(smooth_image(4, 4, 3).astype(np.uint8), 2, 8))
    data[40] ^= 0xFF  # inside IDAT: the CRC no longer matches
    assert decode(bytes(data)).shape == (0, 0, 3)
    assert decode(bytes(data[:30]), "Grayscale").shape == (0, 0, 1)
    assert decode(b"not an image at all").shape == (0, 0, 3)


# --------------------------------------------------------------------------- BMP


def write_bmp(rgb, depth=24, top_down=False, palette=None, index=None, bitfields=None):
    h, w = (index if index is not None else rgb).shape[:2]
    if depth <= 8:
        bits = (index[..., None] >> np.arange(depth - 1, -1, -1)) & 1
        rows = np.packbits(bits.reshape(h, -1).astype(np.uint8), axis=1)
        table = np.concatenate([palette[:, ::-1], np.zeros((len(palette), 1))], axis=1)
        extra = table.astype(np.uint8).tobytes()
        colors = len(palette)
    elif depth == 24:
        rows = rgb[..., ::-1].reshape(h, w * 3).astype(np.uint8)
        extra, colors = b"", 0
    else:  # 16 or 32 bits with explicit masks
        masks, widths = bitfields
        value = np.zeros((h, w), dtype=np.uint32)
        for channel, (mask, bits) in enumerate(zip(masks, widths)):
            shift = (mask & -mask).bit_length() - 1
            value |= (rgb[..., channel].astype(np.uint32) >> (8 - bits)) << shift
        rows = value.astype("<u2" if depth == 16 else "<u4").view(np.uint8).reshape(h, -1)
        extra, colors = struct.pack("<III", *masks), 0
    stride = (rows.shape[1] + 3) // 4 * 4
    padded = np.zeros((h, stride), dtype=np.uint8)
    padded[:, :rows.shape[1]] = rows
    if not top_down:
        padded = padded[::-1]
    offset = 14 + 40 + len(extra)
    compression = 3 if depth in (16, 32) else 0
    header = struct.pack("<2sIHHI", b"BM", offset + padded.size, 0, 0, offset)
    info = struct.pack("<IiiHHIIiiII", 40, w, -h if top_down else h, 1, depth, compression,
                       padded.size, 2835, 2835, colors, 0)
    return header + info + extra + padded.tobytes()


@pytest.mark.parametrize("top_down", [False, True])
def test_bmp_24_bit(top_down):
    image = rng.integers(0, 256, (5, 7, 3)).astype(np.uint8)  # 21-byte rows: padded to 24
    check(write_bmp(image, top_down=top_down), image)


@pytest.mark.parametrize("depth", [1, 4, 8])
def test_bmp_palette(depth):
    palette = rng.integers(0, 256, (1 << depth, 3))
    index = rng.integers(0, 1 << depth, (6, 9))
    check(write_bmp(None, depth, palette=palette, index=index),
          palette[index].astype(np.uint8))


@pytest.mark.parametrize("depth,masks,widths", [
    (16, (0xF800, 0x07E0, 0x001F), (5, 6, 5)),
    (32, (0x00FF0000, 0x0000FF00, 0x000000FF), (8, 8, 8))])
def test_bmp_bit_fields(depth, masks, widths):
    image = rng.integers(0, 256, (4, 6, 3)).astype(np.uint8)
    # each channel keeps its top bits, stretched back to the full 8-bit range
    reduced = [(image[..., i].astype(int) >> (8 - b)) for i, b in enumerate(widths)]
    expected = np.stack([r * 255 // ((1 << b) - 1) for r, b in zip(reduced, widths)], axis=-1)
    check(write_bmp(image, depth, bitfields=(masks, widths)), expected.astype(np.uint8))


# --------------------------------------------------------------------------- PNM


def test_pnm_binary_and_plain_formats():
    rgb = rng.integers(0, 256, (3, 4, 3)).astype(np.uint8)
    gray = rng.integers(0, 256, (3, 4, 1)).astype(np.uint8)
    bits = rng.integers(0, 2, (3, 10)).astype(np.uint8)
    white_black = ((1 - bits) * 255).astype(np.uint8)[..., None]  # 1 is black
    check(b"P6\n# a comment\n4 3\n255\n" + rgb.tobytes(), rgb)
    check(b"P5 4 3 255\n" + gray.tobytes(), gray, "Grayscale")
    check(b"P3\n4 3\n255\n" + " ".join(map(str, rgb.reshape(-1))).encode(), rgb)
    check(b"P2\n4 3\n255\n" + "\n".join(map(str, gray.reshape(-1))).encode(), gray,
          "Grayscale")
    check(b"P4\n10 3\n" + np.packbits(bits, axis=1).tobytes(), white_black, "Grayscale")
    check(b"P1\n10 3\n" + "".join(map(str, bits.reshape(-1))).encode(), white_black,
          "Grayscale")


def test_pnm_other_maxvals_are_scaled():
    values = np.array([0, 1, 2, 3, 7, 15], dtype=np.uint8).reshape(1, 6, 1)
    check(b"P5 6 1 15\n" + values.tobytes(), (values.astype(int) * 255 // 15).astype(np.uint8),
          "Grayscale")
    wide = np.array([0, 256, 65535, 32768], dtype=">u2").reshape(1, 4, 1)
    check(b"P5 4 1 65535\n" + wide.tobytes(), (wide >> 8).astype(np.uint8), "Grayscale")


# --------------------------------------------------------------------------- TIFF


def lzw_encode(data: bytes) -> bytes:
    """TIFF LZW as libtiff writes it: a clear code first, codes widen as soon as the next
    entry would not fit (one code early), a clear when the table is full, then end."""
    codes, width = [(256, 9)], 9
    table, free = {bytes([i]): i for i in range(256)}, 258

    def emitted():  # the decoder adds an entry for every code after the first
        nonlocal free, width, table
        free += 1
        if free == 4094:
            codes.append((256, width))
            table, free, width = {bytes([i]): i for i in range(256)}, 258, 9
            return True
        if free > (1 << width) - 1:
            width += 1
        return False

    current = b""
    for byte in data:
        longer = current + bytes([byte])
        if longer in table:
            current = longer
            continue
        codes.append((table[current], width))
        code = free
        if not emitted():
            table[longer] = code
        current = bytes([byte])
    if current:
        codes.append((table[current], width))
        emitted()
    codes.append((257, width))
    value = 0
    bits = 0
    for code, size in codes:
        value = (value << size) | code
        bits += size
    value <<= (-bits) % 8
    return value.to_bytes((bits + 7) // 8, "big")


def write_tiff(samples, photometric, compression=1, predictor=1, order="<", rows_per_strip=2,
               colormap=None, depth=8):
    h, w, spp = samples.shape
    raw = samples.astype(np.uint16 if depth == 16 else np.uint8)
    if predictor == 2:  # differences wrap around, as unsigned samples do
        raw = np.concatenate([raw[:, :1], np.diff(raw, axis=1)], axis=1)
    raw = raw.astype(order + ("u2" if depth == 16 else "u1"))
    strips = []
    for y in range(0, h, rows_per_strip):
        chunk = raw[y:y + rows_per_strip].tobytes()
        if compression == 8:
            chunk = zlib.compress(chunk)
        elif compression == 5:
            chunk = lzw_encode(chunk)
        elif compression == 32773:  # PackBits, literal runs of up to 128 bytes
            chunk = b"".join(bytes([len(chunk[i:i + 128]) - 1]) + chunk[i:i + 128]
                             for i in range(0, len(chunk), 128))
        strips.append(chunk)
    entries = [(256, 4, [w]), (257, 4, [h]), (258, 3, [depth] * spp), (259, 3, [compression]),
               (262, 3, [photometric]), (273, 4, None), (277, 3, [spp]),
               (278, 4, [rows_per_strip]), (279, 4, [len(s) for s in strips]),
               (317, 3, [predictor])]
    if colormap is not None:
        entries.append((320, 3, list(colormap.T.reshape(-1))))
    data = bytearray(order.encode() == b"<" and b"II*\x00" or b"MM\x00*")
    data += struct.pack(order + "I", 0)
    blobs = {}
    for tag, kind, values in entries:  # values longer than 4 bytes go before the IFD
        if values is not None and len(values) * (2 if kind == 3 else 4) > 4:
            blobs[tag] = len(data)
            data += struct.pack(order + ("H" if kind == 3 else "I") * len(values), *values)
    strip_offsets = []
    for s in strips:
        strip_offsets.append(len(data))
        data += s
    if len(strips) > 1:
        blobs[273] = len(data)
        data += struct.pack(order + "I" * len(strips), *strip_offsets)
    entries[5] = (273, 4, strip_offsets)
    ifd = len(data)
    data[4:8] = struct.pack(order + "I", ifd)
    data += struct.pack(order + "H", len(entries))
    for tag, kind, values in entries:
        code = "H" if kind == 3 else "I"
        if tag in blobs:
            data += struct.pack(order + "HHII", tag, kind, len(values), blobs[tag])
        else:
            inline = struct.pack(order + code * len(values), *values).ljust(4, b"\x00")
            data += struct.pack(order + "HHI", tag, kind, len(values)) + inline
    return bytes(data + struct.pack(order + "I", 0))


# the horizontal predictor is defined for LZW and Deflate only
@pytest.mark.parametrize("compression,predictor", [(1, 1), (5, 1), (8, 1), (32773, 1), (5, 2),
                                                   (8, 2)])
@pytest.mark.parametrize("order", ["<", ">"])
def test_tiff_rgb_strips(compression, predictor, order):
    image = smooth_image(7, 9, 3).astype(np.uint8)
    check(write_tiff(image, 2, compression, predictor, order), image)


def test_tiff_gray_palette_and_16_bit():
    gray = smooth_image(5, 6, 1).astype(np.uint8)
    check(write_tiff(gray, 1), gray, "Grayscale")
    check(write_tiff(gray, 0), 255 - gray, "Grayscale")  # white is zero
    colormap = rng.integers(0, 65536, (256, 3))
    index = rng.integers(0, 256, (4, 5, 1))
    check(write_tiff(index, 3, colormap=colormap),
          (colormap[index[..., 0]] >> 8).astype(np.uint8))
    wide = smooth_image(3, 4, 3, 65535)
    check(write_tiff(wide, 2, order=">", depth=16, compression=8, predictor=2),
          (wide >> 8).astype(np.uint8))


def test_lzw_tiff_fills_and_clears_its_table():
    # noise compresses badly: the 4094-entry table fills and is cleared several times
    noisy = rng.integers(0, 256, (60, 70, 3)).astype(np.uint8)
    check(write_tiff(noisy, 2, compression=5, rows_per_strip=60), noisy)


# --------------------------------------------------------------------------- files from elsewhere

SAMPLES = pathlib.Path(sysconfig.get_paths()["stdlib"]) / "test" / "imghdrdata"


@pytest.mark.skipif(not (SAMPLES / "python.png").exists(),
                    reason="this Python installation ships without its test package images")
def test_one_picture_written_by_other_encoders_decodes_alike():
    """CPython's test data holds one 16x16 picture written by other encoders as PNG
    (palette), BMP, PPM and TIFF (with alpha): all four must give the same pixels."""
    pictures = {name: (SAMPLES / f"python.{name}").read_bytes()
                for name in ("png", "bmp", "ppm", "tiff")}
    expected = decode(pictures["png"])
    assert expected.shape == (16, 16, 3) and 0 < expected.mean() < 255
    for name in ("bmp", "ppm", "tiff"):
        check(pictures[name], expected)


# --------------------------------------------------------------------------- JPEG

JPEGS = pathlib.Path(__file__).resolve().parent / "data" / "jpeg"
# Each NAME.jpg was written by libjpeg-turbo 2.1.5's cjpeg from a small synthetic image
# (37x23 gradients, a sharp-edged block and noise; tiny_* are random pixels), with the
# options below; NAME.pnm beside it is that library's `djpeg -dct int -pnm` output: an
# independent decoder's pixels, which nncc must reproduce exactly.
JPEG_FIXTURES = {
    "color_420": "-quality 85 -sample 2x2",
    "color_422": "-quality 85 -sample 2x1",
    "color_444": "-quality 85 -sample 1x1",
    "color_440": "-quality 85 -sample 1x2",
    "color_411": "-quality 85 -sample 4x1",
    "color_420_q100_optimized_restart_each_row": "-quality 100 -sample 2x2 -optimize -restart 1",
    "color_420_restart_every_3_mcus": "-quality 70 -sample 2x2 -restart 3B",
    "color_420_one_scan_per_component": "-quality 85 -scans FILE, FILE holding '0; 1; 2;'",
    "gray": "-quality 85 -grayscale",
    "gray_optimized_restart_every_2_mcus": "-quality 85 -grayscale -restart 2B -optimize",
    "tiny_3x3_420": "-quality 90 -sample 2x2",  # chroma 2 wide: no triangle filter across
    "tiny_17x1_420": "-quality 90 -sample 2x2",
    "tiny_5x3_422": "-quality 90 -sample 2x1",
    "tiny_9x2_4x2": "-quality 90 -sample 4x2",
    "rgb_adobe": "-quality 85 -rgb (its Adobe marker says the components are RGB)",
    "rgb_component_ids": "rgb_adobe without its Adobe marker: only the ids 'R', 'G', 'B' say so",
    # progressive: cjpeg's default scans split DC from AC bands and refine both bit by bit
    "color_420_progressive": "-quality 85 -progressive",
    "gray_progressive": "-quality 85 -progressive -grayscale",
    "color_422_progressive_restart_every_2_mcus":
        "-quality 95 -progressive -restart 2B -sample 2x1",
    "color_444_progressive_optimized": "-quality 95 -progressive -optimize -sample 1x1",
    "tiny_17x1_420_progressive": "-quality 85 -progressive",
}


def read_pnm(data: bytes) -> np.ndarray:
    """A binary 8-bit PGM/PPM with a plain header (as djpeg writes them), parsed here so the
    oracle does not go through nncc's own PNM decoder."""
    magic, width, height, top, pixels = data.split(maxsplit=4)
    assert magic in (b"P5", b"P6") and top == b"255"
    channels = 3 if magic == b"P6" else 1
    return np.frombuffer(pixels, np.uint8).reshape(int(height), int(width), channels)


@pytest.mark.parametrize("name", sorted(JPEG_FIXTURES))
def test_baseline_jpeg_decodes_to_libjpeg_pixels(name):
    data = (JPEGS / f"{name}.jpg").read_bytes()
    expected = read_pnm((JPEGS / f"{name}.pnm").read_bytes())
    if expected.shape[-1] == 1:
        check(data, expected, "Grayscale")
        check(data, np.repeat(expected, 3, axis=-1))
    else:
        check(data, expected)
        check(data, expected[..., ::-1], "BGR")


def test_arithmetic_coded_jpeg_decodes_to_the_huffman_coded_pixels():
    # written by cjpeg -quality 85 -arithmetic from color_420's image: the same
    # coefficients, entropy-coded otherwise, so djpeg's pixels for color_420 are the oracle
    check((JPEGS / "arithmetic.jpg").read_bytes(), read_pnm((JPEGS / "color_420.pnm").read_bytes()))


@pytest.mark.parametrize("cut", [2, 40, 200, 600])
def test_truncated_jpeg_gives_an_empty_image(cut):
    data = (JPEGS / "color_420.jpg").read_bytes()[:cut]
    assert decode(data).shape == (0, 0, 3)


def test_jpeg_without_its_end_marker_is_a_truncated_stream():
    data = (JPEGS / "color_420.jpg").read_bytes()
    assert data.endswith(b"\xff\xd9")
    assert decode(data[:-2]).shape == (0, 0, 3)


def test_jpeg_header_claiming_more_blocks_than_its_data_holds_gives_an_empty_image():
    data = bytearray((JPEGS / "color_420.jpg").read_bytes())
    frame = data.index(b"\xff\xc0")
    data[frame + 5:frame + 9] = b"\xff\xff\xff\xff"  # 65535 x 65535 pixels
    assert decode(bytes(data)).shape == (0, 0, 3)


def test_jpeg_with_corrupt_scan_data_decodes_as_the_reference_evaluator_does():
    data = bytearray((JPEGS / "color_420.jpg").read_bytes())
    scan = data.index(b"\xff\xda")
    data[scan + 14:scan + 30] = b"\xfe" * 16  # codes that run past the 64 coefficients of a block
    stream = np.frombuffer(bytes(data), dtype=np.uint8)
    expected = ReferenceImageDecoder.eval(stream)  # libjpeg decodes on, with a warning
    assert expected.shape == (23, 37, 3)
    check(bytes(data), expected)


# --------------------------------------------------------------------------- other formats


# Lossless WebP and JPEG 2000 have no small writer here: Pillow writes them, and the
# pixels written are the oracle (lossy ones are ONNX's node cases, against stored outputs)
@pytest.mark.parametrize("save_as", [{"format": "WEBP", "lossless": True},
                                     {"format": "JPEG2000", "irreversible": False}])
def test_lossless_webp_and_jpeg_2000(save_as):
    image = smooth_image(9, 11, 3).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(image, "RGB").save(out, **save_as)
    check(out.getvalue(), image)
    check(out.getvalue(), image[..., ::-1], "BGR")


def test_formats_the_operator_does_not_list_give_an_empty_image():
    # a well-formed GIF, and PostScript (which Pillow would hand to Ghostscript)
    gif = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff,\x00\x00\x00\x00"
           b"\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")
    assert decode(gif).shape == (0, 0, 3)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 1 1\nshowpage\n"
    assert decode(eps, "Grayscale").shape == (0, 0, 1)


def test_without_pillow_an_image_decoder_model_fails_naming_the_extra(tmp_path):
    """Pillow made unimportable for one real `nncc run`: one line naming the extra, exit 2."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("ImageDecoder", ["stream"], ["pixels"])], "g",
        [helper.make_tensor_value_info("stream", onnx.TensorProto.UINT8, [None])],
        [helper.make_tensor_value_info("pixels", onnx.TensorProto.UINT8, [None, None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    (tmp_path / "decoder.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / "stream.npy", np.frombuffer(b"P5 1 1 255\n\x07", dtype=np.uint8))
    blocker = tmp_path / "no_pillow" / "PIL"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('Pillow is blocked for this test')\n")
    env = dict(os.environ, NNCC_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "nncc", "-q", "run", str(tmp_path / "decoder.onnx"),
                             "--input", f"stream={tmp_path / 'stream.npy'}"],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nncc: error:"), result.stderr
    assert "pip install 'nncc[image]'" in lines[0]


def test_shape_function_and_attributes():
    shape = resolve("ImageDecoder", "", 20).shape
    stream = TensorInfo(np.dtype(np.uint8), (None,))
    assert shape(Ctx({}, 20), stream)[0].shape == (None, None, 3)
    assert shape(Ctx({"pixel_format": "Grayscale"}, 20), stream)[0].shape == (None, None, 1)
    with pytest.raises(ShapeInferenceError, match="pixel_format"):
        shape(Ctx({"pixel_format": "RGBA"}, 20), stream)
