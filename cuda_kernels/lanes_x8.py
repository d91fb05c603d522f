"""Lane decoders (see `lanes`) that dot the weights with 8-bit activations, 4 values per `dp4a`.

The float32 decoders turn every weight into a float and multiply-add it: for Q4_K two
instructions a value (a byte permute and an FMA), which leaves the MoE's gate/up kernel short of
memory bandwidth. Here x is quantized per 32 values when it is staged (`xstage.stage_x8`, the
CPU engine's rounding) and a lane's nibbles are masked into bytes and dotted with it four at a
time in integers; the group's scale is applied once per 32 values. Each dot is exactly the
dequantized row times the quantized x, up to float32 rounding: the quantization of x, |error|
<= dx / 2 a value, is the only approximation (the CPU engine's for Q4_K; it dots IQ4_XS and
IQ3_S with float32 x).

Every 8-bit format takes 64 values a lane (4 lanes a super-block), the span whose reads
`xstage`'s 8-bit layout spreads over the bank groups; the staged x of part k starts at word
x8_word(64k) = 20k of its super-block:
  Q4_K    the float32 slice (`lanes_k`): qs words j < 8 hold values 64k + 4j .. +3 (low
          nibbles, group 2k) and 32 further (high nibbles, group 2k + 1): x words + j, + 8 + j.
  IQ4_XS  its own slice (the float32 decoder takes 8 lanes): the 8-byte header and qs[32k ..
          32k + 31], sub-blocks 2k and 2k + 1. Byte i of a sub-block holds values i (low nibble)
          and 16 + i (high); the nibbles index the 16 int8 levels, looked up four at a time by
          byte permutes (`levels`).
  IQ3_S   the float32 slice (`lanes_iq`): grid entry e of a sub-block is values 4e .. 4e + 3,
          x word e; its four sign bits become a byte mask by one multiply and one permute.
  Q6_K    its own slice (the float32 decoder takes 8 lanes): part p = 2n + h holds ql[64n +
          16h .. +15] (A), ql[64n + 32 + 16h .. +15] (B) and qh[32n + 16h .. +15] (H): the 16-value
          chunks c = 0..3 at values 128n + 16h + 32c, each under one scale (sc[8n + h + 2c]) and
          in the 32-value x group 4n + c. Chunk c's 6-bit codes are A's low nibbles (c = 0),
          B's (1), A's high (2), B's (3) under H's bit pair 2c; the bias of 32 is one more dp4a
          of each x word with bytes of -32. The lanes of a half (h = 0, 1) read disjoint bytes,
          unlike a 64-value contiguous slice, whose two lanes of a half would both load A, B and H.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda

from strata.quant.planar import Q6_K_P8

from .intrinsics import (dp4a, h2f, ld_nc_u32x2, ld_nc_u32x4, ld_u16, ld_u32_at, ld_w4, prmt,
                         u2f)
from .lanes import LaneFormat, lane_format
from .lanes_iq import ROW_SEL, ninth_bits
from .lanes_k import _k4_scales, i8_f32, small_f32
from .levels import IQ4_L0, IQ4_L1, IQ4_L2, IQ4_L3, iq4_levels_of, iq4_xs_scale
from .planar import q6_k_fields, q6_k_p8_fields
from .qtables import GRID_IQ3_S, IQ4NL_WORDS_OFF
from .spans import span2, span4
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


# ---- IQ4_XS ----

F32 = np.float32(32.0)


@cuda.jit(device=True, inline="always")
def load_iq4_xs_x8(w, off, part):
    h0, h1 = ld_nc_u32x2(w, off)                   # d | scales_h << 16, scales_l
    q0, q1 = ld_nc_u32x2(w, off + 8 + 32 * part)   # the super-block is 8-aligned, qs too
    q2, q3 = ld_nc_u32x2(w, off + 16 + 32 * part)
    q4, q5 = ld_nc_u32x2(w, off + 24 + 32 * part)
    q6, q7 = ld_nc_u32x2(w, off + 32 + 32 * part)
    return (h0, h1, q0, q1, q2, q3, q4, q5, q6, q7)


@cuda.jit(device=True, inline="always")
def _iq4_word(q, lv, xa, xb, acc):
    lo, hi = iq4_levels_of(q, lv[0], lv[1], lv[2], lv[3])
    return dp4a(hi, xb, dp4a(lo, xa, acc))


@cuda.jit(device=True, inline="always")
def _iq4_sub(q0, q1, q2, q3, lv, xs, p):
    """Integer dot of one 32-value sub-block (qs words q0..q3, level words lv) with x words
    p .. p + 7."""
    a0, a1, a2, a3 = ld_w4(xs, p)                  # values 0 .. 15
    b0, b1, b2, b3 = ld_w4(xs, p + 4)              # values 16 .. 31
    s = _iq4_word(q0, lv, a0, b0, 0)
    s = _iq4_word(q1, lv, a1, b1, s)
    s = _iq4_word(q2, lv, a2, b2, s)
    return _iq4_word(q3, lv, a3, b3, s)


@cuda.jit(device=True, inline="always")
def _iq4_scale(h0, h1, sub):
    """Sub-block `sub`'s 6-bit scale minus its bias of 32, as float32."""
    return small_f32(iq4_xs_scale(h0, h1, sub)) - F32


@cuda.jit(device=True, inline="always")
def _dot_iq4_xs_x8(v, part, xs, xo, so, lv):
    p = xo + 20 * part
    sa = _iq4_sub(v[2], v[3], v[4], v[5], lv, xs, p)
    sb = _iq4_sub(v[6], v[7], v[8], v[9], lv, xs, p + 8)
    d_a, d_b, _, _ = ld_w4(xs, so + 4 * part)
    h0 = v[0]
    return h2f(h0 & 0xFFFF) * (_iq4_scale(h0, v[1], 2 * part) * u2f(d_a) * np.float32(sa)
                               + _iq4_scale(h0, v[1], 2 * part + 1) * u2f(d_b) * np.float32(sb))


@cuda.jit(device=True, inline="always")
def dot_iq4_xs_x8(v, part, xs, xo, so, tab):
    return _dot_iq4_xs_x8(v, part, xs, xo, so, (IQ4_L0, IQ4_L1, IQ4_L2, IQ4_L3))


@cuda.jit(device=True, inline="always")
def dot_iq4_xs_x8_loaded(v, part, xs, xo, so, tab):
    """dot_iq4_xs_x8 with the int8 level words read from the staged table, a copy for even and
    one for odd lanes (see qtables.TABLE_IQ4NL), so ptxas keeps them in four registers."""
    t = IQ4NL_WORDS_OFF + 16 * (cuda.threadIdx.x & 1)
    return _dot_iq4_xs_x8(v, part, xs, xo, so, (ld_u32_at(tab, t), ld_u32_at(tab, t + 4),
                                                ld_u32_at(tab, t + 8), ld_u32_at(tab, t + 12)))


# ---- IQ3_S ----

# A negated grid byte is dotted as its complement and corrected by the mask's -1 (`entry`),
# which holds only where the complement is the int8 -g - 1: every grid magnitude at most 127.
_MAGS = GRID_IQ3_S.view(np.uint8)
if _MAGS.max() > 127:
    raise ValueError("IQ3_S grid magnitudes past 127: the 8-bit sign trick needs them in int8")
SPREAD = 0x10204080  # sign bit j (of 4) times this lands on bit 8j + 7, nothing else there


def _iq3_s_x8_dot(copies: int):
    """IQ3_S's 8-bit dot for a staged grid of `copies` interleaved copies (1: the grid as it is;
    else entry e of copy c at e * copies + c, lane l reading copy l % copies: see
    GRID_COPIES)."""
    stride = 4 * copies  # bytes from one entry to the next in a lane's copy

    @cuda.jit(device=True, inline="always")
    def entry(q, nb, sel, nib, tab, xw, acc, neg, at):
        """(acc, neg) + the grid entry of the row prmt(q, nb, sel) (index byte and ninth bit),
        signed by the 4 bits of nib, dotted with the x word xw: a negated byte is stored as
        its complement (-g - 1), and neg gathers the -1 a negated value owes (dp4a of the
        0x00/0xFF mask), so acc - neg is the signed dot. at: the lane's copy's byte offset."""
        if copies == 1:  # compile time
            grid = ld_u32_at(tab, 4 * prmt(q, nb, sel))
        else:
            grid = ld_u32_at(tab, stride * prmt(q, nb, sel) + at)
        # each byte's sign, replicated. Masks from eight shifted sign words (a permute
        # gathering byte c of two of them for two entries, 23 instructions a sub-block against
        # 30) were 1-4% slower in the one-pair kernels and lengthened the rounds' loop
        # (2026-12-07_iq3s_one_pair_copies_words_tried_h100.json; removed)
        mask = prmt(nib * SPREAD, 0, 0xBA98)
        return dp4a(grid ^ mask, xw, acc), dp4a(mask, xw, neg)

    @cuda.jit(device=True, inline="always")
    def sub(qa, qb, qh, signs, tab, xs, p, at):
        """Integer dot of one 32-value sub-block: grid indices in qa (entries 0..3) and qb
        (4..7), their ninth bits in qh's bits 0..7."""
        a0, a1, a2, a3 = ld_w4(xs, p)
        b0, b1, b2, b3 = ld_w4(xs, p + 4)
        na = ninth_bits(qh)
        nb = ninth_bits(qh >> 4)
        s, n = entry(qa, na, ROW_SEL[0], signs & 0xF, tab, a0, 0, 0, at)
        s, n = entry(qa, na, ROW_SEL[1], (signs >> 4) & 0xF, tab, a1, s, n, at)
        s, n = entry(qa, na, ROW_SEL[2], (signs >> 8) & 0xF, tab, a2, s, n, at)
        s, n = entry(qa, na, ROW_SEL[3], (signs >> 12) & 0xF, tab, a3, s, n, at)
        s, n = entry(qb, nb, ROW_SEL[0], (signs >> 16) & 0xF, tab, b0, s, n, at)
        s, n = entry(qb, nb, ROW_SEL[1], (signs >> 20) & 0xF, tab, b1, s, n, at)
        s, n = entry(qb, nb, ROW_SEL[2], (signs >> 24) & 0xF, tab, b2, s, n, at)
        s, n = entry(qb, nb, ROW_SEL[3], signs >> 28, tab, b3, s, n, at)
        return np.int32(s - n)  # numba widens int32 arithmetic to int64: this keeps it 32-bit

    @cuda.jit(device=True, inline="always")
    def dot(v, part, xs, xo, so, tab):
        p = xo + 20 * part
        qh = v[6]
        sc = v[7]
        # through a permute LLVM cannot see into: knowing at < 64 it would turn the address
        # add into an or, which ptxas makes two instructions (shift, or), not one (LEA); 5-6%
        # faster on an H100 (2026-12-07_iq3s_copies_address_h100.json)
        at = prmt(4 * (cuda.threadIdx.x & (copies - 1)), 0, 0x3210)
        sa = sub(v[0], v[1], qh & 0xFF, v[4], tab, xs, p, at)
        sb = sub(v[2], v[3], qh >> 8, v[5], tab, xs, p + 8, at)
        d_a, d_b, _, _ = ld_w4(xs, so + 4 * part)
        return h2f(v[8]) * (small_f32(1 + 2 * (sc & 0xF)) * u2f(d_a) * np.float32(sa)
                            + small_f32(1 + 2 * (sc >> 4)) * u2f(d_b) * np.float32(sb))
    return dot


dot_iq3_s_x8 = _iq3_s_x8_dot(1)


# ---- Q6_K ----

HB = 0x30303030      # a code's two high bits, in place
NEG32 = 0xE0E0E0E0   # int8 -32 in every byte: dp4a(NEG32, x) = -32 * (sum of x's 4 values)


def q6_k_x8_loader(fields, ld16, ld8):
    """load(w, off, part) of the 4-lane slices (`planar`: `span4`/`span2` at GGUF's even
    offsets, vector loads at the planar layout's aligned ones)."""
    @cuda.jit(device=True, inline="always")
    def load(w, off, part):
        ql, qh, sc, d = fields(off)
        n = part >> 1
        h = part & 1
        a0, a1, a2, a3 = ld16(w, ql + 64 * n + 16 * h)
        b0, b1, b2, b3 = ld16(w, ql + 64 * n + 32 + 16 * h)
        c0, c1, c2, c3 = ld16(w, qh + 32 * n + 16 * h)
        s0, s1 = ld8(w, sc + 8 * n)                # sc[8n .. 8n + 7]; shifted to put sc[8n + h]
        sh = 8 * h                                 # and sc[8n + h + 4] in bytes 0 (chunks 0, 2)
        return (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,   # and 2 (chunks 1, 3)
                s0 >> sh, s1 >> sh, ld_u16(w, d))
    return load


load_q6_k_x8 = q6_k_x8_loader(q6_k_fields, span4, span2)
load_q6_k_x8_p8 = q6_k_x8_loader(q6_k_p8_fields, ld_nc_u32x4, ld_nc_u32x2)


@cuda.jit(device=True, inline="always")
def _q6_chunk(q0, q1, q2, q3, xs, p):
    """Integer dot of one 16-value chunk, codes q0..q3 (0..63 a byte), minus 32 times the sum of
    x, with x words p .. p + 3. The bias is its own chain, started from zero and fed into the
    codes' chain: it depends on x alone, so the two rows of a pair (`lanes.pair_step`, both
    inlined) share it once ptxas sees the same chain twice (12 dp4a fewer a rounds step, 60 ->
    48; integer sums, so the same result; no change in time on the H100,
    `2026-12-05_q6k_bias_chain_ab_h100.json`: these loops wait on loads, not on issue)."""
    x0, x1, x2, x3 = ld_w4(xs, p)
    b = dp4a(NEG32, x3, dp4a(NEG32, x2, dp4a(NEG32, x1, dp4a(NEG32, x0, 0))))
    return dp4a(q3, x3, dp4a(q2, x2, dp4a(q1, x1, dp4a(q0, x0, b))))


@cuda.jit(device=True, inline="always")
def dot_q6_k_x8(v, part, xs, xo, so, tab):
    n = part >> 1
    p = xo + 40 * n + 4 * (part & 1)               # x8_word(128n + 16h); chunks at + 0, 8, 20, 28
    h0, h1, h2, h3 = v[8], v[9], v[10], v[11]
    s0 = _q6_chunk((v[0] & NIB) | ((h0 << 4) & HB), (v[1] & NIB) | ((h1 << 4) & HB),
                   (v[2] & NIB) | ((h2 << 4) & HB), (v[3] & NIB) | ((h3 << 4) & HB), xs, p)
    s1 = _q6_chunk((v[4] & NIB) | ((h0 << 2) & HB), (v[5] & NIB) | ((h1 << 2) & HB),
                   (v[6] & NIB) | ((h2 << 2) & HB), (v[7] & NIB) | ((h3 << 2) & HB), xs, p + 8)
    s2 = _q6_chunk(((v[0] >> 4) & NIB) | (h0 & HB), ((v[1] >> 4) & NIB) | (h1 & HB),
                   ((v[2] >> 4) & NIB) | (h2 & HB), ((v[3] >> 4) & NIB) | (h3 & HB), xs, p + 20)
    s3 = _q6_chunk(((v[4] >> 4) & NIB) | ((h0 >> 2) & HB), ((v[5] >> 4) & NIB) | ((h1 >> 2) & HB),
                   ((v[6] >> 4) & NIB) | ((h2 >> 2) & HB), ((v[7] >> 4) & NIB) | ((h3 >> 2) & HB),
                   xs, p + 28)
    d0, d1, _, _ = ld_w4(xs, so + 8 * n)           # dx of the x groups 4n, 4n + 1
    d2, d3, _, _ = ld_w4(xs, so + 8 * n + 4)       # 4n + 2, 4n + 3
    sa = v[12]
    sb = v[13]
    return h2f(v[14]) * (i8_f32(sa & 0xFF) * u2f(d0) * np.float32(s0)
                         + i8_f32((sa >> 16) & 0xFF) * u2f(d1) * np.float32(s1)
                         + i8_f32(sb & 0xFF) * u2f(d2) * np.float32(s2)
                         + i8_f32((sb >> 16) & 0xFF) * u2f(d3) * np.float32(s3))


def _x8(t: int, dot, **slice_) -> tuple[int, LaneFormat]:
    return int(t), replace(lane_format(t), dot=dot, x8=True, **slice_)


# The formats with an 8-bit decoding: the float32 one's loads and slices unless given here.
# Their tables stay the float32 format's: `launch.device_table` keeps one per format.
X8_FORMATS: dict[int, LaneFormat] = dict([
    _x8(T.Q4_K, dot_q4_k_x8),
    _x8(T.IQ4_XS, dot_iq4_xs_x8, lanes=4, load=load_iq4_xs_x8),
    _x8(T.IQ3_S, dot_iq3_s_x8),
    _x8(T.Q6_K, dot_q6_k_x8, lanes=4, load=load_q6_k_x8),
    _x8(Q6_K_P8.ggml_type, dot_q6_k_x8, lanes=4, load=load_q6_k_x8_p8),  # `strata.quant.planar`
])


# Decoders the one-token rounds matvecs (`matvec.lane_body` with rounds) take instead of the
# format's: IQ4_XS's level words as immediates are rematerialised by ptxas before each of the 64
# byte permutes that read them a step (SASS of the rounds loop 786 instructions; 734 with them
# loaded, at 126 registers against 96). On the H200 (2026-12-05, best of two): 8192x8192 18.04
# against 19.18 us, the 151,936-row head 70.5 against 73.7; the one-pair kernels (96 registers
# against 80) were 0.4-1.2% slower with them, the fused MoE 17.67 against 17.42 us, so those
# keep the immediates (one run; `2026-12-05_iq4xs_level_words_h200.json`).
ROUNDS_DOTS = {int(T.IQ4_XS): dot_iq4_xs_x8_loaded}


def rounds_decoding(lf: LaneFormat, copies: int = 1) -> LaneFormat:
    """lf with the decoder its rounds matvec kernels take (ROUNDS_DOTS: 8-bit formats only);
    copies > 1: the one reading its table staged in that many copies (GRID_COPIES)."""
    if copies > 1:
        if lf.ggml_type not in GRID_COPIES or not lf.x8:
            raise ValueError(f"{lf.name}: no decoder reads its table in {copies} copies")
        return replace(lf, dot=_COPIES_DOTS[lf.ggml_type](copies))
    dot = ROUNDS_DOTS.get(lf.ggml_type) if lf.x8 else None
    return lf if dot is None else replace(lf, dot=dot)


# IQ3_S's grid (512 words) in a rounds matvec's shared memory as 16 copies, entry e of copy c
# at word 16e + c, lane l reading copy l % 16: a lookup's bank is 16 (e & 1) + l % 16, so only
# lanes l and l + 16 can meet in a bank (two wavefronts a warp's lookup at most), where one copy
# takes 3-4 for 32 random entries. Tried because its rounds loops did not wait on their
# instruction count (a signed 32 KiB table took 145 of 543 instructions out and was no faster,
# 2026-12-05), so the lookups looked like the bound. 32 copies (none meet) would take 64 KiB,
# past a block's 48 KiB. Rounds matvecs on 8-bit x only (the MoE and the one-pair kernels keep
# the 2 KiB grid), where the copies and x fit (`grid_copies`). On an H100 the head's
# shared-memory wavefronts fell 34% (9.64 M -> 6.38 M) and its time 2% (79.3 against 81.0 us;
# 8192x8192 20.8 against 21.2; the rest equal; `2026-12-05_iq3s_grid_copies_h100.json`): the
# lookups' conflicts are not what bounds it either. Read at launch, so a benchmark can compare
# both.
# The one-pair kernels on the copies (their lookups come after a step's weights, every warp
# of the SM at once, so a shared-memory bound looked likelier there) were 1.5-3.5% slower at
# every shape on an H100 (2026-12-07_iq3s_one_pair_copies_words_tried_h100.json; removed).
GRID_COPIES = {int(T.IQ3_S): 16}
_COPIES_DOTS = {int(T.IQ3_S): _iq3_s_x8_dot}
COPY_GRIDS = True
# a lane finds its copy by a mask and the stager rotates by one: powers of two up to a warp
if any(c & (c - 1) or not 1 < c <= 32 for c in GRID_COPIES.values()):
    raise ValueError(f"GRID_COPIES: copies must be powers of two from 2 to 32, got {GRID_COPIES}")


def grid_copies(lf: LaneFormat, n_cols: int, room: int) -> int:
    """Copies of lf's table its rounds matvec stages for rows of n_cols (1: the table once),
    given `room` bytes of shared memory a block for x and the tables."""
    copies = GRID_COPIES.get(lf.ggml_type, 1) if (COPY_GRIDS and lf.x8) else 1
    if copies > 1 and lf.stage_bytes(n_cols) + copies * lf.table.nbytes > room:
        return 1
    return copies


@cuda.jit(device=True, inline="always")
def stage_table_copies(tab, tab_s, n, copies):
    """The block stages tab[:n] in shared memory `copies` times, interleaved (entry e of copy
    c at tab_s[e * copies + c]). Each thread writes its entries' copies in an order rotated by
    its lane, so a warp's 32 stores fall in 32 banks (for 16 copies and consecutive entries)."""
    lane = cuda.threadIdx.x & 31
    rot = lane + (lane >> 4)
    e = cuda.threadIdx.x
    while e < n:
        v = tab[e]
        for j in range(copies):
            tab_s[e * copies + ((j + rot) & (copies - 1))] = v
        e += cuda.blockDim.x


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
