"""Lane decoders (see `lanes`) of Q4_K, Q5_K, Q6_K and Q8_0: each lane loads one fixed slice of a
super-block with wide loads and dots the values of that slice with the staged x.

Slices (block layouts: `qformats_k`, `qformats_simple`):
  Q4_K  8 lanes: part p = 2k + h holds qs[32k + 16h .. +15]: values 64k + 16h + i of sub-block 2k
        (low nibbles) and 64k + 32 + 16h + i of sub-block 2k + 1 (high nibbles), i < 16.
  Q5_K  as Q4_K, plus qh[16h .. 16h + 15], whose bits 2k and 2k + 1 are the fifth bits.
  Q6_K  8 lanes: part p = 4n + 2h + t holds ql[16p .. +15] and qh[32n + 16t .. +15]: values
        128n + 32h + 16t + i (low nibbles, sub-block 4n + h) and 64 further (high nibbles,
        sub-block 4n + h + 2).
  Q8_0  1 lane per 32-value block.
Each `dot_*(v, part, xs, xo, so, tab)` takes the loaded words `v`, the lane's part, the staged x
`xs` with the super-block's first value at padded position `xo` and its first 16-value sum at
`xs[so]`; the x offsets below are the format's padding (`lanes.LANE_FORMATS`) worked out.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .intrinsics import F_2P23, MAGIC_2P23, byte_to_f32, h2f, ld_nc_u32x4, ld_u16, ld_u8, ld_x4, u2f
from .spans import span4, span8

F0 = np.float32(0.0)
B_Q6 = np.float32(8388608.0 + 32.0)   # 2^23 + the 6-bit bias
B_Q8 = np.float32(8388608.0 + 128.0)  # 2^23 + the bias of (int8 q) ^ 0x80


@cuda.jit(device=True, inline="always")
def small_f32(n):
    """An integer 0 <= n < 2^23 as float32 (no integer-to-float conversion unit)."""
    return u2f(MAGIC_2P23 | n) - F_2P23


@cuda.jit(device=True, inline="always")
def i8_f32(b):
    """A byte 0..255 read as int8, as float32."""
    return u2f(MAGIC_2P23 | (b ^ 0x80)) - B_Q8


@cuda.jit(device=True, inline="always")
def _dot4(q, bias, x0, x1, x2, x3):
    """sum over bytes b of q of (byte b - bias's offset) * x_b."""
    a = byte_to_f32(q, 0, bias) * x0
    a += byte_to_f32(q, 1, bias) * x1
    a += byte_to_f32(q, 2, bias) * x2
    a += byte_to_f32(q, 3, bias) * x3
    return a


@cuda.jit(device=True, inline="always")
def _pair(lo, hi, bias, xs, p, p_hi):
    """(bytes of lo dotted with xs[p..p+3], bytes of hi with xs[p_hi..p_hi+3])."""
    x0, x1, x2, x3 = ld_x4(xs, p)
    y0, y1, y2, y3 = ld_x4(xs, p_hi)
    return _dot4(lo, bias, x0, x1, x2, x3), _dot4(hi, bias, y0, y1, y2, y3)


# ---- Q4_K / Q5_K ----

@cuda.jit(device=True, inline="always")
def _k4_scales(h1, h2, h3, part):
    """(scales, mins) of sub-blocks 2k and 2k + 1 (k = part >> 1) from the 12 packed bytes
    h1..h3, each as two 8-bit fields (low: 2k)."""
    k = part >> 1
    sh = 16 * (k & 1)
    b1 = h1 >> sh
    b2 = h2 >> sh
    b3 = h3 >> sh
    if k >= 2:
        sc = (b3 & 0x0F0F) | ((b1 >> 2) & 0x3030)
        mn = ((b3 >> 4) & 0x0F0F) | ((b2 >> 2) & 0x3030)
    else:
        sc = b1 & 0x3F3F
        mn = b2 & 0x3F3F
    return sc, mn


@cuda.jit(device=True, inline="always")
def _k4_finish(h0, h1, h2, h3, part, lo, hi, xs, so):
    k = part >> 1
    s = so + 4 * k + (part & 1)
    sc, mn = _k4_scales(h1, h2, h3, part)
    return (h2f(h0 & 0xFFFF) * (small_f32(sc & 0xFF) * lo + small_f32(sc >> 8) * hi)
            - h2f(h0 >> 16) * (small_f32(mn & 0xFF) * xs[s] + small_f32(mn >> 8) * xs[s + 2]))


@cuda.jit(device=True, inline="always")
def load_q4_k(w, off, part):
    h0, h1, h2, h3 = ld_nc_u32x4(w, off)
    q0, q1, q2, q3 = ld_nc_u32x4(w, off + 16 + 16 * part)
    return (h0, h1, h2, h3, q0, q1, q2, q3)


@cuda.jit(device=True, inline="always")
def _q4_words(q, xs, p):
    return _pair(q & 0x0F0F0F0F, (q >> 4) & 0x0F0F0F0F, F_2P23, xs, p, p + 32)


@cuda.jit(device=True, inline="always")
def dot_q4_k(v, part, xs, xo, so, tab):
    p = xo + 68 * (part >> 1) + 16 * (part & 1)   # padding: 4 floats per 64 values
    a0, b0 = _q4_words(v[4], xs, p)
    a1, b1 = _q4_words(v[5], xs, p + 4)
    a2, b2 = _q4_words(v[6], xs, p + 8)
    a3, b3 = _q4_words(v[7], xs, p + 12)
    return _k4_finish(v[0], v[1], v[2], v[3], part, (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3),
                      xs, so)


@cuda.jit(device=True, inline="always")
def load_q5_k(w, off, part):
    h0, h1, h2, h3 = ld_nc_u32x4(w, off)
    m0, m1, m2, m3 = ld_nc_u32x4(w, off + 16 + 16 * (part & 1))
    q0, q1, q2, q3 = ld_nc_u32x4(w, off + 48 + 16 * part)
    return (h0, h1, h2, h3, q0, q1, q2, q3, m0, m1, m2, m3)


@cuda.jit(device=True, inline="always")
def _q5_words(q, m, k2, xs, p):
    lo = (q & 0x0F0F0F0F) | (((m >> k2) & 0x01010101) << 4)
    hi = ((q >> 4) & 0x0F0F0F0F) | (((m >> (k2 + 1)) & 0x01010101) << 4)
    return _pair(lo, hi, F_2P23, xs, p, p + 32)


@cuda.jit(device=True, inline="always")
def dot_q5_k(v, part, xs, xo, so, tab):
    p = xo + 68 * (part >> 1) + 16 * (part & 1)
    k2 = part & 6                                  # 2k: the fifth bit of sub-block 2k
    a0, b0 = _q5_words(v[4], v[8], k2, xs, p)
    a1, b1 = _q5_words(v[5], v[9], k2, xs, p + 4)
    a2, b2 = _q5_words(v[6], v[10], k2, xs, p + 8)
    a3, b3 = _q5_words(v[7], v[11], k2, xs, p + 12)
    return _k4_finish(v[0], v[1], v[2], v[3], part, (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3),
                      xs, so)


# ---- Q6_K ----

@cuda.jit(device=True, inline="always")
def load_q6_k(w, off, part):
    n = part >> 2
    l0, l1, l2, l3 = span4(w, off + 16 * part)
    m0, m1, m2, m3 = span4(w, off + 128 + 32 * n + 16 * (part & 1))
    so = off + 192 + 8 * n + (part & 3)            # int8 scale of the low sub-block's 16 values
    return (l0, l1, l2, l3, m0, m1, m2, m3, ld_u8(w, so), ld_u8(w, so + 4), ld_u16(w, off + 208))


@cuda.jit(device=True, inline="always")
def _q6_words(ql, qh, h2, xs, p):
    m = qh >> h2
    lo = (ql & 0x0F0F0F0F) | ((m & 0x03030303) << 4)
    hi = ((ql >> 4) & 0x0F0F0F0F) | (m & 0x30303030)
    return _pair(lo, hi, B_Q6, xs, p, p + 72)


@cuda.jit(device=True, inline="always")
def dot_q6_k(v, part, xs, xo, so, tab):
    h = (part >> 1) & 1
    # padding: 4 floats per 32 values and 8 more per 128
    p = xo + 152 * (part >> 2) + 36 * h + 16 * (part & 1)
    a0, b0 = _q6_words(v[0], v[4], 2 * h, xs, p)
    a1, b1 = _q6_words(v[1], v[5], 2 * h, xs, p + 4)
    a2, b2 = _q6_words(v[2], v[6], 2 * h, xs, p + 8)
    a3, b3 = _q6_words(v[3], v[7], 2 * h, xs, p + 12)
    return h2f(v[10]) * (i8_f32(v[8]) * ((a0 + a1) + (a2 + a3))
                         + i8_f32(v[9]) * ((b0 + b1) + (b2 + b3)))


# ---- Q8_0 ----

@cuda.jit(device=True, inline="always")
def load_q8_0(w, off, part):
    q0, q1, q2, q3, q4, q5, q6, q7 = span8(w, off + 2)
    return (q0, q1, q2, q3, q4, q5, q6, q7, ld_u16(w, off))


@cuda.jit(device=True, inline="always")
def _q8_words(q, r, xs, p):
    x0, x1, x2, x3 = ld_x4(xs, p)
    y0, y1, y2, y3 = ld_x4(xs, p + 4)
    return (_dot4(q ^ 0x80808080, B_Q8, x0, x1, x2, x3)
            + _dot4(r ^ 0x80808080, B_Q8, y0, y1, y2, y3))


@cuda.jit(device=True, inline="always")
def dot_q8_0(v, part, xs, xo, so, tab):
    a = _q8_words(v[0], v[1], xs, xo) + _q8_words(v[2], v[3], xs, xo + 8)
    b = _q8_words(v[4], v[5], xs, xo + 16) + _q8_words(v[6], v[7], xs, xo + 24)
    return h2f(v[8]) * (a + b)
