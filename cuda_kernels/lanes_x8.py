"""Lane decoders (see `lanes`) that dot the weights with 8-bit activations, 4 values per `dp4a`.

The float32 decoders turn every weight into a float and multiply-add it: for Q4_K two
instructions a value (a byte permute and an FMA), which leaves the MoE's gate/up kernel short of
memory bandwidth. Here x is quantized per 32 values when it is staged (`xstage.stage_x8`, the
CPU engine's rounding) and a lane's nibbles are masked into bytes and dotted with it four at a
time in integers; the group's scale is applied once per 32 values. Each dot is exactly the
dequantized row times the quantized x (as the CPU engine's), up to float32 rounding: the
quantization of x, |error| <= dx / 2 a value, is the only approximation.

Slices are the float32 decoders' (`lanes_k`); the staged x is `xstage`'s 8-bit layout:
  Q4_K  part k: qs words j < 8 hold values 64k + 4j .. +3 (low nibbles, group 2k) and 32 further
        (high nibbles, group 2k + 1); their x words are x8_word(64k) + j and + 8 + j.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda

from .intrinsics import dp4a, h2f, ld_w4, u2f
from .lanes import LaneFormat, lane_format
from .lanes_k import _k4_scales, small_f32
from .xstage import stage_padded, stage_padded_normed, stage_x8, stage_x8_normed

NIB = 0x0F0F0F0F


@cuda.jit(device=True, inline="always")
def _nib8(q, x0, x1, x2, x3, x4, x5, x6, x7, sh):
    """Sum over the 8 words q[j] (a tuple) of dp4a(nibbles of q[j] at shift sh, x_j)."""
    a = dp4a((q[4] >> sh) & NIB, x0, 0)
    a = dp4a((q[5] >> sh) & NIB, x1, a)
    a = dp4a((q[6] >> sh) & NIB, x2, a)
    a = dp4a((q[7] >> sh) & NIB, x3, a)
    a = dp4a((q[8] >> sh) & NIB, x4, a)
    a = dp4a((q[9] >> sh) & NIB, x5, a)
    a = dp4a((q[10] >> sh) & NIB, x6, a)
    return dp4a((q[11] >> sh) & NIB, x7, a)


@cuda.jit(device=True, inline="always")
def dot_q4_k_x8(v, part, xs, xo, so, tab):
    p = xo + 20 * part                             # x8_word(64 * part) within the super-block
    a0, a1, a2, a3 = ld_w4(xs, p)
    a4, a5, a6, a7 = ld_w4(xs, p + 4)
    b0, b1, b2, b3 = ld_w4(xs, p + 8)
    b4, b5, b6, b7 = ld_w4(xs, p + 12)
    lo = _nib8(v, a0, a1, a2, a3, a4, a5, a6, a7, 0)
    hi = _nib8(v, b0, b1, b2, b3, b4, b5, b6, b7, 4)
    d_lo, d_hi, s_lo, s_hi = ld_w4(xs, so + 4 * part)
    sc, mn = _k4_scales(v[1], v[2], v[3], part)
    return (h2f(v[0] & 0xFFFF) * (small_f32(sc & 0xFF) * u2f(d_lo) * np.float32(lo)
                                  + small_f32(sc >> 8) * u2f(d_hi) * np.float32(hi))
            - h2f(v[0] >> 16) * (small_f32(mn & 0xFF) * u2f(s_lo)
                                 + small_f32(mn >> 8) * u2f(s_hi)))


def _x8(t: T, dot) -> tuple[int, LaneFormat]:
    return int(t), replace(lane_format(t), dot=dot, x8=True)


# The formats with an 8-bit decoding: the same loads and slices as their float32 one
X8_FORMATS: dict[int, LaneFormat] = dict([_x8(T.Q4_K, dot_q4_k_x8)])


def x8_format(ggml_type: int) -> LaneFormat | None:
    """The 8-bit lane decoding of a GGML type number, or None."""
    return X8_FORMATS.get(int(ggml_type))


def stager(lf: LaneFormat):
    """Device functions (stage, stage_normed) with which the whole block stages x as lf's dot
    reads it (xs uint32 for an 8-bit format, else float32):
      stage(x, n_vals, xs, sums_off)                           x[:n_vals], float32 or float16
      stage_normed(x, nw, scale, n_vals, xs, sums_off, xn, write_xn)   x * scale * nw, and
                                                               with write_xn that to xn too"""
    if lf.x8:
        @cuda.jit(device=True, inline="always")
        def stage(x, n_vals, xs, sums_off):
            stage_x8(x, n_vals, xs, sums_off)

        @cuda.jit(device=True, inline="always")
        def stage_normed(x, nw, scale, n_vals, xs, sums_off, xn, write_xn):
            stage_x8_normed(x, nw, scale, n_vals, xs, sums_off, xn, write_xn)
        return stage, stage_normed
    pa_a, pa_pa, pa_b, pa_pb = lf.pad
    sums = lf.sums

    @cuda.jit(device=True, inline="always")
    def stage(x, n_vals, xs, sums_off):
        stage_padded(x, 0, n_vals, xs, pa_a, pa_pa, pa_b, pa_pb, sums, sums_off)

    @cuda.jit(device=True, inline="always")
    def stage_normed(x, nw, scale, n_vals, xs, sums_off, xn, write_xn):
        stage_padded_normed(x, nw, scale, n_vals, xs, pa_a, pa_pa, pa_b, pa_pb, sums, sums_off,
                            xn, write_xn)
    return stage, stage_normed


def lanes_for(lf: LaneFormat, x8: bool) -> LaneFormat:
    """lf's format decoded with 8-bit x where x8 and it has that decoding, else with float32."""
    if x8:
        return X8_FORMATS.get(lf.ggml_type, lf)
    return lane_format(lf.ggml_type) if lf.x8 else lf
