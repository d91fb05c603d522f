"""Decoders of the 32-value block formats: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4.

Common layout fact: the 4-bit formats pack value `i` of the first half in the low nibble of byte
`i` and value `i + 16` in the high nibble of the same byte. Every decoder has the signature
`(src uint8[::1], off, dst float32[::1], dst_off)` and writes 32 values.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.quant.scalars import U, byte, e8m0_half_at, f16_at, sbyte, u32_at
from strata.quant.tables import E2M1_VALUES, IQ4NL_VALUES

F32 = np.float32


@njit(cache=True)
def decode_q8_0(src, off, dst, dst_off):
    """Q8_0, 34 bytes: fp16 d, 32 x int8 q; x = d * q."""
    d = f16_at(src, off)
    for i in range(32):
        dst[U(dst_off + i)] = F32(sbyte(src, off + 2 + i)) * d


@njit(cache=True)
def decode_q4_0(src, off, dst, dst_off):
    """Q4_0, 18 bytes: fp16 d, 16 bytes of nibbles; x = d * (q - 8)."""
    d = f16_at(src, off)
    for i in range(16):
        b = byte(src, off + 2 + i)
        dst[U(dst_off + i)] = d * F32((b & 15) - 8)
        dst[U(dst_off + 16 + i)] = d * F32((b >> 4) - 8)


@njit(cache=True)
def decode_q4_1(src, off, dst, dst_off):
    """Q4_1, 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles; x = d * q + m."""
    d = f16_at(src, off)
    m = f16_at(src, off + 2)
    for i in range(16):
        b = byte(src, off + 4 + i)
        dst[U(dst_off + i)] = d * F32(b & 15) + m
        dst[U(dst_off + 16 + i)] = d * F32(b >> 4) + m


@njit(cache=True)
def decode_q5_0(src, off, dst, dst_off):
    """Q5_0, 22 bytes: fp16 d, uint32 of 5th bits (bit i for value i), 16 bytes of nibbles;
    x = d * (q - 16)."""
    d = f16_at(src, off)
    qh = u32_at(src, off + 2)
    for i in range(16):
        b = byte(src, off + 6 + i)
        lo = (b & 15) | (((qh >> i) & 1) << 4)
        hi = (b >> 4) | (((qh >> (i + 16)) & 1) << 4)
        dst[U(dst_off + i)] = d * F32(lo - 16)
        dst[U(dst_off + 16 + i)] = d * F32(hi - 16)


@njit(cache=True)
def decode_q5_1(src, off, dst, dst_off):
    """Q5_1, 24 bytes: fp16 d, fp16 m, uint32 of 5th bits, 16 bytes of nibbles; x = d * q + m."""
    d = f16_at(src, off)
    m = f16_at(src, off + 2)
    qh = u32_at(src, off + 4)
    for i in range(16):
        b = byte(src, off + 8 + i)
        lo = (b & 15) | (((qh >> i) & 1) << 4)
        hi = (b >> 4) | (((qh >> (i + 16)) & 1) << 4)
        dst[U(dst_off + i)] = d * F32(lo) + m
        dst[U(dst_off + 16 + i)] = d * F32(hi) + m


@njit(cache=True)
def decode_iq4_nl(src, off, dst, dst_off):
    """IQ4_NL, 18 bytes: fp16 d, 16 bytes of nibbles indexing a 16-entry codebook; x = d * v[q]."""
    d = f16_at(src, off)
    for i in range(16):
        b = byte(src, off + 2 + i)
        dst[U(dst_off + i)] = d * IQ4NL_VALUES[U(b & 15)]
        dst[U(dst_off + 16 + i)] = d * IQ4NL_VALUES[U(b >> 4)]


@njit(cache=True)
def decode_mxfp4(src, off, dst, dst_off):
    """MXFP4, 17 bytes: E8M0 shared exponent, 16 bytes of E2M1 nibbles; x = 2^(e-127) * fp4(q)."""
    d = e8m0_half_at(src, off)
    for i in range(16):
        b = byte(src, off + 1 + i)
        dst[U(dst_off + i)] = d * E2M1_VALUES[U(b & 15)]
        dst[U(dst_off + 16 + i)] = d * E2M1_VALUES[U(b >> 4)]
