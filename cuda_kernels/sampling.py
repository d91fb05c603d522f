"""On-device token choice, so a decode step never waits on the host: greedy argmax, and a seeded
sampler (repeat, presence and frequency penalties, top-k, top-p, min-p, temperature) whose
random number is a hash of (seed, step). Both append the chosen id to a device token history
and bump its length, which the next step's embedding lookup reads.

Both are one launch of many blocks whose last block to finish (a count in `state`, which that
block sets back to zero, so a replayed graph starts from zero again) appends the token. One
block over a 151,936-logit vocabulary took 27 us to find the argmax and 200 us to sample
(top-k 40, H200).

Greedy argmax: each block reduces its 4 x 256 logits to a key (the float's order in the high 32
bits, the complement of the id in the low: the largest, then the lowest id), and one 64-bit
atomic max per block keeps the best in state[0].

The sampler: each block stages PICK_CHUNK logits in shared memory (the penalties applied there,
the host `apply_penalties`' over the window's counts; NaN as -inf), sorts them (bitonic; equal
values keep the lower id first) and writes its n_keep best, n_keep the power of two at or above
k = top_k (KMAX = 256 when top_k is 0 or larger: candidates past the 256th are never sampled).
The k best of all are among the blocks' k best, so the last block merges the blocks' lists
(`pick_sort.merge_lists`, 4,096 pairs of shared memory at a time) and draws from the k best
as the host's `strata.engine.sampler.Sampler` does: their weights at the temperature, cut by
min-p and top-p, then the kept prefix (its random number aside, and where the k-th logit ties
others: the host keeps them all, this the lowest ids). Temperature <= 0 means greedy, as argmax
does it, on the penalised logits. Top-k 0 with top-p 1 and min-p 0 keeps every token: then no
block sorts; each writes its largest logit and mass, and the last block draws over the whole
vocabulary (`pick_full.full_draw`), the host's distribution exactly. Top-k 0 with a top-p or
min-p cut still keeps only the 256 best.

Each launch serves one sequence or several (grid rows, blockIdx.y: each row its own logits,
history, length, settings and scratch), so a batched step picks every row's token in one launch.

Device parameters, so a captured graph reads the current request's settings:
  fparams float32 [N_FPARAMS = 6]: temperature, top_p, min_p, repeat_penalty (1 = off),
    presence_penalty, frequency_penalty (0 = off)
  iparams int64 [N_IPARAMS = 4]: seed, top_k (0 = KMAX), penalty_last_n (clamped to the block
    size), n_bias (the logit-bias entries in use)
  bias_ids int32 / bias_vals float32 [MAX_BIAS]: the logit bias, (token id, value added) in the
    first n_bias entries (ids unique; `bias_table` builds them)
The bias, then the penalties ((v / p if v > 0 else v * p) - presence - frequency * count), change
the staged copy, as the host's `apply_logit_bias` then `apply_penalties`; the logits are left as
they are. A biased row is picked by this kernel even at temperature 0 (argmax has no table).
A state of three entries a row also records NaN logits: any block that meets one sets state[2]
to 1, which stays set until the host, reading it with the token, clears it (the host `Sampler`
refuses NaN logits; the device ranks them as -inf and flags them).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types

from .intrinsics import SIMULATED, block_sum, f2u, warp_argmax
from .launch import check_array, register_ptx
from .pick_full import ID_PAST, NEG_INF, chunk_mass, full_draw, stage_chunk, weight
from .pick_sort import bitonic_sort, draw, merge_lists
from strata.plan.pick import (PICK_CHUNK, PICK_FPARAMS, PICK_IPARAMS, PICK_KMAX, PICK_MAX_BIAS,
                              pick_blocks, pick_cand_len)

THREADS = 64 if SIMULATED else 1024  # the simulator runs one Python thread per CUDA thread
KMAX = PICK_KMAX
N_FPARAMS = PICK_FPARAMS  # a row's float settings (the plan sizes them)
N_IPARAMS = PICK_IPARAMS  # and its integer ones
MAX_BIAS = PICK_MAX_BIAS  # a row's logit-bias entries
ARGMAX_THREADS = 64 if SIMULATED else 256
ARGMAX_PER = 4  # logits a thread of the argmax launch reads (unrolled by hand in the kernel)
F0 = np.float32(0.0)
M32 = 0xFFFFFFFF
LG_CHUNK = PICK_CHUNK.bit_length() - 1
assert 1 << LG_CHUNK == PICK_CHUNK


@cuda.jit(device=True, inline="always")
def mix32(x):
    """A 32-bit integer hash (xor-shift-multiply), in int64 arithmetic that never wraps: the
    second constant is 2^31 or more, so x times it (x < 2^32) is taken in 16-bit halves of the
    constant (each product < 2^48), low 32 bits the same as the full product's."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0xA68B + (((x * 0x846C) & 0xFFFF) << 16)) & M32  # x * 0x846CA68B mod 2^32
    x ^= x >> 16
    return x


@cuda.jit(device=True, inline="always")
def uniform01(seed, step):
    """A float32 in [0, 1) from (seed, step); `uniform(seed, step)` is the host mirror."""
    h = mix32(mix32(mix32((np.int64(step) ^ 0x9E3779B9) & M32) ^ (seed & M32)) ^ ((seed >> 32) & M32))
    return np.float32(h >> 8) * np.float32(1.0 / 16777216.0)


def uniform(seed: int, step: int) -> float:
    """Host mirror of the device random number for (seed, step)."""
    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & M32
        x ^= x >> 15
        x = (x * 0x846CA68B) & M32
        return x ^ (x >> 16)
    h = mix(mix(mix((step ^ 0x9E3779B9) & M32) ^ (seed & M32)) ^ ((seed >> 32) & M32))
    return float(np.float32(h >> 8) * np.float32(1.0 / 16777216.0))


@cuda.jit(device=True, inline="always")
def fkey(v):
    """An unsigned key ordering floats like their values (NaN ranks as -inf)."""
    if v != v:
        v = NEG_INF
    u = f2u(v)
    return (u ^ M32) if u & 0x80000000 else (u | 0x80000000)


@cuda.jit(device=True, inline="always")
def push_token(tokens, n_tokens, row, tok):
    """Append `tok` to row `row`'s history (thread 0 only); a full one is left unchanged."""
    n = n_tokens[row]
    if n < tokens.shape[0]:
        tokens[n] = tok
        n_tokens[row] = n + 1


@cuda.jit(device=True, inline="always")
def offer(state, best, bi, sk, si):
    """Reduce the threads' (key, id) over the block (the larger key, then the lower id; keys
    of -1 are empty) and atomically max the block's best, packed, into state[0]."""
    best, bi = warp_argmax(best, bi)
    lane, warp = cuda.threadIdx.x & 31, cuda.threadIdx.x >> 5
    if lane == 0:
        sk[warp] = best
        si[warp] = bi
    cuda.syncthreads()
    if warp == 0:
        n_warps = cuda.blockDim.x >> 5
        best, bi = warp_argmax(sk[lane] if lane < n_warps else np.int64(-1),
                               si[lane] if lane < n_warps else np.int64(0))
        if lane == 0 and best >= 0:
            cuda.atomic.max(state, 0, (np.uint64(best) << np.uint64(32)) | np.uint64(M32 - bi))


@cuda.jit(device=True, inline="always")
def last_block(state, flag):
    """Whether this block is the launch's last to get here (uniform over the block): every
    block's writes before the call are then visible to it, and the count is back at zero."""
    cuda.syncthreads()  # the block's writes are made
    if cuda.threadIdx.x == 0:
        cuda.threadfence()  # and visible before the count says so
        flag[0] = cuda.atomic.add(state, 1, np.uint64(1)) == np.uint64(cuda.gridDim.x - 1)
    cuda.syncthreads()
    last = flag[0]
    if last:
        cuda.threadfence()  # then read the other blocks' writes
        if cuda.threadIdx.x == 0:
            cuda.atomic.exch(state, 1, np.uint64(0))
    return last


FLAG_NAN = 1  # state[2] bits (sticky: the host reads and clears them)
FLAG_PAST = 2


@cuda.jit(device=True, inline="always")
def flag_nan(state):
    """Record that the logits held a NaN in state[2], where the state has that slot."""
    if state.shape[0] > 2:
        cuda.atomic.or_(state, 2, np.uint64(FLAG_NAN))


@cuda.jit(device=True, inline="always")
def flag_past(state):
    """Record in state[2] (where the state has it) that a top-p / min-p cut over every token
    lay past the 256 candidates: the token pushed is the best one, not a draw."""
    if state.shape[0] > 2:
        cuda.atomic.or_(state, 2, np.uint64(FLAG_PAST))


@cuda.jit(device=True, inline="always")
def push_best(state, tokens, n_tokens, row):
    """Append the id of state[0]'s key (thread 0 of the last block) and zero the key."""
    key = cuda.atomic.exch(state, 0, np.uint64(0))
    push_token(tokens, n_tokens, row, np.int32(M32 - np.int64(key & np.uint64(M32))))


@cuda.jit
def argmax_kernel(logits_rows, n_vocab, token_rows, n_tokens, state_rows):
    # per row (blockIdx.y): logits [n_rows, n_vocab] f32; tokens [n_rows, capacity] i32
    # history; n_tokens [n_rows] i32; state [n_rows, 2 or 3] u64, zero at launch: best key so
    # far (fkey(v) << 32 | M32 - id), blocks done, and (sticky) whether a NaN was met
    row = cuda.blockIdx.y
    logits, state = logits_rows[row], state_rows[row]
    sk = cuda.shared.array(32, np.int64)
    si = cuda.shared.array(32, np.int64)
    flag = cuda.shared.array(1, types.boolean)
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    i0 = np.int64(cuda.blockIdx.x) * bd * ARGMAX_PER + t
    # every load issued before the first compare: a thread's logits are independent
    i1, i2, i3 = i0 + bd, i0 + 2 * bd, i0 + 3 * bd
    v0 = logits[i0] if i0 < n_vocab else NEG_INF
    v1 = logits[i1] if i1 < n_vocab else NEG_INF
    v2 = logits[i2] if i2 < n_vocab else NEG_INF
    v3 = logits[i3] if i3 < n_vocab else NEG_INF
    if v0 != v0 or v1 != v1 or v2 != v2 or v3 != v3:
        flag_nan(state)
    best, bi = np.int64(-1), i0  # -1: below every key, so the first in-range logit wins
    if i0 < n_vocab:
        best = np.int64(fkey(v0))
    k = np.int64(fkey(v1))
    if i1 < n_vocab and k > best:
        best, bi = k, i1
    k = np.int64(fkey(v2))
    if i2 < n_vocab and k > best:
        best, bi = k, i2
    k = np.int64(fkey(v3))
    if i3 < n_vocab and k > best:
        best, bi = k, i3
    offer(state, best, bi, sk, si)
    if last_block(state, flag) and t == 0:
        push_best(state, token_rows[row], n_tokens, row)


# a block of 1,024 threads fits an SM only at 64 registers a thread or fewer
SAMPLE_JIT_OPTIONS = {"launch_bounds": (1024, 1)}


@cuda.jit(**({} if SIMULATED else SAMPLE_JIT_OPTIONS))
def sample_kernel(logits_rows, n_vocab, token_rows, n_tokens, fparam_rows, iparam_rows,
                  state_rows, cand_v_rows, cand_i_rows, bias_id_rows, bias_val_rows):
    # per row (blockIdx.y): logits [n_vocab] f32; tokens [capacity] i32; n_tokens[row] i32;
    # fparams [N_FPARAMS] f32; iparams [N_IPARAMS] i64; state [2 or 3] u64 zero at launch
    # (best key, blocks done, NaN met); bias_ids / bias_vals [MAX_BIAS] i32 / f32;
    # cand_v / cand_i: [pick_blocks(n_vocab) * KMAX] f32 / i32, each block's n_keep best (or,
    # drawing over every token, its largest logit and mass at cand_v[b * KMAX], [+ 1])
    row = cuda.blockIdx.y
    logits, tokens, state = logits_rows[row], token_rows[row], state_rows[row]
    fparams, iparams = fparam_rows[row], iparam_rows[row]
    cand_v, cand_i = cand_v_rows[row], cand_i_rows[row]
    bias_ids, bias_vals, n_bias = bias_id_rows[row], bias_val_rows[row], iparams[3]
    sv = cuda.shared.array(PICK_CHUNK, np.float32)  # the block's chunk; then lists to merge
    si = cuda.shared.array(PICK_CHUNK, np.int32)
    scratch = cuda.shared.array(KMAX, np.float32)
    part = cuda.shared.array(32, np.float32)
    found = cuda.shared.array(2, np.int32)
    sk = cuda.shared.array(32, np.int64)
    sb = cuda.shared.array(32, np.int64)
    flag = cuda.shared.array(1, types.boolean)
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    lo = np.int64(cuda.blockIdx.x) * PICK_CHUNK
    n = n_tokens[row]
    temp = fparams[0]
    last_n = min(iparams[2], n, bd)
    if fparams[3] == np.float32(1.0) and fparams[4] == F0 and fparams[5] == F0:
        last_n = 0
    if stage_chunk(logits, n_vocab, lo, tokens, n, fparams, last_n, bias_ids, bias_vals, n_bias,
                   sv, si):
        flag_nan(state)
    if temp <= F0:  # greedy on the penalised logits, as argmax
        best, bi = np.int64(-1), lo
        j = t
        while j < PICK_CHUNK:
            kj = np.int64(fkey(sv[j]))
            if lo + j < n_vocab and kj > best:
                best, bi = kj, lo + j
            j += bd
        offer(state, best, bi, sk, sb)
        if last_block(state, flag) and t == 0:
            push_best(state, tokens, n_tokens, row)
        return
    k = iparams[1]
    if k == 0 and fparams[1] >= np.float32(1.0) and fparams[2] <= F0:  # every token is kept
        inv_t = np.float32(1.0) / temp
        m_b, s_b = chunk_mass(sv, inv_t, part)
        if t == 0:
            cand_v[np.int64(cuda.blockIdx.x) * KMAX] = m_b
            cand_v[np.int64(cuda.blockIdx.x) * KMAX + 1] = s_b
        if not last_block(state, flag):
            return
        tok = full_draw(logits, n_vocab, tokens, n, fparams, last_n, bias_ids, bias_vals,
                        n_bias, inv_t, uniform01(iparams[0], n), cand_v, cuda.gridDim.x, sv, si,
                        part, found)
        if t == 0:
            push_token(tokens, n_tokens, row, tok)
        return
    stats = np.int64(cuda.gridDim.x) * KMAX  # the blocks' (largest logit, mass) after the lists
    nucleus = k == 0  # a top-p or min-p cut over every token: its mass, besides the 256 best
    if nucleus:
        m_b, s_b = chunk_mass(sv, np.float32(1.0) / temp, part)
        if t == 0:
            cand_v[stats + 2 * cuda.blockIdx.x] = m_b
            cand_v[stats + 2 * cuda.blockIdx.x + 1] = s_b
    if k <= 0 or k > KMAX:
        k = KMAX
    k = min(k, n_vocab)
    lg_keep = 0
    while (1 << lg_keep) < k:
        lg_keep += 1
    n_keep = 1 << lg_keep  # each block's list: a power of two, for the merge
    bitonic_sort(sv, si, PICK_CHUNK)
    out = np.int64(cuda.blockIdx.x) * KMAX
    j = t
    while j < n_keep:
        cand_v[out + j] = sv[j]
        cand_i[out + j] = si[j]
        j += bd
    if not last_block(state, flag):
        return
    # the blocks' lists, PICK_CHUNK // n_keep at a time, merged into list 0 (kept between)
    lg_list = LG_CHUNK - lg_keep
    n_blocks = cuda.gridDim.x
    nxt, first = 0, 1
    while nxt < n_blocks or first == 1:
        j = t + (0 if first == 1 else n_keep)  # list 0 holds the best so far after the first
        while j < PICK_CHUNK:
            b = nxt + (j >> lg_keep) - (1 - first)
            if b < n_blocks:
                sv[j] = cand_v[b * KMAX + (j & (n_keep - 1))]
                si[j] = cand_i[b * KMAX + (j & (n_keep - 1))]
            else:
                sv[j] = NEG_INF
                si[j] = ID_PAST
            j += bd
        cuda.syncthreads()
        nxt += (PICK_CHUNK >> lg_keep) - (1 - first)
        first = 0
        merge_lists(sv, si, lg_keep, lg_list)
    u = uniform01(iparams[0], n)
    mass = F0  # top-p of the k candidates' mass, or (nucleus) of every token's
    if nucleus and k < n_vocab:
        mass = total_mass(cand_v, stats, n_blocks, sv[0], np.float32(1.0) / temp, part)
    tok, past = draw(sv, si, k, temp, fparams[1], fparams[2], u, scratch, part, found, mass)
    if t == 0:
        if past:  # the host draws this one (it reads the flag); the history gets the best
            flag_past(state)
            tok = si[0]
        push_token(tokens, n_tokens, row, tok)


@cuda.jit(device=True, inline="always")
def total_mass(cand_v, stats, n_blocks, top, inv_t, part):
    """Every token's mass at the largest logit `top`: the blocks' masses at their own largest
    (cand_v[stats + 2b], [+ 1]) rescaled, summed; in every thread."""
    s = F0
    b = cuda.threadIdx.x
    while b < n_blocks:
        mb = cand_v[stats + 2 * b]
        if mb > NEG_INF:
            s += cand_v[stats + 2 * b + 1] * weight(mb, top, inv_t)
        b += cuda.blockDim.x
    return block_sum(s, part)


def _rows(a):
    """A one-sequence array as the kernels' one row: [n] -> [1, n]."""
    return a.reshape((1,) + tuple(a.shape))


def _check_pick(what, logits, tokens, n_tokens, state):
    """The arguments argmax and sample share, checked, as rows: (logits [R, n_vocab], tokens
    [R, capacity], n_tokens [R], state [R, 2]), from one sequence's 1-D arrays (R = 1) or R
    sequences' rows (`logits` 2-D)."""
    one = getattr(logits, "ndim", len(logits.shape)) == 1
    if one:
        check_array("logits", logits, np.float32, (None,))
        check_array("tokens", tokens, np.int32, (None,))
        check_array("n_tokens", n_tokens, np.int32, (1,))
        check_array("state", state, np.uint64, (None,))
        logits, tokens, state = _rows(logits), _rows(tokens), _rows(state)
    else:
        check_array("logits", logits, np.float32, (None, None))
        n_rows = logits.shape[0]
        check_array("tokens", tokens, np.int32, (n_rows, None))
        check_array("n_tokens", n_tokens, np.int32, (n_rows,))
        check_array("state", state, np.uint64, (n_rows, None))
    if state.shape[1] not in (2, 3):
        raise ValueError(f"state: {state.shape[1]} entries a row, expected 2 (best key, blocks "
                         f"done) or 3 (and a NaN flag)")
    n_vocab = logits.shape[1]
    if n_vocab < 1 or n_vocab > PICK_CHUNK * PICK_CHUNK:
        raise ValueError(f"{what} needs 1 to {PICK_CHUNK * PICK_CHUNK} logits, got {n_vocab}")
    if logits.shape[0] < 1:
        raise ValueError(f"{what} needs at least one row of logits")
    return logits, tokens, n_tokens, state


def argmax_blocks(n_vocab: int) -> int:
    """Blocks of the argmax launch (per row): ARGMAX_PER logits a thread."""
    return -(-n_vocab // (ARGMAX_THREADS * ARGMAX_PER))


def argmax(logits, tokens, n_tokens, state, *, stream=0) -> None:
    """Append argmax(logits) (float32 [n_vocab], ties to the lower id, NaN ranked as -inf) to
    the device history `tokens` (int32 [capacity]) at n_tokens[0], then increment n_tokens[0].
    `state` (uint64 [2] or [3]) must be zero; the launch leaves its first two zero (allocate it
    once, zeroed); a third entry is set to 1 where the logits held a NaN, and stays so until the
    caller clears it.
    Several sequences in one launch: logits [R, n_vocab], tokens [R, capacity], n_tokens [R],
    state [R, 2] (row r's token at tokens[r, n_tokens[r]])."""
    logits, tokens, n_tokens, state = _check_pick("argmax", logits, tokens, n_tokens, state)
    grid = (argmax_blocks(logits.shape[1]), logits.shape[0])
    argmax_kernel[grid, ARGMAX_THREADS, stream](logits, logits.shape[1], tokens, n_tokens, state)


def sample(logits, tokens, n_tokens, fparams, iparams, state, cand_v, cand_i, bias_ids,
           bias_vals, *, stream=0) -> None:
    """Sample one token into the device history (see the module doc for the parameters).
    `state` (uint64 [2]) must be zero and is left zero; `cand_v` / `cand_i` (float32 / int32,
    at least pick_blocks(n_vocab) * KMAX each) are scratch; `bias_ids` / `bias_vals` (int32 /
    float32 [MAX_BIAS]) the logit bias, iparams[3] entries of it in use. Several sequences in
    one launch: as `argmax`, with fparams [R, N_FPARAMS], iparams [R, N_IPARAMS], cand_v /
    cand_i [R, >= blocks * KMAX] and bias_ids / bias_vals [R, MAX_BIAS] (each row its own)."""
    one = getattr(logits, "ndim", len(logits.shape)) == 1
    logits, tokens, n_tokens, state = _check_pick("sample", logits, tokens, n_tokens, state)
    n_rows, n_vocab = logits.shape
    if one:
        check_array("fparams", fparams, np.float32, (N_FPARAMS,))
        check_array("iparams", iparams, np.int64, (N_IPARAMS,))
        check_array("cand_v", cand_v, np.float32, (None,))
        check_array("cand_i", cand_i, np.int32, (None,))
        check_array("bias_ids", bias_ids, np.int32, (MAX_BIAS,))
        check_array("bias_vals", bias_vals, np.float32, (MAX_BIAS,))
        fparams, iparams, cand_v, cand_i, bias_ids, bias_vals = (
            _rows(fparams), _rows(iparams), _rows(cand_v), _rows(cand_i), _rows(bias_ids),
            _rows(bias_vals))
    else:
        check_array("fparams", fparams, np.float32, (n_rows, N_FPARAMS))
        check_array("iparams", iparams, np.int64, (n_rows, N_IPARAMS))
        check_array("cand_v", cand_v, np.float32, (n_rows, None))
        check_array("cand_i", cand_i, np.int32, (n_rows, None))
        check_array("bias_ids", bias_ids, np.int32, (n_rows, MAX_BIAS))
        check_array("bias_vals", bias_vals, np.float32, (n_rows, MAX_BIAS))
    n_blocks = pick_blocks(n_vocab)
    if cand_v.shape[1] < pick_cand_len(n_vocab) or cand_i.shape[1] < n_blocks * KMAX:
        raise ValueError(f"cand_v and cand_i need {pick_cand_len(n_vocab)} and "
                         f"{n_blocks * KMAX} entries for {n_vocab} logits, got "
                         f"{cand_v.shape[1]} and {cand_i.shape[1]}")
    sample_kernel[(n_blocks, n_rows), THREADS, stream](logits, n_vocab, tokens, n_tokens,
                                                       fparams, iparams, state, cand_v, cand_i,
                                                       bias_ids, bias_vals)


def make_params(*, temperature: float, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                repeat_penalty: float = 1.0, penalty_last_n: int = 64, seed: int = 0,
                presence_penalty: float = 0.0, frequency_penalty: float = 0.0, n_bias: int = 0):
    """(fparams [N_FPARAMS], iparams [N_IPARAMS]) host arrays for `sample`, validated (copy them
    to the device); `n_bias`: the entries of the row's bias table in use (`bias_table`)."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if not 0.0 <= min_p < 1.0:
        raise ValueError(f"min_p must be in [0, 1), got {min_p}")
    if repeat_penalty <= 0.0:
        raise ValueError(f"repeat_penalty must be > 0, got {repeat_penalty}")
    if top_k < 0 or penalty_last_n < 0:
        raise ValueError("top_k and penalty_last_n must be >= 0")
    if not (np.isfinite(presence_penalty) and np.isfinite(frequency_penalty)):
        raise ValueError(f"presence_penalty and frequency_penalty must be finite, got "
                         f"{presence_penalty} and {frequency_penalty}")
    if not 0 <= n_bias <= MAX_BIAS:
        raise ValueError(f"n_bias must be in [0, {MAX_BIAS}], got {n_bias}")
    f = np.array([temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty],
                 dtype=np.float32)
    i = np.array([seed & (2**63 - 1), top_k, penalty_last_n, n_bias], dtype=np.int64)
    return f, i


def bias_table(logit_bias, n_vocab: int):
    """(ids int32 [MAX_BIAS], vals float32 [MAX_BIAS]) host arrays of a row's logit bias
    ((token id, value) pairs; ids -1 past them), validated: ids unique and in the vocabulary,
    values finite, at most MAX_BIAS entries. Its length is make_params' `n_bias`."""
    pairs = list(logit_bias)
    if len(pairs) > MAX_BIAS:
        raise ValueError(f"the device takes at most {MAX_BIAS} logit-bias entries, got "
                         f"{len(pairs)}")
    ids = np.full(MAX_BIAS, -1, np.int32)
    vals = np.zeros(MAX_BIAS, np.float32)
    if pairs:
        got = np.array([int(t) for t, _ in pairs], np.int64)
        if got.min() < 0 or got.max() >= n_vocab or np.unique(got).size != got.size:
            raise ValueError(f"logit bias ids must be unique and in 0..{n_vocab - 1}")
        v = np.array([float(b) for _, b in pairs], np.float64)
        if not np.isfinite(v).all():
            raise ValueError("logit bias values must be finite")
        ids[:got.size], vals[:got.size] = got, v
    return ids, vals


_F32 = types.float32[:, ::1]
_I32 = types.int32[:, ::1]
register_ptx("sampling", "argmax", lambda: (argmax_kernel.py_func, (
    _F32, types.int64, _I32, types.int32[::1], types.uint64[:, ::1])))
register_ptx("sampling", "sample", lambda: (sample_kernel.py_func, (
    _F32, types.int64, _I32, types.int32[::1], _F32, types.int64[:, ::1], types.uint64[:, ::1],
    _F32, _I32, _I32, _F32)), options=SAMPLE_JIT_OPTIONS)
