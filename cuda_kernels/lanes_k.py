"""Lane decoders (see `lanes`) of Q4_K, Q5_K, Q6_K and Q8_0: each lane loads one fixed slice of a
super-block with wide loads and dots the values of that slice with the staged x.

Slices (block layouts: `qformats_k`, `qformats_simple`):
  Q4_K  4 lanes: part k holds qs[32k .. 32k + 31]: values 64k + i of sub-block 2k (low
        nibbles) and 64k + 32 + i of sub-block 2k + 1 (high nibbles), i < 32.
  Q5_K  8 lanes: part p = 2k + h holds qs[32k + 16h .. +15] (values 64k + 16h + i and 32 further,
        i < 16) and qh[16h .. 16h + 15], whose bits 2k and 2k + 1 are the fifth bits.
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

from .intrinsics import (F_2P23, MAGIC_2P23, byte_to_f32, h2f, ld_f32_at, ld_nc_u32x4, ld_u16,
                         ld_u8, ld_x4, prmt, u2f)
from .planar import q6_k_fields, q6_k_p8_fields
from .spans import span4, span8

F0 = np.float32(0.0)
F16 = np.float32(16.0)
F32 = np.float32(32.0)
F96 = np.float32(96.0)
F128 = np.float32(128.0)
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
def _dot4(q, bias, x0, x1, x2, x3, acc):
    """acc + the sum over bytes b of q of (byte b - bias's offset) * x_b (fused multiply-adds
    into one running sum)."""
    acc += byte_to_f32(q, 0, bias) * x0
    acc += byte_to_f32(q, 1, bias) * x1
    acc += byte_to_f32(q, 2, bias) * x2
    acc += byte_to_f32(q, 3, bias) * x3
    return acc


@cuda.jit(device=True, inline="always")
def _pair(lo, hi, bias, xs, p, p_hi, a, b):
    """(a + bytes of lo dotted with xs[p..p+3], b + bytes of hi with xs[p_hi..p_hi+3])."""
    x0, x1, x2, x3 = ld_x4(xs, p)
    y0, y1, y2, y3 = ld_x4(xs, p_hi)
    return _dot4(lo, bias, x0, x1, x2, x3, a), _dot4(hi, bias, y0, y1, y2, y3, b)


# ---- Q4_K / Q5_K ----

@cuda.jit(device=True, inline="always")
def _k4_scales(h1, h2, h3, k):
    """(scales, mins) of sub-blocks 2k and 2k + 1 from the 12 packed bytes h1..h3, each as two
    8-bit fields (low: 2k)."""
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
def _k4_finish(h0, h1, h2, h3, k, lo, hi, s_lo, s_hi):
    """d * (scale * lo-dot + ...) - dmin * (min * sum of x + ...) of sub-blocks 2k, 2k + 1."""
    sc, mn = _k4_scales(h1, h2, h3, k)
    return (h2f(h0 & 0xFFFF) * (small_f32(sc & 0xFF) * lo + small_f32(sc >> 8) * hi)
            - h2f(h0 >> 16) * (small_f32(mn & 0xFF) * s_lo + small_f32(mn >> 8) * s_hi))


@cuda.jit(device=True, inline="always")
def _sum16(xs, s):
    """The staged 16-value sum xs[s] (a raw shared load: s is never negative)."""
    return ld_f32_at(xs, 4 * s)


@cuda.jit(device=True, inline="always")
def load_q4_k(w, off, part):
    h0, h1, h2, h3 = ld_nc_u32x4(w, off)
    q0, q1, q2, q3 = ld_nc_u32x4(w, off + 16 + 32 * part)
    q4, q5, q6, q7 = ld_nc_u32x4(w, off + 32 + 32 * part)
    return (h0, h1, h2, h3, q0, q1, q2, q3, q4, q5, q6, q7)


@cuda.jit(device=True, inline="always")
def _half_f32(w8, b):
    """0.5 + q / 32 for the nibble q that byte b of w8 holds as q << 3: one byte permute puts it
    in the top mantissa bits of 0.5 (exact), saving the subtraction byte_to_f32 needs; the
    offset 0.5 goes once per sub-block, through the staged sums of x."""
    return u2f(prmt(w8, 0x3F000000, 0x7044 | (b << 8)))


@cuda.jit(device=True, inline="always")
def _half4(w8, x0, x1, x2, x3, acc):
    acc += _half_f32(w8, 0) * x0
    acc += _half_f32(w8, 1) * x1
    acc += _half_f32(w8, 2) * x2
    acc += _half_f32(w8, 3) * x3
    return acc


@cuda.jit(device=True, inline="always")
def _q4_words(q, xs, p, a, b):
    """(a + sum (0.5 + lo nibble / 32) * x, b + the same of the high nibbles, 32 further)."""
    x0, x1, x2, x3 = ld_x4(xs, p)
    y0, y1, y2, y3 = ld_x4(xs, p + 32)
    return (_half4((q << 3) & 0x78787878, x0, x1, x2, x3, a),
            _half4((q >> 1) & 0x78787878, y0, y1, y2, y3, b))


@cuda.jit(device=True, inline="always")
def dot_q4_k(v, part, xs, xo, so, tab):
    p = xo + 68 * part                             # padding: 4 floats per 64 values
    a, b = _q4_words(v[4], xs, p, F0, F0)
    a, b = _q4_words(v[5], xs, p + 4, a, b)
    a, b = _q4_words(v[6], xs, p + 8, a, b)
    a, b = _q4_words(v[7], xs, p + 12, a, b)
    a, b = _q4_words(v[8], xs, p + 16, a, b)
    a, b = _q4_words(v[9], xs, p + 20, a, b)
    a, b = _q4_words(v[10], xs, p + 24, a, b)
    a, b = _q4_words(v[11], xs, p + 28, a, b)
    s = so + 4 * part
    s_lo = _sum16(xs, s) + _sum16(xs, s + 1)
    s_hi = _sum16(xs, s + 2) + _sum16(xs, s + 3)
    # sum q * x = 32 * a - 16 * sum x
    return _k4_finish(v[0], v[1], v[2], v[3], part, F32 * a - F16 * s_lo, F32 * b - F16 * s_hi,
                      s_lo, s_hi)


@cuda.jit(device=True, inline="always")
def load_q5_k(w, off, part):
    h0, h1, h2, h3 = ld_nc_u32x4(w, off)
    m0, m1, m2, m3 = ld_nc_u32x4(w, off + 16 + 16 * (part & 1))
    q0, q1, q2, q3 = ld_nc_u32x4(w, off + 48 + 16 * part)
    return (h0, h1, h2, h3, q0, q1, q2, q3, m0, m1, m2, m3)


@cuda.jit(device=True, inline="always")
def _q5_words(q, m, k2, xs, p, a, b):
    lo = (q & 0x0F0F0F0F) | (((m >> k2) & 0x01010101) << 4)
    hi = ((q >> 4) & 0x0F0F0F0F) | (((m >> (k2 + 1)) & 0x01010101) << 4)
    return _pair(lo, hi, F_2P23, xs, p, p + 32, a, b)


@cuda.jit(device=True, inline="always")
def dot_q5_k(v, part, xs, xo, so, tab):
    p = xo + 68 * (part >> 1) + 16 * (part & 1)
    k2 = part & 6                                  # 2k: the fifth bit of sub-block 2k
    a, b = _q5_words(v[4], v[8], k2, xs, p, F0, F0)
    a, b = _q5_words(v[5], v[9], k2, xs, p + 4, a, b)
    a, b = _q5_words(v[6], v[10], k2, xs, p + 8, a, b)
    a, b = _q5_words(v[7], v[11], k2, xs, p + 12, a, b)
    s = so + 2 * k2 + (part & 1)
    return _k4_finish(v[0], v[1], v[2], v[3], part >> 1, a, b, _sum16(xs, s), _sum16(xs, s + 2))


# ---- Q6_K ----

def q6_k_loader(fields, ld16):
    """load(w, off, part) of Q6_K super-blocks whose fields `fields` places (`planar`), their
    16-byte slices read by ld16: `span4` at GGUF's even offsets, one vector load in the planar
    layout's aligned ones."""
    @cuda.jit(device=True, inline="always")
    def load(w, off, part):
        ql, qh, sc, d = fields(off)
        n = part >> 2
        l0, l1, l2, l3 = ld16(w, ql + 16 * part)
        m0, m1, m2, m3 = ld16(w, qh + 32 * n + 16 * (part & 1))
        so = sc + 8 * n + (part & 3)               # int8 scale of the low sub-block's 16 values
        return (l0, l1, l2, l3, m0, m1, m2, m3, ld_u8(w, so), ld_u8(w, so + 4), ld_u16(w, d))
    return load


load_q6_k = q6_k_loader(q6_k_fields, span4)
load_q6_k_p8 = q6_k_loader(q6_k_p8_fields, ld_nc_u32x4)


@cuda.jit(device=True, inline="always")
def _q6_words(ql, qh, h2, xs, p, a, b):
    """(a + sum (0.5 + q / 128) * x over the low sub-block's 4 values, b + the same of the
    high one's): each 6-bit q is assembled as q << 1 (see `_half_f32`, one bit further)."""
    m = qh >> h2
    lo = ((ql << 1) & 0x1E1E1E1E) | ((m << 5) & 0x60606060)
    hi = ((ql >> 3) & 0x1E1E1E1E) | ((m << 1) & 0x60606060)
    x0, x1, x2, x3 = ld_x4(xs, p)
    y0, y1, y2, y3 = ld_x4(xs, p + 72)
    return _half4(lo, x0, x1, x2, x3, a), _half4(hi, y0, y1, y2, y3, b)


@cuda.jit(device=True, inline="always")
def dot_q6_k(v, part, xs, xo, so, tab):
    h2 = part & 2                                  # 2h: the shift of the low sub-block's bits
    # padding: 4 floats per 32 values and 8 more per 128
    p = xo + 152 * (part >> 2) + 18 * h2 + 16 * (part & 1)
    a, b = _q6_words(v[0], v[4], h2, xs, p, F0, F0)
    a, b = _q6_words(v[1], v[5], h2, xs, p + 4, a, b)
    a, b = _q6_words(v[2], v[6], h2, xs, p + 8, a, b)
    a, b = _q6_words(v[3], v[7], h2, xs, p + 12, a, b)
    s = so + 8 * (part >> 2) + (part & 3)           # the low 16 values' sum; the high: 4 on
    # sum (q - 32) * x = 128 * a - 64 * sum x - 32 * sum x
    return h2f(v[10]) * (i8_f32(v[8]) * (F128 * a - F96 * _sum16(xs, s))
                         + i8_f32(v[9]) * (F128 * b - F96 * _sum16(xs, s + 4)))


# ---- Q8_0 ----

@cuda.jit(device=True, inline="always")
def load_q8_0(w, off, part):
    q0, q1, q2, q3, q4, q5, q6, q7 = span8(w, off + 2)
    return (q0, q1, q2, q3, q4, q5, q6, q7, ld_u16(w, off))


@cuda.jit(device=True, inline="always")
def dot_q8_0(v, part, xs, xo, so, tab):
    # two running sums: values 0..15 and 16..31
    a, b = _pair(v[0] ^ 0x80808080, v[4] ^ 0x80808080, B_Q8, xs, xo, xo + 16, F0, F0)
    a, b = _pair(v[1] ^ 0x80808080, v[5] ^ 0x80808080, B_Q8, xs, xo + 4, xo + 20, a, b)
    a, b = _pair(v[2] ^ 0x80808080, v[6] ^ 0x80808080, B_Q8, xs, xo + 8, xo + 24, a, b)
    a, b = _pair(v[3] ^ 0x80808080, v[7] ^ 0x80808080, B_Q8, xs, xo + 12, xo + 28, a, b)
    return h2f(v[8]) * (a + b)
