"""ImageDecoder (opset 20): encoded image bytes to an (H, W, C) uint8 array.

Decoded here, with the standard library and numpy only: PNG (every color type and bit
depth, Adam7 interlacing), BMP (1/2/4/8-bit palettes, 16/24/32-bit, bit fields), PNM
(P1-P6), TIFF (strips; uncompressed, LZW, Deflate or PackBits; horizontal predictor) and
JPEG (8-bit Huffman-coded, baseline or progressive: nncc/kernels/jpeg.py). JPEG 2000, WebP
and GIF need codecs nncc does not include: such a stream is refused with a clear error
rather than answered with a wrong or empty image.
A stream that is not a well-formed image yields an empty (0, 0, C) image, as the
operator specifies.

Alpha channels are dropped; 16-bit samples keep their high byte; Grayscale from color
uses the ITU-R 601 luma weights in 16-bit fixed point, rounded. PNG's Average and Paeth
row filters need the pixel just decoded to their left, so such images are decoded one
anti-diagonal of pixels at a time. LZW is sequential by nature (each code extends the
table the next one reads) and runs one code at a time; every other step works on whole
rows or images.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.jpeg import JpegCorrupt, decode_jpeg
from nncc.kernels.registry import kernel

_FORMATS = ("RGB", "BGR", "Grayscale")


class _Corrupt(Exception):
    """The stream is not a well-formed image of the format its signature names."""


_SUPPORTED = "PNG, BMP, PNM, JPEG and uncompressed, LZW, Deflate or PackBits TIFF"


def _unsupported(what: str) -> KernelError:
    return KernelError(f"ImageDecoder: {what} is not supported (nncc decodes {_SUPPORTED})")


def _needs_codec(name: str) -> KernelError:
    return KernelError(f"ImageDecoder: {name} images need a full codec, which nncc does not "
                       f"include (it decodes {_SUPPORTED})")


def _need(condition: bool, why: str = "") -> None:
    if not condition:
        raise _Corrupt(why)


# --------------------------------------------------------------------------- PNG

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# Adam7 passes: (first column, first row, column step, row step)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))


def _png_chunks(data: bytes):
    pos = len(_PNG_SIGNATURE)
    while pos < len(data):
        _need(pos + 12 <= len(data), "truncated chunk")
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        end = pos + 8 + length
        _need(end + 4 <= len(data), "truncated chunk")
        body = data[pos + 8:end]
        (crc,) = struct.unpack(">I", data[end:end + 4])
        _need(zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind!r}")
        yield kind, body
        if kind == b"IEND":
            return
        pos = end + 4
    raise _Corrupt("no IEND chunk")


def _unfilter_diagonals(kinds: np.ndarray, data: np.ndarray, bpp: int) -> np.ndarray:
    """Undo any mix of row filters, Average and Paeth included, whose bytes depend on the
    decoded pixel to their left as well as on the row above: all pixels on one
    anti-diagonal (row + column constant) depend only on earlier diagonals, so each step
    decodes a whole diagonal, and the image takes rows + columns - 1 steps.

    The image is sheared and stored diagonal-major: pixel (y, x) sits at [y + x, y], so a
    diagonal is one contiguous slice, the left and upper neighbours of its pixels are in
    the previous diagonal (rows y and y - 1) and the upper-left ones two diagonals back."""
    rows, row_bytes = data.shape
    pixels = row_bytes // bpp  # whole pixels; a byte is the unit below 8 bits per pixel
    diagonals = rows + pixels - 1
    ys, xs = np.arange(rows)[:, None], np.arange(pixels)[None, :]
    filtered = np.zeros((diagonals, rows, bpp), dtype=np.uint8)
    filtered[ys + xs, ys] = data.reshape(rows, pixels, bpp)
    # decoded: two zero diagonals before, a zero row above; cells outside the image are
    # never written and read as the zero border
    out = np.zeros((diagonals + 2, rows + 1, bpp), dtype=np.uint8)  # int16 only per step
    # per row, 0/1 weights selecting its filter's predictor
    sub, up_, average, paeth_ = ((kinds == k).astype(np.int16)[:, None] for k in (1, 2, 3, 4))
    for d in range(diagonals):
        lo, hi = max(0, d - pixels + 1), min(rows, d + 1)
        before = out[d + 1, lo:hi + 1].astype(np.int16)
        left, up, corner = before[1:], before[:-1], out[d, lo:hi].astype(np.int16)
        to_left = np.abs(up - corner)  # |(left + up - corner) - left|
        to_up = np.abs(left - corner)
        to_corner = np.abs(left + up - 2 * corner)
        paeth = np.where((to_left <= to_up) & (to_left <= to_corner), left,
                         np.where(to_up <= to_corner, up, corner))
        predicted = (sub[lo:hi] * left + up_[lo:hi] * up
                     + average[lo:hi] * ((left + up) >> 1) + paeth_[lo:hi] * paeth)
        out[d + 2, lo + 1:hi + 1] = (filtered[d, lo:hi] + predicted) & 0xFF
    return out[ys + xs + 2, ys + 1].reshape(rows, row_bytes)


def _png_unfilter(raw: np.ndarray, rows: int, row_bytes: int, bpp: int) -> np.ndarray:
    """Undo the per-row filters of one (sub)image. Without Average or Paeth rows, each run
    of equal filters goes at once; with them, the image goes one diagonal at a time."""
    _need(raw.size >= rows * (row_bytes + 1), "image data too short")
    lines = raw[:rows * (row_bytes + 1)].reshape(rows, row_bytes + 1)
    kinds, data = lines[:, 0], lines[:, 1:]
    _need(bool(np.all(kinds <= 4)), "unknown filter type")
    if np.any(kinds >= 3):
        return _unfilter_diagonals(kinds, data, bpp)
    out = np.empty((rows, row_bytes), dtype=np.uint8)
    prior = np.zeros(row_bytes, dtype=np.uint8)
    starts = np.flatnonzero(np.diff(kinds.astype(np.int16), prepend=-1))
    for start, stop in zip(starts, list(starts[1:]) + [rows]):
        kind, block = int(kinds[start]), data[start:stop]
        if kind == 0:
            out[start:stop] = block
        elif kind == 1:  # Sub: a running sum along each byte lane of a row
            lanes = block.reshape(stop - start, -1, bpp)
            out[start:stop] = np.cumsum(lanes, axis=1, dtype=np.uint8).reshape(stop - start, -1)
        else:  # Up: a running sum down the columns, from the row before the run
            out[start:stop] = np.cumsum(block, axis=0, dtype=np.uint8) + prior
        prior = out[stop - 1]
    return out


def _png_samples(lines: np.ndarray, width: int, channels: int, depth: int) -> np.ndarray:
    """Filtered-free rows (rows, row_bytes) to samples (rows, width, channels), 8-bit or
    (for depth 16) big-endian 16-bit values as uint16."""
    rows = lines.shape[0]
    if depth == 8:
        return lines[:, :width * channels].reshape(rows, width, channels)
    if depth == 16:
        pairs = lines[:, :width * channels * 2].reshape(rows, width, channels, 2).astype(np.uint16)
        return (pairs[..., 0] << 8) | pairs[..., 1]
    bits = np.unpackbits(lines, axis=1)[:, :width * depth].reshape(rows, width, depth)
    weights = (1 << np.arange(depth - 1, -1, -1)).astype(np.uint8)
    return (bits * weights).sum(axis=-1, dtype=np.uint8)[..., None]


def _png(data: bytes):
    header, palette, parts = None, None, []
    for kind, body in _png_chunks(data):
        if kind == b"IHDR":
            _need(len(body) == 13, "bad IHDR")
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            _need(len(body) % 3 == 0 and len(body) > 0, "bad PLTE")
            palette = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3)
        elif kind == b"IDAT":
            parts.append(body)
    _need(header is not None and parts, "no IHDR or IDAT")
    width, height, depth, color, method, filtering, interlace = header
    _need(width > 0 and height > 0 and color in _PNG_CHANNELS and depth in _PNG_DEPTHS[color],
          "bad IHDR")
    _need(method == 0 and filtering == 0 and interlace in (0, 1), "bad IHDR")
    _need(color != 3 or palette is not None, "palette image without PLTE")
    try:
        raw = np.frombuffer(zlib.decompress(b"".join(parts)), dtype=np.uint8)
    except zlib.error as error:
        raise _Corrupt(str(error)) from None
    channels = _PNG_CHANNELS[color]
    bits = channels * depth
    bpp = max(1, bits // 8)
    if interlace == 0:
        lines = _png_unfilter(raw, height, (width * bits + 7) // 8, bpp)
        samples = _png_samples(lines, width, channels, depth)
    else:
        samples = np.zeros((height, width, channels), dtype=np.uint16 if depth == 16 else np.uint8)
        pos = 0
        for x0, y0, dx, dy in _ADAM7:
            w, h = -(-(width - x0) // dx), -(-(height - y0) // dy)
            if w <= 0 or h <= 0:
                continue
            row_bytes = (w * bits + 7) // 8
            lines = _png_unfilter(raw[pos:], h, row_bytes, bpp)
            pos += h * (row_bytes + 1)
            samples[y0::dy, x0::dx] = _png_samples(lines, w, channels, depth)
    if depth == 16:
        samples = (samples >> 8).astype(np.uint8)
    if color == 3:
        _need(int(samples.max()) < len(palette), "palette index out of range")
        return palette[samples[..., 0]]
    if depth < 8:  # stretch 1/2/4-bit gray to the full 8-bit range
        samples = samples * np.uint8(255 // ((1 << depth) - 1))
    return samples[..., :3] if color in (2, 6) else samples[..., :1]


# --------------------------------------------------------------------------- BMP


def _indices(rows: np.ndarray, width: int, depth: int) -> np.ndarray:
    """Packed palette indices (most significant bits first) to (rows, width)."""
    if depth == 8:
        return rows[:, :width]
    bits = np.unpackbits(rows, axis=1)[:, :width * depth].reshape(rows.shape[0], width, depth)
    weights = (1 << np.arange(depth - 1, -1, -1)).astype(np.uint8)
    return (bits * weights).sum(axis=-1, dtype=np.uint8)


def _bit_field(pixels: np.ndarray, mask: int) -> np.ndarray:
    if mask == 0:
        return np.zeros(pixels.shape, dtype=np.uint8)
    shift = (mask & -mask).bit_length() - 1
    top = mask >> shift
    values = (pixels & np.uint32(mask)) >> np.uint32(shift)
    return (values.astype(np.uint64) * 255 // top).astype(np.uint8)


def _bmp(data: bytes):
    _need(len(data) >= 26, "truncated header")
    (offset,) = struct.unpack("<I", data[10:14])
    (dib,) = struct.unpack("<I", data[14:18])
    if dib == 12:
        width, height, planes, depth = struct.unpack("<HHHH", data[18:26])
        compression, colors, entry = 0, 0, 3
    else:
        _need(dib >= 40 and len(data) >= 14 + dib, "truncated header")
        width, height, planes, depth, compression = struct.unpack("<iiHHI", data[18:34])
        (colors,) = struct.unpack("<I", data[46:50])
        entry = 4
    top_down = height < 0
    height = abs(height)
    _need(width > 0 and height > 0 and planes == 1, "bad dimensions")
    if compression in (1, 2):
        raise _unsupported("run-length encoded BMP")
    if compression in (4, 5):
        raise _unsupported("BMP with embedded JPEG or PNG data")
    _need(compression in (0, 3, 6), "unknown compression")
    _need(depth in (1, 2, 4, 8, 16, 24, 32), "bad bit depth")
    stride = (width * depth + 31) // 32 * 4
    _need(offset + stride * height <= len(data), "pixel data too short")
    rows = np.frombuffer(data, dtype=np.uint8, count=stride * height, offset=offset)
    rows = rows.reshape(height, stride)
    if not top_down:
        rows = rows[::-1]
    if depth <= 8:
        count = colors or (1 << depth)
        start = 14 + dib
        _need(start + count * entry <= len(data), "palette too short")
        palette = np.frombuffer(data, dtype=np.uint8, count=count * entry, offset=start)
        palette = palette.reshape(count, entry)[:, 2::-1]  # BGR(X) to RGB
        index = _indices(rows, width, depth)
        _need(int(index.max()) < count, "palette index out of range")
        return palette[index]
    if depth == 24 and compression == 0:
        return rows[:, :width * 3].reshape(height, width, 3)[..., ::-1]
    if compression == 0:
        masks = (0x7C00, 0x03E0, 0x001F) if depth == 16 else (0xFF0000, 0xFF00, 0xFF)
    else:
        at = 54 if dib == 40 else 14 + 40  # after a 40-byte header, or inside a longer one
        _need(at + 12 <= len(data), "bit field masks missing")
        masks = struct.unpack("<III", data[at:at + 12])
    _need(depth in (16, 32), "bit fields need 16 or 32 bits per pixel")
    raw = rows[:, :width * depth // 8].copy()
    pixels = raw.view("<u2" if depth == 16 else "<u4").astype(np.uint32)
    return np.stack([_bit_field(pixels, m) for m in masks], axis=-1)


# --------------------------------------------------------------------------- PNM


def _pnm_header(data: bytes, fields: int):
    """The first `fields` whitespace-separated header numbers (comments skipped) and the
    offset just past the single whitespace byte that ends the header."""
    values, pos = [], 2
    while len(values) < fields:
        _need(pos < len(data), "truncated header")
        ch = data[pos:pos + 1]
        if ch == b"#":
            end = data.find(b"\n", pos)
            _need(end >= 0, "truncated header")
            pos = end + 1
        elif ch.isspace():
            pos += 1
        else:
            start = pos
            while pos < len(data) and data[pos:pos + 1].isdigit():
                pos += 1
            _need(pos > start, "bad header")
            values.append(int(data[start:pos]))
    _need(data[pos:pos + 1].isspace(), "bad header")  # one whitespace byte ends it
    return values, pos + 1


def _pnm(data: bytes):
    kind = data[1:2]
    bitmap = kind in (b"1", b"4")
    values, pos = _pnm_header(data, 2 if bitmap else 3)
    width, height = values[0], values[1]
    maxval = 1 if bitmap else values[2]
    _need(width > 0 and height > 0 and 0 < maxval < 65536, "bad header")
    channels = 3 if kind in (b"3", b"6") else 1
    count = width * height * channels
    if kind == b"4":
        stride = (width + 7) // 8
        _need(pos + stride * height <= len(data), "pixel data too short")
        rows = np.frombuffer(data, dtype=np.uint8, count=stride * height, offset=pos)
        bits = np.unpackbits(rows.reshape(height, stride), axis=1)[:, :width]
        return ((1 - bits) * 255).astype(np.uint8)[..., None]  # 1 is black
    if kind in (b"1", b"2", b"3"):
        if bitmap:  # plain bitmaps may run their digits together
            text = bytes(b for b in data[pos:] if b in b"01")
            _need(len(text) >= count, "pixel data too short")
            return ((1 - (np.frombuffer(text[:count], dtype=np.uint8) - 48)) * 255).astype(
                np.uint8).reshape(height, width, 1)
        try:
            numbers = np.array(data[pos:].split()[:count], dtype=np.int64)
        except ValueError:
            raise _Corrupt("bad sample") from None
        _need(numbers.size == count, "pixel data too short")
    else:
        size = 2 if maxval > 255 else 1
        _need(pos + count * size <= len(data), "pixel data too short")
        numbers = np.frombuffer(data, dtype=">u2" if size == 2 else np.uint8, count=count,
                                offset=pos).astype(np.int64)
    numbers = np.minimum(numbers, maxval)
    if maxval != 255:
        numbers = numbers * 255 // maxval
    return numbers.astype(np.uint8).reshape(height, width, channels)


# --------------------------------------------------------------------------- TIFF

_TIFF_TYPES = {1: "B", 2: "B", 3: "H", 4: "I", 6: "b", 7: "B", 8: "h", 9: "i", 16: "Q"}


def _tiff_tags(data: bytes, order: str) -> dict:
    (ifd,) = struct.unpack(order + "I", data[4:8])
    _need(8 <= ifd and ifd + 2 <= len(data), "bad IFD offset")
    (count,) = struct.unpack(order + "H", data[ifd:ifd + 2])
    _need(ifd + 2 + 12 * count <= len(data), "truncated IFD")
    tags = {}
    for i in range(count):
        at = ifd + 2 + 12 * i
        tag, kind, n = struct.unpack(order + "HHI", data[at:at + 8])
        if kind not in _TIFF_TYPES:
            continue  # rationals, floats: no tag this decoder reads uses them
        code = _TIFF_TYPES[kind]
        size = struct.calcsize(code) * n
        if size <= 4:
            raw = data[at + 8:at + 8 + size]
        else:
            (where,) = struct.unpack(order + "I", data[at + 8:at + 12])
            _need(where + size <= len(data), f"tag {tag} points outside the file")
            raw = data[where:where + size]
        tags[tag] = list(struct.unpack(order + code * n, raw))
    return tags


def _packbits(src: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(src):  # one iteration per run, not per byte
        n = src[i]
        i += 1
        if n < 128:
            out += src[i:i + n + 1]
            i += n + 1
        elif n > 128:
            _need(i < len(src), "truncated PackBits run")
            out += src[i:i + 1] * (257 - n)
            i += 1
    return bytes(out)


def _lzw(src: bytes) -> bytes:
    """TIFF's LZW: codes of 9 to 12 bits, most significant bit first, 256 clears the
    table, 257 ends the data, and the code width grows one code early."""
    padded = src + b"\x00\x00\x00"
    total = len(src) * 8
    table = [bytes([i]) for i in range(256)] + [b"", b""]
    out, prev, width, pos = bytearray(), None, 9, 0
    while pos + width <= total:
        at = pos >> 3
        window = (padded[at] << 16) | (padded[at + 1] << 8) | padded[at + 2]
        code = (window >> (24 - (pos & 7) - width)) & ((1 << width) - 1)
        pos += width
        if code == 257:
            break
        if code == 256:
            del table[258:]
            prev, width = None, 9
            continue
        if code < len(table):
            entry = table[code]
            added = None if prev is None else prev + entry[:1]
        elif code == len(table) and prev is not None:  # the entry being defined
            entry = added = prev + prev[:1]
        else:
            raise _Corrupt("bad LZW code")
        if added is not None and len(table) < 4096:  # a full table waits for a clear
            table.append(added)
        out += entry
        prev = entry
        if len(table) + 1 >= 1 << width and width < 12:
            width += 1
    return bytes(out)


def _tiff(data: bytes):
    order = "<" if data[:2] == b"II" else ">"
    tags = _tiff_tags(data, order)

    def one(tag, default=None):
        value = tags.get(tag)
        _need(value is not None or default is not None, f"missing tag {tag}")
        return default if value is None else value[0]

    width, height = one(256), one(257)
    spp = one(277, 1)
    depths = tags.get(258, [1] * spp)
    compression, photometric = one(259, 1), one(262, 2 if spp >= 3 else 1)
    predictor, planar = one(317, 1), one(284, 1)
    if 322 in tags or 324 in tags:
        raise _unsupported("tiled TIFF")
    if compression not in (1, 5, 8, 32946, 32773):
        raise _unsupported(f"TIFF compression {compression} (e.g. 7 is JPEG)")
    if photometric not in (0, 1, 2, 3):
        raise _unsupported(f"TIFF photometric interpretation {photometric} (CMYK, YCbCr, ...)")
    if planar != 1:
        raise _unsupported("planar (not interleaved) TIFF")
    _need(width > 0 and height > 0 and len(set(depths)) == 1, "bad dimensions or depths")
    depth = depths[0]
    if depth not in (1, 8, 16) or (depth == 1 and spp != 1):
        raise _unsupported(f"TIFF with {depth}-bit samples")
    offsets, counts = tags.get(273), tags.get(279)
    _need(offsets is not None and counts is not None and len(offsets) == len(counts),
          "bad strips")
    strips = []
    for start, size in zip(offsets, counts):
        _need(start + size <= len(data), "strip outside the file")
        chunk = data[start:start + size]
        if compression in (8, 32946):
            try:
                chunk = zlib.decompress(chunk)
            except zlib.error as error:
                raise _Corrupt(str(error)) from None
        elif compression == 32773:
            chunk = _packbits(chunk)
        elif compression == 5:
            chunk = _lzw(chunk)
        strips.append(chunk)
    row_bytes = (width * spp * depth + 7) // 8
    raw = b"".join(strips)
    _need(len(raw) >= row_bytes * height, "image data too short")
    lines = np.frombuffer(raw, dtype=np.uint8, count=row_bytes * height).reshape(height, row_bytes)
    if depth == 1:
        samples = np.unpackbits(lines, axis=1)[:, :width].astype(np.uint16)[..., None]
    elif depth == 8:
        samples = lines.reshape(height, width, spp).astype(np.uint16)
    else:
        samples = lines.copy().view(order + "u2").reshape(height, width, spp).astype(np.uint16)
    if predictor == 2:  # horizontal differencing: a running sum along each row and sample
        samples = np.cumsum(samples, axis=1, dtype=np.uint16)
        if depth < 16:
            samples &= (1 << depth) - 1
    elif predictor != 1:
        raise _unsupported(f"TIFF predictor {predictor}")
    if photometric == 3:
        colormap = tags.get(320)
        _need(colormap is not None and len(colormap) == 3 * (1 << depth), "bad color map")
        table = (np.array(colormap, dtype=np.uint16).reshape(3, -1).T >> 8).astype(np.uint8)
        _need(int(samples[..., 0].max()) < len(table), "color map index out of range")
        return table[samples[..., 0]]
    if depth == 16:
        values = (samples >> 8).astype(np.uint8)
    else:
        values = (samples * (255 // ((1 << depth) - 1))).astype(np.uint8)
    if photometric == 0:  # white is zero
        values = 255 - values
    if photometric == 2:
        _need(spp >= 3, "RGB with fewer than 3 samples")
        return values[..., :3]
    return values[..., :1]


# --------------------------------------------------------------------------- kernel

_NEEDS_CODEC = (
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
)


def decode_image(data: bytes) -> np.ndarray | None:
    """(H, W, 1) gray or (H, W, 3) RGB uint8 pixels, or None when `data` is not a
    well-formed image. Raises KernelError for formats nncc cannot decode."""
    for signature, name in _NEEDS_CODEC:
        if data.startswith(signature):
            raise _needs_codec(name)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        raise _needs_codec("WebP")
    try:
        if data.startswith(b"\xff\xd8\xff"):
            return decode_jpeg(data)
        if data.startswith(_PNG_SIGNATURE):
            return _png(data)
        if data.startswith(b"BM"):
            return _bmp(data)
        if data[:1] == b"P" and data[1:2] in b"123456" and data[1:2] and data[2:3].isspace():
            return _pnm(data)
        if data[:4] in (b"II*\x00", b"MM\x00*"):
            return _tiff(data)
    except (_Corrupt, JpegCorrupt, struct.error, ValueError):
        return None
    return None


def _to_format(pixels: np.ndarray, pixel_format: str) -> np.ndarray:
    if pixel_format == "Grayscale":
        if pixels.shape[-1] == 1:
            return pixels
        rgb = pixels.astype(np.uint32)
        luma = (rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16
        return luma.astype(np.uint8)[..., None]
    if pixels.shape[-1] == 1:
        pixels = np.repeat(pixels, 3, axis=-1)
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
    pixels = decode_image(encoded.tobytes())
    if pixels is None:
        return np.zeros((0, 0, 1 if pixel_format == "Grayscale" else 3), dtype=np.uint8)
    return np.ascontiguousarray(_to_format(pixels, pixel_format))
