"""Lane decoders (see `lanes`) of IQ4_XS and IQ3_S; block layouts in `qformats_k` and
`qformats_iq`.

Slices:
  IQ4_XS  8 lanes: part p = sub-block p, qs[16p .. 16p + 15] (8-byte aligned: two 8-byte loads)
          plus the 8-byte header (d, scales_h, scales_l).
  IQ3_S   4 lanes: part p = sub-blocks 2p and 2p + 1: qs[16p .. +15], qh[2p], qh[2p + 1],
          signs[8p .. +7], the scale byte p and d (2-byte aligned: span loads).
The lookup tables are the kernel's shared-memory copies of the format's `qtables` table,
addressed by byte offset (IQ4_XS: 16 float32 levels; IQ3_S: 512 u32 grid rows of 4 bytes).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .intrinsics import F_2P23, MAGIC_2P23, byte_to_f32, f2u, h2f, ld_f32_at, ld_nc_u32x2, ld_u16
from .intrinsics import ld_u32_at, ld_u8, ld_x4, prmt, u2f
from .lanes_k import small_f32
from .levels import iq4_xs_scale
from .spans import span2, span4

B_S6 = np.float32(8388608.0 + 32.0)  # 2^23 + the bias of IQ4_XS's 6-bit scales
F0 = np.float32(0.0)


# ---- IQ4_XS ----

@cuda.jit(device=True, inline="always")
def load_iq4_xs(w, off, part):
    h0, h1 = ld_nc_u32x2(w, off)
    q0, q1 = ld_nc_u32x2(w, off + 8 + 16 * part)
    q2, q3 = ld_nc_u32x2(w, off + 16 + 16 * part)
    return (h0, h1, q0, q1, q2, q3)


@cuda.jit(device=True, inline="always")
def _kv4(i4, tab, x0, x1, x2, x3, acc):
    """acc + the sum over bytes b of i4 (each 4 * a level index) of level * x_b."""
    acc += ld_f32_at(tab, i4 & 0xFF) * x0
    acc += ld_f32_at(tab, prmt(i4, 0, 0x4441)) * x1     # byte 1, zero-extended: one permute
    acc += ld_f32_at(tab, prmt(i4, 0, 0x4442)) * x2
    acc += ld_f32_at(tab, i4 >> 24) * x3
    return acc


@cuda.jit(device=True, inline="always")
def _iq4_word(q, tab, xs, p, a, b):
    x0, x1, x2, x3 = ld_x4(xs, p)
    y0, y1, y2, y3 = ld_x4(xs, p + 16)
    return (_kv4((q << 2) & 0x3C3C3C3C, tab, x0, x1, x2, x3, a),
            _kv4((q >> 2) & 0x3C3C3C3C, tab, y0, y1, y2, y3, b))


@cuda.jit(device=True, inline="always")
def dot_iq4_xs(v, part, xs, xo, so, tab):
    h0 = v[0]
    p = xo + 36 * part                             # padding: 4 floats per 32 values
    a, b = _iq4_word(v[2], tab, xs, p, F0, F0)
    a, b = _iq4_word(v[3], tab, xs, p + 4, a, b)
    a, b = _iq4_word(v[4], tab, xs, p + 8, a, b)
    a, b = _iq4_word(v[5], tab, xs, p + 12, a, b)
    sc = iq4_xs_scale(h0, v[1], part)
    return h2f(h0 & 0xFFFF) * (u2f(MAGIC_2P23 | sc) - B_S6) * (a + b)


# ---- IQ3_S ----

NINTH = 0x00204081  # bit j (of 4) times this lands on bit 8j (bits j + 7k never overlap for j < 7)
# prmt selectors of index byte b of a qs word (the low byte) and byte b of its entries' ninth
# bits (0 or 1: the high byte), whose sign (0) fills the upper half: a 9-bit grid row, one permute
ROW_SEL = (0xCC40, 0xDD51, 0xEE62, 0xFF73)


@cuda.jit(device=True, inline="always")
def ninth_bits(h):
    """Bytes j = bit j of h, 0 or 1 (j < 4): four grid entries' ninth index bits."""
    return ((h & 0xF) * NINTH) & 0x01010101


@cuda.jit(device=True, inline="always")
def load_iq3_s(w, off, part):
    q0, q1, q2, q3 = span4(w, off + 2 + 16 * part)
    s0, s1 = span2(w, off + 74 + 8 * part)
    return (q0, q1, q2, q3, s0, s1, ld_u16(w, off + 66 + 2 * part), ld_u8(w, off + 106 + part),
            ld_u16(w, off))


@cuda.jit(device=True, inline="always")
def _signed(g, b, signs, bit, x):
    """(magnitude byte b of grid word g, negated where bit `bit` of signs is set) * x."""
    m = byte_to_f32(g, b, F_2P23)
    return u2f(f2u(m) ^ ((signs << (31 - bit)) & 0x80000000)) * x


@cuda.jit(device=True, inline="always")
def _iq3_g4(q, nb, sel, g, signs, tab, xs, p, acc):
    """acc + the 4 values of grid entry g (index byte b of word q, its ninth bit byte b of nb:
    sel = ROW_SEL[b], indexed by the caller with a constant, as numba types a tuple's constant
    index in place) dotted with xs[p..p+3]."""
    grid = ld_u32_at(tab, 4 * prmt(q, nb, sel))
    x0, x1, x2, x3 = ld_x4(xs, p)
    acc += _signed(grid, 0, signs, 4 * g, x0)
    acc += _signed(grid, 1, signs, 4 * g + 1, x1)
    acc += _signed(grid, 2, signs, 4 * g + 2, x2)
    acc += _signed(grid, 3, signs, 4 * g + 3, x3)
    return acc


@cuda.jit(device=True, inline="always")
def _iq3_sub(qa, qb, qh, signs, tab, xs, p):
    """Dot of one 32-value sub-block: grid indices in qa (entries 0..3) and qb (4..7), their
    ninth bits in qh's bits 0..7."""
    na = ninth_bits(qh)
    nb = ninth_bits(qh >> 4)
    a = _iq3_g4(qa, na, ROW_SEL[0], 0, signs, tab, xs, p, F0)
    b = _iq3_g4(qb, nb, ROW_SEL[0], 4, signs, tab, xs, p + 16, F0)
    a = _iq3_g4(qa, na, ROW_SEL[1], 1, signs, tab, xs, p + 4, a)
    b = _iq3_g4(qb, nb, ROW_SEL[1], 5, signs, tab, xs, p + 20, b)
    a = _iq3_g4(qa, na, ROW_SEL[2], 2, signs, tab, xs, p + 8, a)
    b = _iq3_g4(qb, nb, ROW_SEL[2], 6, signs, tab, xs, p + 24, b)
    a = _iq3_g4(qa, na, ROW_SEL[3], 3, signs, tab, xs, p + 12, a)
    b = _iq3_g4(qb, nb, ROW_SEL[3], 7, signs, tab, xs, p + 28, b)
    return a + b


@cuda.jit(device=True, inline="always")
def dot_iq3_s(v, part, xs, xo, so, tab):
    qh = v[6]
    sc = v[7]
    # padding: 4 floats per 32 values and 4 more per 256
    p = xo + 72 * part
    a = _iq3_sub(v[0], v[1], qh & 0xFF, v[4], tab, xs, p)
    b = _iq3_sub(v[2], v[3], qh >> 8, v[5], tab, xs, p + 36)
    return h2f(v[8]) * (small_f32(1 + 2 * (sc & 0xF)) * a + small_f32(1 + 2 * (sc >> 4)) * b)
