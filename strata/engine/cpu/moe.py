"""Parallel kernels of the mixture-of-experts block, straight from the stacked expert tensors.

The routed (token, expert) pairs arrive grouped by expert: `g_expert[g]` is group g's expert and
its pairs are `g_start[g]..g_start[g+1]-1`; pair p belongs to token `pair_tok[p]` with routing
weight `pair_w[p]`. Threads split the rows of the expert matrices (not the experts), so every
thread streams a slice of every active expert, one expert after another, and no two threads
write the same output. A group of one token dots the rows straight from their bytes, a run of
rows per call (`qdot.rows_dot`); a larger group decodes each row once and dots it with all its
tokens.

Stacked tensors come as raw rows: gate/up are uint8[n_expert * n_ff, row_bytes] (expert e's rows
are e*n_ff .. e*n_ff+n_ff-1), down is uint8[n_expert * n_embd, row_bytes].
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from strata.engine.cpu.idot import takes_x8
from strata.engine.cpu.qdot import ACC_SIZE, FAST, decode_row, dot_f32, rows_dot

F32 = np.float32


@njit(cache=True, fastmath=FAST)
def silu(v):
    return v / (F32(1.0) + np.exp(-v))


@njit(cache=True, parallel=True, fastmath=FAST)
def gate_up(wg, fmt_g, bs_g, wu, fmt_u, bs_u, groups, pair_tok, x, x8, h, n_chunks):
    """h[p, r] = silu(gate_e[r] . x[tok]) * (up_e[r] . x[tok]) for every pair p = (tok, e).

    groups: int64[2, n_groups + 1] (row 0: expert of each group, row 1: group starts);
    x: float32[n_tok, n_embd]; x8: its 8-bit form, the tuple `idot.x8_arrays(x)`;
    h: float32[n_pairs, n_ff];
    n_chunks: `n_chunks_for(n_ff)`."""
    n_ff = h.shape[1]
    n_embd = x.shape[1]
    qx, dx, qs16, xq = x8
    xg_8 = takes_x8(fmt_g)  # a group's decoded rows then multiply xq, as one token's do
    xu_8 = takes_x8(fmt_u)
    n_groups = groups.shape[1] - 1
    for c in prange(n_chunks):
        acc = np.empty(ACC_SIZE, F32)
        bg = np.empty(n_embd, F32)
        bu = np.empty(n_embd, F32)
        r0 = c * n_ff // n_chunks
        r1 = (c + 1) * n_ff // n_chunks
        vg = np.empty(r1 - r0, F32)  # one token's gate and up dots over the chunk's rows
        vu = np.empty(r1 - r0, F32)
        for g in range(n_groups):  # one expert at a time: sequential streams per thread
            base = groups[0, g] * n_ff
            p0 = groups[1, g]
            p1 = groups[1, g + 1]
            if p1 - p0 == 1:
                t = pair_tok[p0]
                xt, qt, dt, st = x[t], qx[t], dx[t], qs16[t]
                rows_dot(fmt_g, bs_g, wg, base + r0, base + r1, xt, qt, dt, st, acc, bg, vg)
                rows_dot(fmt_u, bs_u, wu, base + r0, base + r1, xt, qt, dt, st, acc, bu, vu)
                for r in range(r0, r1):
                    h[p0, r] = silu(vg[r - r0]) * vu[r - r0]
            else:
                for r in range(r0, r1):
                    decode_row(fmt_g, bs_g, wg[base + r], bg)
                    decode_row(fmt_u, bs_u, wu[base + r], bu)
                    for p in range(p0, p1):
                        t = pair_tok[p]
                        sg = dot_f32(bg, xq[t] if xg_8 else x[t], acc)
                        su = dot_f32(bu, xq[t] if xu_8 else x[t], acc)
                        h[p, r] = silu(sg) * su


@njit(cache=True, parallel=True, fastmath=FAST)
def down(wd, fmt_d, bs_d, groups, pair_tok, pair_w, h, h8, out, n_chunks):
    """out[tok, r] = sum over the token's pairs p of pair_w[p] * (down_e[r] . h[p]).

    out: float32[n_tok, n_embd], zeroed by the caller; h: float32[n_pairs, n_ff]; h8 its 8-bit
    form (`idot.x8_arrays(h)`);
    n_chunks: `n_chunks_for(n_embd)`."""
    n_embd = out.shape[1]
    n_ff = h.shape[1]
    qh, dh, qs16, hq = h8
    hd_8 = takes_x8(fmt_d)
    n_groups = groups.shape[1] - 1
    for c in prange(n_chunks):
        acc = np.empty(ACC_SIZE, F32)
        buf = np.empty(n_ff, F32)
        r0 = c * n_embd // n_chunks
        r1 = (c + 1) * n_embd // n_chunks
        vd = np.empty(r1 - r0, F32)  # one pair's dots over the chunk's rows
        for g in range(n_groups):
            base = groups[0, g] * n_embd
            p0 = groups[1, g]
            p1 = groups[1, g + 1]
            if p1 - p0 == 1:
                rows_dot(fmt_d, bs_d, wd, base + r0, base + r1, h[p0], qh[p0], dh[p0], qs16[p0],
                         acc, buf, vd)
                t = pair_tok[p0]
                for r in range(r0, r1):
                    out[t, r] += pair_w[p0] * vd[r - r0]
            else:
                for r in range(r0, r1):
                    decode_row(fmt_d, bs_d, wd[base + r], buf)
                    for p in range(p0, p1):
                        v = dot_f32(buf, hq[p] if hd_8 else h[p], acc)
                        out[pair_tok[p], r] += pair_w[p] * v


@njit(cache=True)
def softmax_topk(logits, k, ids, weights):
    """Router: per token, softmax over all experts, the k largest probabilities (lower index
    first on ties), renormalised to sum to 1. logits: [n_tok, n_expert]; ids: int64[n_tok, k];
    weights: float32[n_tok, k]."""
    n_expert = logits.shape[1]
    p = np.empty(n_expert, F32)
    for t in range(logits.shape[0]):
        mx = logits[t].max()
        total = F32(0.0)
        for e in range(n_expert):
            p[e] = np.exp(logits[t, e] - mx)
            total += p[e]
        for e in range(n_expert):
            p[e] /= total
        chosen = 0.0
        for j in range(k):
            best = -1
            for e in range(n_expert):
                if p[e] >= 0 and (best < 0 or p[e] > p[best]):
                    best = e
            ids[t, j] = best
            weights[t, j] = p[best]
            chosen += p[best]
            p[best] = -1.0
        for j in range(k):
            weights[t, j] = weights[t, j] / F32(chosen)
