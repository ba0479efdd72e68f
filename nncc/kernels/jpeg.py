"""Baseline JPEG decoding (8-bit, Huffman-coded, sequential), with numpy only.

The pixel arithmetic is the one common decoders use by default, so the same stream decodes
to the same bytes: the "slow integer" inverse DCT (13-bit fixed-point constants, two extra
bits between its passes), chroma doubled by the triangle ("fancy") filter with its
alternating rounding (other factors repeat samples), and YCbCr to RGB through 16-bit
fixed-point products. Progressive, arithmetic-coded, lossless, 12-bit and CMYK streams are
refused with a clear error.

Huffman decoding is sequential by nature; it looks codes up 16 bits at a time from a
precomputed window of the bit stream. Everything after it works on whole arrays.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError


class JpegCorrupt(Exception):
    """The stream is not a well-formed JPEG."""


def _need(condition: bool, why: str) -> None:
    if not condition:
        raise JpegCorrupt(why)


def _refuse(what: str) -> KernelError:
    return KernelError(f"ImageDecoder: {what} JPEG is not supported (nncc decodes baseline "
                       f"8-bit Huffman-coded JPEG)")


# natural (row-major) position of each zigzag-ordered coefficient
_ZIGZAG = np.array([
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34,
    27, 20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44,
    51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63])

_UNSUPPORTED_FRAMES = {0xC1: "extended sequential (12-bit or four-table)", 0xC2: "progressive",
                       0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical",
                       0xC7: "hierarchical", 0xC9: "arithmetic-coded", 0xCA: "arithmetic-coded",
                       0xCB: "arithmetic-coded", 0xCD: "arithmetic-coded",
                       0xCE: "arithmetic-coded", 0xCF: "arithmetic-coded"}


# --------------------------------------------------------------------------- markers


def _segment_at(data: bytes, pos: int):
    """(marker, payload, offset after it) of the marker at ``pos``; end of image has no
    payload."""
    while data[pos:pos + 2] == b"\xff\xff":
        pos += 1  # fill bytes
    _need(pos + 2 <= len(data) and data[pos] == 0xFF, "a marker was expected")
    marker = data[pos + 1]
    if marker == 0xD9:
        return marker, b"", pos + 2
    _need(pos + 4 <= len(data), "truncated marker segment")
    length = int.from_bytes(data[pos + 2:pos + 4], "big")
    _need(length >= 2 and pos + 2 + length <= len(data), "truncated marker segment")
    return marker, data[pos + 4:pos + 2 + length], pos + 2 + length


def _huffman_table(counts: bytes, symbols: bytes):
    """A 65536-entry lookup from the next 16 bits to (symbol, code length); length 0 marks
    a bit pattern no code starts."""
    lookup_symbol = np.zeros(65536, np.int32)
    lookup_length = np.zeros(65536, np.int32)
    code = 0
    k = 0
    for length in range(1, 17):
        for _ in range(counts[length - 1]):
            _need(code < (1 << length), "bad Huffman table")
            first = code << (16 - length)
            span = 1 << (16 - length)
            lookup_symbol[first:first + span] = symbols[k]
            lookup_length[first:first + span] = length
            code += 1
            k += 1
        code <<= 1
    return lookup_symbol.tolist(), lookup_length.tolist()


def _parse_dht(payload: bytes, tables: dict) -> None:
    pos = 0
    while pos < len(payload):
        _need(pos + 17 <= len(payload), "truncated Huffman table")
        kind, index = payload[pos] >> 4, payload[pos] & 15
        _need(kind in (0, 1) and index < 4, "bad Huffman table id")
        counts = payload[pos + 1:pos + 17]
        total = sum(counts)
        _need(pos + 17 + total <= len(payload), "truncated Huffman table")
        tables[(kind, index)] = _huffman_table(counts, payload[pos + 17:pos + 17 + total])
        pos += 17 + total


def _parse_dqt(payload: bytes, tables: dict) -> None:
    pos = 0
    while pos < len(payload):
        precision, index = payload[pos] >> 4, payload[pos] & 15
        _need(precision in (0, 1) and index < 4, "bad quantization table id")
        size = 128 if precision else 64
        _need(pos + 1 + size <= len(payload), "truncated quantization table")
        raw = np.frombuffer(payload[pos + 1:pos + 1 + size], ">u2" if precision else np.uint8)
        table = np.zeros(64, np.int64)
        table[_ZIGZAG] = raw  # stored in zigzag order
        tables[index] = table
        pos += 1 + size


# --------------------------------------------------------------------------- entropy decoding


def _scan_bits(data: bytes, start: int) -> tuple[list[bytes], int]:
    """The entropy-coded segments after a scan header (split at restart markers, stuffed
    zero bytes removed), and the offset where the scan ends."""
    segments = []
    pieces = []
    pos = start
    n = len(data)
    while True:
        at = data.find(b"\xff", pos)
        if at < 0 or at + 1 >= n:
            pieces.append(data[pos:])
            segments.append(b"".join(pieces))
            return segments, n
        pieces.append(data[pos:at])
        follower = data[at + 1]
        if follower == 0x00:
            pieces.append(b"\xff")
            pos = at + 2
        elif follower == 0xFF:
            pos = at + 1  # fill byte
        elif 0xD0 <= follower <= 0xD7:
            segments.append(b"".join(pieces))
            pieces = []
            pos = at + 2
        else:
            segments.append(b"".join(pieces))
            return segments, at


_CHUNK = 1 << 15  # bytes of scan data whose bit windows are held at once
_BLOCK_BITS = 2048  # more than one block's codes can span (27 + 63 * 26 bits)


def _windows(segment: bytes, first: int) -> list[int]:
    """For each bit offset from byte ``first`` on (up to _CHUNK bytes), the 16 bits starting
    there; ones past the end, which is what a decoder reads after the data runs out."""
    piece = segment[first:first + _CHUNK]
    bits = np.unpackbits(np.frombuffer(piece + b"\xff\xff\xff", np.uint8)).astype(np.int64)
    weights = 1 << np.arange(15, -1, -1, dtype=np.int64)
    count = len(piece) * 8 + 1
    view = np.lib.stride_tricks.sliding_window_view(bits, 16)[:count]
    return (view @ weights).tolist()


def _decode_blocks(segments, units, dc_tables, ac_tables, restart_interval, total_units):
    """Zigzag-ordered coefficients of every block of the scan, in scan order.

    ``units``: for each block of one MCU, the index of its component. Returns an
    (MCUs, len(units), 64) int64 array."""
    # every block spends at least one bit on its DC code and one on an AC code: a header
    # claiming more blocks than the data can hold is refused before anything is allocated
    _need(2 * total_units * len(units) <= 8 * sum(map(len, segments)) + 32,
          "the scan is too short for the frame's size")
    out = np.zeros((total_units, len(units), 64), np.int64)
    per_segment = restart_interval or total_units
    mcu = 0
    for segment in segments:
        if mcu >= total_units:
            break
        first = 0  # the byte the windows start at; pos counts bits from there
        window = _windows(segment, first)
        limit = len(window) - 1
        pos = 0
        predictors = {}
        for _ in range(min(per_segment, total_units - mcu)):
            row = out[mcu]
            for b, comp in enumerate(units):
                if pos > limit - _BLOCK_BITS and first + _CHUNK < len(segment):
                    first += pos >> 3
                    pos &= 7
                    window = _windows(segment, first)
                    limit = len(window) - 1
                symbols, lengths = dc_tables[comp]
                _need(pos <= limit, "scan data ends early")
                peek = window[pos]
                length = lengths[peek]
                _need(length, "bad Huffman code")
                size = symbols[peek]
                pos += length
                diff = 0
                if size:
                    _need(size <= 11 and pos <= limit, "bad DC coefficient")
                    diff = window[pos] >> (16 - size)
                    if diff < (1 << (size - 1)):
                        diff -= (1 << size) - 1
                    pos += size
                value = predictors.get(comp, 0) + diff
                predictors[comp] = value
                coeffs = [value] + [0] * 63
                symbols, lengths = ac_tables[comp]
                k = 1
                while k < 64:
                    _need(pos <= limit, "scan data ends early")
                    peek = window[pos]
                    length = lengths[peek]
                    _need(length, "bad Huffman code")
                    rs = symbols[peek]
                    pos += length
                    run, size = rs >> 4, rs & 15
                    if size == 0:
                        if run != 15:
                            break  # end of block
                        k += 16
                        continue
                    k += run
                    _need(k < 64 and size <= 10 and pos <= limit, "bad AC coefficient")
                    v = window[pos] >> (16 - size)
                    if v < (1 << (size - 1)):
                        v -= (1 << size) - 1
                    pos += size
                    coeffs[k] = v
                    k += 1
                row[b] = coeffs
            mcu += 1
    _need(mcu >= total_units, "scan data ends early")
    return out


# --------------------------------------------------------------------------- inverse DCT

_CONST_BITS = 13
_PASS1_BITS = 2


def _fix(x: float) -> int:
    return int(x * (1 << _CONST_BITS) + 0.5)


_F0_298 = _fix(0.298631336)
_F0_390 = _fix(0.390180644)
_F0_541 = _fix(0.541196100)
_F0_765 = _fix(0.765366865)
_F0_899 = _fix(0.899976223)
_F1_175 = _fix(1.175875602)
_F1_501 = _fix(1.501321110)
_F1_847 = _fix(1.847759065)
_F1_961 = _fix(1.961570560)
_F2_053 = _fix(2.053119869)
_F2_562 = _fix(2.562915447)
_F3_072 = _fix(3.072711026)


def _idct_1d(c, shift: int):
    """One pass of the integer inverse DCT over the 8 arrays ``c`` (the 8 inputs along the
    transformed axis); each output rounded and shifted right by ``shift`` bits."""
    z1 = (c[2] + c[6]) * _F0_541
    tmp2 = z1 - c[6] * _F1_847
    tmp3 = z1 + c[2] * _F0_765
    tmp0 = (c[0] + c[4]) << _CONST_BITS
    tmp1 = (c[0] - c[4]) << _CONST_BITS
    tmp10, tmp13 = tmp0 + tmp3, tmp0 - tmp3
    tmp11, tmp12 = tmp1 + tmp2, tmp1 - tmp2

    t0, t1, t2, t3 = c[7], c[5], c[3], c[1]
    z1, z2, z3, z4 = t0 + t3, t1 + t2, t0 + t2, t1 + t3
    z5 = (z3 + z4) * _F1_175
    t0 = t0 * _F0_298
    t1 = t1 * _F2_053
    t2 = t2 * _F3_072
    t3 = t3 * _F1_501
    z1 = z1 * -_F0_899
    z2 = z2 * -_F2_562
    z3 = z3 * -_F1_961 + z5
    z4 = z4 * -_F0_390 + z5
    t0 += z1 + z3
    t1 += z2 + z4
    t2 += z2 + z3
    t3 += z1 + z4

    half = 1 << (shift - 1)
    return [(tmp10 + t3 + half) >> shift, (tmp11 + t2 + half) >> shift,
            (tmp12 + t1 + half) >> shift, (tmp13 + t0 + half) >> shift,
            (tmp13 - t0 + half) >> shift, (tmp12 - t1 + half) >> shift,
            (tmp11 - t2 + half) >> shift, (tmp10 - t3 + half) >> shift]


def _idct(blocks: np.ndarray) -> np.ndarray:
    """(n, 8, 8) dequantized coefficients (row = vertical frequency) to (n, 8, 8) uint8
    samples: columns first, then rows."""
    cols = _idct_1d([blocks[:, k, :] for k in range(8)], _CONST_BITS - _PASS1_BITS)
    work = np.stack(cols, axis=1)  # (n, 8 rows, 8 columns)
    rows = _idct_1d([work[:, :, k] for k in range(8)], _CONST_BITS + _PASS1_BITS + 3)
    samples = np.stack(rows, axis=2) + 128
    return np.clip(samples, 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------- upsampling, color


def _fancy_h2(x: np.ndarray, bias_left: int, bias_right: int, scale: int) -> np.ndarray:
    """Doubles the width: each output is 3/4 of its nearest input and 1/4 of the next
    nearest (the edge columns repeat), with the filter's alternating rounding."""
    left = np.concatenate([x[:, :1], x[:, :-1]], axis=1)
    right = np.concatenate([x[:, 1:], x[:, -1:]], axis=1)
    out = np.empty((x.shape[0], x.shape[1] * 2), np.int64)
    out[:, 0::2] = (3 * x + left + bias_left) >> scale
    out[:, 1::2] = (3 * x + right + bias_right) >> scale
    return out


def _upsample(plane: np.ndarray, h: int, v: int, width: int, height: int) -> np.ndarray:
    """A component plane (cropped to its sampled size), enlarged h times across and v times
    down, cropped to width x height. Doubling uses the triangle filter (3/4 of the nearest
    sample, 1/4 of the next, edges repeated) where a decoder does by default: across when
    the plane is wider than 2 samples, down always; other factors repeat samples."""
    x = plane.astype(np.int64)
    wide = x.shape[1] > 2
    if (h, v) == (2, 1) and wide:
        return _fancy_h2(x, 1, 2, 2)[:height, :width]
    if (h, v) in ((2, 2), (1, 2)) and (wide or h == 1):
        above = np.concatenate([x[:1], x[:-1]], axis=0)
        below = np.concatenate([x[1:], x[-1:]], axis=0)
        out = np.empty((x.shape[0] * 2, x.shape[1] * h), np.int64)
        if h == 1:
            out[0::2] = (3 * x + above + 1) >> 2
            out[1::2] = (3 * x + below + 2) >> 2
        else:  # vertical 3:1 sums first, then the horizontal filter on those sums
            out[0::2] = _fancy_h2(3 * x + above, 8, 7, 4)
            out[1::2] = _fancy_h2(3 * x + below, 8, 7, 4)
        return out[:height, :width]
    return np.repeat(np.repeat(x, v, axis=0), h, axis=1)[:height, :width]


def _ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    scale = 16
    half = 1 << (scale - 1)

    def fix(x: float) -> int:
        return int(x * (1 << scale) + 0.5)

    cb = cb - 128
    cr = cr - 128
    r = y + ((fix(1.40200) * cr + half) >> scale)
    g = y + ((-fix(0.34414) * cb - fix(0.71414) * cr + half) >> scale)
    b = y + ((fix(1.77200) * cb + half) >> scale)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------- decoder


class _Frame:
    """The frame header, and each component's dequantized coefficients as its scans
    deliver them."""

    def __init__(self, payload: bytes):
        _need(len(payload) >= 6, "bad frame header")
        precision = payload[0]
        self.height = int.from_bytes(payload[1:3], "big")
        self.width = int.from_bytes(payload[3:5], "big")
        count = payload[5]
        _need(len(payload) >= 6 + 3 * count and count > 0, "bad frame header")
        if precision != 8:
            raise _refuse(f"{precision}-bit")
        _need(self.height > 0 and self.width > 0, "the frame has no size (a DNL marker)")
        if count not in (1, 3):
            raise _refuse(f"{count}-component")
        # (id, horizontal factor, vertical factor, quantization table) per component
        self.comps = [(payload[6 + 3 * i], payload[7 + 3 * i] >> 4, payload[7 + 3 * i] & 15,
                       payload[8 + 3 * i]) for i in range(count)]
        _need(len({c[0] for c in self.comps}) == count, "repeated component ids")
        _need(all(1 <= h <= 4 and 1 <= v <= 4 for _, h, v, _ in self.comps),
              "bad sampling factors")
        self.hmax = max(c[1] for c in self.comps)
        self.vmax = max(c[2] for c in self.comps)
        self.mcus_x = -(-self.width // (8 * self.hmax))
        self.mcus_y = -(-self.height // (8 * self.vmax))
        # each component's sampled size (columns, rows)
        self.sampled = [(-(-self.width * h // self.hmax), -(-self.height * v // self.vmax))
                        for _, h, v, _ in self.comps]
        self.grids: dict[int, np.ndarray] = {}  # component -> (block rows, block cols, 8, 8)

    def scan(self, data, header, start, quant, huffman, restart_interval) -> int:
        """Decodes one scan starting at ``start``; returns the offset of the marker after it."""
        _need(len(header) >= 1, "bad scan header")
        count = header[0]
        _need(count >= 1 and len(header) >= 4 + 2 * count, "bad scan header")
        ids = [c[0] for c in self.comps]
        members = []
        for k in range(count):
            _need(header[1 + 2 * k] in ids, "the scan names an unknown component")
            members.append(ids.index(header[1 + 2 * k]))
        _need(len(set(members)) == count and not set(members) & set(self.grids),
              "a component is scanned twice")
        tables = {}
        for k, i in enumerate(members):
            dc, ac = (0, header[2 + 2 * k] >> 4), (1, header[2 + 2 * k] & 15)
            _need(dc in huffman and ac in huffman, "a missing Huffman table")
            _need(self.comps[i][3] in quant, "a missing quantization table")
            tables[i] = (huffman[dc], huffman[ac])
        if count == 1:  # non-interleaved: the component's own blocks in raster order
            (i,) = members
            sw, sh = self.sampled[i]
            shape = [(i, -(-sh // 8), -(-sw // 8), 1, 1)]
            units, total = [i], shape[0][1] * shape[0][2]
        else:  # interleaved: each MCU holds every member's h x v blocks in turn
            shape = [(i, self.mcus_y, self.mcus_x, self.comps[i][2], self.comps[i][1])
                     for i in members]
            units = [i for i, _, _, v, h in shape for _ in range(h * v)]
            total = self.mcus_x * self.mcus_y
        segments, end = _scan_bits(data, start)
        coeffs = _decode_blocks(segments, units, {i: t[0] for i, t in tables.items()},
                                {i: t[1] for i, t in tables.items()}, restart_interval, total)
        first = 0
        for i, rows, cols, v, h in shape:
            blocks = coeffs[:, first:first + h * v]  # (MCUs, h * v, 64), zigzag order
            first += h * v
            natural = np.zeros(blocks.shape, np.int64)
            natural[..., _ZIGZAG] = blocks * quant[self.comps[i][3]][_ZIGZAG]
            grid = natural.reshape(rows, cols, v, h, 8, 8).transpose(0, 2, 1, 3, 4, 5)
            self.grids[i] = grid.reshape(rows * v, cols * h, 8, 8)
        return end

    def pixels(self, rgb: bool) -> np.ndarray:
        _need(len(self.grids) == len(self.comps), "a component has no scan")
        planes = []
        for i, (_, ch, cv, _) in enumerate(self.comps):
            grid = self.grids[i]
            rows, cols = grid.shape[:2]
            samples = _idct(grid.reshape(-1, 8, 8)).reshape(rows, cols, 8, 8)
            plane = samples.transpose(0, 2, 1, 3).reshape(rows * 8, cols * 8)
            sw, sh = self.sampled[i]
            plane = plane[:sh, :sw]
            if len(self.comps) == 1:
                return plane[:self.height, :self.width, None].copy()
            if self.hmax % ch or self.vmax % cv:
                raise _refuse(f"{self.hmax}x{self.vmax} to {ch}x{cv} (fractional) subsampling")
            planes.append(_upsample(plane, self.hmax // ch, self.vmax // cv, self.width,
                                    self.height))
        if rgb:
            return np.stack(planes, axis=-1).astype(np.uint8)
        return _ycc_to_rgb(*planes)


def decode_jpeg(data: bytes) -> np.ndarray:
    """(H, W, 1) gray or (H, W, 3) RGB uint8 pixels of a baseline JPEG stream. Raises
    JpegCorrupt for a malformed stream and KernelError for a kind nncc does not decode."""
    _need(data[:2] == b"\xff\xd8", "no start-of-image marker")
    quant, huffman = {}, {}
    frame = None
    restart_interval = 0
    adobe_transform = None
    jfif = False
    pos = 2
    while True:
        if frame is not None and frame.grids and pos >= len(data):
            break  # the stream stops after its scans without an end marker
        marker, payload, pos = _segment_at(data, pos)
        if marker == 0xD9:
            break
        if marker in _UNSUPPORTED_FRAMES:
            raise _refuse(_UNSUPPORTED_FRAMES[marker])
        if marker == 0xDB:
            _parse_dqt(payload, quant)
        elif marker == 0xC4:
            _parse_dht(payload, huffman)
        elif marker == 0xDD:
            _need(len(payload) >= 2, "bad restart interval")
            restart_interval = int.from_bytes(payload[:2], "big")
        elif marker == 0xE0 and payload[:5] == b"JFIF\x00":
            jfif = True
        elif marker == 0xEE and payload[:5] == b"Adobe" and len(payload) >= 12:
            adobe_transform = payload[11]
        elif marker == 0xC0:
            _need(frame is None, "a second frame header")
            frame = _Frame(payload)
        elif marker == 0xDA:
            _need(frame is not None, "a scan before the frame header")
            pos = frame.scan(data, payload, pos, quant, huffman, restart_interval)
    _need(frame is not None, "no frame")
    return frame.pixels(_is_rgb(frame.comps, jfif, adobe_transform))


def _is_rgb(comps, jfif: bool, adobe_transform) -> bool:
    """Whether 3 components hold R, G, B rather than Y, Cb, Cr: JFIF says YCbCr, else an
    Adobe marker's transform flag decides (0: RGB), else component ids 'R', 'G', 'B'."""
    if jfif:
        return False
    if adobe_transform is not None:
        return adobe_transform == 0
    return [c[0] for c in comps] == [ord("R"), ord("G"), ord("B")]
