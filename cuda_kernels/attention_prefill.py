"""Causal attention of a prefill chunk over the cached prefix and itself, on tensor cores.

The chunk's n_q tokens sit at positions start .. start + n_q - 1, start = seq_len[0] read on the
device, and their keys/values are already in the cache (kvcache.kv_write). Query token i attends
to keys 0 .. start + i. A block takes BQ = 16 * warps query tokens of one head (GQA: its KV head
is head // G); each warp owns 16 of them as mma A fragments (f16, pre-scaled by 1/sqrt(d)).
Per tile of BKV keys the block dequantizes K (row-major) and V (transposed, so the key axis is the
mma k axis) into shared memory as f16 pairs; each warp computes S = Q K^T (m16n8k16, f32),
masks, updates its running row max / sum (online softmax; a row lives in the 4 lanes of a quad),
turns P into A fragments in registers and accumulates O += P V. Tiles past the block's last query
position are never loaded.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from .attention import _row_bytes
from .attention_prefill_gqa import WARPS as GQA_WARPS
from .attention_prefill_gqa import (check_args, p_fragments, prefill_attention_gqa,
                                    q_fragments, write_rows)
from .kvcache import KvSide, make_reader
from .mma import mma_16816, pack_half2, shfl_xor

WARPS = 4
BKV = 32
NEG_INF = float32(-np.inf)


@functools.cache
def _prefill_kernel(k_fmt, v_fmt, head_dim, warps, bkv):
    BQ, NTHREADS = 16 * warps, 32 * warps
    KK = head_dim // 16      # k16 steps over head_dim (S = Q K^T)
    NS = bkv // 8            # n8 key tiles per KV tile
    KC = bkv // 16           # k16 key chunks (O += P V)
    NO = head_dim // 8       # n8 dim tiles of O
    KS = head_dim // 2 + 4   # words per K row in shared (pad: conflict-free fragment reads)
    VS = bkv // 2 + 4        # words per transposed V row (one dim, key pairs)
    SH_K, SH_V = bkv * KS, head_dim * VS  # one buffer each; two buffers are allocated
    SH_K2, SH_V2 = 2 * SH_K, 2 * SH_V
    K_CHUNKS, V_CHUNKS = bkv * head_dim // 8, bkv * head_dim // 16
    read_k = make_reader(k_fmt, 8, _row_bytes(k_fmt, head_dim))
    read_v = make_reader(v_fmt, 8, _row_bytes(v_fmt, head_dim))
    N_QF, N_S, N_O, N_P = KK * 4, NS * 4, NO * 4, KC * 4

    @cuda.jit(device=True, inline="always")
    def load_tiles(kd, ks, vd, vs, sK, sV, kt0, length, n_kv, hk, tid, va, vb, buf):
        ok, ov = buf * SH_K, buf * SH_V
        for c in range(tid, K_CHUNKS, NTHREADS):
            key, d0 = c // (head_dim // 8), (c % (head_dim // 8)) * 8
            if kt0 + key < length:
                read_k(kd, ks, (kt0 + key) * n_kv + hk, d0, va, 0)
                for w in range(4):
                    sK[ok + key * KS + d0 // 2 + w] = pack_half2(va[2 * w], va[2 * w + 1])
            else:  # keys past the sequence are zeros, never stale cache bytes (NaN * 0 = NaN)
                for w in range(4):
                    sK[ok + key * KS + d0 // 2 + w] = uint32(0)
        for c in range(tid, V_CHUNKS, NTHREADS):
            kp, d0 = c % (bkv // 2), (c // (bkv // 2)) * 8
            for e in range(8):
                va[e] = float32(0.0)
                vb[e] = float32(0.0)
            if kt0 + 2 * kp < length:
                read_v(vd, vs, (kt0 + 2 * kp) * n_kv + hk, d0, va, 0)
            if kt0 + 2 * kp + 1 < length:
                read_v(vd, vs, (kt0 + 2 * kp + 1) * n_kv + hk, d0, vb, 0)
            for e in range(8):
                sV[ov + (d0 + e) * VS + kp] = pack_half2(va[e], vb[e])

    # Not the GQA kernel's `_row_update` (base 2, rescaling only where the max moved): sharing it
    # takes this kernel from 168 to 178 registers at head_dim 128 under ptxas sm_90, 3 blocks an
    # SM to 2, and this kernel is the measured A/B reference (CudaOptions.prefill_attention).
    @cuda.jit(device=True, inline="always")
    def row_update(s, o, m_old, l_old, first, kt0, pos, length, t):
        """Mask, new row max, rescale O and l for one of the lane's two rows (first: c0/c1)."""
        e0 = 0 if first else 2
        mx = NEG_INF
        for nt in range(NS):
            for e in range(2):
                key = kt0 + nt * 8 + 2 * t + e
                if key > pos or key >= length:
                    s[nt * 4 + e0 + e] = NEG_INF
                mx = max(mx, s[nt * 4 + e0 + e])
        mx = max(mx, shfl_xor(mx, 1))
        mx = max(mx, shfl_xor(mx, 2))
        m_new = max(m_old, mx)
        ref = m_new if m_new != NEG_INF else float32(0.0)
        alpha = math.exp(m_old - ref)
        total = float32(0.0)
        for nt in range(NS):
            for e in range(2):
                p = math.exp(s[nt * 4 + e0 + e] - ref)
                s[nt * 4 + e0 + e] = p
                total += p
        for nt in range(NO):
            o[nt * 4 + e0] *= alpha
            o[nt * 4 + e0 + 1] *= alpha
        return m_new, l_old * alpha + total

    @cuda.jit
    def kernel(q, kd, ks, vd, vs, seq_len, n_ctx, n_kv, qk_scale, out):
        qb, h = cuda.blockIdx.x, cuda.blockIdx.y
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t = lane >> 2, lane & 3
        n_q = q.shape[0]
        hk = h // (q.shape[1] // n_kv)
        start = seq_len[0]
        length = min(start + n_q, n_ctx)
        r0 = qb * BQ + warp * 16 + g
        r1 = r0 + 8
        sK = cuda.shared.array(SH_K2, uint32)
        sV = cuda.shared.array(SH_V2, uint32)
        qf = cuda.local.array(N_QF, uint32)
        s = cuda.local.array(N_S, float32)
        o = cuda.local.array(N_O, float32)
        pf = cuda.local.array(N_P, uint32)
        va = cuda.local.array(8, float32)
        vb = cuda.local.array(8, float32)
        q_fragments(q, qf, h, r0, r1, t, n_q, qk_scale, KK)
        for i in range(N_O):
            o[i] = float32(0.0)
        m0, m1 = NEG_INF, NEG_INF
        l0, l1 = float32(0.0), float32(0.0)
        pos0, pos1 = start + r0, start + r1
        kv_end = min(length, start + min(n_q, (qb + 1) * BQ))
        load_tiles(kd, ks, vd, vs, sK, sV, 0, length, n_kv, hk, tid, va, vb, 0)
        cuda.syncthreads()
        for kt0 in range(0, kv_end, bkv):
            # compute on this tile's buffer, then stage the next tile into the other one (last
            # read one tile ago, before the barrier every warp has passed since)
            buf = (kt0 // bkv) & 1
            ok, ov = buf * SH_K, buf * SH_V
            for i in range(N_S):
                s[i] = float32(0.0)
            for nt in range(NS):
                for kk in range(KK):
                    rb = ok + (nt * 8 + g) * KS + kk * 8 + t
                    d4 = mma_16816(qf[kk * 4], qf[kk * 4 + 1], qf[kk * 4 + 2], qf[kk * 4 + 3],
                                   sK[rb], sK[rb + 4], s[nt * 4], s[nt * 4 + 1], s[nt * 4 + 2],
                                   s[nt * 4 + 3])
                    for e in range(4):
                        s[nt * 4 + e] = d4[e]
            m0, l0 = row_update(s, o, m0, l0, True, kt0, pos0, length, t)
            m1, l1 = row_update(s, o, m1, l1, False, kt0, pos1, length, t)
            p_fragments(s, pf, KC)
            for nt in range(NO):
                for kc in range(KC):
                    rb = ov + (nt * 8 + g) * VS + kc * 8 + t
                    d4 = mma_16816(pf[kc * 4], pf[kc * 4 + 1], pf[kc * 4 + 2], pf[kc * 4 + 3],
                                   sV[rb], sV[rb + 4], o[nt * 4], o[nt * 4 + 1], o[nt * 4 + 2],
                                   o[nt * 4 + 3])
                    for e in range(4):
                        o[nt * 4 + e] = d4[e]
            if kt0 + bkv < kv_end:
                load_tiles(kd, ks, vd, vs, sK, sV, kt0 + bkv, length, n_kv, hk, tid, va, vb,
                           buf ^ 1)
            cuda.syncthreads()
        write_rows(o, l0, l1, out, h, r0, r1, t, n_q, NO)

    return kernel


def prefill_attention(q, k: KvSide, v: KvSide, seq_len, out, *, warps: int | None = None,
                      bkv: int | None = None, variant: str = "base", stream=0):
    """Causal attention of a chunk: out[i, h] over keys 0 .. seq_len[0] + i of KV head h // G.

    q: [n_q, n_head, head_dim] f32 (RoPE applied); k, v: the layer's cache sides with the
    chunk already written at seq_len[0] ..; out: [n_q, n_head, head_dim] f32.
    variant: "base" (this module's kernel: a block takes one head) or "gqa" (each staged K/V
    tile shared by the heads of one KV head: `attention_prefill_gqa`); warps / bkv: None takes
    the variant's own defaults.
    """
    if variant == "gqa":
        prefill_attention_gqa(q, k, v, seq_len, out, warps=warps or GQA_WARPS, bkv=bkv,
                              stream=stream)
        return
    if variant != "base":
        raise ValueError(f"prefill attention variant must be 'base' or 'gqa', got {variant!r}")
    warps, bkv = warps or WARPS, bkv or BKV
    check_args(q, k, v, seq_len, out, bkv)
    lay = k.layout
    if warps < 1:
        raise ValueError(f"warps must be >= 1, got {warps}")
    kernel = _prefill_kernel(lay.fmt, v.layout.fmt, lay.head_dim, warps, bkv)
    scale = np.float32(1.0 / math.sqrt(lay.head_dim))
    grid = (-(-q.shape[0] // (16 * warps)), q.shape[1])
    kernel[grid, 32 * warps, stream](q, k.data, k.scale, v.data, v.scale, seq_len, lay.n_ctx,
                                     lay.n_kv_head, scale, out)


def attention_flops(n_q: int, start: int, n_head: int, head_dim: int) -> int:
    """Useful FLOPs of causal prefill attention (QK^T and PV over the unmasked pairs)."""
    pairs = n_q * start + n_q * (n_q + 1) // 2
    return 4 * pairs * n_head * head_dim
