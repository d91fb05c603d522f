"""Decode attention for an f16 or int8 KV cache on tensor cores, streaming K and V with an online
softmax.

Same contract, arguments and partial outputs as `attention._split_kernel` (pass 1 of
flash-decoding; `attention._combine` merges the splits; the split length follows the live
length on the device, `strata.plan.attn_split.split_len`), for f16 or int8 K and V (int8 rows
widened to f16 in shared memory, their scales applied in f32: `stream_kernel`), head_dim 64 or
128 and a GQA group of up to 32 query heads. A block takes at most 8 of a KV head's query heads
(one mma n-tile): a larger group (Qwen3-235B's 16) gives each KV head `n_sub(group)` blocks,
adjacent in the grid, each reading the head's K and V (the later ones mostly from L2).

Why: the two-pass tensor-core kernel before it (`attention_wide`, removed in favour of this one)
scored all of a split's keys, took the softmax statistics, then read V: each warp had one 16-key
tile in flight at a time, K and V one after the other, with the block's barriers between the
passes, and every block of a long context ran the passes in step (one wave). Here each warp
streams its tiles (16 keys; tiles warp, warp + WARPS, ...) through its own two shared-memory
slots with `cp.async`: a tile's K and V rows are requested together, the next tile's K as soon
as this tile's scores are taken, its V as soon as this tile's P V is done, and the softmax is
online (a running max and sum per query head, the output rescaled when the max grows), so there
is no score buffer, no pass barrier, and no limit on the split length from shared memory. On
the H200 (pass 1 + combine, one run, `2026-12-03_kernels_decode_attention_stream.json`): 600
live keys 8.6 us a layer against 10.4, a full 4K cache 11.3 against 12.7, 32K keys 26.2 against
30.4 (2.56 TB/s). Asking L2 for the warp's tile after next as each tile was requested (a
pipeline a tile deeper than the slots) made 32K slower, 28.8 us, and was dropped.

Per tile, warp-private (`mma.sync.m16n8k16`, f16 inputs, f32 accumulation):
* scores S[key, head] = K[key, :] . Q[head, :]: A = the K tile by `ldmatrix` (rows = keys),
  B = Q^T, staged once a block in shared memory as fragments (one 16-byte load a k-chunk).
  c0, c1: key g, heads 2t, 2t+1; c2, c3: key g + 8.
* O^T[dim, head] += V^T[dim, key] . P^T[key, head]: A = the V tile by `ldmatrix .trans`, B = P^T
  from the scores transposed through 640 bytes of shared memory. The accumulator of m-tile i
  holds dims 16i + g (+ 8) of heads 2t, 2t + 1: the heads whose statistics the lane already has.
The slots hold rows of 16-byte chunks XOR-swizzled by the row's low 3 bits, so `ldmatrix` reads
and the copies are free of bank conflicts. Keys past the split's valid length are copied as
zeros (not read) and get probability 0.

Accuracy stays at f32 level: K and V are f16 already (exact in the mma); Q and P are split into
f16 hi + lo parts (x = hi + lo to ~2^-22 relative) and multiplied twice. Q * scale must be within
the f16 range (|q| / sqrt(head_dim) < 65504). At the end the block's warps merge their
statistics and outputs in shared memory (the slots, reused) in warp order: the result does not
depend on scheduling.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from strata.plan import attn_split

from .intrinsics import SIMULATED, f2u, ld_w4, prmt, st_x4, u2f
from .launch import MAX_SHARED_BYTES, factory_cache
from .mma import (cp_async16_at, cp_async_commit, cp_async_wait, cp_async_wait_group1, gaddr1,
                  h2_sub, half2_hi, half2_lo, ldsm_x4_at, ldsm_x4_trans_at, mma_16816, pack_half2,
                  shfl_xor, smem_u32, syncwarp, warp_all)

WARPS = 4
THREADS = 32 * WARPS
TILE = 16                 # keys per warp tile (the mma's m for scores, k for P V)
HEAD_DIMS = (64, 128)
FORMATS = ("f16", "int8")  # KV formats: int8 rows are widened to f16 in the slots (exact)
I8_MAGIC = 0x64646464     # f16 0x64xx = 1024 + byte xx
I8_BIAS = 0x64806480      # f16 1152 twice: 1024 + (b ^ 0x80) - 1152 = the signed byte b
TILE_HEADS = 8            # query heads a block takes: one mma n-tile
MAX_GROUP = 32            # query heads per KV head: n_sub(group) blocks of TILE_HEADS
# Resident blocks per SM asked of ptxas (launch bounds; 0: none), by KV format. On the H200, f16
# at 5 (96 registers; shared memory holds 5 blocks) was as fast as 4 (125) at 32K keys and
# 0.2-0.4 us faster at 600 and 4K; unbounded (172 registers here, 124 on the device's ptxas) not
# faster (`2026-12-03_kernels_decode_attention_stream.json`). int8 widens its rows in registers
# and spills at 96 (ptxas 13.0): 4, 128 registers.
MIN_BLOCKS = {"f16": 5, "int8": 4}
# The longest split the launcher gives this kernel by KV format (it keeps no score buffer, so any
# length serves; the split follows the live length up to n_target splits, so this only changes
# lengths past 16K keys at 4 KV heads). On the H200 at 32K keys (30B shape, pass 1 + combine):
# f16 512-key splits 25.2-25.5 us against 26.1-27.0 with 256 in three runs of 2026-12-04 (the
# combine's 64 splits, not 128; pass 1 the same), int8 26.1 against 25.1, so it keeps 256
# (`bench/probes/attention_layout.py`; 1,024 keys were slower for both).
LONG_SPLIT = {"f16": 512, "int8": 256}
PS = 20                   # row stride (floats) of a warp's P transpose: conflict-free stores
RED_ROW = 33              # one P V fragment of a warp at the merge: 32 lanes + 1 of padding
NEG_INF = float32(-np.inf)
_split_len = cuda.jit(device=True, inline="always")(attn_split.split_len)


def ring_words(head_dim: int) -> int:
    """u32 words of the block's slots: a K and a V tile per warp."""
    return WARPS * 2 * TILE * 2 * head_dim // 4


def shared_bytes(head_dim: int) -> int:
    """Static shared memory of the kernel: the slots, Q^T's fragments [head_dim / 16, 32, 4],
    the P transposes [WARPS, 8, PS] and the merge's statistics [WARPS, 8, 2], 4 bytes each."""
    return 4 * (ring_words(head_dim) + head_dim * 8 + WARPS * TILE_HEADS * PS
                + WARPS * TILE_HEADS * 2)


def n_sub(group: int) -> int:
    """Blocks a KV head takes (grid x = n_kv_head * n_sub): TILE_HEADS query heads each."""
    return -(-group // TILE_HEADS)


def supports(k_fmt: str, v_fmt: str, head_dim: int, group: int, max_split: int) -> bool:
    """Whether this kernel handles the case (any longest split that is a multiple of a tile)."""
    return (k_fmt == v_fmt and k_fmt in FORMATS and head_dim in HEAD_DIMS
            and 1 <= group <= MAX_GROUP and max_split % TILE == 0 and max_split > 0
            and shared_bytes(head_dim) <= MAX_SHARED_BYTES)


def jit_options(min_blocks: int) -> dict:
    """Compile options of the kernel (also recorded in the PTX registry for ahead-of-time
    builds)."""
    return {"launch_bounds": (THREADS, min_blocks)} if min_blocks else {}


@cuda.jit(device=True, inline="always")
def _split_pair(x0, x1):
    """(hi, lo) f16x2 words with x = hi + lo to ~2^-22 relative."""
    hi = pack_half2(x0, x1)
    return hi, pack_half2(x0 - half2_lo(hi), x1 - half2_hi(hi))


@cuda.jit(device=True, inline="always")
def _max_over_g(v):
    """Max over the 8 lanes of a warp with the same t = lane & 3."""
    v = max(v, shfl_xor(v, 4))
    v = max(v, shfl_xor(v, 8))
    return max(v, shfl_xor(v, 16))


@cuda.jit(device=True, inline="always")
def _sum_over_g(v):
    v += shfl_xor(v, 4)
    v += shfl_xor(v, 8)
    return v + shfl_xor(v, 16)


@factory_cache
def stream_kernel(fmt: str, head_dim: int, group: int, max_split: int,
                  min_split: int = attn_split.SPLIT_K_MIN, min_blocks: int | None = None):
    """Pass-1 kernel (grid (n_kv_head * n_sub(group), n_split), THREADS threads) for f16 or int8
    K/V (`fmt`); splits of at least min(min_split, max_split) and at most max_split keys, as the
    launcher's rule makes them (any length: there is no shared score buffer).

    int8: a tile's rows are copied as they lie into the first half of their slot, then every
    lane widens the bytes it copied to f16 (exact: a byte over f16's 1024, less 1152) into the
    swizzled f16 layout; the per-row scales are applied in f32, a key's K scale to its scores and
    its V scale to its probabilities in P V (not to their sum), so the results are the f16 path's
    up to f32 rounding."""
    if not supports(fmt, fmt, head_dim, group, max_split):
        raise ValueError(f"streaming decode attention: {fmt} KV, head_dim {head_dim}, group "
                         f"{group}, longest split {max_split} not supported")
    MAX_SPLIT, MIN_SPLIT = max_split, min_split
    min_blocks = MIN_BLOCKS[fmt] if min_blocks is None else min_blocks
    INT8 = fmt == "int8"
    ROW = 2 * head_dim        # bytes of one f16 row in a slot
    SLOT = TILE * ROW         # bytes of one tile
    KV_ROW = head_dim if INT8 else ROW  # bytes of one cache row
    CH_G = KV_ROW // 16       # 16-byte chunks of a cache row
    RSTEP = 32 // CH_G        # rows one copy instruction of the warp covers
    NC = TILE // RSTEP        # copies per lane per tile
    ROW_W = ROW // 4          # words of an f16 row
    N_GOT = 4 * NC            # words a lane copies a tile (int8: widened from registers)
    N_CH = head_dim // 16     # k-chunks of the score mma = m-tiles of P V
    N_ACC = 4 * N_CH          # P V accumulators per lane
    N_RING, N_P, N_ML = ring_words(head_dim), WARPS * TILE_HEADS * PS, WARPS * TILE_HEADS * 2
    N_Q = N_CH * 32 * 4       # Q^T fragments: [k-chunk, lane, (b0, b1) hi, (b0, b1) lo]
    N_SUB = n_sub(group)
    EVEN_SUB = group % TILE_HEADS == 0  # every block a full n-tile: a constant head count

    @cuda.jit(device=True, inline="always")
    def issue(ring, slot, src, g_src, key0, n_keys, kstride, r0, lane):
        # this lane's NC chunks of the tile's rows key0.. (chunk lane % CH_G of rows
        # r0 + RSTEP*j) into the slot, f16 swizzled, int8 as they lie (chunk lane + 32j); rows
        # past the split are zero-filled and not read. Keys in int32: numba widens integer
        # arithmetic to 64 bits, and a 64-bit compare and min cost twice the instructions. The
        # f16 swizzle: r0 < RSTEP (a power of two), so (r0 + RSTEP j) & 7 = r0 ^ c_j with
        # c_j = (RSTEP j) & 7, and the chunk col ^ (row & 7) = (col ^ r0) ^ c_j: an XOR and an
        # add a copy. (Together with the unsigned P^T indices and the skipped rescale below,
        # the f16 tile loop went from 600 SASS instructions to 430, `bench/probes/sass_loops.py`.)
        last = int32(n_keys - 1)
        d_lane = slot + uint32(r0 * ROW)
        x16 = uint32(((lane % CH_G) ^ r0) << 4)
        for j in range(NC):
            row = int32(r0 + RSTEP * j)
            key = int32(key0 + row)
            valid = key < n_keys
            key = min(key, last)
            if INT8:
                dst = slot + uint32((lane + 32 * j) << 4)
            else:
                dst = d_lane + uint32(RSTEP * j * ROW) + (x16 ^ uint32(((RSTEP * j) & 7) << 4))
            cp_async16_at(ring, dst, src, g_src + uint32(key) * kstride, valid)

    @cuda.jit(device=True, inline="always")
    def widen(ring, slot_w, r0, lane):
        # int8: the bytes this lane copied (its own copies: visible to it after the wait) to
        # f16 in the slot's swizzled layout, once every lane has read its bytes
        got = cuda.local.array(N_GOT, uint32)
        for j in range(NC):
            w0, w1, w2, w3 = ld_w4(ring, slot_w + (lane + 32 * j) * 4)
            got[4 * j] = w0
            got[4 * j + 1] = w1
            got[4 * j + 2] = w2
            got[4 * j + 3] = w3
        syncwarp()
        col = lane % CH_G
        for j in range(NC):
            row = r0 + RSTEP * j
            for h in range(2):  # f16 chunk 2 col + h: the int8 words 2h, 2h + 1
                wa = got[4 * j + 2 * h] ^ 0x80808080
                wb = got[4 * j + 2 * h + 1] ^ 0x80808080
                st_x4(ring, slot_w + row * ROW_W + (((2 * col + h) ^ (row & 7)) << 2),
                      h2_sub(prmt(wa, I8_MAGIC, 0x4140), I8_BIAS),
                      h2_sub(prmt(wa, I8_MAGIC, 0x4342), I8_BIAS),
                      h2_sub(prmt(wb, I8_MAGIC, 0x4140), I8_BIAS),
                      h2_sub(prmt(wb, I8_MAGIC, 0x4342), I8_BIAS))

    @cuda.jit(device=True, inline="always")
    def row_scale(sc, k0, key, n_keys, n_kv, hk):
        # the int8 row scale of the split's key `key` (clamped to the last valid one)
        return float32(sc[(k0 + min(key, n_keys - 1)) * n_kv + hk])

    @cuda.jit(device=True, inline="always")
    def request(ring, slot, src, g_src, sc, k0, key0, n_keys, kstride, n_kv, hk, r0, g, lane):
        # issue a tile's copies (K or V); int8: also load its row scales of keys g, g + 8
        issue(ring, slot, src, g_src, key0, n_keys, kstride, r0, lane)
        s0 = s1 = float32(1.0)
        if INT8:
            s0 = row_scale(sc, k0, key0 + g, n_keys, n_kv, hk)
            s1 = row_scale(sc, k0, key0 + g + 8, n_keys, n_kv, hk)
        return s0, s1

    @cuda.jit(device=True, inline="always")
    def block_heads():
        # (KV head, first query head, query heads) of this block: a function of the block
        # index, taken again at the end rather than held in registers through the loop
        if N_SUB == 1:  # a constant: the whole group in one block
            return cuda.blockIdx.x, cuda.blockIdx.x * group, group
        hk = cuda.blockIdx.x // N_SUB
        h_first = (cuda.blockIdx.x - hk * N_SUB) * TILE_HEADS
        if EVEN_SUB:
            return hk, cuda.blockIdx.x * TILE_HEADS, TILE_HEADS
        return hk, hk * group + h_first, min(TILE_HEADS, group - h_first)

    @cuda.jit(**({} if SIMULATED else jit_options(min_blocks)))
    def kernel(q, kd, ks, vd, vs, seq_len, n_new, n_ctx, n_target, qk_scale, part_o, part_ml):
        split = cuda.blockIdx.y
        hk, q_first, n_heads = block_heads()
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3
        n_kv = q.shape[0] // group
        length = min(seq_len[0] + n_new, n_ctx)
        split_len = _split_len(length, n_target, MAX_SPLIT, MIN_SPLIT)
        k0 = int32(split * split_len)
        n_keys = int32(min(split_len, length - k0))
        if n_keys <= 0:
            return
        ring = cuda.shared.array(N_RING, uint32)    # [WARPS, K|V, TILE, ROW] f16, swizzled
        s_p = cuda.shared.array(N_P, float32)       # [WARPS, 8 heads, PS] P of a tile
        s_ml = cuda.shared.array(N_ML, float32)     # [WARPS, 8 heads, max | sum]
        s_q = cuda.shared.array(N_Q, uint32)        # B fragments of Q^T, read once a tile
        acc = cuda.local.array(N_ACC, float32)
        n_tiles = (n_keys + TILE - 1) // TILE
        base_s = smem_u32(ring)
        k_slot = base_s + uint32(warp * 2 * SLOT)
        v_slot = k_slot + uint32(SLOT)
        k_slot_w = warp * 2 * SLOT // 4  # the slots as word indices (ld_w4, st_x4)
        v_slot_w = k_slot_w + SLOT // 4
        kstride = uint32(n_kv * KV_ROW)
        # the global address of chunk lane % CH_G of key k0 + row 0 (add key * kstride)
        lane_off = uint64(k0) * uint64(kstride) + uint32(hk * KV_ROW + (lane % CH_G) * 16)
        gk = gaddr1(kd, 0) + lane_off
        gv = gaddr1(vd, 0) + lane_off
        r0 = lane // CH_G
        r = warp
        # int8: the row scales of keys g, g + 8 of this tile (s*) and of the next (n*), loaded
        # when the tile's rows are requested
        sk0 = sk1 = sv0 = sv1 = nk0 = nk1 = nv0 = nv1 = float32(1.0)
        if r < n_tiles:  # this warp's first tile: K and V requested together
            sk0, sk1 = request(ring, k_slot, kd, gk, ks, k0, r * TILE, n_keys, kstride, n_kv,
                               hk, r0, g, lane)
            cp_async_commit()
            sv0, sv1 = request(ring, v_slot, vd, gv, vs, k0, r * TILE, n_keys, kstride, n_kv,
                               hk, r0, g, lane)
        cp_async_commit()
        # B fragments of Q^T (k-chunk c): b0 = q[head g, 16c + 2t, +1], b1 = the dims 8 further;
        # warp w makes chunks w, w + WARPS, ... for the block (in shared memory rather than 32
        # registers a lane, which left the kernel spilling at 128 registers)
        c = warp
        while c < N_CH:
            for h in range(2):
                d = 16 * c + 2 * t + 8 * h
                x0 = float32(0.0)
                x1 = float32(0.0)
                if g < n_heads:
                    x0 = q[q_first + g, d] * qk_scale
                    x1 = q[q_first + g, d + 1] * qk_scale
                hi, lo = _split_pair(x0, x1)
                s_q[(c * 32 + lane) * 4 + h] = hi
                s_q[(c * 32 + lane) * 4 + 2 + h] = lo
            c += WARPS
        cuda.syncthreads()
        for i in range(N_ACC):
            acc[i] = float32(0.0)
        m0 = NEG_INF      # running max of heads 2t, 2t + 1 (the same in the 8 lanes of a t)
        m1 = NEG_INF
        l0 = float32(0.0)  # running sums of this lane's keys
        l1 = float32(0.0)
        # ldmatrix rows: K (keys (l & 7) + 8 ((l >> 3) & 1), chunk 2c + (l >> 4)); V .trans
        # (keys (l & 7) + 8 (l >> 4), chunk 2i + ((l >> 3) & 1)); the swizzle XORs the chunk
        # with the key's low 3 bits, (l & 7)
        sw = lane & 7
        k_row = k_slot + uint32((sw + 8 * ((lane >> 3) & 1)) * ROW)
        k_x = (lane >> 4) ^ sw
        v_row = v_slot + uint32((sw + 8 * (lane >> 4)) * ROW)
        v_x = ((lane >> 3) & 1) ^ sw
        pw = warp * TILE_HEADS * PS
        while r < n_tiles:
            base = r * TILE
            cp_async_wait_group1()  # this tile's K (its V may still be in flight)
            if INT8:
                widen(ring, k_slot_w, r0, lane)
            syncwarp()
            c0 = c1 = c2 = c3 = float32(0.0)
            for c in range(N_CH):
                a0, a1, a2, a3 = ldsm_x4_at(ring, k_row + uint32(((2 * c) ^ k_x) << 4))
                bh0, bh1, bl0, bl1 = ld_w4(s_q, (c * 32 + lane) * 4)
                c0, c1, c2, c3 = mma_16816(a0, a1, a2, a3, bh0, bh1, c0, c1, c2, c3)
                c0, c1, c2, c3 = mma_16816(a0, a1, a2, a3, bl0, bl1, c0, c1, c2, c3)
            syncwarp()  # every lane has read the K slot: the next tile's K may land
            nxt = r + WARPS
            if nxt < n_tiles:
                nk0, nk1 = request(ring, k_slot, kd, gk, ks, k0, nxt * TILE, n_keys, kstride,
                                   n_kv, hk, r0, g, lane)
            cp_async_commit()
            if INT8:  # the keys' K scales, before the mask
                c0 *= sk0
                c1 *= sk0
                c2 *= sk1
                c3 *= sk1
            # online softmax: keys g (c0, c1) and g + 8 (c2, c3) of heads 2t, 2t + 1
            if int32(base + g) >= n_keys:
                c0 = c1 = NEG_INF
            if int32(base + g + 8) >= n_keys:
                c2 = c3 = NEG_INF
            n0 = max(m0, _max_over_g(max(c0, c2)))  # finite: the tile's key 0 is valid
            n1 = max(m1, _max_over_g(max(c1, c3)))
            al0 = math.exp(m0 - n0)
            al1 = math.exp(m1 - n1)
            m0, m1 = n0, n1
            p0, p2 = math.exp(c0 - n0), math.exp(c2 - n0)
            p1, p3 = math.exp(c1 - n1), math.exp(c3 - n1)
            l0 = l0 * al0 + p0 + p2
            l1 = l1 * al1 + p1 + p3
            big_v = float32(1.0)
            if INT8:
                # each key's probability times its V scale over the tile's largest, so P keeps
                # f16's normal range (a scale of ~0.02 would push it into subnormals, where the
                # hi + lo split loses bits); the accumulators are divided by that largest scale
                # before the mma and multiplied by it after (f32, a rounding each)
                big_v = _max_over_g(max(sv0, sv1))
                if big_v == float32(0.0):  # every V row of the tile is zero
                    big_v = float32(1.0)
                inv_v = float32(1.0) / big_v
                al0 *= inv_v
                al1 *= inv_v
                p0 *= sv0 * inv_v
                p1 *= sv0 * inv_v
                p2 *= sv1 * inv_v
                p3 *= sv1 * inv_v
            # f16: once the running maxima stop growing (most tiles) every factor is exactly 1
            # and the warp skips the 4 N_CH multiplies (int8's factors carry 1 / big_v)
            rescale = True
            if not INT8:
                rescale = not warp_all(al0 == float32(1.0) and al1 == float32(1.0))
            if rescale:
                for i in range(N_CH):
                    acc[4 * i] *= al0
                    acc[4 * i + 1] *= al1
                    acc[4 * i + 2] *= al0
                    acc[4 * i + 3] *= al1
            # P^T for the B fragment (head g, keys 2t, 2t + 1 and 2t + 8, 2t + 9)
            # (unsigned indices: a signed one costs each access a wrap-around check; int8 keeps
            # the signed stores, with which ptxas fits its group of 16 in 128 registers unspilled)
            if INT8:
                s_p[pw + 2 * t * PS + g] = p0
                s_p[pw + (2 * t + 1) * PS + g] = p1
                s_p[pw + 2 * t * PS + g + 8] = p2
                s_p[pw + (2 * t + 1) * PS + g + 8] = p3
            else:
                p_st = uint32(pw + 2 * t * PS + g)  # this lane's P^T (keys 2t, 2t + 1, head g)
                s_p[p_st] = p0
                s_p[p_st + uint32(PS)] = p1
                s_p[p_st + uint32(8)] = p2
                s_p[p_st + uint32(PS + 8)] = p3
            cp_async_wait_group1()  # this tile's V (the next K may still be in flight)
            if INT8:
                widen(ring, v_slot_w, r0, lane)
            syncwarp()
            p_ld = uint32(pw + g * PS + 2 * t)  # and its B-fragment loads
            b0h, b0l = _split_pair(s_p[p_ld], s_p[p_ld + uint32(1)])
            b1h, b1l = _split_pair(s_p[p_ld + uint32(8)], s_p[p_ld + uint32(9)])
            for i in range(N_CH):  # m-tile i: dims 16i + g, 16i + g + 8
                a0, a1, a2, a3 = ldsm_x4_trans_at(ring, v_row + uint32(((2 * i) ^ v_x) << 4))
                x0, x1, x2, x3 = mma_16816(a0, a1, a2, a3, b0h, b1h, acc[4 * i],
                                           acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3])
                x0, x1, x2, x3 = mma_16816(a0, a1, a2, a3, b0l, b1l, x0, x1, x2, x3)
                acc[4 * i] = x0 * big_v
                acc[4 * i + 1] = x1 * big_v
                acc[4 * i + 2] = x2 * big_v
                acc[4 * i + 3] = x3 * big_v
            syncwarp()  # every lane has read the V slot and the P transpose
            if nxt < n_tiles:
                nv0, nv1 = request(ring, v_slot, vd, gv, vs, k0, nxt * TILE, n_keys, kstride,
                                   n_kv, hk, r0, g, lane)
            cp_async_commit()
            sk0, sk1, sv0, sv1 = nk0, nk1, nv0, nv1
            r = nxt
        cp_async_wait()
        # merge the warps: statistics first (rows of heads >= n_heads are never read)
        _, q_first, n_heads = block_heads()
        l0 = _sum_over_g(l0)
        l1 = _sum_over_g(l1)
        if g == 0:
            s_ml[(warp * TILE_HEADS + 2 * t) * 2] = m0
            s_ml[(warp * TILE_HEADS + 2 * t) * 2 + 1] = l0
            s_ml[(warp * TILE_HEADS + 2 * t + 1) * 2] = m1
            s_ml[(warp * TILE_HEADS + 2 * t + 1) * 2 + 1] = l1
        cuda.syncthreads()  # also: every warp is done with the slots
        big0 = NEG_INF
        big1 = NEG_INF
        for w in range(WARPS):
            big0 = max(big0, s_ml[(w * TILE_HEADS + 2 * t) * 2])
            big1 = max(big1, s_ml[(w * TILE_HEADS + 2 * t + 1) * 2])
        sc0 = math.exp(m0 - big0)  # 0 for a warp that had no tile (its max is -inf)
        sc1 = math.exp(m1 - big1)
        for f in range(N_ACC):
            ring[(warp * N_ACC + f) * RED_ROW + lane] = f2u(acc[f] * (sc0 if f % 2 == 0 else sc1))
        if warp == 0 and g == 0:
            for j in range(2):
                h = 2 * t + j
                big = big0 if j == 0 else big1
                if h < n_heads:
                    tot = float32(0.0)
                    for w in range(WARPS):
                        mw = s_ml[(w * TILE_HEADS + h) * 2]
                        tot += s_ml[(w * TILE_HEADS + h) * 2 + 1] * math.exp(mw - big)
                    part_ml[split, q_first + h, 0] = big
                    part_ml[split, q_first + h, 1] = tot
        cuda.syncthreads()
        # output (head h, dim d) is fragment f = 4 (d >> 4) + 2 ((d >> 3) & 1) + (h & 1) of
        # lane 4 (d & 7) + (h >> 1); summed over the warps in warp order
        o = tid
        while o < n_heads * head_dim:
            h = o // head_dim
            d = o - h * head_dim
            at = (4 * (d >> 4) + 2 * ((d >> 3) & 1) + (h & 1)) * RED_ROW + 4 * (d & 7) + (h >> 1)
            v = u2f(ring[at])
            for w in range(1, WARPS):
                v += u2f(ring[w * N_ACC * RED_ROW + at])
            part_o[split, q_first + h, d] = v
            o += THREADS

    return kernel
