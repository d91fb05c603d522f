"""MoE router: softmax over the experts' logits, top-k (k <= 16, up to 512 experts), optional
renormalisation of the k weights to sum 1 (Qwen3's norm_topk_prob).

One warp per token: each lane holds 16 expert slots (experts lane, lane+32, ...), so the softmax is
two warp reductions and each of the k picks is one warp argmax; the winning lane retires its entry.
Ties go to the lower expert id. The k ids come out in descending weight order.

`route_block` routes one token with a whole block instead (the fused decode router's last block):
each thread ranks its experts against all the others in shared memory, one pass over the logits
instead of k dependent warp argmaxes. On the H200 it took as long as the warp (~3.7 us in the
router's last block, bench/probes/phase_stamps.py), so latency there is not in the picks.
Same picks, ties and order; the softmax's sum is reduced over the block, so a weight may differ
from `route`'s in its last bits.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .intrinsics import block_sum, ld_x4, warp_argmax, warp_max, warp_sum
from .launch import check_array, n_blocks, register_ptx

MAX_EXPERTS = 512
MAX_K = 16
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
def _beats(u, j, v, e):
    """1 where expert j (logit u) ranks before expert e (logit v): larger, or equal and a lower
    id; else 0."""
    return np.int32((u > v) | ((u == v) & (j < e)))


@cuda.jit(device=True, inline="always")
def _beats4(s_val, j, v, e):
    """How many of experts j..j+3 rank before expert e (one 16-byte shared read)."""
    u0, u1, u2, u3 = ld_x4(s_val, j)
    return (_beats(u0, j, v, e) + _beats(u1, j + 1, v, e)) + (
        _beats(u2, j + 2, v, e) + _beats(u3, j + 3, v, e))


@cuda.jit(device=True, inline="always")
def route_block(logits, tok, n_expert, k, norm_topk, ids, weights, s_val, s_id, s_pick,
                scratch):
    """Token `tok`'s routing by the whole calling block (every thread calls: it synchronises),
    with `route_warp`'s picks: an expert's rank is the number of experts with a larger logit, or
    an equal one and a lower id (a strict order: every rank is taken once), and ranks 0..k-1 are
    the picks in descending weight order. A NaN logit counts as -inf (never picked over a real
    one). logits, ids, weights as `route_warp`; shared: s_val f32 [>= n_expert rounded up to
    16], 16-byte aligned; s_id i32 [>= k]; s_pick f32 [>= k]; scratch f32 [32].

    One block runs this alone at the end of the router, so latency is what counts: the rank
    loop reads 16 logits per step with four 16-byte broadcast reads issued together."""
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    n_pad = (n_expert + 15) & ~15
    for e in range(tid, n_pad, n_threads):
        v = logits[tok, e] if e < n_expert else NEG_INF  # padding ranks after every expert
        s_val[e] = v if v > NEG_INF else NEG_INF
    cuda.syncthreads()
    for e in range(tid, n_expert, n_threads):
        v = s_val[e]
        rank = np.int32(0)
        for j in range(0, n_pad, 16):
            rank += (_beats4(s_val, j, v, e) + _beats4(s_val, j + 4, v, e)) + (
                _beats4(s_val, j + 8, v, e) + _beats4(s_val, j + 12, v, e))
        if rank < k:
            s_id[rank] = e
    cuda.syncthreads()
    m = s_val[s_id[0]]  # rank 0: the largest logit
    z = F0
    for e in range(tid, n_expert, n_threads):
        v = s_val[e]
        if v > NEG_INF:
            z += math.exp(v - m)
    z = block_sum(z, scratch)
    if tid < k:
        e = s_id[tid]
        v = s_val[e]
        s_pick[tid] = math.exp(v - m) / z if v > NEG_INF else F0
    cuda.syncthreads()
    if tid < k:
        picked = F0
        for r in range(k):  # rank order, as route_warp adds them
            picked += s_pick[r]
        p = s_pick[tid]
        ids[tok, tid] = s_id[tid]
        weights[tok, tid] = p / picked if norm_topk else p


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
