"""Decoders of the K-quant super-blocks (256 values): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Shared layout facts: 2-bit fields are packed four to a byte across 32-byte rows (value j of a
128-value half sits in byte `j % 32` of that half, at bit `2 * (j // 32)`); 4-bit fields pair the
32-value sub-blocks `2k` (low nibble) and `2k + 1` (high nibble) in one 32-byte row. Signature of
every decoder: `(src uint8[::1], off, dst float32[::1], dst_off)`, 256 values written.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.quant.scalars import U, byte, f16_at, sbyte

F32 = np.float32


@njit(cache=True)
def _two_bits(src, qs_off, j):
    """The 2-bit field of value j (0..255) in a 64-byte K-quant `qs` array."""
    half = j >> 7
    shift = 2 * ((j >> 5) & 3)
    return (byte(src, qs_off + half * 32 + (j & 31)) >> shift) & 3


@njit(cache=True)
def _k4_scale_min(src, sc_off, k):
    """Sub-block k's 6-bit (scale, min) from the 12-byte packed array of Q4_K / Q5_K: the first
    four pairs are the low 6 bits of bytes 0-3 / 4-7; the last four take 4 low bits from bytes
    8-11 and their top 2 bits from the spare top bits of bytes 0-7."""
    if k < 4:
        sc = byte(src, sc_off + k) & 63
        mn = byte(src, sc_off + k + 4) & 63
    else:
        packed = byte(src, sc_off + k + 4)
        sc = (packed & 15) | ((byte(src, sc_off + k - 4) >> 6) << 4)
        mn = (packed >> 4) | ((byte(src, sc_off + k) >> 6) << 4)
    return sc, mn


@njit(cache=True)
def decode_q2_k(src, off, dst, dst_off):
    """Q2_K, 84 bytes: 16 scale bytes (low nibble scale, high nibble min, per 16 values), 64 bytes
    of 2-bit q, fp16 d, fp16 dmin; x = d * sc * q - dmin * m."""
    d = f16_at(src, off + 80)
    dmin = f16_at(src, off + 82)
    for k in range(16):
        s = byte(src, off + k)
        dl = d * F32(s & 15)
        ml = dmin * F32(s >> 4)
        for i in range(16):
            j = 16 * k + i
            dst[U(dst_off + j)] = dl * F32(_two_bits(src, off + 16, j)) - ml


@njit(cache=True)
def _q3_scale(src, sc_off, k):
    """Q3_K's 6-bit signed scale k (0..15): 4 low bits from nibbles of bytes 0-7, 2 high bits
    from bytes 8-11."""
    low = (byte(src, sc_off + (k & 7)) >> (4 * (k >> 3))) & 15
    high = (byte(src, sc_off + 8 + (k & 3)) >> (2 * (k >> 2))) & 3
    return (low | (high << 4)) - 32


@njit(cache=True)
def decode_q3_k(src, off, dst, dst_off):
    """Q3_K, 110 bytes: 32-byte high-bit mask, 64 bytes of 2-bit q, 12 bytes of packed 6-bit
    scales, fp16 d; x = d * scale * (q - 4 * (1 - hbit))."""
    d = f16_at(src, off + 108)
    for k in range(16):
        dl = d * F32(_q3_scale(src, off + 96, k))
        for i in range(16):
            j = 16 * k + i
            hbit = (byte(src, off + (j & 31)) >> (j >> 5)) & 1
            q = _two_bits(src, off + 32, j) - (0 if hbit else 4)
            dst[U(dst_off + j)] = dl * F32(q)


@njit(cache=True)
def decode_q4_k(src, off, dst, dst_off):
    """Q4_K, 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles;
    x = d * sc * q - dmin * m per 32-value sub-block."""
    d = f16_at(src, off)
    dmin = f16_at(src, off + 2)
    for k in range(8):
        sc, mn = _k4_scale_min(src, off + 4, k)
        dk = d * F32(sc)
        mk = dmin * F32(mn)
        row = off + 16 + (k >> 1) * 32
        shift = 4 * (k & 1)
        for i in range(32):
            q = (byte(src, row + i) >> shift) & 15
            dst[U(dst_off + 32 * k + i)] = dk * F32(q) - mk


@njit(cache=True)
def decode_q5_k(src, off, dst, dst_off):
    """Q5_K, 176 bytes: as Q4_K plus a 32-byte array of 5th bits (bit k of byte i for value
    32k + i) before the nibbles."""
    d = f16_at(src, off)
    dmin = f16_at(src, off + 2)
    for k in range(8):
        sc, mn = _k4_scale_min(src, off + 4, k)
        dk = d * F32(sc)
        mk = dmin * F32(mn)
        row = off + 48 + (k >> 1) * 32
        shift = 4 * (k & 1)
        for i in range(32):
            q = ((byte(src, row + i) >> shift) & 15) | (((byte(src, off + 16 + i) >> k) & 1) << 4)
            dst[U(dst_off + 32 * k + i)] = dk * F32(q) - mk


@njit(cache=True)
def decode_q6_k(src, off, dst, dst_off):
    """Q6_K, 210 bytes: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (per 16
    values), fp16 d; x = d * scale * (q - 32)."""
    d = f16_at(src, off + 208)
    for k in range(16):
        dl = d * F32(sbyte(src, off + 192 + k))
        for i in range(16):
            j = 16 * k + i
            half = j >> 7
            r = j & 127
            lo = (byte(src, off + half * 64 + (r & 63)) >> (4 * (r >> 6))) & 15
            hi = _two_bits(src, off + 128, j)
            dst[U(dst_off + j)] = dl * F32((lo | (hi << 4)) - 32)
