"""Small-batch (2..8 tokens) matrix-vector products on the tensor cores, for the K-quant formats
of the usual mixes (Q4_K, Q6_K): y[t] = W x[t] with each weight dequantized once for the whole
batch.

Why: the lane kernels (`lanes_batch`) decode every weight again for each token and re-read x
from shared memory per token; at 8 tokens the dense matvecs of a batched step were compute bound
at 5-20% of the read bandwidth. Here a warp's `mma.m16n8k16` multiplies 16 weight rows (A, f16)
by the 8 tokens' x (B, one column per token), so a weight costs about one f16 operation however
many tokens share it, and the kernel is bound by the weight reads again.

Exactness: quantized values are small integers, exact in f16 (A); each 16-value chunk shares one
scale, applied to the chunk's f32 accumulator after the MMA. x is split into two f16 parts
(hi = f16(x), lo = f16(x - hi)) and both are multiplied (two MMAs): products are exact in the f32
accumulators, so a token's result matches a float32 dot product to about 2^-22 relative error
(not bit for bit: the one-token lane kernels sum in another order). Columns of an MMA never mix,
so a token's result does not depend on the other tokens of the batch (batch invariant).

Fragment use (m16n8k16, see `mma`): lane (g = lane >> 2, t = lane & 3) holds rows g and g + 8 of
a 16-row tile (row a, row b) and token g's x; its accumulators are rows g, g + 8 at tokens 2t,
2t + 1. The k order inside a chunk is free as long as A and B agree: each lane takes 4 values
whose bytes it loads as one word, bytes (0, 2) as logical k (2t, 2t + 1) and bytes (1, 3) as
(2t + 8, 2t + 9), and reads x at the same 4 positions.
  Q4_K (144-byte super-blocks, 8 sub-blocks of 32 with a 6-bit scale and min): for qs bytes
       32p .. 32p + 31 (sub-blocks 2p in the low nibbles, 2p + 1 in the high ones), lane t takes
       bytes 32p + 8t .. + 7: two chunks per sub-block. The min term, dmin * m * sum x, uses the
       sub-block's x sum per token (quad sums, then two shuffles to the accumulator's tokens).
  Q6_K (210-byte super-blocks, 16 sub-blocks of 16 with an int8 scale): chunk (n, j, s) is the
       values 128n + 32j + 16s + l, l < 16 (one sub-block); lane t takes l = 4t .. 4t + 3 from
       ql and qh (words at 2-byte alignment: `ld_u32_any`).
A block is one 16-row tile; its warps take the row's super-blocks in turn and meet in shared
memory, summed in warp order (deterministic).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types

from .intrinsics import h2f, ld_nc_u32x2, ld_nc_u32x4, ld_u16, ld_u32_any, ld_x4
from .lanes_k import _k4_scales, i8_f32, small_f32
from .launch import check_rows, check_token_batch, flat, register_ptx
from .mma import h2_sub, half2_hi, half2_lo, mma_16816, pack_half2, shfl_idx, shfl_xor
from .planar import q6_k_fields, q6_k_p8_fields
from .qformats import get_format

MAX_TOKENS = 8
TC_WARPS = 8            # warps of a block (fewer when the row has fewer super-blocks)
TILE_ROWS = 16
RED_FLOATS = TC_WARPS * 128  # [warp, lane, 4] f32 partial sums in shared memory
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
def mma2(a0, a1, a2, a3, x0, x1, x2, x3, c0, c1, c2, c3):
    """C + A @ B for the chunk whose B fragment (this lane's token) is x0..x3 at bytes 0..3:
    the MMA of x's f16 high part, then of its low part."""
    bh0, bl0 = split_x(x0, x2)
    bh1, bl1 = split_x(x1, x3)
    c0, c1, c2, c3 = mma_16816(a0, a1, a2, a3, bh0, bh1, c0, c1, c2, c3)
    return mma_16816(a0, a1, a2, a3, bl0, bl1, c0, c1, c2, c3)


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


# ---- Q4_K ----
# Every load of a super-block is issued before any of its math, and x two pairs ahead: with one
# super-block per warp (2048-wide rows), a warp's time is then one memory latency, not one per
# pair (a first version, loading per pair, ran 2048->4096 at 7 us whatever the batch).

@cuda.jit(device=True, inline="always")
def ld_x8(x, i):
    """x[i .. i + 7] (i a multiple of 4) as 8 float32."""
    a0, a1, a2, a3 = ld_x4(x, i)
    a4, a5, a6, a7 = ld_x4(x, i + 4)
    return a0, a1, a2, a3, a4, a5, a6, a7


@cuda.jit(device=True, inline="always")
def _q4k_sub(wa0, wa1, wb0, wb1, sh, xv, t, dsa, dma, dsb, dmb, acc0, acc1, acc2, acc3):
    """One sub-block (the nibbles at bit sh: 0 low, 4 high) of rows a, b: two chunks (words 0
    and 1 of each row's 8 bytes) against this lane's 8 x values xv, scaled, minus the min term."""
    x0, x1, x2, x3, y0, y1, y2, y3 = xv
    c0, c1, c2, c3 = mma2(nib_pair(wa0, sh), nib_pair(wb0, sh), nib_pair(wa0, sh + 8),
                          nib_pair(wb0, sh + 8), x0, x1, x2, x3, F0, F0, F0, F0)
    c0, c1, c2, c3 = mma2(nib_pair(wa1, sh), nib_pair(wb1, sh), nib_pair(wa1, sh + 8),
                          nib_pair(wb1, sh + 8), y0, y1, y2, y3, c0, c1, c2, c3)
    s0, s1 = token_pair_sums(((x0 + x1) + (x2 + x3)) + ((y0 + y1) + (y2 + y3)), t)
    return (acc0 + (dsa * c0 - dma * s0), acc1 + (dsa * c1 - dma * s1),
            acc2 + (dsb * c2 - dmb * s0), acc3 + (dsb * c3 - dmb * s1))


@cuda.jit(device=True, inline="always")
def _q4k_pair(p, ha, hb, qa, qb, xl, xh, t, acc0, acc1, acc2, acc3):
    """Pair p (sub-blocks 2p, 2p + 1) of rows a, b: headers ha, hb (4 words), qs words qa, qb
    (this lane's 8 bytes of the pair), x of the low and high sub-block xl, xh."""
    sca, mna = _k4_scales(ha[1], ha[2], ha[3], p)
    scb, mnb = _k4_scales(hb[1], hb[2], hb[3], p)
    da, dmin_a = h2f(ha[0] & 0xFFFF), h2f(ha[0] >> 16)
    db, dmin_b = h2f(hb[0] & 0xFFFF), h2f(hb[0] >> 16)
    acc0, acc1, acc2, acc3 = _q4k_sub(
        qa[0], qa[1], qb[0], qb[1], 0, xl, t, da * small_f32(sca & 0xFF),
        dmin_a * small_f32(mna & 0xFF), db * small_f32(scb & 0xFF),
        dmin_b * small_f32(mnb & 0xFF), acc0, acc1, acc2, acc3)
    return _q4k_sub(
        qa[0], qa[1], qb[0], qb[1], 4, xh, t, da * small_f32(sca >> 8),
        dmin_a * small_f32(mna >> 8), db * small_f32(scb >> 8), dmin_b * small_f32(mnb >> 8),
        acc0, acc1, acc2, acc3)


@cuda.jit(device=True, inline="always")
def sb_q4_k(w, off_a, off_b, x, xb, t, acc0, acc1, acc2, acc3):
    """Super-block at byte offsets off_a, off_b (rows a, b) against x[xb .. xb + 255]."""
    ha = ld_nc_u32x4(w, off_a)
    hb = ld_nc_u32x4(w, off_b)
    q = off_a + 16 + 8 * t
    qa0, qa1, qa2, qa3 = (ld_nc_u32x2(w, q), ld_nc_u32x2(w, q + 32), ld_nc_u32x2(w, q + 64),
                          ld_nc_u32x2(w, q + 96))
    q = off_b + 16 + 8 * t
    qb0, qb1, qb2, qb3 = (ld_nc_u32x2(w, q), ld_nc_u32x2(w, q + 32), ld_nc_u32x2(w, q + 64),
                          ld_nc_u32x2(w, q + 96))
    xi = xb + 8 * t
    xl0, xh0 = ld_x8(x, xi), ld_x8(x, xi + 32)
    xl1, xh1 = ld_x8(x, xi + 64), ld_x8(x, xi + 96)
    acc0, acc1, acc2, acc3 = _q4k_pair(0, ha, hb, qa0, qb0, xl0, xh0, t, acc0, acc1, acc2, acc3)
    xl2, xh2 = ld_x8(x, xi + 128), ld_x8(x, xi + 160)
    acc0, acc1, acc2, acc3 = _q4k_pair(1, ha, hb, qa1, qb1, xl1, xh1, t, acc0, acc1, acc2, acc3)
    xl3, xh3 = ld_x8(x, xi + 192), ld_x8(x, xi + 224)
    acc0, acc1, acc2, acc3 = _q4k_pair(2, ha, hb, qa2, qb2, xl2, xh2, t, acc0, acc1, acc2, acc3)
    return _q4k_pair(3, ha, hb, qa3, qb3, xl3, xh3, t, acc0, acc1, acc2, acc3)


# ---- Q6_K ----

@cuda.jit(device=True, inline="always")
def q6_pair(ql, qh, j):
    """Chunk j's 6-bit values of bytes 0 and 2 (ql nibble j >> 1, qh bits 2j) minus 32, f16."""
    v = ((ql >> (4 * (j >> 1))) & LO_NIB) | (((qh >> (2 * j)) & LO_2BIT) << 4)
    return h2_sub(v | H1024, H1056)


@cuda.jit(device=True, inline="always")
def _byte_of(ws, i):
    """Byte i (0..15) of the 16 bytes held by the 4 words ws (little-endian)."""
    return (ws[i >> 2] >> (8 * (i & 3))) & 0xFF


def _q6_words_of(fields):
    """words(w, off, t): the row words of one lane of the super-block at GGUF byte offset off,
    its fields placed by `fields` (`planar`): ql at 16m + 4t (m < 8), qh at 16m + 4t (m < 4),
    the 16 int8 scales (4 words) and d."""
    @cuda.jit(device=True, inline="always")
    def words(w, off, t):
        lo, hi, sc, d = fields(off)
        ql = (ld_u32_any(w, lo + 4 * t), ld_u32_any(w, lo + 16 + 4 * t),
              ld_u32_any(w, lo + 32 + 4 * t), ld_u32_any(w, lo + 48 + 4 * t),
              ld_u32_any(w, lo + 64 + 4 * t), ld_u32_any(w, lo + 80 + 4 * t),
              ld_u32_any(w, lo + 96 + 4 * t), ld_u32_any(w, lo + 112 + 4 * t))
        qh = (ld_u32_any(w, hi + 4 * t), ld_u32_any(w, hi + 16 + 4 * t),
              ld_u32_any(w, hi + 32 + 4 * t), ld_u32_any(w, hi + 48 + 4 * t))
        scs = (ld_u32_any(w, sc), ld_u32_any(w, sc + 4), ld_u32_any(w, sc + 8),
               ld_u32_any(w, sc + 12))
        return ql, qh, scs, h2f(ld_u16(w, d))
    return words


@cuda.jit(device=True, inline="always")
def _q6_chunk(n, s, j, ra, rb, xv, acc0, acc1, acc2, acc3):
    """Chunk (n, j, s) of rows a, b (their `_q6_words_of` words) against this lane's 4 x values."""
    qla, qha, sca, da = ra
    qlb, qhb, scb, db = rb
    m = 4 * n + 2 * (j & 1) + s     # the ql word; qh: 2n + s
    la, lb = qla[m], qlb[m]
    ha, hb = qha[2 * n + s], qhb[2 * n + s]
    x0, x1, x2, x3 = xv
    c0, c1, c2, c3 = mma2(q6_pair(la, ha, j), q6_pair(lb, hb, j), q6_pair(la >> 8, ha >> 8, j),
                          q6_pair(lb >> 8, hb >> 8, j), x0, x1, x2, x3, F0, F0, F0, F0)
    i = 8 * n + 2 * j + s
    fa = da * i8_f32(_byte_of(sca, i))
    fb = db * i8_f32(_byte_of(scb, i))
    return acc0 + fa * c0, acc1 + fa * c1, acc2 + fb * c2, acc3 + fb * c3


@cuda.jit(device=True, inline="always")
def _q6_ns(n, s, ra, rb, x, xi, acc0, acc1, acc2, acc3):
    """The 4 chunks (j) of (n, s): x at xi + 32j."""
    x0 = ld_x4(x, xi)
    x1 = ld_x4(x, xi + 32)
    x2 = ld_x4(x, xi + 64)
    x3 = ld_x4(x, xi + 96)
    acc0, acc1, acc2, acc3 = _q6_chunk(n, s, 0, ra, rb, x0, acc0, acc1, acc2, acc3)
    acc0, acc1, acc2, acc3 = _q6_chunk(n, s, 1, ra, rb, x1, acc0, acc1, acc2, acc3)
    acc0, acc1, acc2, acc3 = _q6_chunk(n, s, 2, ra, rb, x2, acc0, acc1, acc2, acc3)
    return _q6_chunk(n, s, 3, ra, rb, x3, acc0, acc1, acc2, acc3)


def _sb_q6_k_of(fields):
    words = _q6_words_of(fields)

    @cuda.jit(device=True, inline="always")
    def sb(w, off_a, off_b, x, xb, t, acc0, acc1, acc2, acc3):
        """Super-block at GGUF byte offsets off_a, off_b (rows a, b) against
        x[xb .. xb + 255]: chunk (n, j, s) reads x at 128n + 32j + 16s + 4t."""
        ra = words(w, off_a, t)
        rb = words(w, off_b, t)
        xi = xb + 4 * t
        acc0, acc1, acc2, acc3 = _q6_ns(0, 0, ra, rb, x, xi, acc0, acc1, acc2, acc3)
        acc0, acc1, acc2, acc3 = _q6_ns(0, 1, ra, rb, x, xi + 16, acc0, acc1, acc2, acc3)
        acc0, acc1, acc2, acc3 = _q6_ns(1, 0, ra, rb, x, xi + 128, acc0, acc1, acc2, acc3)
        return _q6_ns(1, 1, ra, rb, x, xi + 144, acc0, acc1, acc2, acc3)
    return sb


sb_q6_k = _sb_q6_k_of(q6_k_fields)
sb_q6_k_p8 = _sb_q6_k_of(q6_k_p8_fields)  # planar Q6_K (`strata.quant.planar`)


# ---- the kernels' ends: each warp's accumulators meet in shared memory, summed in warp order ----

@cuda.jit(device=True, inline="always")
def store_partials(red, warp, lane, a0, a1, a2, a3):
    """This lane's 4 accumulators into red[warp, lane, 0..3] (f32 [n_warps * 128])."""
    i = warp * 128 + lane * 4
    red[i] = a0
    red[i + 1] = a1
    red[i + 2] = a2
    red[i + 3] = a3


@cuda.jit(device=True, inline="always")
def warp_order_sum(red, lane, c, n_warps):
    """Accumulator c (0..3: (row a, token 2t), (a, 2t + 1), (b, 2t), (b, 2t + 1)) of this lane,
    summed over the warps in warp order (deterministic). After a block barrier."""
    s = red[lane * 4 + c]
    for k in range(1, n_warps):
        s += red[k * 128 + lane * 4 + c]
    return s


# ---- the kernel ----

SB_FUNCS = {"Q4_K": (sb_q4_k, 144), "Q6_K": (sb_q6_k, 210), "Q6_K_P8": (sb_q6_k_p8, 210)}
_CACHE: dict[str, object] = {}


def _kernel(name: str):
    sb_fn, sb_bytes = SB_FUNCS[name]

    @cuda.jit
    def matvec_tc(w, row_bytes, n_sb, n_rows, n_tok, x, y):
        # w: [n_rows * row_bytes] u8; x: [n_tok * n_sb * 256] f32; y: [n_tok * n_rows] f32;
        # grid: one block per 16-row tile; block: warps taking super-blocks in turn
        red = cuda.shared.array(RED_FLOATS, types.float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        n_warps = cuda.blockDim.x >> 5
        g = lane >> 2
        t = lane & 3
        row_a = cuda.blockIdx.x * TILE_ROWS + g
        row_b = row_a + 8
        off_a = min(row_a, n_rows - 1) * row_bytes
        off_b = min(row_b, n_rows - 1) * row_bytes
        n_cols = n_sb * SB_VALUES
        xb = min(g, n_tok - 1) * n_cols  # columns past n_tok repeat a token, never written
        acc0 = F0
        acc1 = F0
        acc2 = F0
        acc3 = F0
        for sb in range(warp, n_sb, n_warps):
            acc0, acc1, acc2, acc3 = sb_fn(w, off_a + sb * sb_bytes, off_b + sb * sb_bytes, x,
                                           xb + sb * SB_VALUES, t, acc0, acc1, acc2, acc3)
        store_partials(red, warp, lane, acc0, acc1, acc2, acc3)
        cuda.syncthreads()
        if warp == 0:
            for c in range(4):
                s = warp_order_sum(red, lane, c, n_warps)
                tok = 2 * t + (c & 1)
                row = row_a if c < 2 else row_b
                if tok < n_tok and row < n_rows:
                    y[tok * n_rows + row] = s
    return matvec_tc


def tc_kernel(name: str):
    """The compiled-on-first-use kernel of a format ("Q4_K", "Q6_K")."""
    k = _CACHE.get(name)
    if k is None:
        k = _CACHE[name] = _kernel(name)
    return k


def tc_fits(ggml_type, n_cols: int) -> bool:
    """Whether the tensor-core batch kernel takes rows of this format and width."""
    return get_format(ggml_type).name in SB_FUNCS and n_cols > 0 and n_cols % SB_VALUES == 0


def block_warps(n_sb: int) -> int:
    return max(1, min(TC_WARPS, n_sb))


def matvec_tc(w, ggml_type, x, y, *, stream=0) -> None:
    """y[t] = W x[t] for 1..8 tokens on the tensor cores. `w`: uint8 rows (1-D or
    [n_rows, row_bytes], 16-byte aligned); x: float32 [n_tok, n_cols]; y: float32
    [n_tok, n_rows]. x must be finite and within f16 range (|x| < 65504): the kernels' inputs
    are normed activations and attention outputs."""
    n_tok, n_cols, n_rows = check_token_batch(x, y, MAX_TOKENS, "the tensor-core batch matvec")
    fmt = get_format(ggml_type)
    if not tc_fits(ggml_type, n_cols):
        raise ValueError(f"{fmt.name} [{n_rows}, {n_cols}]: the tensor-core batch matvec takes "
                         f"{', '.join(SB_FUNCS)} rows of a multiple of {SB_VALUES} values")
    sb_bytes = SB_FUNCS[fmt.name][1]
    n_sb = n_cols // SB_VALUES
    row_bytes = n_sb * sb_bytes
    check_rows(w, fmt.name, n_rows, n_cols, row_bytes)
    if n_rows == 0:
        return
    grid = -(-n_rows // TILE_ROWS)
    tc_kernel(fmt.name)[grid, 32 * block_warps(n_sb), stream](
        flat(w), row_bytes, n_sb, n_rows, n_tok, flat(x), flat(y))


def register_tc(family: str, name: str) -> None:
    """Put a format's tensor-core batch kernel in the compile registry."""
    def build():
        i64, f32 = types.int64, types.float32[::1]
        return tc_kernel(name).py_func, (types.uint8[::1], i64, i64, i64, i64, f32, f32)
    register_ptx(family, f"matvec_tc_{name}", build)


for _name in SB_FUNCS:
    register_tc("batch", _name)
