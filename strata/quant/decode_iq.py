"""Decoders of the i-quant super-blocks (256 values): IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS,
IQ2_S.

The IQ2/IQ3 formats store indices into grids of non-negative magnitudes (`tables.py`) plus sign
bits; 7-bit sign indices expand to 8 sign bits through KSIGNS. Signature of every decoder:
`(src uint8[::1], off, dst float32[::1], dst_off)`, 256 values written.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.quant.scalars import U, byte, f16_at, u16_at, u32_at
from strata.quant.tables import (
    IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, IQ4NL_VALUES, KSIGNS,
)

F32 = np.float32


@njit(cache=True)
def _put8(dst, at, db, grid, idx, signs):
    """Write 8 values db * grid[idx, t], negated where bit t of `signs` is set."""
    for t in range(8):
        v = db * grid[U(idx), U(t)]
        dst[U(at + t)] = -v if (signs >> t) & 1 else v


@njit(cache=True)
def _put4(dst, at, db, grid, idx, signs, first_bit):
    """Write 4 values db * grid[idx, t], with signs from bits first_bit.. of `signs`."""
    for t in range(4):
        v = db * grid[U(idx), U(t)]
        dst[U(at + t)] = -v if (signs >> (first_bit + t)) & 1 else v


@njit(cache=True)
def _nibble(src, at, k):
    """Nibble k of the byte array at `at` (low nibble first)."""
    return (byte(src, at + (k >> 1)) >> (4 * (k & 1))) & 15


@njit(cache=True)
def decode_iq4_xs(src, off, dst, dst_off):
    """IQ4_XS, 136 bytes: fp16 d, uint16 of high scale bits, 4 bytes of low scale nibbles,
    128 bytes of codebook nibbles; x = d * (scale - 32) * v[q] per 32-value sub-block."""
    d = f16_at(src, off)
    scales_h = u16_at(src, off + 2)
    for k in range(8):
        ls = _nibble(src, off + 4, k) | (((scales_h >> (2 * k)) & 3) << 4)
        dl = d * F32(ls - 32)
        for i in range(16):
            b = byte(src, off + 8 + 16 * k + i)
            dst[U(dst_off + 32 * k + i)] = dl * IQ4NL_VALUES[U(b & 15)]
            dst[U(dst_off + 32 * k + 16 + i)] = dl * IQ4NL_VALUES[U(b >> 4)]


@njit(cache=True)
def decode_iq2_xxs(src, off, dst, dst_off):
    """IQ2_XXS, 66 bytes: fp16 d, then per 32 values 4 grid bytes and a uint32 holding four 7-bit
    sign indices and a 4-bit scale; x = d * (0.5 + s) / 4 * grid * sign."""
    d = f16_at(src, off)
    for ib in range(8):
        base = off + 2 + 8 * ib
        aux = u32_at(src, base + 4)
        db = d * (F32(0.5) + F32(aux >> 28)) * F32(0.25)
        for g in range(4):
            signs = KSIGNS[U((aux >> (7 * g)) & 127)]
            _put8(dst, dst_off + 32 * ib + 8 * g, db, IQ2XXS_GRID, byte(src, base + g), signs)


@njit(cache=True)
def decode_iq2_xs(src, off, dst, dst_off):
    """IQ2_XS, 74 bytes: fp16 d, 32 uint16 (9-bit grid index, 7-bit sign index), 8 bytes of 4-bit
    scales (one per 16 values); x = d * (0.5 + s) / 4 * grid * sign."""
    d = f16_at(src, off)
    for grp in range(32):
        q = u16_at(src, off + 2 + 2 * grp)
        db = d * (F32(0.5) + F32(_nibble(src, off + 66, grp >> 1))) * F32(0.25)
        _put8(dst, dst_off + 8 * grp, db, IQ2XS_GRID, q & 511, KSIGNS[U(q >> 9)])


@njit(cache=True)
def decode_iq2_s(src, off, dst, dst_off):
    """IQ2_S, 82 bytes: fp16 d, 32 low grid-index bytes, 32 sign bytes, 8 bytes of 2-bit index
    highs, 8 bytes of 4-bit scales (one per 16 values)."""
    d = f16_at(src, off)
    for grp in range(32):
        high = (byte(src, off + 66 + (grp >> 2)) >> (2 * (grp & 3))) & 3
        idx = byte(src, off + 2 + grp) | (high << 8)
        db = d * (F32(0.5) + F32(_nibble(src, off + 74, grp >> 1))) * F32(0.25)
        _put8(dst, dst_off + 8 * grp, db, IQ2S_GRID, idx, byte(src, off + 34 + grp))


@njit(cache=True)
def decode_iq3_xxs(src, off, dst, dst_off):
    """IQ3_XXS, 98 bytes: fp16 d, 64 grid bytes (4 values each), then per 32 values a uint32
    holding four 7-bit sign indices and a 4-bit scale; x = d * (0.5 + s) / 2 * grid * sign."""
    d = f16_at(src, off)
    for ib in range(8):
        aux = u32_at(src, off + 66 + 4 * ib)
        db = d * (F32(0.5) + F32(aux >> 28)) * F32(0.5)
        for g in range(4):
            signs = KSIGNS[U((aux >> (7 * g)) & 127)]
            at = dst_off + 32 * ib + 8 * g
            qi = off + 2 + 8 * ib + 2 * g
            _put4(dst, at, db, IQ3XXS_GRID, byte(src, qi), signs, 0)
            _put4(dst, at + 4, db, IQ3XXS_GRID, byte(src, qi + 1), signs, 4)


@njit(cache=True)
def decode_iq3_s(src, off, dst, dst_off):
    """IQ3_S, 110 bytes: fp16 d, 64 low grid-index bytes, 8 bytes of 9th index bits, 32 bytes of
    sign bits (one per value), 4 bytes of 4-bit scales; x = d * (1 + 2s) * grid * sign."""
    d = f16_at(src, off)
    for k in range(8):
        db = d * F32(1 + 2 * _nibble(src, off + 106, k))
        high_bits = byte(src, off + 66 + k)
        for p in range(8):
            gi = 8 * k + p
            idx = byte(src, off + 2 + gi) | (((high_bits >> p) & 1) << 8)
            signs = byte(src, off + 74 + (gi >> 1))
            _put4(dst, dst_off + 4 * gi, db, IQ3S_GRID, idx, signs, 4 * (p & 1))
