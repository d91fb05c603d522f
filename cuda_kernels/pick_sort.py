"""Block-wide sorting and drawing for the sampler (`sampling.sample_kernel`): (value, id) pairs
in shared memory, ordered by value descending and then id ascending, so equal values keep the
lower ids and every result is the same from run to run.

* `bitonic_sort`: a whole power-of-two buffer, descending.
* `merge_lists`: 2^a sorted lists of 2^b pairs side by side, reduced to the 2^b best of them
  all in list 0. For two sorted lists A and B, max(A[i], B[n-1-i]) is a
  bitonic sequence holding the n best of both, which log2(n) merge stages sort; pairs of lists
  are reduced that way, then pairs of the results, log2(n_list) rounds.
* `draw`: the weights of the k best at temperature T, cut by min-p and top-p as the host's
  `Sampler` cuts them, then an inverse-CDF draw, its sums taken in parallel (prefix sums by
  warps).

Every function is called by all threads of the block (they hold `cuda.syncthreads`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .intrinsics import warp_suffix_sum

F0 = np.float32(0.0)


@cuda.jit(device=True, inline="always")
def before(va, ia, vb, ib):
    """Whether (va, ia) sorts before (vb, ib): the larger value, then the lower id."""
    return va > vb or (va == vb and ia < ib)


@cuda.jit(device=True, inline="always")
def _order(vals, ids, a, b):
    """Put the better of slots a and b in slot a."""
    if before(vals[b], ids[b], vals[a], ids[a]):
        tv = vals[a]
        vals[a] = vals[b]
        vals[b] = tv
        ti = ids[a]
        ids[a] = ids[b]
        ids[b] = ti


@cuda.jit(device=True, inline="always")
def bitonic_sort(vals, ids, n):
    """Sort vals[:n] / ids[:n] (n a power of two) best first."""
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    size = 2
    while size <= n:
        stride = size >> 1
        while stride > 0:
            p = t
            while p < (n >> 1):
                low = p & (stride - 1)  # strides are powers of two: no division
                i = ((p - low) << 1) + low
                if (i & size) == 0:
                    _order(vals, ids, i, i + stride)
                else:
                    _order(vals, ids, i + stride, i)
                p += bd
            cuda.syncthreads()
            stride >>= 1
        size <<= 1


@cuda.jit(device=True, inline="always")
def merge_lists(vals, ids, lg_keep, lg_list):
    """2^lg_list lists of n_keep = 2^lg_keep pairs at vals[j * n_keep:], each sorted best
    first: the n_keep best of them all, sorted, into list 0 (the others are left spent).
    Indices by shifts and masks: no division."""
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    n_keep = 1 << lg_keep
    lg = 0  # log2 of the lists between the two of a pair, one more each round
    while lg < lg_list:
        lg_pair = lg_list - lg - 1  # log2 of this round's pairs
        q = t
        while q < (n_keep << lg_pair):  # the better of A[i] and B[n_keep - 1 - i], into A
            pair, i = q >> lg_keep, q & (n_keep - 1)
            a = (pair << (lg + 1 + lg_keep)) + i
            b = a + (1 << (lg + lg_keep)) + n_keep - 1 - 2 * i
            if before(vals[b], ids[b], vals[a], ids[a]):
                vals[a] = vals[b]
                ids[a] = ids[b]
            q += bd
        cuda.syncthreads()
        stride = n_keep >> 1
        while stride > 0:  # each A is bitonic: merge it, best first
            q = t
            while q < (n_keep << lg_pair) >> 1:
                pair, p = q >> (lg_keep - 1), q & ((n_keep >> 1) - 1)
                low = p & (stride - 1)
                i = (pair << (lg + 1 + lg_keep)) + ((p - low) << 1) + low
                _order(vals, ids, i, i + stride)
                q += bd
            cuda.syncthreads()
            stride >>= 1
        lg += 1


@cuda.jit(device=True, inline="always")
def block_prefix(x, k, part):
    """x[:k] replaced by its inclusive prefix sums; `part` holds a float per warp. A tile of
    blockDim values at a time: sums by warps, then the warps' totals in order, then the tiles'."""
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    lane, warp = t & 31, t >> 5
    carry = F0  # the earlier tiles' total
    base = 0
    while base < k:
        i = base + t
        v = x[i] if i < k else F0
        suffix = warp_suffix_sum(v)  # this lane's and the later lanes' of its warp
        if lane == 0:
            part[warp] = suffix  # the warp's total
        cuda.syncthreads()
        before_warps = carry
        for w in range(warp):
            before_warps += part[w]
        if i < k:
            x[i] = before_warps + (part[warp] - suffix + v)
        for w in range(warp, bd >> 5):
            before_warps += part[w]
        carry = before_warps  # every thread: the sum through this tile
        cuda.syncthreads()
        base += bd


@cuda.jit(device=True, inline="always")
def draw(vals, ids, k, temp, top_p, min_p, u, scratch, part, found, mass):
    """The token drawn from the k best (vals / ids sorted best first; scratch holds k floats),
    as `strata.engine.sampler.Sampler` draws: the weights exp((v - v_best) / temp); keep the
    prefix before the first candidate whose weight is under min_p (relative to the best's) or
    that comes after top_p of the mass; pick by u in [0, 1) from the kept weights. `mass`: the
    mass top-p is a share of (every token's, at the best value) or 0 (the k candidates').
    Returns (the token in thread 0, -1 elsewhere; whether the cut lies past the k candidates:
    top-p of `mass` not reached and no min-p cut among them, so the draw is not the host's)."""
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    v0 = vals[0]
    i = t
    while i < k:
        # exactly 1 at the best value: +inf logits (a penalty's overflow) share the draw, as
        # the host's; inf - inf would make NaN
        scratch[i] = np.float32(1.0) if vals[i] == v0 else math.exp((vals[i] - v0) / temp)
        i += bd
    if t == 0:
        found[0] = k  # keep
        found[1] = k  # the chosen: any kept candidate is below
    cuda.syncthreads()
    i = t
    while i < k:  # before the prefix sums replace the weights
        if i > 0 and scratch[i] < min_p:
            cuda.atomic.min(found, 0, i)
        i += bd
    block_prefix(scratch, k, part)  # scratch[i]: the weight of candidates 0..i
    total = scratch[k - 1] if mass <= F0 else mass
    i = t
    while i < k:
        if i > 0 and scratch[i - 1] >= top_p * total:
            cuda.atomic.min(found, 0, i)
        i += bd
    cuda.syncthreads()
    keep = found[0]
    past = mass > F0 and keep == k and scratch[k - 1] < top_p * total  # block-uniform
    target = u * scratch[keep - 1]
    i = t
    while i < keep:
        if scratch[i] > target:
            cuda.atomic.min(found, 1, i)
        i += bd
    cuda.syncthreads()
    chosen = min(found[1], keep - 1)  # none above the target (rounding): the last kept
    return (ids[chosen] if t == 0 else -1), past
