"""Where a decode expert's bytes are, read on the device by the MoE kernels (`moe`,
`moe_lanes`, the batched ones): a VRAM cache slot (hit), mapped host memory (miss), or left to the
CPU pool (a miss, when the pool takes them). See `moe` for the tables these read. And which
experts: the lane gate/up kernels can route the router's logits themselves (`route_shared`)."""

from __future__ import annotations

import numpy as np
from numba import cuda, types

from .intrinsics import SIMULATED

from .router import GROUP, rank_topk, topk_weights

MAX_K = 16  # experts per token the kernels' shared lists hold
# The most experts a MoE kernel routes itself (its shared lists are sized for them; Qwen3's
# MoE models have 128): more are routed by the router's last block instead.
ROUTE_MAX_EXPERTS = 256
ROUTE_MAX_CAND = ROUTE_MAX_EXPERTS // GROUP * MAX_K
ALIGN16 = None if SIMULATED else 16  # route_shared's 16-byte shared reads (simulator: none)


@cuda.jit(device=True, inline="always")
def resolve(slot_table, layer, e, slot_off, host_off, cpu_misses):
    """(where, base): where 0 = cache, 1 = host, -1 = left to the CPU pool."""
    return resolve_slot(slot_table[layer, e], layer, e, slot_off, host_off, cpu_misses)


@cuda.jit(device=True, inline="always")
def resolve_slot(slot, layer, e, slot_off, host_off, cpu_misses):
    """`resolve` of expert e of layer with its slot-table entry already read."""
    if slot >= 0:
        return 0, slot_off[slot]
    if cpu_misses:
        return -1, np.int64(0)
    return 1, host_off[layer, e]


@cuda.jit(device=True, inline="always")
def resolve_shared(ids, k, slot_table, layer, slot_off, host_off, cpu_misses, miss_list,
                   counters, s_where, s_base, count):
    """The k experts resolved at once, thread t < k taking the t-th, into s_where/s_base (read
    them after a barrier); with `count`, block 0 lists the experts left to the CPU and counts
    hits/misses (a launch that resolves the same experts again passes False)."""
    t = cuda.threadIdx.x
    if t < k:
        e = ids[t]
        _put(t, e, resolve(slot_table, layer, e, slot_off, host_off, cpu_misses), layer,
             miss_list, counters, s_where, s_base, count)


@cuda.jit(device=True, inline="always")
def _put(t, e, where_base, layer, miss_list, counters, s_where, s_base, count):
    """Thread t's resolved expert e into the shared lists; with `count`, block 0 lists it if it
    is left to the CPU and counts it as a hit or a miss."""
    where, base = where_base
    s_where[t] = where
    s_base[t] = base
    if count and cuda.blockIdx.x == 0:
        miss_list[t] = e if where < 0 else -1
        cuda.atomic.add(counters, (layer, 0 if where == 0 else 1), 1)


@cuda.jit(device=True, inline="always")
def resolve_compact(ids, weights, k, slot_table, layer, slot_off, host_off, cpu_misses, off,
                    s_w0, s_b0, s_where, s_base, s_kk, s_wt, s_n):
    """The k experts resolved at once (thread t < k takes the t-th), then the ones not left to
    the CPU listed in top-k order in s_where/s_base (+ off)/s_kk/s_wt, their count in s_n[0].
    The whole block calls this (it synchronises; the lists are readable after it)."""
    t = cuda.threadIdx.x
    if t < k:
        where, base = resolve(slot_table, layer, ids[t], slot_off, host_off, cpu_misses)
        s_w0[t] = where
        s_b0[t] = base + off
    cuda.syncthreads()
    if t < k:
        n = 0
        for j in range(t):
            if s_w0[j] >= 0:
                n += 1
        where = s_w0[t]
        if where >= 0:
            s_where[n] = where
            s_base[n] = s_b0[t]
            s_kk[n] = t
            s_wt[n] = weights[t]
        if t == k - 1:
            s_n[0] = n + (1 if where >= 0 else 0)
    cuda.syncthreads()


@cuda.jit(device=True, inline="always")
def route_shared(logits, n_expert, k, norm_topk, ids, weights, s_val, s_key, s_cand, s_id, s_top,
                 scratch):
    """The token's top k of its router logits [1, n_expert] (n_expert <= ROUTE_MAX_EXPERTS) into
    s_id (readable on return), by every block alike; block 0 also writes ids [k] and weights [k]
    (`router.topk_weights`) for the launches after this one. The whole block calls this (it
    synchronises). Every block ranks the same logits with the same code, so each one's s_id is
    the ids block 0 writes. Shared: s_val f32 / s_key i64 [ROUTE_MAX_EXPERTS], s_cand i64
    [ROUTE_MAX_CAND], s_id i32 / s_top f32 [MAX_K], scratch f32 [32]."""
    rank_topk(logits, 0, n_expert, k, s_val, s_key, s_cand, s_id, s_top)
    if cuda.blockIdx.x == 0:  # uniform over the block: topk_weights may synchronise
        topk_weights(n_expert, k, norm_topk, ids, weights, s_val, s_id, s_top, scratch)


@cuda.jit(device=True, inline="always")
def route_resolve(logits, n_route, k, norm_topk, ids, weights, slot_table, layer, slot_off,
                  host_off, cpu_misses, miss_list, counters, s_where, s_base, count):
    """The prologue of the lane gate/up kernels: with n_route > 0 the token's top k of its
    router logits ranked by this block (`route_shared`, block 0 writing ids and weights), else
    ids as given; then those k experts resolved into s_where/s_base (`resolve_shared`; read
    them after a barrier). The whole block calls this (it synchronises); the routing scratch is
    declared here, in the shared memory of the kernel that inlines it. (Reading the layer's
    whole slot-table row beside the ids, two dependent reads instead of three, made the fused
    MoE slower on the H200: `bench/results/2026-12-04_kernels_moe_fused_variants_2.json`.)"""
    s_val = cuda.shared.array(ROUTE_MAX_EXPERTS, types.float32)
    s_key = cuda.shared.array(ROUTE_MAX_EXPERTS, types.int64, alignment=ALIGN16)
    s_cand = cuda.shared.array(ROUTE_MAX_CAND, types.int64, alignment=ALIGN16)
    s_id = cuda.shared.array(MAX_K, types.int32)
    s_top = cuda.shared.array(MAX_K, types.float32)
    scratch = cuda.shared.array(32, types.float32)
    if n_route > 0:  # the same in every block: the router wrote logits, not ids
        route_shared(logits, n_route, k, norm_topk, ids, weights, s_val, s_key, s_cand, s_id,
                     s_top, scratch)
    resolve_shared(s_id if n_route > 0 else ids, k, slot_table, layer, slot_off, host_off,
                   cpu_misses, miss_list, counters, s_where, s_base, count)
