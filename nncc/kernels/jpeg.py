"""JPEG decoding (8-bit, Huffman-coded: baseline, extended sequential and progressive),
with numpy only. The entropy-coded data is read in nncc/kernels/jpeg_entropy.py.

The pixel arithmetic is the one common decoders use by default, so the same stream decodes
to the same bytes: the "slow integer" inverse DCT (13-bit fixed-point constants, two extra
bits between its passes), chroma doubled by the triangle ("fancy") filter with its
alternating rounding (other factors repeat samples), and YCbCr to RGB through 16-bit
fixed-point products. Arithmetic-coded, lossless, hierarchical, 12-bit and CMYK streams
are refused with a clear error.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError
from nncc.kernels.jpeg_entropy import (JpegCorrupt, decode_progressive, decode_sequential,
                                       need as _need, parse_dht, scan_segments)

__all__ = ["JpegCorrupt", "decode_jpeg"]


def _refuse(what: str) -> KernelError:
    return KernelError(f"ImageDecoder: {what} JPEG is not supported (nncc decodes 8-bit "
                       f"Huffman-coded JPEG: baseline, extended sequential and progressive)")


# natural (row-major) position of each zigzag-ordered coefficient
_ZIGZAG = np.array([
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34,
    27, 20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44,
    51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63])

_UNSUPPORTED_FRAMES = {0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical",
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
    """The frame header, and each component's coefficients as its scans deliver them."""

    def __init__(self, payload: bytes, progressive: bool, data_size: int):
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
        self.progressive = progressive
        self.data_size = data_size
        self.hmax = max(c[1] for c in self.comps)
        self.vmax = max(c[2] for c in self.comps)
        self.mcus_x = -(-self.width // (8 * self.hmax))
        self.mcus_y = -(-self.height // (8 * self.vmax))
        # each component's sampled size (columns, rows), and its grid of blocks (padded to
        # whole MCUs)
        self.sampled = [(-(-self.width * h // self.hmax), -(-self.height * v // self.vmax))
                        for _, h, v, _ in self.comps]
        self.blocks = [(self.mcus_y * v, self.mcus_x * h) for _, h, v, _ in self.comps]
        self.quant: dict[int, np.ndarray] = {}  # component -> its table, fixed at its first scan
        # component -> zigzag-ordered coefficients: a (rows, cols, 64) array from a
        # sequential scan, or one list of 64 per block that progressive scans refine
        self.coefs: dict[int, object] = {}

    def scan(self, data, header, start, quant, huffman, restart_interval) -> int:
        """Decodes one scan starting at ``start``; returns the offset of the marker after it."""
        _need(len(header) >= 1, "bad scan header")
        count = header[0]
        _need(count >= 1 and len(header) >= 4 + 2 * count, "bad scan header")
        ss, se, ah, al = (header[1 + 2 * count], header[2 + 2 * count],
                          header[3 + 2 * count] >> 4, header[3 + 2 * count] & 15)
        ids = [c[0] for c in self.comps]
        members = []
        for k in range(count):
            _need(header[1 + 2 * k] in ids, "the scan names an unknown component")
            members.append(ids.index(header[1 + 2 * k]))
        _need(len(set(members)) == count, "a component is named twice in one scan")
        dc_tables, ac_tables = {}, {}
        for k, i in enumerate(members):
            dc, ac = (0, header[2 + 2 * k] >> 4), (1, header[2 + 2 * k] & 15)
            uses_dc = not self.progressive or (ss == 0 and ah == 0)
            uses_ac = not self.progressive or ss > 0
            _need((dc in huffman or not uses_dc) and (ac in huffman or not uses_ac),
                  "a missing Huffman table")
            dc_tables[i], ac_tables[i] = huffman.get(dc), huffman.get(ac)
            if i not in self.quant:
                _need(self.comps[i][3] in quant, "a missing quantization table")
                self.quant[i] = quant[self.comps[i][3]]
        segments, end = scan_segments(data, start)
        if self.progressive:
            _need(ss == 0 or count == 1, "a progressive AC scan of several components")
            decode_progressive(segments, self._mcus(members), dc_tables, ac_tables,
                               restart_interval, ss, se, ah, al)
            return end
        _need(ss == 0 and se == 63 and ah == 0 and al == 0, "bad sequential scan")
        _need(not set(members) & set(self.coefs), "a component is scanned twice")
        if count == 1:  # non-interleaved: the component's own blocks in raster order
            (i,) = members
            sw, sh = self.sampled[i]
            layout = [(i, -(-sh // 8), -(-sw // 8), 1, 1)]
            units = [i]
        else:  # interleaved: each MCU holds every member's h x v blocks in turn
            layout = [(i, self.mcus_y, self.mcus_x, self.comps[i][2], self.comps[i][1])
                      for i in members]
            units = [i for i, _, _, v, h in layout for _ in range(h * v)]
        coeffs = decode_sequential(segments, units, dc_tables, ac_tables, restart_interval,
                                   layout[0][1] * layout[0][2])
        first = 0
        for i, rows, cols, v, h in layout:
            blocks = coeffs[:, first:first + h * v]  # (MCUs, h * v, 64)
            first += h * v
            grid = blocks.reshape(rows, cols, v, h, 64).transpose(0, 2, 1, 3, 4)
            self.coefs[i] = grid.reshape(rows * v, cols * h, 64)
        return end

    def _mcus(self, members) -> list:
        """A progressive scan's MCUs: per MCU, its (component, block) pairs."""
        for i in members:
            if i not in self.coefs:
                rows, cols = self.blocks[i]
                # each block spends at least a bit in the first scan of its DC coefficient
                _need(rows * cols <= 8 * self.data_size, "the stream is too short for its size")
                self.coefs[i] = [[0] * 64 for _ in range(rows * cols)]
        if len(members) == 1:  # non-interleaved: the component's own blocks in raster order
            (i,) = members
            sw, sh = self.sampled[i]
            cols = self.blocks[i][1]
            grid = self.coefs[i]
            return [[(i, grid[r * cols + c])] for r in range(-(-sh // 8))
                    for c in range(-(-sw // 8))]
        mcus = []
        for my in range(self.mcus_y):
            for mx in range(self.mcus_x):
                mcu = []
                for i in members:
                    h, v = self.comps[i][1], self.comps[i][2]
                    cols = self.blocks[i][1]
                    grid = self.coefs[i]
                    mcu += [(i, grid[(my * v + bv) * cols + mx * h + bh])
                            for bv in range(v) for bh in range(h)]
                mcus.append(mcu)
        return mcus

    def pixels(self, rgb: bool) -> np.ndarray:
        _need(len(self.coefs) == len(self.comps), "a component has no scan")
        planes = []
        for i, (_, ch, cv, _) in enumerate(self.comps):
            coefs = self.coefs[i]
            rows, cols = self.blocks[i] if isinstance(coefs, list) else coefs.shape[:2]
            zigzag = np.asarray(coefs, np.int64).reshape(rows * cols, 64)
            natural = np.zeros_like(zigzag)
            natural[:, _ZIGZAG] = zigzag * self.quant[i][_ZIGZAG]
            samples = _idct(natural.reshape(-1, 8, 8)).reshape(rows, cols, 8, 8)
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
    """(H, W, 1) gray or (H, W, 3) RGB uint8 pixels of a JPEG stream. Raises JpegCorrupt
    for a malformed stream and KernelError for a kind nncc does not decode."""
    _need(data[:2] == b"\xff\xd8", "no start-of-image marker")
    quant, huffman = {}, {}
    frame = None
    restart_interval = 0
    adobe_transform = None
    jfif = False
    pos = 2
    while True:
        if frame is not None and frame.coefs and pos >= len(data):
            break  # the stream stops after its scans without an end marker
        marker, payload, pos = _segment_at(data, pos)
        if marker == 0xD9:
            break
        if marker in _UNSUPPORTED_FRAMES:
            raise _refuse(_UNSUPPORTED_FRAMES[marker])
        if marker == 0xDB:
            _parse_dqt(payload, quant)
        elif marker == 0xC4:
            parse_dht(payload, huffman)
        elif marker == 0xDD:
            _need(len(payload) >= 2, "bad restart interval")
            restart_interval = int.from_bytes(payload[:2], "big")
        elif marker == 0xE0 and payload[:5] == b"JFIF\x00":
            jfif = True
        elif marker == 0xEE and payload[:5] == b"Adobe" and len(payload) >= 12:
            adobe_transform = payload[11]
        elif marker in (0xC0, 0xC1, 0xC2):
            _need(frame is None, "a second frame header")
            frame = _Frame(payload, marker == 0xC2, len(data))
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
