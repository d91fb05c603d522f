"""The dot product of one quantized weight row with an f32 activation vector, from the row's bytes.

The K-quants (Q4_K, Q5_K, Q6_K) take integer dot products against the activations quantized to
8 bits (`idot`). F32, F16, BF16 and Q8_0 have fused f32 loops: each block's values are unpacked,
converted to f32 and multiplied into `LANES` independent accumulators by straight-line vector
code (`simd`), and the sum is reduced once per row, not once per block. Every other format
decodes a block at a time into a scratch row with the quant package's `decode_block` and then
takes a plain f32 dot: correct for every format; a fused loop can be added one format at a time.

All functions take `row`: uint8[::1] (one row's bytes), `x`: float32[::1] (the row's width),
and scratch `acc`: float32[ACC_SIZE], `buf`: float32[width]; `row_dot` also the 8-bit form of x
(`idot.x8_arrays`).

Development note: numba's disk cache keys each function on its own file only, so the parallel
drivers (matmul.py, moe.py) that inline these keep their cached code after an edit here; delete
strata/engine/cpu/__pycache__ when changing this file or simd.py.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as _T
from numba import njit

from strata.engine.cpu.idot import (
    dot_q4_k_x8,
    dot_q5_k_x8,
    dot_q6_k_x8,
    dots_x8,
    takes_x8,
)
from strata.engine.cpu.simd import (
    NATIVE_HALF,
    fma_h16x32,
    fma_i8x32,
    half_at,
    put_h16x32,
    put_i8x32,
    put_q6x32,
    put_u4x64,
)
from strata.quant.blocks import decode_block
from strata.quant.scalars import f16_bits_to_f32

F32 = np.float32
# Independent accumulators. They live in memory (numba cannot name a vector register), so each
# update waits for the previous one to the same address: blocks and sub-blocks rotate through
# LANES so that an accumulator is touched about once per 128 values (more lanes cost more to
# clear and sum per row than they gain: measured on 768-value rows).
LANES = 128
ACC_SIZE = LANES + 16  # the lanes, then a fused loop's per-block scratch
FAST = {"contract", "reassoc", "nsz"}  # fused multiply-add and reassociation of the lane sums

F32_T, F16_T, BF16_T = int(_T.F32), int(_T.F16), int(_T.BF16)
Q8_0_T, Q4_K_T, Q5_K_T, Q6_K_T = int(_T.Q8_0), int(_T.Q4_K), int(_T.Q5_K), int(_T.Q6_K)


@njit(cache=True, fastmath=FAST)
def _lanes_zero(acc):
    for i in range(LANES):
        acc[i] = 0.0


@njit(cache=True, fastmath=FAST)
def _lanes_sum(acc):
    s = F32(0.0)
    for i in range(LANES):
        s += acc[i]
    return s


_f16 = half_at  # the fp16 at a byte offset, as f32


@njit(cache=True, fastmath=FAST)
def dot_f32(w, x, acc):
    """Dot of two f32 vectors of the same length (w may be a decoded row)."""
    n = x.shape[0]
    _lanes_zero(acc)
    n_full = n - n % LANES
    for b in range(0, n_full, LANES):
        for i in range(LANES):
            acc[i] += w[b + i] * x[b + i]
    s = _lanes_sum(acc)
    for i in range(n_full, n):
        s += w[i] * x[i]
    return s


@njit(cache=True, fastmath=FAST)
def _dot_f16_bits(row, x, acc):
    h = row.view(np.uint16)
    n = x.shape[0]
    _lanes_zero(acc)
    n_full = n - n % LANES
    for b in range(0, n_full, LANES):
        for i in range(LANES):
            acc[i] += f16_bits_to_f32(np.int64(h[b + i])) * x[b + i]
    s = _lanes_sum(acc)
    for i in range(n_full, n):
        s += f16_bits_to_f32(np.int64(h[i])) * x[i]
    return s


@njit(cache=True, fastmath=FAST)
def _dot_f16_native(row, x, acc):
    n = x.shape[0]
    _lanes_zero(acc)
    n_full = n - n % 32
    for b in range(0, n_full, 32):
        fma_h16x32(acc, b % LANES, row, 2 * b, x, b)
    s = _lanes_sum(acc)
    for i in range(n_full, n):
        s += _f16(row, 2 * i) * x[i]
    return s


# F16 row: 32 halves at a time converted in hardware where there is a converter, else each half
# by the exponent re-bias trick (also exact).
dot_f16 = _dot_f16_native if NATIVE_HALF else _dot_f16_bits


@njit(cache=True, fastmath=FAST)
def dot_bf16(row, x, acc):
    """BF16 row: a bf16 is the top half of an f32."""
    h = row.view(np.uint16)
    n = x.shape[0]
    _lanes_zero(acc)
    n_full = n - n % LANES
    for b in range(0, n_full, LANES):
        for i in range(LANES):
            acc[i] += np.uint32(np.uint32(h[b + i]) << 16).view(F32) * x[b + i]
    s = _lanes_sum(acc)
    for i in range(n_full, n):
        s += np.uint32(np.uint32(h[i]) << 16).view(F32) * x[i]
    return s


@njit(cache=True, fastmath=FAST, inline="always")
def dot_q8_0(w, r, x, acc):
    """Row r of Q8_0 w (34-byte blocks of fp16 d and 32 int8; value = d * q) . x."""
    _lanes_zero(acc)
    o0 = r * w.shape[1]
    for b in range(w.shape[1] // 34):
        o = o0 + b * 34
        fma_i8x32(acc, 32 * (b & 3), w, o + 2, x, 32 * b, _f16(w, o))
    return _lanes_sum(acc)


@njit(cache=True)
def _k4_scale_min(row, sc, k):
    """Sub-block k's 6-bit (scale, min) from a Q4_K/Q5_K 12-byte packed scale array at `sc`."""
    if k < 4:
        return row[sc + k] & 63, row[sc + k + 4] & 63
    packed = row[sc + k + 4]
    return ((packed & 15) | ((row[sc + k - 4] >> 6) << 4),
            (packed >> 4) | ((row[sc + k] >> 6) << 4))


@njit(cache=True, fastmath=FAST)
def _decode_q8_0(row, buf):
    for b in range(row.shape[0] // 34):
        put_i8x32(buf, 32 * b, row, 34 * b + 2, _f16(row, 34 * b))


@njit(cache=True, fastmath=FAST)
def _decode_q4_k(row, buf):
    for b in range(row.shape[0] // 144):
        o = b * 144
        d = _f16(row, o)
        dmin = _f16(row, o + 2)
        for c in range(4):
            s0, m0 = _k4_scale_min(row, o + 4, 2 * c)
            s1, m1 = _k4_scale_min(row, o + 4, 2 * c + 1)
            put_u4x64(buf, 256 * b + 64 * c, row, o + 16 + 32 * c, d * F32(s0), d * F32(s1),
                      dmin * F32(m0), dmin * F32(m1))


@njit(cache=True, fastmath=FAST)
def _decode_q6_k(row, buf):
    sc8 = row.view(np.int8)
    for b in range(row.shape[0] // 210):
        o = b * 210
        d = _f16(row, o + 208)
        for h in range(2):
            for k in range(4):
                sc = o + 192 + 8 * h + 2 * k
                put_q6x32(buf, 256 * b + 128 * h + 32 * k, row, o + 64 * h + 32 * (k & 1),
                          o + 128 + 32 * h, 4 * (k >> 1), 2 * k, d * F32(sc8[sc]),
                          d * F32(sc8[sc + 1]))


@njit(cache=True, fastmath=FAST)
def decode_row(fmt, block_size, row, buf):
    """Decode a whole row into buf[:width] (width = len(buf)) as f32, any supported format."""
    n = buf.shape[0]
    if fmt == Q8_0_T:
        _decode_q8_0(row, buf)
    elif fmt == Q4_K_T:
        _decode_q4_k(row, buf)
    elif fmt == Q6_K_T:
        _decode_q6_k(row, buf)
    elif fmt == F32_T:
        w = row.view(np.float32)
        for i in range(n):
            buf[i] = w[i]
    elif fmt == F16_T:
        n_full = n - n % 32 if NATIVE_HALF else 0
        for b in range(0, n_full, 32):
            put_h16x32(buf, b, row, 2 * b)
        h = row.view(np.uint16)
        for i in range(n_full, n):
            buf[i] = f16_bits_to_f32(np.int64(h[i]))
    elif fmt == BF16_T:
        h = row.view(np.uint16)
        for i in range(n):
            buf[i] = np.uint32(np.uint32(h[i]) << 16).view(F32)
    else:
        n_blocks = n // block_size
        block_bytes = row.shape[0] // n_blocks
        for b in range(n_blocks):
            decode_block(fmt, row, b * block_bytes, buf, b * block_size)


@njit(cache=True, fastmath=FAST)
def row_dot(fmt, block_size, w, r, x, qx, dx, qs16, acc, buf):
    """dot(row r of w, x) for any supported format (w: uint8[n_rows, row_bytes]): the K-quants
    in integers against the 8-bit activations (qx, dx, qs16: `idot.x8_arrays` of x), the other
    fused formats against x in f32, the rest by decoding into `buf` (float32[len(x)]) and an
    f32 dot."""
    if fmt == Q4_K_T:
        return dot_q4_k_x8(w, r, qx, dx, qs16, acc)
    if fmt == Q6_K_T:
        return dot_q6_k_x8(w, r, qx, dx, qs16, acc)
    if fmt == Q5_K_T:
        return dot_q5_k_x8(w, r, qx, dx, qs16, acc)
    if fmt == Q8_0_T:
        return dot_q8_0(w, r, x, acc)
    row = w[r]
    if fmt == F32_T:
        return dot_f32(row.view(np.float32), x, acc)
    if fmt == F16_T:
        return dot_f16(row, x, acc)
    if fmt == BF16_T:
        return dot_bf16(row, x, acc)
    decode_row(fmt, block_size, row, buf)
    return dot_f32(buf, x, acc)


@njit(cache=True, fastmath=FAST)
def rows_dot(fmt, block_size, w, r0, r1, x, qx, dx, qs16, acc, buf, out):
    """out[r - r0] = `row_dot` of row r of w, for r0 <= r < r1. The K-quants run the whole loop
    (and Q8_0) in one compiled function (`idot.dots_x8`): no call, format test or row view per row (a row
    view touches a reference count that every thread shares)."""
    if takes_x8(fmt):
        dots_x8(fmt, w, r0, r1, qx, dx, qs16, acc, out)
    elif fmt == Q8_0_T:
        for r in range(r0, r1):
            out[r - r0] = dot_q8_0(w, r, x, acc)
    else:
        for r in range(r0, r1):
            out[r - r0] = row_dot(fmt, block_size, w, r, x, qx, dx, qs16, acc, buf)
