"""Staging of the activation vector in shared memory for the matvec-style kernels.

Each lane of a matvec warp dots its own 32-value group, so a warp's load of x at one position of
the group touches 32 groups at once. From global memory that is 32 cache lines per instruction;
from shared memory laid out with 32 values then 4 floats of padding per group (XPAD = 36), the 16-
byte reads of 8 consecutive lanes land in 8 distinct bank quads: conflict-free. The block loads a
tile of x once, coalesced, converting float16 to float32 on the way.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .intrinsics import f2u, ld_x4, quad_max, quad_sum, rint_i32, st_x4

XPAD = 36  # floats per staged 32-value group (16-byte aligned, bank-spreading)
# The staging loops are while loops: numba computes the trip count of a range whose step is the
# block size with a 64-bit division, about 30 instructions per thread in every block (ncu).


@cuda.jit(device=True, inline="always")
def stage_x(x, x_base, n_vals, xs, xs_base):
    """xs[xs_base + (i // 32) * XPAD + i % 32] = x[x_base + i] for i < n_vals (whole block)."""
    i = cuda.threadIdx.x
    while i < n_vals:
        xs[xs_base + (i >> 5) * XPAD + (i & 31)] = np.float32(x[x_base + i])
        i += cuda.blockDim.x


def staged_bytes(n_groups: int) -> int:
    """Dynamic shared memory for n_groups staged groups."""
    return int(n_groups) * XPAD * 4


# ---- padded staging for the lane-cooperative kernels (`lanes`) ------------------------------
#
# Those kernels give each lane a fixed slice of a super-block, so the lanes of one 16-byte
# shared-memory phase (8 lanes) read x at a format-specific stride. Position v of x is staged at
#     pad_pos(v) = v + PA * (v >> A) + PB * (v >> B)
# floats, with (A, PA, B, PB) chosen per format so that those 8 reads fall in 8 distinct
# 16-byte bank groups; 16 consecutive values never straddle a pad (A >= 4). After the padded x,
# optionally, the sums of x over each 16 consecutive values (formats with a per-block minimum,
# whose dot needs sum(x) over the block).

@cuda.jit(device=True, inline="always")
def pad_pos(v, a, pa, b, pb):
    """Staged position of x value v under the padding (a, pa, b, pb)."""
    return v + pa * (v >> a) + pb * (v >> b)


def padded_len(n_vals: int, pad: tuple[int, int, int, int]) -> int:
    """Floats the padded copy of n_vals values occupies, rounded up to 4 (16-byte aligned)."""
    a, pa, b, pb = pad
    n = n_vals + pa * (n_vals >> a) + pb * (n_vals >> b)
    return -(-n // 4) * 4


def padded_bytes(n_vals: int, pad: tuple[int, int, int, int], sums: bool) -> int:
    """Dynamic shared memory of a padded staging of n_vals values (plus their 16-value sums)."""
    return 4 * (padded_len(n_vals, pad) + (n_vals // 16 if sums else 0))


@cuda.jit(device=True, inline="always")
def _put_quad(xs, q, n_quads, v0, v1, v2, v3, a, pa, b, pb, sums, sums_off):
    """Quad q stored at its padded position and (sums) added into its 16-value sum; every
    thread calls this the same number of times (the sums use 4-lane shuffles)."""
    s = np.float32(0.0)
    if q < n_quads:
        st_x4(xs, pad_pos(4 * q, a, pa, b, pb), v0, v1, v2, v3)
        s = (v0 + v1) + (v2 + v3)
    if sums:
        s = quad_sum(s)
        if (cuda.threadIdx.x & 3) == 0 and q < n_quads:
            xs[sums_off + (q >> 2)] = s


@cuda.jit(device=True, inline="always")
def stage_padded(x, x_base, n_vals, xs, a, pa, b, pb, sums, sums_off):
    """xs[pad_pos(i)] = x[x_base + i] for i < n_vals (a multiple of 16; x float32 or float16,
    x_base a multiple of 4), and with `sums` xs[sums_off + i // 16] = the sum of those 16 values.
    The whole block calls this; every thread runs the same number of iterations (the sums use
    4-lane shuffles)."""
    n_quads = n_vals >> 2
    q0 = 0
    while q0 < n_quads:
        q = q0 + cuda.threadIdx.x
        x0 = x1 = x2 = x3 = np.float32(0.0)
        if q < n_quads:
            x0, x1, x2, x3 = ld_x4(x, x_base + 4 * q)
        _put_quad(xs, q, n_quads, x0, x1, x2, x3, a, pa, b, pb, sums, sums_off)
        q0 += cuda.blockDim.x


def _wide_stager(n_at_once: int):
    six = n_at_once == 6
    if n_at_once not in (4, 6):
        raise ValueError(f"a wide staging loads 4 or 6 quads at a time, not {n_at_once}")

    @cuda.jit(device=True, inline="always")
    def stage_padded_wide(x, n_vals, xs, a, pa, b, pb, sums, sums_off):
        """`stage_padded` of x[:n_vals] (x_base 0) with each thread's loads issued 4 (or 6)
        quads at a time, before any of their stores. A shared store may alias a later global
        load for the compiler (numba's arrays are generic pointers), so `stage_padded`'s loop
        waits a memory latency per iteration: the MoE down kernel's 8 x 768 values (6
        iterations of 256 threads) took ~3.5 us that way on the H200 with nothing else in
        flight (`phase_stamps.py`). Worth it where nothing else is in flight (loads return in
        issue order); the same sums, in the same order, as `stage_padded`."""
        n_quads = n_vals >> 2
        last = n_quads - 1
        bd = cuda.blockDim.x
        q = cuda.threadIdx.x
        e0 = e1 = e2 = e3 = f0 = f1 = f2 = f3 = np.float32(0.0)
        while q < n_quads + cuda.threadIdx.x:
            # a quad past the end loads the last one again (in bounds) and is never stored
            a0, a1, a2, a3 = ld_x4(x, 4 * min(q, last))
            b0, b1, b2, b3 = ld_x4(x, 4 * min(q + bd, last))
            c0, c1, c2, c3 = ld_x4(x, 4 * min(q + 2 * bd, last))
            d0, d1, d2, d3 = ld_x4(x, 4 * min(q + 3 * bd, last))
            if six:
                e0, e1, e2, e3 = ld_x4(x, 4 * min(q + 4 * bd, last))
                f0, f1, f2, f3 = ld_x4(x, 4 * min(q + 5 * bd, last))
            _put_quad(xs, q, n_quads, a0, a1, a2, a3, a, pa, b, pb, sums, sums_off)
            _put_quad(xs, q + bd, n_quads, b0, b1, b2, b3, a, pa, b, pb, sums, sums_off)
            _put_quad(xs, q + 2 * bd, n_quads, c0, c1, c2, c3, a, pa, b, pb, sums, sums_off)
            _put_quad(xs, q + 3 * bd, n_quads, d0, d1, d2, d3, a, pa, b, pb, sums, sums_off)
            if six:
                _put_quad(xs, q + 4 * bd, n_quads, e0, e1, e2, e3, a, pa, b, pb, sums, sums_off)
                _put_quad(xs, q + 5 * bd, n_quads, f0, f1, f2, f3, a, pa, b, pb, sums, sums_off)
            q += n_at_once * bd
    return stage_padded_wide


stage_padded_wide = _wide_stager(4)
# six at a time: the fused MoE's 8 x 768 values of h in one round of 256 threads, not two
stage_padded_wide6 = _wide_stager(6)


@cuda.jit(device=True, inline="always")
def sum_squares(x, n_vals):
    """This thread's part of sum(x[i]^2) over i < n_vals (a multiple of 4; x float32): the quads
    threadIdx.x, threadIdx.x + blockDim.x, ... in that order, so a fixed block reduction of the
    parts gives every block of a launch the same bits."""
    s = np.float32(0.0)
    q = cuda.threadIdx.x
    while q < n_vals >> 2:
        x0, x1, x2, x3 = ld_x4(x, 4 * q)
        s += (x0 * x0 + x1 * x1) + (x2 * x2 + x3 * x3)
        q += cuda.blockDim.x
    return s


@cuda.jit(device=True, inline="always")
def stage_padded_normed(x, nw, scale, n_vals, xs, a, pa, b, pb, sums, sums_off, xn, write_xn):
    """`stage_padded` of v[i] = x[i] * scale * nw[i] (RMSNorm with its weight, in the order
    `norm_rope.rms_norm` computes it), i < n_vals; with `write_xn` also xn[i] = v[i] (x, nw, xn
    float32). The whole block calls this."""
    n_quads = n_vals >> 2
    q0 = 0
    while q0 < n_quads:
        q = q0 + cuda.threadIdx.x
        s = np.float32(0.0)
        if q < n_quads:
            x0, x1, x2, x3 = ld_x4(x, 4 * q)
            w0, w1, w2, w3 = ld_x4(nw, 4 * q)
            v0 = x0 * scale * w0
            v1 = x1 * scale * w1
            v2 = x2 * scale * w2
            v3 = x3 * scale * w3
            st_x4(xs, pad_pos(4 * q, a, pa, b, pb), v0, v1, v2, v3)
            if write_xn:
                st_x4(xn, 4 * q, v0, v1, v2, v3)
            s = (v0 + v1) + (v2 + v3)
        if sums:
            s = quad_sum(s)
            if (cuda.threadIdx.x & 3) == 0 and q < n_quads:
                xs[sums_off + (q >> 2)] = s
        q0 += cuda.blockDim.x


# ---- 8-bit staging (`lanes_x8`) -------------------------------------------------------------
#
# x quantized as the CPU engine's `quantize_x8` does it: per 32-value group, dx = absmax / 127
# and q = rint(x / dx) (x * (1 / dx), the same float32 operations), so that the two engines'
# integer dots see the same activations. The int8 values are packed 4 to a uint32 word, with 4
# words of padding after every 64 values (word of value v: `x8_word`), which puts the 16-byte
# reads of a Q4_K lane quad's 8 lanes (64 values apart) in 8 distinct bank groups. After them,
# per 64 values, 4 words: dx of its two groups, then dx * sum(q) of each (float32 bits).

X8_SPAN = 64   # values between two pads


def x8_len(n_vals: int) -> int:
    """Words the packed, padded int8 copy of n_vals values (a multiple of 64) occupies."""
    return n_vals // 4 + 4 * (n_vals // 64)


@cuda.jit(device=True, inline="always")
def _pack4(a, b, c, d):
    return (a & 0xFF) | ((b & 0xFF) << 8) | ((c & 0xFF) << 16) | ((d & 0xFF) << 24)


@cuda.jit(device=True, inline="always")
def _put_x8(o, n_oct, xs, sums_off, a0, a1, a2, a3, b0, b1, b2, b3):
    """Octet o (values 8o .. 8o + 7) quantized with its lane quad's group and stored; every
    thread calls this the same number of times (4-lane shuffles)."""
    m = max(max(max(abs(a0), abs(a1)), max(abs(a2), abs(a3))),
            max(max(abs(b0), abs(b1)), max(abs(b2), abs(b3))))
    d = quad_max(m) / np.float32(127.0)
    inv = np.float32(1.0) / d if d > np.float32(0.0) else np.float32(0.0)
    q0 = rint_i32(a0 * inv)
    q1 = rint_i32(a1 * inv)
    q2 = rint_i32(a2 * inv)
    q3 = rint_i32(a3 * inv)
    q4 = rint_i32(b0 * inv)
    q5 = rint_i32(b1 * inv)
    q6 = rint_i32(b2 * inv)
    q7 = rint_i32(b3 * inv)
    s = quad_sum(np.float32(((q0 + q1) + (q2 + q3)) + ((q4 + q5) + (q6 + q7))))  # exact
    if o < n_oct:
        w = 2 * o + 4 * (o >> 3)  # x8_word(8 * o)
        xs[w] = _pack4(q0, q1, q2, q3)
        xs[w + 1] = _pack4(q4, q5, q6, q7)
        if (cuda.threadIdx.x & 3) == 0:
            g = o >> 2  # the group; its pair's 4 words
            at = sums_off + 4 * (g >> 1) + (g & 1)
            xs[at] = f2u(d)
            xs[at + 2] = f2u(d * s)


@cuda.jit(device=True, inline="always")
def stage_x8(x, n_vals, xs, sums_off):
    """xs (uint32) = x[:n_vals] (float32 or float16, n_vals a multiple of 64) quantized and
    packed as the section above says. Each thread takes 8 consecutive values, so an aligned
    lane quad holds one 32-value group (its max and sum by 4-lane shuffles). The whole block
    calls this."""
    _stage_x8_from(0, x, n_vals, xs, sums_off)


@cuda.jit(device=True, inline="always")
def _stage_x8_from(o0, x, n_vals, xs, sums_off):
    """`stage_x8`'s rounds of octets from octet o0 (a multiple of the block size) on."""
    n_oct = n_vals >> 3
    last = n_oct - 1
    while o0 < n_oct:
        o = o0 + cuda.threadIdx.x
        a0, a1, a2, a3 = ld_x4(x, 8 * min(o, last))
        b0, b1, b2, b3 = ld_x4(x, 8 * min(o, last) + 4)
        _put_x8(o, n_oct, xs, sums_off, a0, a1, a2, a3, b0, b1, b2, b3)
        o0 += cuda.blockDim.x


@cuda.jit(device=True, inline="always")
def x8_preload(x, n_vals):
    """The calling thread's octets of `stage_x8`'s first two rounds (o = thread, thread + block;
    clamped to the last octet), loaded into registers: issued before other loads, they are
    staged by `stage_x8_preloaded` while those still stream (16 float32)."""
    last = (n_vals >> 3) - 1
    i = 8 * min(cuda.threadIdx.x, last)
    j = 8 * min(cuda.threadIdx.x + cuda.blockDim.x, last)
    a0, a1, a2, a3 = ld_x4(x, i)
    b0, b1, b2, b3 = ld_x4(x, i + 4)
    c0, c1, c2, c3 = ld_x4(x, j)
    d0, d1, d2, d3 = ld_x4(x, j + 4)
    return (a0, a1, a2, a3, b0, b1, b2, b3), (c0, c1, c2, c3, d0, d1, d2, d3)


@cuda.jit(device=True, inline="always")
def stage_x8_preloaded(pre, x, n_vals, xs, sums_off):
    """`stage_x8` with its first two rounds' octets already loaded (`x8_preload`): the same
    words in xs, every octet quantized by the same code."""
    n_oct = n_vals >> 3
    o = cuda.threadIdx.x
    p, q = pre
    _put_x8(o, n_oct, xs, sums_off, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
    if n_oct > cuda.blockDim.x:  # the whole block alike; one round (2,048 values) stores no more
        _put_x8(o + cuda.blockDim.x, n_oct, xs, sums_off, q[0], q[1], q[2], q[3], q[4], q[5],
                q[6], q[7])
        _stage_x8_from(2 * cuda.blockDim.x, x, n_vals, xs, sums_off)


@cuda.jit(device=True, inline="always")
def stage_x8_normed(x, nw, scale, n_vals, xs, sums_off, xn, write_xn):
    """`stage_x8` of v[i] = x[i] * scale * nw[i] (as `stage_padded_normed`; x, nw float32), and
    with `write_xn` xn[i] = v[i]."""
    n_oct = n_vals >> 3
    last = n_oct - 1
    o0 = 0
    while o0 < n_oct:
        o = o0 + cuda.threadIdx.x
        i = 8 * min(o, last)
        a0, a1, a2, a3 = ld_x4(x, i)
        b0, b1, b2, b3 = ld_x4(x, i + 4)
        w0, w1, w2, w3 = ld_x4(nw, i)
        a0 = a0 * scale * w0
        a1 = a1 * scale * w1
        a2 = a2 * scale * w2
        a3 = a3 * scale * w3
        w0, w1, w2, w3 = ld_x4(nw, i + 4)
        b0 = b0 * scale * w0
        b1 = b1 * scale * w1
        b2 = b2 * scale * w2
        b3 = b3 * scale * w3
        if write_xn and o < n_oct:
            st_x4(xn, i, a0, a1, a2, a3)
            st_x4(xn, i + 4, b0, b1, b2, b3)
        _put_x8(o, n_oct, xs, sums_off, a0, a1, a2, a3, b0, b1, b2, b3)
        o0 += cuda.blockDim.x
