"""Device decoders of the float and 32-value-block GGML formats: F32, F16, BF16, Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4. The contract is in `qformats`.

Layouts (bytes of one block, values 0..31):
  Q8_0   34: f16 d, i8 q[32]                              v = d*q
  Q4_0   18: f16 d, u8 qs[16] (lo nibbles 0..15, hi 16..31) v = d*(q-8)
  Q4_1   20: f16 d, f16 m, qs[16]                         v = d*q + m
  Q5_0   22: f16 d, u32 qh (bit i = 5th bit of value i), qs[16]   v = d*(q-16)
  Q5_1   24: f16 d, f16 m, u32 qh, qs[16]                 v = d*q + m
  IQ4_NL 18: f16 d, qs[16]                                v = d*kvalues[q]
  MXFP4  17: u8 e (e8m0 scale, halved), qs[16]            v = scale(e)*kvalues_e2m1x2[q]
Blocks of 18, 22 or 34 bytes start on 2-byte boundaries and MXFP4's on any byte, so their quant
words are read with `ld_u32_any` (two aligned loads and a funnel shift).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .intrinsics import byte_to_f32, h2f, ld_u16, ld_u32, ld_u32_any, ld_u8, ld_x4, u2f
from .qtables import TABLE_IQ4NL, TABLE_MXFP4

F0 = np.float32(0.0)
B_Q8 = np.float32(8388608.0 + 128.0)  # 2^23 + the bias of q + 128, for byte_to_f32


@cuda.jit(device=True, inline="always")
def sx8(b):
    """A byte (0..255) as a signed int8 value."""
    return b - ((b & 0x80) << 1)


# ---- F32 / F16 / BF16: 32 values are 128 / 64 / 64 contiguous bytes ----

@cuda.jit(device=True, inline="always")
def dq32_f32(src, row_off, j, dst, dst_off):
    o = row_off + j * 128
    for i in range(32):
        dst[dst_off + i] = u2f(ld_u32(src, o + 4 * i))


@cuda.jit(device=True, inline="always")
def dot32_f32(src, row_off, j, x, x_off):
    o = row_off + j * 128
    acc = F0
    for t in range(8):
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        acc += (u2f(ld_u32(src, o + 16 * t)) * x0 + u2f(ld_u32(src, o + 16 * t + 4)) * x1
                + u2f(ld_u32(src, o + 16 * t + 8)) * x2 + u2f(ld_u32(src, o + 16 * t + 12)) * x3)
    return acc


@cuda.jit(device=True, inline="always")
def dq32_f16(src, row_off, j, dst, dst_off):
    o = row_off + j * 64
    for t in range(16):
        w = ld_u32(src, o + 4 * t)
        dst[dst_off + 2 * t] = h2f(w & 0xFFFF)
        dst[dst_off + 2 * t + 1] = h2f(w >> 16)


@cuda.jit(device=True, inline="always")
def dot32_f16(src, row_off, j, x, x_off):
    o = row_off + j * 64
    acc = F0
    for t in range(8):
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        w0 = ld_u32(src, o + 8 * t)
        w1 = ld_u32(src, o + 8 * t + 4)
        acc += h2f(w0 & 0xFFFF) * x0 + h2f(w0 >> 16) * x1 + h2f(w1 & 0xFFFF) * x2 + h2f(w1 >> 16) * x3
    return acc


@cuda.jit(device=True, inline="always")
def dq32_bf16(src, row_off, j, dst, dst_off):
    o = row_off + j * 64
    for t in range(16):
        w = ld_u32(src, o + 4 * t)
        dst[dst_off + 2 * t] = u2f((w & 0xFFFF) << 16)
        dst[dst_off + 2 * t + 1] = u2f(w & 0xFFFF0000)


@cuda.jit(device=True, inline="always")
def dot32_bf16(src, row_off, j, x, x_off):
    o = row_off + j * 64
    acc = F0
    for t in range(8):
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        w0 = ld_u32(src, o + 8 * t)
        w1 = ld_u32(src, o + 8 * t + 4)
        acc += (u2f((w0 & 0xFFFF) << 16) * x0 + u2f(w0 & 0xFFFF0000) * x1
                + u2f((w1 & 0xFFFF) << 16) * x2 + u2f(w1 & 0xFFFF0000) * x3)
    return acc


# ---- Q8_0 ----

@cuda.jit(device=True, inline="always")
def dq32_q8_0(src, row_off, j, dst, dst_off):
    o = row_off + j * 34
    d = h2f(ld_u16(src, o))
    for t in range(8):
        w = ld_u32_any(src, o + 2 + 4 * t)
        for b in range(4):
            dst[dst_off + 4 * t + b] = d * np.float32(sx8((w >> (8 * b)) & 0xFF))


@cuda.jit(device=True, inline="always")
def dot32_q8_0(src, row_off, j, x, x_off):
    o = row_off + j * 34
    acc = F0
    for t in range(8):
        w = ld_u32_any(src, o + 2 + 4 * t) ^ 0x80808080  # int8 q -> byte q + 128
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        acc += (byte_to_f32(w, 0, B_Q8) * x0 + byte_to_f32(w, 1, B_Q8) * x1
                + byte_to_f32(w, 2, B_Q8) * x2 + byte_to_f32(w, 3, B_Q8) * x3)
    return h2f(ld_u16(src, o)) * acc


# ---- 4-bit nibble blocks: Q4_0, Q4_1, IQ4_NL, MXFP4 share the qs layout ----

@cuda.jit(device=True, inline="always")
def _dq_nibbles_affine(src, qo, d, m, dst, dst_off):
    """dst[i] = d*q_i + m for the 32 nibbles of the 16 bytes at qo."""
    for t in range(4):
        w = ld_u32_any(src, qo + 4 * t)
        for b in range(4):
            dst[dst_off + 4 * t + b] = d * np.float32((w >> (8 * b)) & 0xF) + m
            dst[dst_off + 16 + 4 * t + b] = d * np.float32((w >> (8 * b + 4)) & 0xF) + m


@cuda.jit(device=True, inline="always")
def _dot_nibbles(src, qo, x, x_off):
    """(sum q_i*x_i, sum x_i) over the 32 nibbles of the 16 bytes at qo."""
    acc = F0
    xs = F0
    for t in range(4):
        w = ld_u32_any(src, qo + 4 * t)
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        y0, y1, y2, y3 = ld_x4(x, x_off + 16 + 4 * t)
        acc += (np.float32(w & 0xF) * x0 + np.float32((w >> 8) & 0xF) * x1
                + np.float32((w >> 16) & 0xF) * x2 + np.float32((w >> 24) & 0xF) * x3
                + np.float32((w >> 4) & 0xF) * y0 + np.float32((w >> 12) & 0xF) * y1
                + np.float32((w >> 20) & 0xF) * y2 + np.float32((w >> 28) & 0xF) * y3)
        xs += x0 + x1 + x2 + x3 + y0 + y1 + y2 + y3
    return acc, xs


@cuda.jit(device=True, inline="always")
def dq32_q4_0(src, row_off, j, dst, dst_off):
    o = row_off + j * 18
    d = h2f(ld_u16(src, o))
    _dq_nibbles_affine(src, o + 2, d, d * np.float32(-8.0), dst, dst_off)


@cuda.jit(device=True, inline="always")
def dot32_q4_0(src, row_off, j, x, x_off):
    o = row_off + j * 18
    acc, xs = _dot_nibbles(src, o + 2, x, x_off)
    return h2f(ld_u16(src, o)) * (acc - np.float32(8.0) * xs)


@cuda.jit(device=True, inline="always")
def dq32_q4_1(src, row_off, j, dst, dst_off):
    o = row_off + j * 20
    _dq_nibbles_affine(src, o + 4, h2f(ld_u16(src, o)), h2f(ld_u16(src, o + 2)), dst, dst_off)


@cuda.jit(device=True, inline="always")
def dot32_q4_1(src, row_off, j, x, x_off):
    o = row_off + j * 20
    acc, xs = _dot_nibbles(src, o + 4, x, x_off)
    return h2f(ld_u16(src, o)) * acc + h2f(ld_u16(src, o + 2)) * xs


@cuda.jit(device=True, inline="always")
def _dq_nibbles_table(src, qo, d, dst, dst_off, kv):
    for t in range(4):
        w = ld_u32_any(src, qo + 4 * t)
        for b in range(4):
            dst[dst_off + 4 * t + b] = d * kv[(w >> (8 * b)) & 0xF]
            dst[dst_off + 16 + 4 * t + b] = d * kv[(w >> (8 * b + 4)) & 0xF]


@cuda.jit(device=True, inline="always")
def _dot_nibbles_table(src, qo, x, x_off, kv):
    acc = F0
    for t in range(4):
        w = ld_u32_any(src, qo + 4 * t)
        x0, x1, x2, x3 = ld_x4(x, x_off + 4 * t)
        y0, y1, y2, y3 = ld_x4(x, x_off + 16 + 4 * t)
        acc += (kv[w & 0xF] * x0 + kv[(w >> 8) & 0xF] * x1 + kv[(w >> 16) & 0xF] * x2
                + kv[(w >> 24) & 0xF] * x3 + kv[(w >> 4) & 0xF] * y0 + kv[(w >> 12) & 0xF] * y1
                + kv[(w >> 20) & 0xF] * y2 + kv[(w >> 28) & 0xF] * y3)
    return acc


@cuda.jit(device=True, inline="always")
def dq32t_iq4_nl(src, row_off, j, dst, dst_off, tab):
    o = row_off + j * 18
    _dq_nibbles_table(src, o + 2, h2f(ld_u16(src, o)), dst, dst_off, tab)


@cuda.jit(device=True, inline="always")
def dot32t_iq4_nl(src, row_off, j, x, x_off, tab):
    o = row_off + j * 18
    return h2f(ld_u16(src, o)) * _dot_nibbles_table(src, o + 2, x, x_off, tab)


@cuda.jit(device=True, inline="always")
def dq32_iq4_nl(src, row_off, j, dst, dst_off):
    dq32t_iq4_nl(src, row_off, j, dst, dst_off, cuda.const.array_like(TABLE_IQ4NL))


@cuda.jit(device=True, inline="always")
def dot32_iq4_nl(src, row_off, j, x, x_off):
    return dot32t_iq4_nl(src, row_off, j, x, x_off, cuda.const.array_like(TABLE_IQ4NL))


@cuda.jit(device=True, inline="always")
def e8m0_half(e):
    """The MXFP4 block scale 2^(e-128) (half of 2^(e-127): the levels are stored doubled)."""
    if e < 2:
        return u2f(0x00200000 << e)
    return u2f((e - 1) << 23)


@cuda.jit(device=True, inline="always")
def dq32t_mxfp4(src, row_off, j, dst, dst_off, tab):
    o = row_off + j * 17
    _dq_nibbles_table(src, o + 1, e8m0_half(ld_u8(src, o)), dst, dst_off, tab)


@cuda.jit(device=True, inline="always")
def dot32t_mxfp4(src, row_off, j, x, x_off, tab):
    o = row_off + j * 17
    return e8m0_half(ld_u8(src, o)) * _dot_nibbles_table(src, o + 1, x, x_off, tab)


@cuda.jit(device=True, inline="always")
def dq32_mxfp4(src, row_off, j, dst, dst_off):
    dq32t_mxfp4(src, row_off, j, dst, dst_off, cuda.const.array_like(TABLE_MXFP4))


@cuda.jit(device=True, inline="always")
def dot32_mxfp4(src, row_off, j, x, x_off):
    return dot32t_mxfp4(src, row_off, j, x, x_off, cuda.const.array_like(TABLE_MXFP4))


# ---- 5-bit blocks: Q5_0, Q5_1 ----

@cuda.jit(device=True, inline="always")
def _dq_q5(src, qo, qh, d, m, dst, dst_off):
    for t in range(4):
        w = ld_u32_any(src, qo + 4 * t)
        for b in range(4):
            i = 4 * t + b
            lo = ((w >> (8 * b)) & 0xF) | (((qh >> i) & 1) << 4)
            hi = ((w >> (8 * b + 4)) & 0xF) | (((qh >> (i + 16)) & 1) << 4)
            dst[dst_off + i] = d * np.float32(lo) + m
            dst[dst_off + 16 + i] = d * np.float32(hi) + m


@cuda.jit(device=True, inline="always")
def _dot_q5(src, qo, qh, x, x_off):
    acc, xs = _dot_nibbles(src, qo, x, x_off)
    for i in range(32):  # the 5th bits: add 16 * x_i where set
        if (qh >> i) & 1:
            acc += np.float32(16.0) * np.float32(x[x_off + i])
    return acc, xs


@cuda.jit(device=True, inline="always")
def dq32_q5_0(src, row_off, j, dst, dst_off):
    o = row_off + j * 22
    d = h2f(ld_u16(src, o))
    _dq_q5(src, o + 6, ld_u32_any(src, o + 2), d, d * np.float32(-16.0), dst, dst_off)


@cuda.jit(device=True, inline="always")
def dot32_q5_0(src, row_off, j, x, x_off):
    o = row_off + j * 22
    acc, xs = _dot_q5(src, o + 6, ld_u32_any(src, o + 2), x, x_off)
    return h2f(ld_u16(src, o)) * (acc - np.float32(16.0) * xs)


@cuda.jit(device=True, inline="always")
def dq32_q5_1(src, row_off, j, dst, dst_off):
    o = row_off + j * 24
    _dq_q5(src, o + 8, ld_u32(src, o + 4), h2f(ld_u16(src, o)), h2f(ld_u16(src, o + 2)),
           dst, dst_off)


@cuda.jit(device=True, inline="always")
def dot32_q5_1(src, row_off, j, x, x_off):
    o = row_off + j * 24
    acc, xs = _dot_q5(src, o + 8, ld_u32(src, o + 4), x, x_off)
    return h2f(ld_u16(src, o)) * acc + h2f(ld_u16(src, o + 2)) * xs
