"""Decode attention for an f16 KV cache on tensor cores ("wide" split kernel).

Same contract, arguments and partial outputs as `attention._split_kernel` (pass 1 of
flash-decoding; `attention._combine` merges the splits; the split length follows the live
length on the device, `strata.plan.attn_split.split_len`, up to the `max_split` keys the shared
score buffer holds), specialised for f16 K and V, head_dim 64 or 128 and a GQA group of at most
8 query heads (one mma n-tile).

Why: the generic kernel gives each lane head_dim / 32 values of one key (8 bytes at head_dim 128),
so a warp has 1 KB of loads in flight, and it spends ~75 instructions per key on FMAs and the
shuffles that reduce the G dot products; on the H200 it reached 1.08 TB/s (24 % of the read
ceiling) at 32K context. Here a warp takes 16 keys at a time (a "tile", 4 KB at head_dim 128,
loaded as 16-byte `ld.global.nc.v4` while the previous tile is computed) and does both products
with `mma.sync.m16n8k16` (f16 inputs, f32 accumulation):

* scores S[key, head] = K[key, :] . Q[head, :]: A = the K tile as it lies in memory (a u32 holds
  two consecutive dims of one key), B = Q^T. A dot product does not depend on the order of the
  dims, so lane t of a row takes whole 16-byte segments (t, t+4, ...) and Q uses the same
  assignment.
* P V as O^T[dim, head] = V^T[dim, key] . P^T[key, head]: lane (g, t) loads dims
  [g*hd/8, (g+1)*hd/8) of keys 2t, 2t+1, 2t+8, 2t+9 and builds the transposed A fragments with
  one `prmt` each (the low halves of two keys' words: one dim of two keys).

Accuracy stays at f32 level: K and V are f16 already (exact in the mma); Q and P are split into
f16 hi + lo parts (x = hi + lo to ~2^-22 relative) and multiplied twice. Q * scale must be within
the f16 range (|q| / sqrt(head_dim) < 65504). Keys past the split's valid length are never read
(loads clamp to the last valid key) and get probability 0.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint32

from strata.plan import attn_split

from .intrinsics import SIMULATED, ld_nc_u32x4, prmt
from .launch import MAX_SHARED_BYTES, factory_cache
from .mma import half2_hi, half2_lo, mma_16816, pack_half2, shfl_xor

WARPS = 4
THREADS = 32 * WARPS
TILE = 16                 # keys per warp tile (the mma's m for scores, k for P V)
HEAD_DIMS = (64, 128)
MAX_GROUP = 8             # query heads per KV head: one mma n-tile
MIN_BLOCKS = 4            # resident blocks per SM asked of ptxas (launch bounds; 0: none)
NEG_INF = float32(-np.inf)
LO_PAIR, HI_PAIR = 0x5410, 0x7632  # prmt: the low / high halves of two words
_split_len = cuda.jit(device=True, inline="always")(attn_split.split_len)


RED_ROW = 33              # one P V fragment of a warp in shared memory: 32 lanes + 1 of padding


def shared_bytes(head_dim: int, group: int, max_split: int) -> int:
    """Static shared memory of the kernel: the scores [group, max_split + 8] and the warps' P V
    fragments [WARPS, head_dim / 4, RED_ROW], float32."""
    return 4 * (group * (max_split + 8) + WARPS * (head_dim // 4) * RED_ROW)


def supports(k_fmt: str, v_fmt: str, head_dim: int, group: int, max_split: int) -> bool:
    """Whether the tensor-core kernel handles this case (otherwise the generic kernel does);
    max_split: the longest split (its scores must fit the shared memory: at group 8 at most
    1,264 keys at head_dim 64, 992 at head_dim 128)."""
    return (k_fmt == "f16" and v_fmt == "f16" and head_dim in HEAD_DIMS
            and 1 <= group <= MAX_GROUP and max_split % TILE == 0
            and shared_bytes(head_dim, group, max_split) <= MAX_SHARED_BYTES)


@cuda.jit(device=True, inline="always")
def _split_pair(x0, x1):
    """(hi, lo) f16x2 words with x = hi + lo to ~2^-22 relative."""
    hi = pack_half2(x0, x1)
    return hi, pack_half2(x0 - half2_lo(hi), x1 - half2_hi(hi))


def jit_options(min_blocks: int) -> dict:
    """Compile options of the kernel (also recorded in the PTX registry for ahead-of-time builds)."""
    return {"launch_bounds": (THREADS, min_blocks)} if min_blocks else {}


@factory_cache
def wide_kernel(head_dim: int, group: int, max_split: int, min_blocks: int = MIN_BLOCKS,
                min_split: int = attn_split.SPLIT_K_MIN):
    """Pass-1 kernel (grid (n_kv_head, n_split), THREADS threads) for f16 K/V; splits of at
    least min(min_split, max_split) and at most max_split keys (the shared score buffer's length
    per head).

    min_blocks: blocks per SM the register allocation must allow. Unbounded, ptxas takes 137
    registers at head_dim 128 (3 blocks of 4 warps per SM: the 512 blocks of a 32K context at
    4 KV heads then run in two waves); 4 caps it at 128 (ptxas, sm_90, with the split's first
    key and length in 32 bits: 8 bytes of local memory at group 8 since the fragment epilogue,
    none before; group 1 would take 164 and spill 128 bytes). Measured on the H200 at 32K
    context: 47.5 us unbounded, 34.6 us with 4 (pass 1 + combine), 30.3 us with the fragment
    epilogue (`2026-12-01_kernels_decode_attention_epilogue.json`).
    """
    if not supports("f16", "f16", head_dim, group, max_split):
        raise ValueError(f"tensor-core decode attention: head_dim {head_dim}, group {group}, "
                         f"longest split {max_split} not supported")
    ROW = 2 * head_dim        # bytes of one cache row
    N_SEG = head_dim // 32    # 16-byte segments of a key row per lane (scores)
    N_KW = 4 * N_SEG          # u32 words per key per lane (scores) = 2 per k-chunk
    N_CH = head_dim // 16     # k-chunks of the score mma
    DL = head_dim // 8        # dims per lane row in P V
    N_VW = DL // 2            # u32 words per key per lane (P V) = m-tiles
    N_W = 2 * N_KW            # words of one tile per lane (both passes: 2 * N_KW == 4 * N_VW)
    CAP = max_split           # scores per head in shared memory: the longest split
    SPS = CAP + 8             # score row stride in shared memory (fewer bank conflicts)
    N_ACC = 4 * N_VW          # P V accumulators per lane (head_dim / 4)
    N_SCORES, N_RED, N_OUT = group * SPS, WARPS * N_ACC * RED_ROW, group * head_dim
    STEP = WARPS * TILE       # keys per block per round
    MIN_SPLIT = min_split

    @cuda.jit(device=True, inline="always")
    def load_k(data, k0, base, n_keys, n_kv, hk, g, t, dst):
        # lane (g, t): keys g and g+8 of the tile, 16-byte segments t, t+4, ... of each
        for r in range(2):
            key = k0 + min(base + g + 8 * r, n_keys - 1)
            row = (key * n_kv + hk) * ROW
            for s in range(N_SEG):
                w0, w1, w2, w3 = ld_nc_u32x4(data, row + (t + 4 * s) * 16)
                o = r * N_KW + 4 * s
                dst[o] = w0
                dst[o + 1] = w1
                dst[o + 2] = w2
                dst[o + 3] = w3

    @cuda.jit(device=True, inline="always")
    def load_v(data, k0, base, n_keys, n_kv, hk, g, t, dst):
        # lane (g, t): dims [g*DL, (g+1)*DL) of keys 2t, 2t+1, 2t+8, 2t+9 of the tile
        for r in range(4):
            key = k0 + min(base + 2 * t + (r & 1) + 8 * (r >> 1), n_keys - 1)
            row = (key * n_kv + hk) * ROW + g * DL * 2
            for s in range(N_VW // 4):
                w0, w1, w2, w3 = ld_nc_u32x4(data, row + s * 16)
                o = r * N_VW + 4 * s
                dst[o] = w0
                dst[o + 1] = w1
                dst[o + 2] = w2
                dst[o + 3] = w3

    @cuda.jit(**({} if SIMULATED else jit_options(min_blocks)))
    def kernel(q, kd, ks, vd, vs, seq_len, n_new, n_ctx, n_target, qk_scale, part_o, part_ml):
        hk, split = cuda.blockIdx.x, cuda.blockIdx.y
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t = lane >> 2, lane & 3
        n_kv = q.shape[0] // group
        length = min(seq_len[0] + n_new, n_ctx)
        split_len = _split_len(length, n_target, CAP, MIN_SPLIT)  # a multiple of TILE, <= CAP
        k0 = int32(split * split_len)  # positions fit 32 bits (seq_len is int32): 128 registers
        n_keys = int32(min(split_len, length - k0))
        if n_keys <= 0:
            return
        s_p = cuda.shared.array(N_SCORES, float32)  # scores, then probabilities [G, split]
        s_red = cuda.shared.array(N_RED, float32)      # [WARPS, N_ACC, 33] P V fragments
        qhi = cuda.local.array(N_KW, uint32)
        qlo = cuda.local.array(N_KW, uint32)
        words = cuda.local.array(N_W, uint32)
        nxt = cuda.local.array(N_W, uint32)            # the next tile, loading meanwhile
        acc = cuda.local.array(N_ACC, float32)
        first = warp * TILE
        # pass A: scores; tile r + 1 is requested before tile r is computed
        load_k(kd, k0, first, n_keys, n_kv, hk, g, t, nxt)
        # B fragments of Q^T: head g, the dims of lane t's words (segment t + 4*(w//4), pair w%4)
        for w in range(N_KW):
            d = 8 * (t + 4 * (w // 4)) + 2 * (w % 4)
            x0 = float32(0.0)
            x1 = float32(0.0)
            if g < group:
                x0 = q[hk * group + g, d] * qk_scale
                x1 = q[hk * group + g, d + 1] * qk_scale
            hi, lo = _split_pair(x0, x1)
            qhi[w] = hi
            qlo[w] = lo
        for base in range(first, n_keys, STEP):
            for i in range(N_W):
                words[i] = nxt[i]
            if base + STEP < n_keys:
                load_k(kd, k0, base + STEP, n_keys, n_kv, hk, g, t, nxt)
            c0 = c1 = c2 = c3 = float32(0.0)
            for c in range(N_CH):
                a0, a2 = words[2 * c], words[2 * c + 1]
                a1, a3 = words[N_KW + 2 * c], words[N_KW + 2 * c + 1]
                c0, c1, c2, c3 = mma_16816(a0, a1, a2, a3, qhi[2 * c], qhi[2 * c + 1],
                                           c0, c1, c2, c3)
                c0, c1, c2, c3 = mma_16816(a0, a1, a2, a3, qlo[2 * c], qlo[2 * c + 1],
                                           c0, c1, c2, c3)
            # c0, c1: keys g, heads 2t, 2t+1; c2, c3: key g+8
            for r in range(2):
                key = base + g + 8 * r
                for j in range(2):
                    h = 2 * t + j
                    if h < group and key < n_keys:
                        s_p[h * SPS + key] = (c0 if j == 0 else c1) if r == 0 else \
                            (c2 if j == 0 else c3)
        load_v(vd, k0, first, n_keys, n_kv, hk, g, t, nxt)  # lands during pass B
        cuda.syncthreads()
        # pass B: softmax statistics per head; keys past n_keys get probability 0
        for h in range(warp, group, WARPS):
            m = NEG_INF
            for k in range(lane, n_keys, 32):
                m = max(m, s_p[h * SPS + k])
            for sh in (16, 8, 4, 2, 1):
                m = max(m, shfl_xor(m, sh))
            total = float32(0.0)
            for k in range(lane, n_keys, 32):
                p = math.exp(s_p[h * SPS + k] - m)
                s_p[h * SPS + k] = p
                total += p
            for k in range(n_keys + lane, (n_keys + TILE - 1) // TILE * TILE, 32):
                s_p[h * SPS + k] = float32(0.0)  # the last tile's keys past the split
            for sh in (16, 8, 4, 2, 1):
                total += shfl_xor(total, sh)
            if lane == 0:
                part_ml[split, hk * group + h, 0] = m
                part_ml[split, hk * group + h, 1] = total
        cuda.syncthreads()
        # pass C: O^T += V^T P^T per tile (every key index read here is < the last tile's end)
        for i in range(N_ACC):
            acc[i] = float32(0.0)
        for base in range(first, n_keys, STEP):
            for i in range(N_W):
                words[i] = nxt[i]
            if base + STEP < n_keys:
                load_v(vd, k0, base + STEP, n_keys, n_kv, hk, g, t, nxt)
            p0 = p1 = p2 = p3 = float32(0.0)
            if g < group:  # B fragment: head g, keys 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1)
                o = g * SPS + base + 2 * t
                p0, p1, p2, p3 = s_p[o], s_p[o + 1], s_p[o + 8], s_p[o + 9]
            b0h, b0l = _split_pair(p0, p1)
            b1h, b1l = _split_pair(p2, p3)
            for j in range(N_VW):  # m-tile j: rows g <-> dim g*DL + 2j, g+8 <-> + 1
                w0, w1 = words[j], words[N_VW + j]              # keys 2t, 2t+1
                w8, w9 = words[2 * N_VW + j], words[3 * N_VW + j]  # keys 2t+8, 2t+9
                a0, a1 = prmt(w0, w1, LO_PAIR), prmt(w0, w1, HI_PAIR)
                a2, a3 = prmt(w8, w9, LO_PAIR), prmt(w8, w9, HI_PAIR)
                x0, x1, x2, x3 = mma_16816(a0, a1, a2, a3, b0h, b1h, acc[4 * j],
                                           acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3])
                x0, x1, x2, x3 = mma_16816(a0, a1, a2, a3, b0l, b1l, x0, x1, x2, x3)
                acc[4 * j] = x0
                acc[4 * j + 1] = x1
                acc[4 * j + 2] = x2
                acc[4 * j + 3] = x3
        # acc[f], f = 4j + 2r + c, is O[head 2t + c, dim g*DL + 2j + r]: every warp stores its
        # fragments as they lie (s_red[warp, f, lane], rows padded to 33: no bank conflicts) and
        # after one barrier each thread sums its outputs over the warps in warp order (the sum
        # does not depend on scheduling). Summing in (head, dim) order in shared memory instead,
        # warp after warp with a barrier each, cost 16-way bank conflicts and took ~6.9 us of a
        # block's ~12.8 at 4,096 keys on the H200 (`bench/probes/phase_stamps.py`).
        for f in range(N_ACC):
            s_red[(warp * N_ACC + f) * RED_ROW + lane] = acc[f]
        cuda.syncthreads()
        for o in range(tid, N_OUT, THREADS):
            h = o // head_dim
            d = o - h * head_dim
            gg = d // DL
            f = 4 * ((d - gg * DL) >> 1) + 2 * (d & 1) + (h & 1)
            at = f * RED_ROW + 4 * gg + (h >> 1)
            v = s_red[at]
            for w in range(1, WARPS):
                v += s_red[w * N_ACC * RED_ROW + at]
            part_o[split, hk * group + h, d] = v

    return kernel
