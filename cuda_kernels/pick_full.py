"""The sampler's chunk staging and its draw over every token (`sampling.sample_kernel`).

* `stage_chunk`: a block's PICK_CHUNK logits into shared memory, the logit bias and the
  penalties applied.
* `chunk_mass`: the staged chunk's largest logit m_b and its mass sum(exp((v - m_b) / T)).
* `full_draw`: top-k 0 with top-p 1 and min-p 0 keeps every token, so the draw needs no sort:
  the last block scales each block's mass to the largest logit of all,
  M (s_b * exp((m_b - M) / T)), finds the block where u times the total falls (prefix sums in
  block order), stages that one chunk again and finds the token the same way inside it. That is
  an inverse-CDF draw over all tokens in id order, the host `Sampler`'s distribution exactly.

Every function is called by all threads of the block (they hold `cuda.syncthreads`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .intrinsics import block_max, block_sum
from .pick_sort import block_prefix
from strata.plan.pick import PICK_CHUNK, PICK_KMAX

NEG_INF = np.float32(-np.inf)
F0 = np.float32(0.0)
ID_PAST = 2**31 - 1  # the id of a staged slot past the vocabulary: after every real id


@cuda.jit(device=True, inline="always")
def _penalised(v, c, rp, pres, freq):
    """`v` with the penalties of an id met `c` times in the window (none where c is 0)."""
    if c != 0:
        v = v / rp if v > F0 else v * rp
        if pres != F0 or freq != F0:
            v = v - (pres + freq * np.float32(c))
    return v


@cuda.jit(device=True, inline="always")
def stage_chunk(logits, n_vocab, lo, tokens, n, fparams, last_n, bias_ids, bias_vals, n_bias,
                sv, si):
    """sv[j], si[j] = logits[lo + j], lo + j for the block's chunk (-inf and ID_PAST past the
    end, NaN as -inf), plus the bias of the id where one of the first `n_bias` (bias_ids[b],
    bias_vals[b]) entries names it, then penalised where the id is one of the last `last_n`
    (<= blockDim) tokens of the history (si counts them first): divided by the repeat penalty
    fparams[3] if positive, else multiplied (once, however often it occurs there), then minus
    the presence penalty fparams[4] plus the frequency penalty fparams[5] times its count, as
    the host's `apply_logit_bias` then `apply_penalties`. Returns whether this thread met a
    NaN."""
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    rp, pres, freq = fparams[3], fparams[4], fparams[5]
    j = t
    while j < PICK_CHUNK:
        si[j] = 0
        j += bd
    cuda.syncthreads()
    if t < last_n:
        tok = tokens[n - 1 - t] - lo
        if 0 <= tok < PICK_CHUNK:
            cuda.atomic.add(si, tok, 1)
    cuda.syncthreads()
    nan = False
    biased = n_bias > 0  # uniform over the block: a row's settings
    j = t
    while j < PICK_CHUNK:  # a thread reads the counts it then overwrites
        v = NEG_INF
        if lo + j < n_vocab:
            v = logits[lo + j]
            if v != v:
                v = NEG_INF
                nan = True
        if biased:  # the bias goes on first: the penalties follow once every one is in
            sv[j] = v
        else:
            sv[j] = _penalised(v, si[j], rp, pres, freq)
            si[j] = lo + j if lo + j < n_vocab else ID_PAST
        j += bd
    cuda.syncthreads()
    if biased:
        b = t
        while b < n_bias:  # ids are unique (the host checks): one thread a slot
            i = np.int64(bias_ids[b]) - lo
            if 0 <= i < PICK_CHUNK and lo + i < n_vocab:
                sv[i] += bias_vals[b]
            b += bd
        cuda.syncthreads()
        j = t
        while j < PICK_CHUNK:
            sv[j] = _penalised(sv[j], si[j], rp, pres, freq)
            si[j] = lo + j if lo + j < n_vocab else ID_PAST
            j += bd
        cuda.syncthreads()
    return nan


@cuda.jit(device=True, inline="always")
def weight(v, top, inv_t):
    """exp((v - top) * inv_t), exactly 1 where v is the top value: a +inf logit (a repeat
    penalty's overflow) then weighs 1 against every finite one's 0, as the host's `Sampler`
    shares the draw among the +inf logits (inf - inf would make NaN)."""
    return np.float32(1.0) if v == top else math.exp((v - top) * inv_t)


@cuda.jit(device=True, inline="always")
def chunk_mass(sv, inv_t, red):
    """(m, s) in every thread: the largest of sv[:PICK_CHUNK] and sum(exp((v - m) * inv_t))
    over it (-inf adds 0; s is 0 where every value is -inf). `red`: float32[32] scratch."""
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    m = NEG_INF
    j = t
    while j < PICK_CHUNK:
        m = max(m, sv[j])
        j += bd
    m = block_max(m, red)
    s = F0
    if m > NEG_INF:  # uniform over the block: m is every thread's
        j = t
        while j < PICK_CHUNK:
            s += weight(sv[j], m, inv_t)
            j += bd
    return m, block_sum(s, red)


@cuda.jit(device=True, inline="always")
def _crossing(x, k, target, found):
    """The first i < k with x[i] > target (x: prefix sums), else the last i whose own weight is
    positive (rounding put the target past the total), else 0; in every thread."""
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    if t == 0:
        found[0] = k
        found[1] = -1
    cuda.syncthreads()
    i = t
    while i < k:
        if x[i] > target:
            cuda.atomic.min(found, 0, i)
        if x[i] > (x[i - 1] if i > 0 else F0):
            cuda.atomic.max(found, 1, i)
        i += bd
    cuda.syncthreads()
    c = found[0] if found[0] < k else max(found[1], 0)
    cuda.syncthreads()  # every thread has read `found` before it is set again
    return c


@cuda.jit(device=True, inline="always")
def full_draw(logits, n_vocab, tokens, n, fparams, last_n, bias_ids, bias_vals, n_bias, inv_t,
              u, stats, n_blocks, sv, si, part, found):
    """The token drawn from every token's weight exp((v - M) * inv_t) by u in [0, 1), in id
    order (the last block; see the module doc). stats[b * PICK_KMAX] / [+ 1]: block b's m_b and
    s_b; n_blocks <= PICK_CHUNK. Returns it in thread 0 (-1 elsewhere)."""
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    big = NEG_INF
    b = t
    while b < n_blocks:
        big = max(big, stats[b * PICK_KMAX])
        b += bd
    big = block_max(big, part)
    b = t
    while b < n_blocks:  # each block's mass at the largest logit of all
        mb = stats[b * PICK_KMAX]
        sv[b] = stats[b * PICK_KMAX + 1] * weight(mb, big, inv_t) if mb > NEG_INF else F0
        b += bd
    cuda.syncthreads()
    block_prefix(sv, n_blocks, part)
    target = u * sv[n_blocks - 1]
    chosen = _crossing(sv, n_blocks, target, found)
    if chosen > 0:
        target -= sv[chosen - 1]  # the mass of the blocks before it
    cuda.syncthreads()  # every thread has its target before the chunk overwrites sv
    stage_chunk(logits, n_vocab, np.int64(chosen) * PICK_CHUNK, tokens, n, fparams, last_n,
                bias_ids, bias_vals, n_bias, sv, si)
    j = t
    while j < PICK_CHUNK:
        sv[j] = weight(sv[j], big, inv_t) if sv[j] > NEG_INF else F0
        j += bd
    cuda.syncthreads()
    block_prefix(sv, PICK_CHUNK, part)
    j = _crossing(sv, PICK_CHUNK, target, found)
    return si[j] if t == 0 else -1
