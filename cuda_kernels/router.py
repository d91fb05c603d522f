"""MoE router: softmax over the experts' logits, top-k (k <= 16, up to 512 experts), optional
renormalisation of the k weights to sum 1 (Qwen3's norm_topk_prob).

One warp per token: each lane holds 16 expert slots (experts lane, lane+32, ...), so the softmax is
two warp reductions and each of the k picks is one warp argmax; the winning lane retires its entry.
Ties go to the lower expert id. The k ids come out in descending weight order.

`route_block` routes one token with a whole block instead (the fused decode router's last block):
each expert is ranked within its group of 32 by one integer compare per pair (`order_key`: the
logit's bits made sortable, the id below them), then the k best of every group are ranked among
themselves. Same picks, ties and order; with norm_topk the weights are exp(v - max) over their
sum across the k picks (the softmax's denominator cancels), so a weight may differ from
`route`'s in its last bits.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .intrinsics import block_sum, f2u, ld_i64x2, warp_argmax, warp_max, warp_sum
from .launch import check_array, n_blocks, register_ptx

MAX_EXPERTS = 512
MAX_K = 16
GROUP = 32  # route_block ranks experts within groups of 32 first
MAX_CAND = MAX_EXPERTS // GROUP * MAX_K  # route_block's candidates: k per group (a multiple of 8)
SIGN = np.int64(1 << 31)
PAD_KEY = np.int64(-(1 << 62))  # below every order_key (those lie within +-2**40)
SLOTS = MAX_EXPERTS // 32
WARPS = 4
NEG_INF = np.float32(-np.inf)
F0 = np.float32(0.0)


@cuda.jit(device=True, inline="always")
def route_warp(logits, tok, active, n_expert, k, norm_topk, ids, weights):
    """Token `tok`'s routing by the calling warp (every lane calls; `active` False: the warp
    takes part in the reductions and writes nothing). logits: [n_tok, n_expert] f32; ids:
    [n_tok, k] i32; weights: [n_tok, k] f32."""
    lane = cuda.threadIdx.x & 31
    vals = cuda.local.array(SLOTS, np.float32)
    m = NEG_INF
    for s in range(SLOTS):
        e = lane + 32 * s
        v = logits[tok, e] if active and e < n_expert else NEG_INF
        vals[s] = v
        m = max(m, v)
    m = warp_max(m)
    z = F0
    for s in range(SLOTS):
        if vals[s] > NEG_INF:
            z += math.exp(vals[s] - m)
    z = warp_sum(z)
    my_id = 0
    my_p = F0
    picked = F0
    for r in range(k):
        best = NEG_INF
        best_e = 1 << 30
        for s in range(SLOTS):
            if vals[s] > best:
                best = vals[s]
                best_e = lane + 32 * s
        best, best_e = warp_argmax(best, best_e)
        p = math.exp(best - m) / z if best > NEG_INF else F0
        picked += p
        if lane == r:  # all-NaN logits leave no winner: clamp, never index past the table
            my_id = min(best_e, n_expert - 1)
            my_p = p
        for s in range(SLOTS):  # constant indices keep vals in registers
            if lane + 32 * s == best_e:
                vals[s] = NEG_INF
    if active and lane < k:
        ids[tok, lane] = my_id
        weights[tok, lane] = my_p / picked if norm_topk else my_p


@cuda.jit(device=True, inline="always")
def order_key(v, e):
    """Expert e's place in the routing order as one int64: larger for a larger logit, or an equal
    one and a lower id (e < 512), so keys are distinct and one integer compare ranks two
    experts. v must not be NaN (the caller maps NaN to -inf)."""
    b = np.int64(f2u(v + F0))  # + 0: -0.0 becomes +0.0, equal logits give equal bits
    s = b if b < SIGN else (SIGN - 1) - b  # negatives below 0, larger magnitude lower
    return s * MAX_EXPERTS + ((MAX_EXPERTS - 1) - e)


@cuda.jit(device=True, inline="always")
def key_expert(key):
    """The expert id in an `order_key` (its low 9 bits hold 511 - id, whatever the sign)."""
    return (MAX_EXPERTS - 1) - np.int32(key & (MAX_EXPERTS - 1))


@cuda.jit(device=True, inline="always")
def rank_topk(logits, tok, n_expert, k, s_val, s_key, s_cand, s_id, s_top):
    """Token `tok`'s k best experts by the whole calling block (every thread calls: it
    synchronises, and the results are readable when it returns): s_id [r] = the expert of rank
    r and s_top[r] its logit, ranks 0..k-1 in `route_warp`'s order (descending logit, ties to
    the lower id; a NaN logit counts as -inf, never picked over a real one); s_val[e] = expert
    e's logit. logits: [n_tok, n_expert] f32; shared: s_val f32 [>= n_expert]; s_key i64
    [>= n_expert rounded up to 32] and s_cand i64 [>= k * that / 32 rounded up to 8], both
    16-byte aligned; s_id i32 [>= k], s_top f32 [>= k].

    Latency is what counts here (one block routing alone at the end of the router, or every
    MoE block before it can resolve its experts). Each expert is ranked within its group of 32
    (32 compares of `order_key`s); the k best of each group are the candidates, and each
    candidate is ranked among them. An expert in the top k is beaten only by experts in the top
    k, which are all candidates, so its rank among them is its rank. Ranking every expert
    against all the others (128 float compares with an id tie-break each) took ~2 us of the
    router's last 4.4 on the H200 (`bench/probes/phase_stamps.py --only route_phases`)."""
    # while loops, not range(tid, n, n_threads): numba computes such a range's trip count with
    # a 64-bit division and carries its bookkeeping through every iteration; the inner loops
    # have constant trip counts, so they unroll into independent shared loads
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    n_pad = (n_expert + GROUP - 1) & ~(GROUP - 1)
    n_cand = (n_pad // GROUP) * k
    n_cand8 = (n_cand + 7) & ~7  # padded with keys that beat none: the rank loop takes 8 a time
    e = tid
    while e < n_pad:
        if e < n_expert:
            v = logits[tok, e]
            v = v if v > NEG_INF else NEG_INF
            s_val[e] = v
            s_key[e] = order_key(v, e)
        else:
            s_key[e] = PAD_KEY - e  # below every expert's key: padding is never a top-k pick
        e += n_threads
    if tid < n_cand8 - n_cand:
        s_cand[n_cand + tid] = PAD_KEY
    cuda.syncthreads()
    e = tid
    while e < n_pad:
        ke = s_key[e]
        g0 = e & ~(GROUP - 1)
        rank = np.int32(0)
        for j in range(0, GROUP, 2):
            a, b = ld_i64x2(s_key, g0 + j)
            rank += np.int32(a > ke) + np.int32(b > ke)
        if rank < k:
            s_cand[(g0 // GROUP) * k + rank] = ke  # every group fills its k slots exactly
        e += n_threads
    cuda.syncthreads()
    c = tid
    while c < n_cand:
        kc = s_cand[c]
        rank = np.int32(0)
        j = 0
        while j < n_cand8:
            for jj in range(0, 8, 2):
                a, b = ld_i64x2(s_cand, j + jj)
                rank += np.int32(a > kc) + np.int32(b > kc)
            j += 8
        if rank < k:
            e = key_expert(kc)
            s_id[rank] = e
            s_top[rank] = s_val[e]
        c += n_threads
    cuda.syncthreads()


@cuda.jit(device=True, inline="always")
def topk_weights(n_expert, k, norm_topk, ids, weights, s_val, s_id, s_top, scratch):
    """After `rank_topk`: ids[r] = s_id[r] and weights[r] its softmax weight (renormalised over
    the k with norm_topk). Every thread of the block calls (it synchronises; without norm_topk
    the softmax's sum is a block reduction over s_val). ids [k] i32, weights [k] f32; scratch
    f32 [32]."""
    tid = cuda.threadIdx.x
    m = s_top[0]  # rank 0: the largest logit
    if norm_topk:  # the softmax's sum cancels: weight r = exp(v_r - m) / sum over the k picks
        if tid < k:  # the k exps at once, then each thread sums them in rank order
            v = s_top[tid]
            scratch[tid] = math.exp(v - m) if v > NEG_INF else F0
        cuda.syncthreads()
        if tid < k:
            picked = F0
            r = 0
            while r < k:
                picked += scratch[r]
                r += 1
            ids[tid] = s_id[tid]
            weights[tid] = scratch[tid] / picked
    else:
        z = F0
        e = tid
        while e < n_expert:  # not a range: its trip count would take a 64-bit division
            v = s_val[e]
            if v > NEG_INF:
                z += math.exp(v - m)
            e += cuda.blockDim.x
        z = block_sum(z, scratch)
        if tid < k:
            v = s_top[tid]
            ids[tid] = s_id[tid]
            weights[tid] = math.exp(v - m) / z if v > NEG_INF else F0


@cuda.jit(device=True, inline="always")
def route_block(logits, tok, n_expert, k, norm_topk, ids, weights, s_val, s_key, s_cand, s_id,
                s_top, scratch):
    """Token `tok`'s routing by the whole calling block: `rank_topk`, then `topk_weights` into
    ids [k] i32 and weights [k] f32 (this token's rows)."""
    rank_topk(logits, tok, n_expert, k, s_val, s_key, s_cand, s_id, s_top)
    topk_weights(n_expert, k, norm_topk, ids, weights, s_val, s_id, s_top, scratch)


@cuda.jit
def route_kernel(logits, n_tok, n_expert, k, norm_topk, ids, weights):
    # logits: [n_tok, n_expert] f32; ids: [n_tok, k] i32; weights: [n_tok, k] f32
    tok = cuda.blockIdx.x * WARPS + (cuda.threadIdx.x >> 5)
    route_warp(logits, tok, tok < n_tok, n_expert, k, norm_topk, ids, weights)


def route(logits, ids, weights, *, norm_topk: bool = True, stream=0) -> None:
    """Top-k routing of `logits` [n_tok, n_expert] (float32, n_expert <= 512) into `ids`
    [n_tok, k] int32 and `weights` [n_tok, k] float32 (k <= 16, k <= n_expert)."""
    check_array("logits", logits, np.float32, (None, None))
    n_tok, n_expert = logits.shape
    if not 1 <= n_expert <= MAX_EXPERTS:
        raise ValueError(f"logits: {n_expert} experts, the router takes 1..{MAX_EXPERTS}")
    check_array("ids", ids, np.int32, (n_tok, None))
    k = ids.shape[1]
    if not 1 <= k <= min(MAX_K, n_expert):
        raise ValueError(f"ids: k = {k}, expected 1..{min(MAX_K, n_expert)}")
    check_array("weights", weights, np.float32, (n_tok, k))
    route_kernel[n_blocks(n_tok, WARPS), 32 * WARPS, stream](
        logits, n_tok, n_expert, k, bool(norm_topk), ids, weights)


register_ptx("router", "route", lambda: (route_kernel.py_func, (
    types.float32[:, ::1], types.int64, types.int64, types.int64, types.boolean,
    types.int32[:, ::1], types.float32[:, ::1])))
