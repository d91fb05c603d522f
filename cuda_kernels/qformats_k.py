"""Device decoders of the 256-value super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.
The contract is in `qformats`. Group j of a row is sub-block jb = j % 8 of super-block j // 8.

Layouts (byte offsets inside one super-block):
  Q2_K  84: scales[16] @0 (lo nibble scale, hi nibble min, per 16 values), qs[64] @16, d @80,
            dmin @82. Value 32*jb+i: q = (qs[32*(jb//4)+i] >> 2*(jb%4)) & 3.
  Q3_K 110: hmask[32] @0, qs[64] @32, scales[12] @96 (16 six-bit scales, biased by 32), d @108.
            q = low 2 bits as Q2_K, minus 4 unless bit jb of hmask[i] is set.
  Q4_K 144: d @0, dmin @2, scales[12] @4 (8 six-bit scales and mins), qs[128] @16.
            q = (qs[32*(jb//2)+i] >> 4*(jb%2)) & 15; v = d*sc*q - dmin*m.
  Q5_K 176: as Q4_K with qh[32] @16 (bit jb of qh[i] is the 5th bit) and qs @48.
  Q6_K 210: ql[128] @0, qh[64] @128, i8 scales[16] @192, d @208. With n = jb//4, r = jb%4:
            q = ((ql[64n+32(r%2)+i] >> 4(r//2)) & 15 | ((qh[32n+i] >> 2r) & 3) << 4) - 32.
            Q6_K_P8 (`planar`): the same fields, 8 super-blocks' of each together.
  IQ4_XS 136: d @0, u16 scales_h @2, scales_l[4] @4, qs[128] @8; sub-block scale
            ((scales_l[jb//2] >> 4(jb%2)) & 15 | ((scales_h >> 2jb) & 3) << 4) - 32;
            q = nibbles of qs[16jb..16jb+15] (lo: values 0..15, hi: 16..31) through kvalues.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .intrinsics import F_2P23, byte_to_f32, h2f, ld_u16, ld_u32, ld_u32_any, ld_u8, ld_x4
from .planar import q6_k_fields, q6_k_p8_fields
from .qformats_simple import sx8
from .qtables import TABLE_IQ4NL

F0 = np.float32(0.0)
B_Q6 = np.float32(8388608.0 + 32.0)  # 2^23 + the 6-bit bias, for byte_to_f32


@cuda.jit(device=True, inline="always")
def _k4_scale_min(src, so, jb):
    """(scale, min) of sub-block jb from the 12 packed bytes at so (Q4_K, Q5_K)."""
    if jb < 4:
        return ld_u8(src, so + jb) & 63, ld_u8(src, so + jb + 4) & 63
    a = ld_u8(src, so + jb + 4)
    return ((a & 0xF) | ((ld_u8(src, so + jb - 4) >> 6) << 4),
            (a >> 4) | ((ld_u8(src, so + jb) >> 6) << 4))


# ---- Q2_K ----

@cuda.jit(device=True, inline="always")
def dq32_q2_k(src, row_off, j, dst, dst_off):
    o = row_off + (j >> 3) * 84
    jb = j & 7
    d = h2f(ld_u16(src, o + 80))
    dmin = h2f(ld_u16(src, o + 82))
    qo = o + 16 + 32 * (jb >> 2)
    sh = 2 * (jb & 3)
    for h in range(2):
        sc = ld_u8(src, o + 2 * jb + h)
        dl = d * np.float32(sc & 0xF)
        ml = dmin * np.float32(sc >> 4)
        for t in range(4):
            w = ld_u32(src, qo + 16 * h + 4 * t) >> sh
            for b in range(4):
                dst[dst_off + 16 * h + 4 * t + b] = dl * np.float32((w >> (8 * b)) & 3) - ml


@cuda.jit(device=True, inline="always")
def dot32_q2_k(src, row_off, j, x, x_off):
    o = row_off + (j >> 3) * 84
    jb = j & 7
    qo = o + 16 + 32 * (jb >> 2)
    sh = 2 * (jb & 3)
    acc = F0
    mins = F0
    for h in range(2):
        sc = ld_u8(src, o + 2 * jb + h)
        a = F0
        xs = F0
        for t in range(4):
            w = ld_u32(src, qo + 16 * h + 4 * t) >> sh
            x0, x1, x2, x3 = ld_x4(x, x_off + 16 * h + 4 * t)
            a += (np.float32(w & 3) * x0 + np.float32((w >> 8) & 3) * x1
                  + np.float32((w >> 16) & 3) * x2 + np.float32((w >> 24) & 3) * x3)
            xs += x0 + x1 + x2 + x3
        acc += np.float32(sc & 0xF) * a
        mins += np.float32(sc >> 4) * xs
    return h2f(ld_u16(src, o + 80)) * acc - h2f(ld_u16(src, o + 82)) * mins


# ---- Q3_K ----

@cuda.jit(device=True, inline="always")
def _q3_scale(src, so, s):
    low = (ld_u8(src, so + (s & 7)) >> (4 * (s >> 3))) & 0xF
    high = (ld_u8(src, so + 8 + (s & 3)) >> (2 * (s >> 2))) & 3
    return (low | (high << 4)) - 32


@cuda.jit(device=True, inline="always")
def _q3_value(w, m, b, sh, jb):
    """The signed 3-bit quant of byte b: 2 low bits from qs word w, the mask bit from word m."""
    return (((w >> (8 * b + sh)) & 3) - 4) + 4 * ((m >> (8 * b + jb)) & 1)


@cuda.jit(device=True, inline="always")
def dq32_q3_k(src, row_off, j, dst, dst_off):
    o = row_off + (j >> 3) * 110
    jb = j & 7
    d = h2f(ld_u16(src, o + 108))
    qo = o + 32 + 32 * (jb >> 2)
    sh = 2 * (jb & 3)
    for h in range(2):
        dl = d * np.float32(_q3_scale(src, o + 96, 2 * jb + h))
        for t in range(4):
            w = ld_u32_any(src, qo + 16 * h + 4 * t)
            m = ld_u32_any(src, o + 16 * h + 4 * t)
            for b in range(4):
                dst[dst_off + 16 * h + 4 * t + b] = dl * np.float32(_q3_value(w, m, b, sh, jb))


@cuda.jit(device=True, inline="always")
def dot32_q3_k(src, row_off, j, x, x_off):
    o = row_off + (j >> 3) * 110
    jb = j & 7
    qo = o + 32 + 32 * (jb >> 2)
    sh = 2 * (jb & 3)
    acc = F0
    for h in range(2):
        a = F0
        for t in range(4):
            w = ld_u32_any(src, qo + 16 * h + 4 * t)
            m = ld_u32_any(src, o + 16 * h + 4 * t)
            x0, x1, x2, x3 = ld_x4(x, x_off + 16 * h + 4 * t)
            a += (np.float32(_q3_value(w, m, 0, sh, jb)) * x0
                  + np.float32(_q3_value(w, m, 1, sh, jb)) * x1
                  + np.float32(_q3_value(w, m, 2, sh, jb)) * x2
                  + np.float32(_q3_value(w, m, 3, sh, jb)) * x3)
        acc += np.float32(_q3_scale(src, o + 96, 2 * jb + h)) * a
    return h2f(ld_u16(src, o + 108)) * acc


# ---- Q4_K / Q5_K ----

@cuda.jit(device=True, inline="always")
def dq32_q4_k(src, row_off, j, dst, dst_off):
    o = row_off + (j >> 3) * 144
    jb = j & 7
    sc, mn = _k4_scale_min(src, o + 4, jb)
    dl = h2f(ld_u16(src, o)) * np.float32(sc)
    ml = h2f(ld_u16(src, o + 2)) * np.float32(mn)
    qo = o + 16 + 32 * (jb >> 1)
    sh = 4 * (jb & 1)
    for t in range(8):
        w = ld_u32(src, qo + 4 * t) >> sh
        for b in range(4):
            dst[dst_off + 4 * t + b] = dl * np.float32((w >> (8 * b)) & 0xF) - ml


@cuda.jit(device=True, inline="always")
def dot32_q4_k(src, row_off, j, x, x_off):
    o = row_off + (j >> 3) * 144
    jb = j & 7
    qo = o + 16 + 32 * (jb >> 1)
    sh = 4 * (jb & 1)
    acc = F0
    xs = F0
    for t in range(8):
        m = (ld_u32(src, qo + 4 * t) >> sh) & 0x0F0F0F0F  # four nibbles, one per byte
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        acc += (byte_to_f32(m, 0, F_2P23) * x0 + byte_to_f32(m, 1, F_2P23) * x1
                + byte_to_f32(m, 2, F_2P23) * x2 + byte_to_f32(m, 3, F_2P23) * x3)
        xs += x0 + x1 + x2 + x3
    dm = ld_u32(src, o)
    sc, mn = _k4_scale_min(src, o + 4, jb)
    return h2f(dm & 0xFFFF) * np.float32(sc) * acc - h2f(dm >> 16) * np.float32(mn) * xs


@cuda.jit(device=True, inline="always")
def dq32_q5_k(src, row_off, j, dst, dst_off):
    o = row_off + (j >> 3) * 176
    jb = j & 7
    sc, mn = _k4_scale_min(src, o + 4, jb)
    dl = h2f(ld_u16(src, o)) * np.float32(sc)
    ml = h2f(ld_u16(src, o + 2)) * np.float32(mn)
    qo = o + 48 + 32 * (jb >> 1)
    sh = 4 * (jb & 1)
    for t in range(8):
        w = ld_u32(src, qo + 4 * t) >> sh
        m = ld_u32(src, o + 16 + 4 * t) >> jb
        for b in range(4):
            q = ((w >> (8 * b)) & 0xF) | (((m >> (8 * b)) & 1) << 4)
            dst[dst_off + 4 * t + b] = dl * np.float32(q) - ml


@cuda.jit(device=True, inline="always")
def dot32_q5_k(src, row_off, j, x, x_off):
    o = row_off + (j >> 3) * 176
    jb = j & 7
    qo = o + 48 + 32 * (jb >> 1)
    sh = 4 * (jb & 1)
    acc = F0
    xs = F0
    for t in range(8):
        w = (ld_u32(src, qo + 4 * t) >> sh) & 0x0F0F0F0F
        w |= ((ld_u32(src, o + 16 + 4 * t) >> jb) & 0x01010101) << 4
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        acc += (np.float32(w & 0xFF) * x0 + np.float32((w >> 8) & 0xFF) * x1
                + np.float32((w >> 16) & 0xFF) * x2 + np.float32(w >> 24) * x3)
        xs += x0 + x1 + x2 + x3
    sc, mn = _k4_scale_min(src, o + 4, jb)
    return (h2f(ld_u16(src, o)) * np.float32(sc) * acc
            - h2f(ld_u16(src, o + 2)) * np.float32(mn) * xs)


# ---- Q6_K ----

@cuda.jit(device=True, inline="always")
def _q6_word(src, ql, qh, jb, t):
    """Four 6-bit quants (0..63, unbiased) of group jb, values 4t..4t+3, one per byte, of the
    super-block whose ql and qh fields start at those bytes."""
    n = jb >> 2
    r = jb & 3
    lo = (ld_u32_any(src, ql + 64 * n + 32 * (r & 1) + 4 * t) >> (4 * (r >> 1))) & 0x0F0F0F0F
    hi = (ld_u32_any(src, qh + 32 * n + 4 * t) >> (2 * r)) & 0x03030303
    return lo | (hi << 4)


def q6_k_readers(fields):
    """(dq32, dot32) of Q6_K super-blocks whose fields `fields` places (`planar`: GGUF's
    layout or the planar one)."""

    @cuda.jit(device=True, inline="always")
    def dq32(src, row_off, j, dst, dst_off):
        ql, qh, sc, do = fields(row_off + (j >> 3) * 210)
        jb = j & 7
        d = h2f(ld_u16(src, do))
        for h in range(2):
            dl = d * np.float32(sx8(ld_u8(src, sc + 2 * jb + h)))
            for t in range(4):
                w = _q6_word(src, ql, qh, jb, 4 * h + t)
                for b in range(4):
                    dst[dst_off + 16 * h + 4 * t + b] = dl * np.float32(((w >> (8 * b)) & 0xFF)
                                                                        - 32)

    @cuda.jit(device=True, inline="always")
    def dot32(src, row_off, j, x, x_off):
        ql, qh, sc, do = fields(row_off + (j >> 3) * 210)
        jb = j & 7
        acc = F0
        for h in range(2):
            a = F0
            for t in range(4):
                w = _q6_word(src, ql, qh, jb, 4 * h + t)
                x0, x1, x2, x3 = ld_x4(x, x_off + 16 * h + 4 * t)
                a += (byte_to_f32(w, 0, B_Q6) * x0 + byte_to_f32(w, 1, B_Q6) * x1
                      + byte_to_f32(w, 2, B_Q6) * x2 + byte_to_f32(w, 3, B_Q6) * x3)
            acc += np.float32(sx8(ld_u8(src, sc + 2 * jb + h))) * a
        return h2f(ld_u16(src, do)) * acc
    return dq32, dot32


dq32_q6_k, dot32_q6_k = q6_k_readers(q6_k_fields)
dq32_q6_k_p8, dot32_q6_k_p8 = q6_k_readers(q6_k_p8_fields)


# ---- IQ4_XS ----

@cuda.jit(device=True, inline="always")
def _iq4xs_scale(src, o, jb):
    low = (ld_u8(src, o + 4 + (jb >> 1)) >> (4 * (jb & 1))) & 0xF
    high = (ld_u16(src, o + 2) >> (2 * jb)) & 3
    return (low | (high << 4)) - 32


@cuda.jit(device=True, inline="always")
def dq32t_iq4_xs(src, row_off, j, dst, dst_off, kv):
    o = row_off + (j >> 3) * 136
    jb = j & 7
    dl = h2f(ld_u16(src, o)) * np.float32(_iq4xs_scale(src, o, jb))
    qo = o + 8 + 16 * jb
    for t in range(4):
        w = ld_u32(src, qo + 4 * t)
        for b in range(4):
            dst[dst_off + 4 * t + b] = dl * kv[(w >> (8 * b)) & 0xF]
            dst[dst_off + 16 + 4 * t + b] = dl * kv[(w >> (8 * b + 4)) & 0xF]


@cuda.jit(device=True, inline="always")
def dot32t_iq4_xs(src, row_off, j, x, x_off, kv):
    o = row_off + (j >> 3) * 136
    jb = j & 7
    qo = o + 8 + 16 * jb
    acc = F0
    for t in range(4):
        w = ld_u32(src, qo + 4 * t)
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        y0, y1, y2, y3 = ld_x4(x, x_off + 16 + 4 * t)
        acc += (kv[w & 0xF] * x0 + kv[(w >> 8) & 0xF] * x1 + kv[(w >> 16) & 0xF] * x2
                + kv[(w >> 24) & 0xF] * x3 + kv[(w >> 4) & 0xF] * y0 + kv[(w >> 12) & 0xF] * y1
                + kv[(w >> 20) & 0xF] * y2 + kv[(w >> 28) & 0xF] * y3)
    return h2f(ld_u16(src, o)) * np.float32(_iq4xs_scale(src, o, jb)) * acc


@cuda.jit(device=True, inline="always")
def dq32_iq4_xs(src, row_off, j, dst, dst_off):
    dq32t_iq4_xs(src, row_off, j, dst, dst_off, cuda.const.array_like(TABLE_IQ4NL))


@cuda.jit(device=True, inline="always")
def dot32_iq4_xs(src, row_off, j, x, x_off):
    return dot32t_iq4_xs(src, row_off, j, x, x_off, cuda.const.array_like(TABLE_IQ4NL))
