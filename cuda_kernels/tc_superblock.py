"""The K-quant super-block routines of the tensor-core small-batch kernels (`batch_tc`,
`batch_moe_tc`), each split into a load part and a math part so a kernel can issue the next
super-block's weight loads before this one's math (or two row tiles' loads before either's math).

* `load(w, off_a, off_b, lane)`: every weight word this lane needs of one 16-row tile's
  super-block (rows a, b at byte offsets off_a, off_b): "tile words", a tuple in registers.
* `math1(words, x, xb, lane, acc)`: that tile against x[xb .. xb + 255] (this lane's token),
  added to the 4 accumulators `acc` (rows a, b at tokens 2t, 2t + 1: the m16n8k16 C fragment).
* `math2(words0, words1, x, xb, lane, acc)`: two tiles against the same x, `acc` their 8
  accumulators (tile 0's four, then tile 1's): the x loads, the hi/lo split of x into f16 B
  fragments and the min term's x sums are done once for both tiles.
Every lane of the warp must call them together (shuffles, MMAs).

Exactness: quantized values are small integers, exact in f16 (A); each 16-value chunk shares one
scale, applied to the chunk's f32 accumulator after the MMA. x is split into two f16 parts
(hi = f16(x), lo = f16(x - hi)) and both are multiplied (two MMAs): products are exact in the f32
accumulators, so a token's result matches a float32 dot product to about 2^-22 relative error.
Columns of an MMA never mix, so a token's result does not depend on the other tokens. A tile
gets the same arithmetic in the same order from math1 and math2.

Fragment use (m16n8k16, see `mma`): lane (g = lane >> 2, t = lane & 3) holds rows g and g + 8 of
a 16-row tile (row a, row b) and token g's x; its accumulators are rows g, g + 8 at tokens 2t,
2t + 1. The k order inside a chunk is free as long as A and B agree: each lane takes 4 values
whose bytes it holds as one word, bytes (0, 2) as logical k (2t, 2t + 1) and bytes (1, 3) as
(2t + 8, 2t + 9), and reads x at the same 4 positions.
  Q4_K (144-byte super-blocks, 8 sub-blocks of 32 with a 6-bit scale and min): for qs bytes
       32p .. 32p + 31 (sub-blocks 2p in the low nibbles, 2p + 1 in the high ones), lane t takes
       bytes 32p + 8t .. + 7: two chunks per sub-block. The min term, dmin * m * sum x, uses the
       sub-block's x sum per token (quad sums, then two shuffles to the accumulator's tokens).
  Q6_K (210-byte super-blocks, 16 sub-blocks of 16 with an int8 scale): chunk (n, j, s) is the
       values 128n + 32j + 16s + l, l < 16 (one sub-block); lane t takes l = 4t .. 4t + 3 from
       ql and qh (words at 2-byte alignment, assembled from aligned ones: see the Q6_K section).
math1 reads x just before its math (a Q4_K pair's 16 values, a Q6_K chunk's 4): registers go
to the weight words in flight (ptxas still hoists the x loads where registers remain); math2
reads Q4_K x a pair ahead (two tiles, 104 registers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from .intrinsics import SIMULATED, h2f, ld_nc_u32x2, ld_nc_u32x4, ld_u16, ld_u32_any, ld_x4
from .lanes_k import _k4_scales, i8_f32, small_f32
from .mma import h2_sub, half2_hi, half2_lo, mma_16816, pack_half2, shfl_idx, shfl_xor

SB_VALUES = 256
F0 = np.float32(0.0)
H1024 = 0x64006400      # f16 pair (1024, 1024): OR-ing a small integer q into its mantissa
H1056 = 0x64206420      # gives 1024 + q exactly; (1056, 1056) takes Q6_K's offset 32 off too
LO_NIB = 0x000F000F     # bytes 0 and 2 of a word: a pair's halves after OR-ing into H1024
LO_2BIT = 0x00030003


@cuda.jit(device=True, inline="always")
def split_x(x0, x1):
    """(hi, lo) f16 pairs of two f32: hi = f16(x), lo = f16(x - hi); hi + lo holds x to ~22 bits."""
    hi = pack_half2(x0, x1)
    return hi, pack_half2(x0 - half2_lo(hi), x1 - half2_hi(hi))


@cuda.jit(device=True, inline="always")
def x_frag(x0, x1, x2, x3):
    """The B fragments of a chunk whose x (this lane's token) is x0..x3 at bytes 0..3: (hi of k
    2t..2t+1, hi of k 2t+8..2t+9, lo of the same two)."""
    h0, l0 = split_x(x0, x2)
    h1, l1 = split_x(x1, x3)
    return h0, h1, l0, l1


@cuda.jit(device=True, inline="always")
def mma_x(a, b, c0, c1, c2, c3):
    """C + A @ B for a chunk: A fragment a (4 words), B its `x_frag` b: x's f16 high part, then
    its low part."""
    a0, a1, a2, a3 = a
    h0, h1, l0, l1 = b
    c0, c1, c2, c3 = mma_16816(a0, a1, a2, a3, h0, h1, c0, c1, c2, c3)
    return mma_16816(a0, a1, a2, a3, l0, l1, c0, c1, c2, c3)


@cuda.jit(device=True, inline="always")
def nib_pair(w, sh):
    """The 4-bit values at bit sh of bytes 0 and 2 of w as an f16 pair."""
    return h2_sub(((w >> sh) & LO_NIB) | H1024, H1024)


@cuda.jit(device=True, inline="always")
def token_pair_sums(s, t):
    """This lane's x sum `s` summed over its quad (one token's whole sub-block), then the sums of
    tokens 2t and 2t + 1 (quads 2t, 2t + 1), the tokens of this lane's accumulators."""
    s += shfl_xor(s, 1)
    s += shfl_xor(s, 2)
    return shfl_idx(s, 8 * t), shfl_idx(s, 8 * t + 4)


if SIMULATED:
    def shfl_u32(w, src):
        """The u32 word w of lane src."""
        return shfl_idx(w, src)
else:
    @cuda.jit(device=True, inline="always")
    def shfl_u32(w, src):
        """The u32 word w of lane src (numba's shfl_sync takes signed words only)."""
        return np.uint32(shfl_idx(np.int32(w), src))


@cuda.jit(device=True, inline="always")
def ld_x8(x, i):
    """x[i .. i + 7] (i a multiple of 4) as 8 float32."""
    a0, a1, a2, a3 = ld_x4(x, i)
    a4, a5, a6, a7 = ld_x4(x, i + 4)
    return a0, a1, a2, a3, a4, a5, a6, a7


# ---- Q4_K ----
# The math follows the one-tile kernel's first order (ptxas: 72 registers): per sub-block, a
# chunk's B fragments just before its MMAs, the x sums' shuffles after them; computing both
# chunks' fragments and the sums first took 99.

@cuda.jit(device=True, inline="always")
def q4k_load(w, off_a, off_b, lane):
    """Tile words of rows a, b: headers (4 words each) and this lane's qs bytes of the 4 pairs
    (two words each)."""
    ha = ld_nc_u32x4(w, off_a)
    hb = ld_nc_u32x4(w, off_b)
    q = off_a + 16 + 8 * (lane & 3)
    qa = (ld_nc_u32x2(w, q), ld_nc_u32x2(w, q + 32), ld_nc_u32x2(w, q + 64),
          ld_nc_u32x2(w, q + 96))
    q = off_b + 16 + 8 * (lane & 3)
    qb = (ld_nc_u32x2(w, q), ld_nc_u32x2(w, q + 32), ld_nc_u32x2(w, q + 64),
          ld_nc_u32x2(w, q + 96))
    return ha, hb, qa, qb


@cuda.jit(device=True, inline="always")
def _q4k_qs(words, p):
    """Pair p's qs words of rows a, b (two each). A run-time index (p & 3): a literal one types
    through an overload that numba-cuda compiles for the current device, which the PTX check
    (no GPU) does not have."""
    _, _, qa, qb = words
    return qa[p & 3], qb[p & 3]


@cuda.jit(device=True, inline="always")
def _nib_a(wa, wb, sh):
    """The A fragment of a chunk whose rows a, b hold the nibbles at bit sh of words wa, wb."""
    return nib_pair(wa, sh), nib_pair(wb, sh), nib_pair(wa, sh + 8), nib_pair(wb, sh + 8)


@cuda.jit(device=True, inline="always")
def _q4k_chunks(words, p, sh, xv, c):
    """C + both chunks of sub-block 2p (sh 0) or 2p + 1 (sh 4) of one tile; xv: this lane's 8
    x values."""
    (wa0, wa1), (wb0, wb1) = _q4k_qs(words, p)
    x0, x1, x2, x3, y0, y1, y2, y3 = xv
    c0, c1, c2, c3 = c
    c0, c1, c2, c3 = mma_x(_nib_a(wa0, wb0, sh), x_frag(x0, x1, x2, x3), c0, c1, c2, c3)
    return mma_x(_nib_a(wa1, wb1, sh), x_frag(y0, y1, y2, y3), c0, c1, c2, c3)


@cuda.jit(device=True, inline="always")
def _xsums(xv, t):
    """The token pair sums (`token_pair_sums`) of a sub-block's x."""
    x0, x1, x2, x3, y0, y1, y2, y3 = xv
    return token_pair_sums(((x0 + x1) + (x2 + x3)) + ((y0 + y1) + (y2 + y3)), t)


@cuda.jit(device=True, inline="always")
def _q4k_scale(words, p, sh, c, s0, s1, acc):
    """acc + a sub-block's scaled products c minus its min term (x sums s0, s1)."""
    ha, hb, _, _ = words
    sca, mna = _k4_scales(ha[1], ha[2], ha[3], p)
    scb, mnb = _k4_scales(hb[1], hb[2], hb[3], p)
    k = 2 * sh    # the sub-block's 8-bit fields: the low ones (sh 0) or the high ones
    dsa = h2f(ha[0] & 0xFFFF) * small_f32((sca >> k) & 0xFF)
    dma = h2f(ha[0] >> 16) * small_f32((mna >> k) & 0xFF)
    dsb = h2f(hb[0] & 0xFFFF) * small_f32((scb >> k) & 0xFF)
    dmb = h2f(hb[0] >> 16) * small_f32((mnb >> k) & 0xFF)
    c0, c1, c2, c3 = c
    a0, a1, a2, a3 = acc
    return (a0 + (dsa * c0 - dma * s0), a1 + (dsa * c1 - dma * s1),
            a2 + (dsb * c2 - dmb * s0), a3 + (dsb * c3 - dmb * s1))


@cuda.jit(device=True, inline="always")
def _q4k_sub1(words, p, sh, xv, t, acc):
    c = _q4k_chunks(words, p, sh, xv, (F0, F0, F0, F0))
    s0, s1 = _xsums(xv, t)
    return _q4k_scale(words, p, sh, c, s0, s1, acc)


@cuda.jit(device=True, inline="always")
def _q4k_sub2(words0, words1, p, sh, xv, t, acc):
    """`_q4k_sub1` of two tiles, x split and summed once (each chunk's B fragment is used by
    both tiles' MMAs before the next is made)."""
    (wa0, wa1), (wb0, wb1) = _q4k_qs(words0, p)
    (va0, va1), (vb0, vb1) = _q4k_qs(words1, p)
    x0, x1, x2, x3, y0, y1, y2, y3 = xv
    b = x_frag(x0, x1, x2, x3)
    c0, c1, c2, c3 = mma_x(_nib_a(wa0, wb0, sh), b, F0, F0, F0, F0)
    d0, d1, d2, d3 = mma_x(_nib_a(va0, vb0, sh), b, F0, F0, F0, F0)
    b = x_frag(y0, y1, y2, y3)
    c = mma_x(_nib_a(wa1, wb1, sh), b, c0, c1, c2, c3)
    d = mma_x(_nib_a(va1, vb1, sh), b, d0, d1, d2, d3)
    s0, s1 = _xsums(xv, t)
    a0, a1, a2, a3, a4, a5, a6, a7 = acc
    a0, a1, a2, a3 = _q4k_scale(words0, p, sh, c, s0, s1, (a0, a1, a2, a3))
    a4, a5, a6, a7 = _q4k_scale(words1, p, sh, d, s0, s1, (a4, a5, a6, a7))
    return a0, a1, a2, a3, a4, a5, a6, a7


@cuda.jit(device=True, inline="always")
def _q4k_xpair(x, i):
    """x of pair p at i = xb + 8t + 64p: its low and high sub-block's 8 values."""
    return ld_x8(x, i), ld_x8(x, i + 32)


@cuda.jit(device=True, inline="always")
def _q4k_pair1(words, p, xp, t, acc):
    acc = _q4k_sub1(words, p, 0, xp[0], t, acc)
    return _q4k_sub1(words, p, 4, xp[1], t, acc)


@cuda.jit(device=True, inline="always")
def q4k_math1(words, x, xb, lane, acc):
    """One tile's super-block against x[xb .. xb + 255] (a pair's x just before its math: the
    pipelined MoE kernels hold the next unit's words too, and loading x a pair ahead took
    gate_up past 128 registers; ptxas still hoists the loads where registers allow)."""
    t = lane & 3
    xi = xb + 8 * t
    acc = _q4k_pair1(words, 0, _q4k_xpair(x, xi), t, acc)
    acc = _q4k_pair1(words, 1, _q4k_xpair(x, xi + 64), t, acc)
    acc = _q4k_pair1(words, 2, _q4k_xpair(x, xi + 128), t, acc)
    return _q4k_pair1(words, 3, _q4k_xpair(x, xi + 192), t, acc)


@cuda.jit(device=True, inline="always")
def _q4k_pair2(words0, words1, p, xp, t, acc):
    acc = _q4k_sub2(words0, words1, p, 0, xp[0], t, acc)
    return _q4k_sub2(words0, words1, p, 4, xp[1], t, acc)


@cuda.jit(device=True, inline="always")
def q4k_math2(words0, words1, x, xb, lane, acc):
    """Two tiles' super-blocks against the same x[xb .. xb + 255]."""
    t = lane & 3
    xi = xb + 8 * t
    x0, x1 = _q4k_xpair(x, xi), _q4k_xpair(x, xi + 64)
    acc = _q4k_pair2(words0, words1, 0, x0, t, acc)
    x2 = _q4k_xpair(x, xi + 128)
    acc = _q4k_pair2(words0, words1, 1, x1, t, acc)
    x3 = _q4k_xpair(x, xi + 192)
    acc = _q4k_pair2(words0, words1, 2, x2, t, acc)
    return _q4k_pair2(words0, words1, 3, x3, t, acc)


# ---- Q6_K ----
# A 210-byte super-block starts at any even offset: its words are read at 2-byte alignment
# (`ld_u32_any`: two aligned loads funnel-shifted). Lane t of a quad holds its rows' 8 ql and
# 4 qh words, d and only scale word t: a group (n, s) of chunks takes the two scale words it
# needs from the quad's lanes 2n, 2n + 1 (shuffles). Every lane holding all 4 took two tiles
# to 136 registers (ptxas 13.0), past the 128 of two 256-thread blocks an SM; x is read a chunk
# at a time for the same reason.

@cuda.jit(device=True, inline="always")
def _q6_row(w, off, t):
    """One row's words of one lane: ql at 16m + 4t (m < 8), qh at 128 + 16m + 4t (m < 4),
    int8 scales 4t .. 4t + 3 (one word) and d."""
    ql = (ld_u32_any(w, off + 4 * t), ld_u32_any(w, off + 16 + 4 * t),
          ld_u32_any(w, off + 32 + 4 * t), ld_u32_any(w, off + 48 + 4 * t),
          ld_u32_any(w, off + 64 + 4 * t), ld_u32_any(w, off + 80 + 4 * t),
          ld_u32_any(w, off + 96 + 4 * t), ld_u32_any(w, off + 112 + 4 * t))
    qh = (ld_u32_any(w, off + 128 + 4 * t), ld_u32_any(w, off + 144 + 4 * t),
          ld_u32_any(w, off + 160 + 4 * t), ld_u32_any(w, off + 176 + 4 * t))
    return ql, qh, ld_u32_any(w, off + 192 + 4 * t), h2f(ld_u16(w, off + 208))


@cuda.jit(device=True, inline="always")
def q6k_load(w, off_a, off_b, lane):
    """Tile words of rows a, b (2-byte aligned offsets)."""
    t = lane & 3
    return _q6_row(w, off_a, t), _q6_row(w, off_b, t)


@cuda.jit(device=True, inline="always")
def q6_pair(ql, qh, j):
    """Chunk j's 6-bit values of bytes 0 and 2 (ql nibble j >> 1, qh bits 2j) minus 32, f16."""
    v = ((ql >> (4 * (j >> 1))) & LO_NIB) | (((qh >> (2 * j)) & LO_2BIT) << 4)
    return h2_sub(v | H1024, H1056)


@cuda.jit(device=True, inline="always")
def _q6_scale_words(row, n, lane):
    """Scale words 2n, 2n + 1 of a row (scales 8n .. 8n + 7: group (n, s)'s), from the quad."""
    q = lane & ~3
    sc = row[2]
    return shfl_u32(sc, q | (2 * n)), shfl_u32(sc, q | (2 * n + 1))


@cuda.jit(device=True, inline="always")
def _q6_chunk(n, s, j, words, sw, b, acc):
    """Chunk (n, j, s) of one tile against its x fragment b; sw: the rows' `_q6_scale_words`."""
    ra, rb = words
    qla, qha, _, da = ra
    qlb, qhb, _, db = rb
    m = 4 * n + 2 * (j & 1) + s     # the ql word; qh: 2n + s
    la, lb = qla[m], qlb[m]
    ha, hb = qha[2 * n + s], qhb[2 * n + s]
    c0, c1, c2, c3 = mma_x((q6_pair(la, ha, j), q6_pair(lb, hb, j), q6_pair(la >> 8, ha >> 8, j),
                            q6_pair(lb >> 8, hb >> 8, j)), b, F0, F0, F0, F0)
    sa, sb = sw
    k = 8 * ((2 * j + s) & 3)       # scale 8n + 2j + s: word 2n + (j >> 1) of the row
    fa = da * i8_f32(((sa[1] if j >= 2 else sa[0]) >> k) & 0xFF)
    fb = db * i8_f32(((sb[1] if j >= 2 else sb[0]) >> k) & 0xFF)
    a0, a1, a2, a3 = acc
    return a0 + fa * c0, a1 + fa * c1, a2 + fb * c2, a3 + fb * c3


@cuda.jit(device=True, inline="always")
def _x_frag_at(x, i):
    """The `x_frag` of this lane's x[i .. i + 3]."""
    x0, x1, x2, x3 = ld_x4(x, i)
    return x_frag(x0, x1, x2, x3)


@cuda.jit(device=True, inline="always")
def _q6_group1(n, s, words, x, i, lane, acc):
    """The 4 chunks (j) of group (n, s) of one tile, x at i + 32j."""
    sw = (_q6_scale_words(words[0], n, lane), _q6_scale_words(words[1], n, lane))
    acc = _q6_chunk(n, s, 0, words, sw, _x_frag_at(x, i), acc)
    acc = _q6_chunk(n, s, 1, words, sw, _x_frag_at(x, i + 32), acc)
    acc = _q6_chunk(n, s, 2, words, sw, _x_frag_at(x, i + 64), acc)
    return _q6_chunk(n, s, 3, words, sw, _x_frag_at(x, i + 96), acc)


@cuda.jit(device=True, inline="always")
def q6k_math1(words, x, xb, lane, acc):
    """One tile's super-block against x[xb .. xb + 255]: chunk (n, j, s) reads x at 128n + 32j
    + 16s + 4t."""
    xi = xb + 4 * (lane & 3)
    acc = _q6_group1(0, 0, words, x, xi, lane, acc)
    acc = _q6_group1(0, 1, words, x, xi + 16, lane, acc)
    acc = _q6_group1(1, 0, words, x, xi + 128, lane, acc)
    return _q6_group1(1, 1, words, x, xi + 144, lane, acc)


@cuda.jit(device=True, inline="always")
def _q6_chunk2(n, s, j, words0, words1, sw0, sw1, b, acc):
    """Chunk (n, j, s) of two tiles against one x fragment b."""
    a0, a1, a2, a3, a4, a5, a6, a7 = acc
    a0, a1, a2, a3 = _q6_chunk(n, s, j, words0, sw0, b, (a0, a1, a2, a3))
    a4, a5, a6, a7 = _q6_chunk(n, s, j, words1, sw1, b, (a4, a5, a6, a7))
    return a0, a1, a2, a3, a4, a5, a6, a7


@cuda.jit(device=True, inline="always")
def _q6_group2(n, s, words0, words1, x, i, lane, acc):
    """The 4 chunks (j) of group (n, s) of two tiles sharing x (at i + 32j)."""
    sw0 = (_q6_scale_words(words0[0], n, lane), _q6_scale_words(words0[1], n, lane))
    sw1 = (_q6_scale_words(words1[0], n, lane), _q6_scale_words(words1[1], n, lane))
    acc = _q6_chunk2(n, s, 0, words0, words1, sw0, sw1, _x_frag_at(x, i), acc)
    acc = _q6_chunk2(n, s, 1, words0, words1, sw0, sw1, _x_frag_at(x, i + 32), acc)
    acc = _q6_chunk2(n, s, 2, words0, words1, sw0, sw1, _x_frag_at(x, i + 64), acc)
    return _q6_chunk2(n, s, 3, words0, words1, sw0, sw1, _x_frag_at(x, i + 96), acc)


@cuda.jit(device=True, inline="always")
def q6k_math2(words0, words1, x, xb, lane, acc):
    """Two tiles' super-blocks against the same x[xb .. xb + 255]."""
    xi = xb + 4 * (lane & 3)
    acc = _q6_group2(0, 0, words0, words1, x, xi, lane, acc)
    acc = _q6_group2(0, 1, words0, words1, x, xi + 16, lane, acc)
    acc = _q6_group2(1, 0, words0, words1, x, xi + 128, lane, acc)
    return _q6_group2(1, 1, words0, words1, x, xi + 144, lane, acc)


@cuda.jit(device=True, inline="always")
def put4(red, i, acc):
    """red[i .. i + 3] = the 4 accumulators acc (a kernel's partial sums in shared memory)."""
    a0, a1, a2, a3 = acc
    red[i] = a0
    red[i + 1] = a1
    red[i + 2] = a2
    red[i + 3] = a3


@dataclass(frozen=True, slots=True)
class TcFormat:
    """A format's super-block routines (module doc) and its super-block size. Kernels capture
    the functions themselves, never this object (a kernel's key hashes what it captures)."""

    name: str
    sb_bytes: int
    load: Any
    math1: Any
    math2: Any

    def __post_init__(self):
        if self.sb_bytes <= 0:
            raise ValueError(f"{self.name}: sb_bytes {self.sb_bytes} must be positive")


TC_FORMATS = {
    "Q4_K": TcFormat("Q4_K", 144, q4k_load, q4k_math1, q4k_math2),
    "Q6_K": TcFormat("Q6_K", 210, q6k_load, q6k_math1, q6k_math2),
}
