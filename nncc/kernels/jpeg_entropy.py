"""JPEG entropy-coded data: Huffman tables, scans split at restart markers, and the
coefficients of sequential and progressive scans (Huffman-coded).

Huffman decoding is sequential by nature; codes are looked up 16 bits at a time from a
precomputed window of the bit stream (held for 32 KB of scan data at a time).
"""

from __future__ import annotations

import numpy as np


class JpegCorrupt(Exception):
    """The stream is not a well-formed JPEG."""


def need(condition: bool, why: str) -> None:
    if not condition:
        raise JpegCorrupt(why)


def huffman_table(counts: bytes, symbols: bytes):
    """A 65536-entry lookup from the next 16 bits to (symbol, code length); length 0 marks
    a bit pattern no code starts."""
    lookup_symbol = np.zeros(65536, np.int32)
    lookup_length = np.zeros(65536, np.int32)
    code = 0
    k = 0
    for length in range(1, 17):
        for _ in range(counts[length - 1]):
            need(code < (1 << length), "bad Huffman table")
            first = code << (16 - length)
            span = 1 << (16 - length)
            lookup_symbol[first:first + span] = symbols[k]
            lookup_length[first:first + span] = length
            code += 1
            k += 1
        code <<= 1
    return lookup_symbol.tolist(), lookup_length.tolist()


def parse_dht(payload: bytes, tables: dict) -> None:
    pos = 0
    while pos < len(payload):
        need(pos + 17 <= len(payload), "truncated Huffman table")
        kind, index = payload[pos] >> 4, payload[pos] & 15
        need(kind in (0, 1) and index < 4, "bad Huffman table id")
        counts = payload[pos + 1:pos + 17]
        total = sum(counts)
        need(pos + 17 + total <= len(payload), "truncated Huffman table")
        tables[(kind, index)] = huffman_table(counts, payload[pos + 17:pos + 17 + total])
        pos += 17 + total


# --------------------------------------------------------------------------- sequential scans


def scan_segments(data: bytes, start: int) -> tuple[list[bytes], int]:
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
    there. Past the end come ones: no Huffman code is all ones, so decoding that runs past
    the data fails at the next code."""
    piece = segment[first:first + _CHUNK]
    bits = np.unpackbits(np.frombuffer(piece + b"\xff\xff\xff", np.uint8)).astype(np.int64)
    weights = 1 << np.arange(15, -1, -1, dtype=np.int64)
    count = len(piece) * 8 + 1
    view = np.lib.stride_tricks.sliding_window_view(bits, 16)[:count]
    return (view @ weights).tolist()


def decode_sequential(segments, units, dc_tables, ac_tables, restart_interval, total_units):
    """Zigzag-ordered coefficients of every block of the scan, in scan order.

    ``units``: for each block of one MCU, the index of its component. Returns an
    (MCUs, len(units), 64) int64 array."""
    # every block spends at least one bit on its DC code and one on an AC code: a header
    # claiming more blocks than the data can hold is refused before anything is allocated
    need(2 * total_units * len(units) <= 8 * sum(map(len, segments)) + 32,
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
                need(pos <= limit, "scan data ends early")
                peek = window[pos]
                length = lengths[peek]
                need(length, "bad Huffman code")
                size = symbols[peek]
                pos += length
                diff = 0
                if size:
                    need(size <= 11 and pos <= limit, "bad DC coefficient")
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
                    need(pos <= limit, "scan data ends early")
                    peek = window[pos]
                    length = lengths[peek]
                    need(length, "bad Huffman code")
                    rs = symbols[peek]
                    pos += length
                    run, size = rs >> 4, rs & 15
                    if size == 0:
                        if run != 15:
                            break  # end of block
                        k += 16
                        continue
                    k += run
                    need(k < 64 and size <= 10 and pos <= limit, "bad AC coefficient")
                    v = window[pos] >> (16 - size)
                    if v < (1 << (size - 1)):
                        v -= (1 << size) - 1
                    pos += size
                    coeffs[k] = v
                    k += 1
                row[b] = coeffs
            mcu += 1
    need(mcu >= total_units, "scan data ends early")
    return out


# --------------------------------------------------------------------------- progressive scans


class _Bits:
    """A reader over one entropy-coded segment."""

    def __init__(self, segment: bytes):
        self.segment = segment
        self.first = 0  # the byte the windows start at; pos counts bits from there
        self.pos = 0
        self.window = _windows(segment, 0)
        self.limit = len(self.window) - 1

    def next_block(self) -> None:
        """Moves the windows on when the next block could run past them."""
        if self.pos > self.limit - _BLOCK_BITS and self.first + _CHUNK < len(self.segment):
            self.first += self.pos >> 3
            self.pos &= 7
            self.window = _windows(self.segment, self.first)
            self.limit = len(self.window) - 1

    def symbol(self, table) -> int:
        symbols, lengths = table
        need(self.pos <= self.limit, "scan data ends early")
        peek = self.window[self.pos]
        length = lengths[peek]
        need(length, "bad Huffman code")
        self.pos += length
        return symbols[peek]

    def bits(self, n: int) -> int:
        """The next n (1 to 16) bits as an unsigned number."""
        need(self.pos <= self.limit, "scan data ends early")
        value = self.window[self.pos] >> (16 - n)
        self.pos += n
        return value

    def signed(self, n: int) -> int:
        """The next n bits as a coefficient of magnitude category n."""
        value = self.bits(n)
        return value - (1 << n) + 1 if value < (1 << (n - 1)) else value


def decode_progressive(segments, mcus, dc_tables, ac_tables, restart_interval, ss, se, ah, al):
    """Adds one progressive scan to the coefficients of its blocks.

    ``mcus``: per MCU, its (component, block) pairs in order, each block a list of 64
    zigzag-ordered coefficients updated in place. ``ss``..``se`` is the scan's band of
    coefficients; ``ah``/``al`` the bit positions of its successive approximation."""
    need(ss <= se <= 63 and (ss == 0) == (se == 0) and al <= 13, "bad progressive scan")
    need(ah == 0 or ah == al + 1, "bad successive approximation")
    per_segment = restart_interval or len(mcus)
    done = 0
    for segment in segments:
        if done >= len(mcus):
            break
        bits = _Bits(segment)
        predictors: dict[int, int] = {}
        eob_run = 0
        for mcu in mcus[done:done + per_segment]:
            for comp, block in mcu:
                bits.next_block()
                if ss == 0 and ah == 0:  # the DC coefficients' first bits
                    size = bits.symbol(dc_tables[comp])
                    need(size <= 11, "bad DC coefficient")
                    value = predictors.get(comp, 0) + (bits.signed(size) if size else 0)
                    predictors[comp] = value
                    block[0] = value << al
                elif ss == 0:  # one more bit of each DC coefficient
                    block[0] |= bits.bits(1) << al
                elif ah == 0:
                    eob_run = _ac_first(bits, block, ac_tables[comp], ss, se, al, eob_run)
                else:
                    eob_run = _ac_refine(bits, block, ac_tables[comp], ss, se, al, eob_run)
        done += len(mcus[done:done + per_segment])
    need(done >= len(mcus), "scan data ends early")


def _ac_first(bits: _Bits, block, table, ss, se, al, eob_run) -> int:
    """The first bits of the band's AC coefficients of one block; returns the run of blocks
    still to skip (ends of band spanning several blocks)."""
    if eob_run:
        return eob_run - 1
    k = ss
    while k <= se:
        rs = bits.symbol(table)
        run, size = rs >> 4, rs & 15
        if size:
            k += run
            need(k <= se, "bad AC coefficient")
            block[k] = bits.signed(size) << al
        elif run == 15:
            k += 15
        else:
            return (1 << run) - 1 + (bits.bits(run) if run else 0)
        k += 1
    return 0


def _ac_refine(bits: _Bits, block, table, ss, se, al, eob_run) -> int:
    """One more bit of the band's AC coefficients of one block: coefficients already
    nonzero read a correction bit each; runs of zeros are skipped up to where a newly
    nonzero one (+-1 at this bit) goes."""
    plus, minus = 1 << al, -1 << al
    k = ss
    if not eob_run:
        while k <= se:
            rs = bits.symbol(table)
            run, size = rs >> 4, rs & 15
            new = 0
            if size:
                need(size == 1, "bad refinement coefficient")
                new = plus if bits.bits(1) else minus
            elif run != 15:
                eob_run = (1 << run) + (bits.bits(run) if run else 0)
                break
            while k <= se:
                if block[k]:
                    if bits.bits(1) and not block[k] & plus:
                        block[k] += plus if block[k] >= 0 else minus
                else:
                    run -= 1
                    if run < 0:
                        break
                k += 1
            if new:
                need(k <= se, "bad refinement coefficient")
                block[k] = new
            k += 1
    if eob_run:
        while k <= se:
            if block[k] and bits.bits(1) and not block[k] & plus:
                block[k] += plus if block[k] >= 0 else minus
            k += 1
        eob_run -= 1
    return eob_run
