"""Device decoders of the lattice ("IQ") formats: IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S. The
contract is in `qformats`. Group j of a row is sub-block jb = j % 8 of super-block j // 8; each
grid row gives 4 (IQ3) or 8 (IQ2) magnitudes, signs come as bits. The `*32t` variants read the
format's flat table (`qtables.TABLE_*`, staged in shared memory by the kernels that care); the
contract's dq32/dot32 pass the constant-memory copy.

Layouts (byte offsets inside one 256-value super-block):
  IQ3_S   110: d @0, qs[64] @2, qh[8] @66, signs[32] @74, scales[4] @106.
               Row index of grid entry k (0..63): qs[k] | ((qh[k//8] >> k%8) & 1) << 8 (512 rows);
               sign of value v: bit v%8 of signs[v//8]; sub-block scale d*(1 + 2*nibble jb).
  IQ3_XXS  98: d @0, qs[64] @2 (256-row grid), u32 aux[8] @66: bits 7l..7l+6 are the sign
               index of values 8l..8l+7 (through KSIGNS), bits 28..31 the scale: d*(0.5+s)*0.5.
  IQ2_XXS  66: d @0, then per sub-block two u32 (a, b) @2+8jb: byte l of a is the grid row
               (256 rows) of values 8l..8l+7, b as IQ3_XXS's aux with scale d*(0.5+s)*0.25.
  IQ2_XS   74: d @0, u16 q[32] @2: q & 511 grid row (512 rows), q >> 9 sign index;
               scales[8] @66: nibble 2jb + l//2 scales entries l of sub-block jb.
  IQ2_S    82: d @0, qs[32] @2, signs[32] @34, qh[8] @66, scales[8] @74; grid row of entry k:
               qs[k] | ((qh[k//4] >> 2(k%4)) & 3) << 8 (1024 rows).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .intrinsics import h2f, ld_u16, ld_u32_any, ld_u8, ld_x4
from .qtables import (KS_OFF_IQ2_XS, KS_OFF_IQ2_XXS, KS_OFF_IQ3_XXS, TABLE_IQ2_S, TABLE_IQ2_XS,
                      TABLE_IQ2_XXS, TABLE_IQ3_S, TABLE_IQ3_XXS)

F0 = np.float32(0.0)
F_QUARTER = np.float32(0.25)
F_HALF = np.float32(0.5)


@cuda.jit(device=True, inline="always")
def _sgn(signs, bit, v):
    """v, negated when bit `bit` of `signs` is set."""
    return -v if (signs >> bit) & 1 else v


@cuda.jit(device=True, inline="always")
def _dq4(g, signs, sbit, scale, dst, o):
    """Write the 4 magnitudes of packed grid word g, signed by bits sbit.. of signs, scaled."""
    for t in range(4):
        dst[o + t] = scale * _sgn(signs, sbit + t, np.float32((g >> (8 * t)) & 0xFF))


@cuda.jit(device=True, inline="always")
def _dot4(g, signs, sbit, x, xo):
    x0, x1, x2, x3 = ld_x4(x, xo)
    return (_sgn(signs, sbit, np.float32(g & 0xFF)) * x0
            + _sgn(signs, sbit + 1, np.float32((g >> 8) & 0xFF)) * x1
            + _sgn(signs, sbit + 2, np.float32((g >> 16) & 0xFF)) * x2
            + _sgn(signs, sbit + 3, np.float32(g >> 24)) * x3)


# ---- IQ3_S ----

@cuda.jit(device=True, inline="always")
def _iq3s_row(src, o, jb, g):
    return ld_u8(src, o + 2 + 8 * jb + g) | (((ld_u8(src, o + 66 + jb) >> g) & 1) << 8)


@cuda.jit(device=True, inline="always")
def _iq3s_scale(src, o, jb):
    nib = (ld_u8(src, o + 106 + (jb >> 1)) >> (4 * (jb & 1))) & 0xF
    return h2f(ld_u16(src, o)) * np.float32(1 + 2 * nib)


@cuda.jit(device=True, inline="always")
def dq32t_iq3_s(src, row_off, j, dst, dst_off, tab):
    o = row_off + (j >> 3) * 110
    jb = j & 7
    db = _iq3s_scale(src, o, jb)
    signs = ld_u32_any(src, o + 74 + 4 * jb)
    for g in range(8):
        _dq4(tab[_iq3s_row(src, o, jb, g)], signs, 4 * g, db, dst, dst_off + 4 * g)


@cuda.jit(device=True, inline="always")
def dot32t_iq3_s(src, row_off, j, x, x_off, tab):
    o = row_off + (j >> 3) * 110
    jb = j & 7
    signs = ld_u32_any(src, o + 74 + 4 * jb)
    acc = F0
    for g in range(8):
        acc += _dot4(tab[_iq3s_row(src, o, jb, g)], signs, 4 * g, x, x_off + 4 * g)
    return _iq3s_scale(src, o, jb) * acc


# ---- IQ3_XXS ----

@cuda.jit(device=True, inline="always")
def dq32t_iq3_xxs(src, row_off, j, dst, dst_off, tab):
    o = row_off + (j >> 3) * 98
    jb = j & 7
    aux = ld_u32_any(src, o + 66 + 4 * jb)
    db = h2f(ld_u16(src, o)) * (F_HALF + np.float32(aux >> 28)) * F_HALF
    for g in range(8):
        signs = tab[KS_OFF_IQ3_XXS + ((aux >> (7 * (g >> 1))) & 127)]
        _dq4(tab[ld_u8(src, o + 2 + 8 * jb + g)], signs, 4 * (g & 1), db, dst, dst_off + 4 * g)


@cuda.jit(device=True, inline="always")
def dot32t_iq3_xxs(src, row_off, j, x, x_off, tab):
    o = row_off + (j >> 3) * 98
    jb = j & 7
    aux = ld_u32_any(src, o + 66 + 4 * jb)
    acc = F0
    for g in range(8):
        signs = tab[KS_OFF_IQ3_XXS + ((aux >> (7 * (g >> 1))) & 127)]
        acc += _dot4(tab[ld_u8(src, o + 2 + 8 * jb + g)], signs, 4 * (g & 1), x, x_off + 4 * g)
    return h2f(ld_u16(src, o)) * (F_HALF + np.float32(aux >> 28)) * F_HALF * acc


# ---- IQ2 family: 8-value grid rows (two consecutive table words) ----

@cuda.jit(device=True, inline="always")
def _dq8(tab, row, signs, scale, dst, o):
    _dq4(tab[2 * row], signs, 0, scale, dst, o)
    _dq4(tab[2 * row + 1], signs, 4, scale, dst, o + 4)


@cuda.jit(device=True, inline="always")
def _dot8(tab, row, signs, x, xo):
    return _dot4(tab[2 * row], signs, 0, x, xo) + _dot4(tab[2 * row + 1], signs, 4, x, xo + 4)


@cuda.jit(device=True, inline="always")
def dq32t_iq2_xxs(src, row_off, j, dst, dst_off, tab):
    base = row_off + (j >> 3) * 66
    o = base + 2 + 8 * (j & 7)
    a = ld_u32_any(src, o)
    b = ld_u32_any(src, o + 4)
    db = h2f(ld_u16(src, base)) * (F_HALF + np.float32(b >> 28)) * F_QUARTER
    for l in range(4):
        _dq8(tab, (a >> (8 * l)) & 0xFF, tab[KS_OFF_IQ2_XXS + ((b >> (7 * l)) & 127)], db,
             dst, dst_off + 8 * l)


@cuda.jit(device=True, inline="always")
def dot32t_iq2_xxs(src, row_off, j, x, x_off, tab):
    base = row_off + (j >> 3) * 66
    o = base + 2 + 8 * (j & 7)
    a = ld_u32_any(src, o)
    b = ld_u32_any(src, o + 4)
    acc = F0
    for l in range(4):
        acc += _dot8(tab, (a >> (8 * l)) & 0xFF, tab[KS_OFF_IQ2_XXS + ((b >> (7 * l)) & 127)],
                     x, x_off + 8 * l)
    return h2f(ld_u16(src, base)) * (F_HALF + np.float32(b >> 28)) * F_QUARTER * acc


@cuda.jit(device=True, inline="always")
def _iq2_scale(src, so, jb, l):
    """d-relative scale (0.5 + nibble) * 0.25 of entry l of sub-block jb (IQ2_XS, IQ2_S)."""
    return (F_HALF + np.float32((ld_u8(src, so + jb) >> (4 * (l >> 1))) & 0xF)) * F_QUARTER


@cuda.jit(device=True, inline="always")
def dq32t_iq2_xs(src, row_off, j, dst, dst_off, tab):
    o = row_off + (j >> 3) * 74
    jb = j & 7
    d = h2f(ld_u16(src, o))
    for l in range(4):
        q = ld_u16(src, o + 2 + 8 * jb + 2 * l)
        _dq8(tab, q & 511, tab[KS_OFF_IQ2_XS + (q >> 9)], d * _iq2_scale(src, o + 66, jb, l),
             dst, dst_off + 8 * l)


@cuda.jit(device=True, inline="always")
def dot32t_iq2_xs(src, row_off, j, x, x_off, tab):
    o = row_off + (j >> 3) * 74
    jb = j & 7
    acc = F0
    for l in range(4):
        q = ld_u16(src, o + 2 + 8 * jb + 2 * l)
        acc += _iq2_scale(src, o + 66, jb, l) * _dot8(tab, q & 511, tab[KS_OFF_IQ2_XS + (q >> 9)],
                                                      x, x_off + 8 * l)
    return h2f(ld_u16(src, o)) * acc


@cuda.jit(device=True, inline="always")
def _iq2s_row(src, o, jb, l):
    return ld_u8(src, o + 2 + 4 * jb + l) | (((ld_u8(src, o + 66 + jb) >> (2 * l)) & 3) << 8)


@cuda.jit(device=True, inline="always")
def dq32t_iq2_s(src, row_off, j, dst, dst_off, tab):
    o = row_off + (j >> 3) * 82
    jb = j & 7
    d = h2f(ld_u16(src, o))
    for l in range(4):
        signs = ld_u8(src, o + 34 + 4 * jb + l)
        _dq8(tab, _iq2s_row(src, o, jb, l), signs, d * _iq2_scale(src, o + 74, jb, l),
             dst, dst_off + 8 * l)


@cuda.jit(device=True, inline="always")
def dot32t_iq2_s(src, row_off, j, x, x_off, tab):
    o = row_off + (j >> 3) * 82
    jb = j & 7
    acc = F0
    for l in range(4):
        signs = ld_u8(src, o + 34 + 4 * jb + l)
        acc += _iq2_scale(src, o + 74, jb, l) * _dot8(tab, _iq2s_row(src, o, jb, l), signs,
                                                      x, x_off + 8 * l)
    return h2f(ld_u16(src, o)) * acc


# ---- the contract's entry points: the same decoders on the constant-memory tables ----

@cuda.jit(device=True, inline="always")
def dq32_iq3_s(src, row_off, j, dst, dst_off):
    dq32t_iq3_s(src, row_off, j, dst, dst_off, cuda.const.array_like(TABLE_IQ3_S))


@cuda.jit(device=True, inline="always")
def dot32_iq3_s(src, row_off, j, x, x_off):
    return dot32t_iq3_s(src, row_off, j, x, x_off, cuda.const.array_like(TABLE_IQ3_S))


@cuda.jit(device=True, inline="always")
def dq32_iq3_xxs(src, row_off, j, dst, dst_off):
    dq32t_iq3_xxs(src, row_off, j, dst, dst_off, cuda.const.array_like(TABLE_IQ3_XXS))


@cuda.jit(device=True, inline="always")
def dot32_iq3_xxs(src, row_off, j, x, x_off):
    return dot32t_iq3_xxs(src, row_off, j, x, x_off, cuda.const.array_like(TABLE_IQ3_XXS))


@cuda.jit(device=True, inline="always")
def dq32_iq2_xxs(src, row_off, j, dst, dst_off):
    dq32t_iq2_xxs(src, row_off, j, dst, dst_off, cuda.const.array_like(TABLE_IQ2_XXS))


@cuda.jit(device=True, inline="always")
def dot32_iq2_xxs(src, row_off, j, x, x_off):
    return dot32t_iq2_xxs(src, row_off, j, x, x_off, cuda.const.array_like(TABLE_IQ2_XXS))


@cuda.jit(device=True, inline="always")
def dq32_iq2_xs(src, row_off, j, dst, dst_off):
    dq32t_iq2_xs(src, row_off, j, dst, dst_off, cuda.const.array_like(TABLE_IQ2_XS))


@cuda.jit(device=True, inline="always")
def dot32_iq2_xs(src, row_off, j, x, x_off):
    return dot32t_iq2_xs(src, row_off, j, x, x_off, cuda.const.array_like(TABLE_IQ2_XS))


@cuda.jit(device=True, inline="always")
def dq32_iq2_s(src, row_off, j, dst, dst_off):
    dq32t_iq2_s(src, row_off, j, dst, dst_off, cuda.const.array_like(TABLE_IQ2_S))


@cuda.jit(device=True, inline="always")
def dot32_iq2_s(src, row_off, j, x, x_off):
    return dot32t_iq2_s(src, row_off, j, x, x_off, cuda.const.array_like(TABLE_IQ2_S))
