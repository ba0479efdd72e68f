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


def _segments(data: bytes):
    """(marker, payload, offset after payload) for each marker segment up to the first scan."""
    _need(data[:2] == b"\xff\xd8", "no start-of-image marker")
    pos = 2
    while True:
        while data[pos:pos + 2] == b"\xff\xff":
            pos += 1  # fill bytes
        _need(pos + 4 <= len(data) and data[pos] == 0xFF, "truncated marker segment")
        marker = data[pos + 1]
        _need(marker != 0xD9, "end of image before any scan")
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        _need(length >= 2 and pos + 2 + length <= len(data), "truncated marker segment")
        yield marker, data[pos + 4:pos + 2 + length], pos + 2 + length
        pos += 2 + length


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


def _windows(segment: bytes) -> list[int]:
    """For each bit offset, the 16 bits starting there (ones past the end: what a decoder
    reads after the data runs out)."""
    bits = np.unpackbits(np.frombuffer(segment + b"\xff\xff\xff", np.uint8)).astype(np.int64)
    weights = 1 << np.arange(15, -1, -1, dtype=np.int64)
    count = len(segment) * 8 + 1
    view = np.lib.stride_tricks.sliding_window_view(bits, 16)[:count]
    return (view @ weights).tolist()


def _decode_blocks(segments, units, dc_tables, ac_tables, restart_interval, total_units):
    """Zigzag-ordered coefficients of every block of the scan, in scan order.

    ``units``: for each block of one MCU, the index of its component. Returns an
    (MCUs, len(units), 64) int64 array."""
    out = np.zeros((total_units, len(units), 64), np.int64)
    per_segment = restart_interval or total_units
    mcu = 0
    for segment in segments:
        if mcu >= total_units:
            break
        window = _windows(segment)
        limit = len(window) - 1
        pos = 0
        predictors = {}
        for _ in range(min(per_segment, total_units - mcu)):
            row = out[mcu]
            for b, comp in enumerate(units):
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


def decode_jpeg(data: bytes) -> np.ndarray:
    """(H, W, 1) gray or (H, W, 3) RGB uint8 pixels of a baseline JPEG stream. Raises
    JpegCorrupt for a malformed stream and KernelError for a kind nncc does not decode."""
    quant, huffman = {}, {}
    frame = None
    restart_interval = 0
    adobe_transform = None
    jfif = False
    for marker, payload, end in _segments(data):
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
            _need(len(payload) >= 6, "bad frame header")
            precision = payload[0]
            height = int.from_bytes(payload[1:3], "big")
            width = int.from_bytes(payload[3:5], "big")
            count = payload[5]
            _need(len(payload) >= 6 + 3 * count and count > 0, "bad frame header")
            if precision != 8:
                raise _refuse(f"{precision}-bit")
            _need(height > 0 and width > 0, "the frame has no size (a DNL marker)")
            comps = [(payload[6 + 3 * i], payload[7 + 3 * i] >> 4, payload[7 + 3 * i] & 15,
                      payload[8 + 3 * i]) for i in range(count)]
            if count not in (1, 3):
                raise _refuse(f"{count}-component")
            _need(all(1 <= h <= 4 and 1 <= v <= 4 for _, h, v, _ in comps), "bad sampling factors")
            frame = (height, width, comps)
        elif marker == 0xDA:
            _need(frame is not None, "a scan before the frame header")
            return _decode_frame(data, payload, end, frame, quant, huffman, restart_interval,
                                 _is_rgb(frame[2], jfif, adobe_transform))
    raise JpegCorrupt("no scan")


def _is_rgb(comps, jfif: bool, adobe_transform) -> bool:
    """Whether 3 components hold R, G, B rather than Y, Cb, Cr: JFIF says YCbCr, else an
    Adobe marker's transform flag decides (0: RGB), else component ids 'R', 'G', 'B'."""
    if jfif:
        return False
    if adobe_transform is not None:
        return adobe_transform == 0
    return [c[0] for c in comps] == [ord("R"), ord("G"), ord("B")]


def _decode_frame(data, scan_header, start, frame, quant, huffman, restart_interval, rgb):
    height, width, comps = frame
    _need(len(scan_header) >= 1, "bad scan header")
    count = scan_header[0]
    _need(len(scan_header) >= 4 + 2 * count, "bad scan header")
    if count != len(comps):
        raise _refuse("multi-scan (non-interleaved)")
    selectors = {scan_header[1 + 2 * i]: scan_header[2 + 2 * i] for i in range(count)}
    _need(set(selectors) == {c[0] for c in comps}, "the scan names unknown components")
    hmax = max(c[1] for c in comps)
    vmax = max(c[2] for c in comps)
    dc_tables, ac_tables = [], []
    for cid, _, _, qt in comps:
        _need(qt in quant, "a missing quantization table")
        dc, ac = (0, selectors[cid] >> 4), (1, selectors[cid] & 15)
        _need(dc in huffman and ac in huffman, "a missing Huffman table")
        dc_tables.append(huffman[dc])
        ac_tables.append(huffman[ac])

    if len(comps) == 1:  # a non-interleaved scan: one block per MCU, over the component
        h = v = 1
        sampled = [(-(-width * comps[0][1] // hmax), -(-height * comps[0][2] // vmax))]
        mcus_x, mcus_y = -(-sampled[0][0] // 8), -(-sampled[0][1] // 8)
        layout = [(1, 1)]
    else:
        mcus_x, mcus_y = -(-width // (8 * hmax)), -(-height // (8 * vmax))
        layout = [(h, v) for _, h, v, _ in comps]
        sampled = [(-(-width * h // hmax), -(-height * v // vmax)) for _, h, v, _ in comps]
    units = [i for i, (h, v) in enumerate(layout) for _ in range(h * v)]
    segments, _ = _scan_bits(data, start)
    coeffs = _decode_blocks(segments, units, dc_tables, ac_tables, restart_interval,
                            mcus_x * mcus_y)

    planes = []
    first = 0
    for i, ((h, v), (cid, ch, cv, qt)) in enumerate(zip(layout, comps)):
        blocks = coeffs[:, first:first + h * v]  # (MCUs, h * v, 64), zigzag order
        first += h * v
        natural = np.zeros(blocks.shape, np.int64)
        natural[..., _ZIGZAG] = blocks * quant[qt][_ZIGZAG]
        pixels = _idct(natural.reshape(-1, 8, 8))
        # (mcus_y, mcus_x, v, h, 8, 8) -> (mcus_y * v * 8, mcus_x * h * 8)
        plane = pixels.reshape(mcus_y, mcus_x, v, h, 8, 8).transpose(0, 2, 4, 1, 3, 5)
        plane = plane.reshape(mcus_y * v * 8, mcus_x * h * 8)
        sw, sh = sampled[i]
        plane = plane[:sh, :sw]
        if len(comps) == 1:
            return plane[:height, :width, None].copy()
        if hmax % ch or vmax % cv:
            raise _refuse(f"{hmax}x{vmax} to {ch}x{cv} (fractional) subsampling")
        up_h, up_v = hmax // ch, vmax // cv
        planes.append(_upsample(plane, up_h, up_v, width, height))
    if rgb:
        return np.stack(planes, axis=-1).astype(np.uint8)
    return _ycc_to_rgb(*planes)
