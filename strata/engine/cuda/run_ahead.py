"""Tokens picked on the device, read back one step behind: the loop under `device_tokens` of
the one-GPU engine and the layer split.

The step that feeds token i (and picks token i+1) is enqueued before token i is read back, so
the GPU always has a step queued while the host reads a token (4 bytes through pinned memory)
and decides whether to go on. Where the caller stops at token i (a stop token, its budget), that
step was one too many: `finish(undo=True)` takes it back, so the engine counts only the tokens
it fed, as a host loop of `decode_step` would leave it.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from strata.cuda_kernels.sampling import KMAX, MAX_BIAS, THREADS, bias_table, make_params
from strata.engine.sampler import SamplingParams


def step_mode(sampling: SamplingParams | None) -> str:
    """What picks a single sequence's tokens on the device: "greedy" (the argmax kernel, which
    sees the logits as they are) or "sample" (the sampler, whose temperature 0 takes the arg-max
    of the biased and penalised logits: greedy with a bias or a penalty)."""
    if sampling is None or (sampling.greedy and not sampling.penalised
                            and not sampling.logit_bias):
        return "greedy"
    return "sample"


def device_params(sampling: SamplingParams, seed: int, n_vocab: int):
    """(fparams, iparams, bias ids, bias values): the host arrays of `sampling` the sampler
    reads from a row of the device's (`make_params`, `bias_table`); `seed` the draw's."""
    ids, vals = bias_table(sampling.logit_bias, n_vocab)
    f, i = make_params(temperature=sampling.temperature, top_k=sampling.top_k,
                       top_p=sampling.top_p, min_p=min(sampling.min_p, 0.999999),
                       repeat_penalty=sampling.repeat_penalty,
                       penalty_last_n=sampling.repeat_last_n, seed=seed,
                       presence_penalty=sampling.presence_penalty,
                       frequency_penalty=sampling.frequency_penalty,
                       n_bias=len(sampling.logit_bias))
    return f, i, ids, vals


PARAM_ROWS = ("sample_fparams", "sample_iparams", "sample_bias_ids", "sample_bias_vals")


def put_params(acts, row: int, params, stream) -> None:
    """Copy `device_params`' four arrays into row `row` of the session's sampler settings."""
    for name, host in zip(PARAM_ROWS, params):
        acts[name][row].copy_to_device(host, stream=stream)


def _window_held(sampling: SamplingParams) -> bool:
    """Whether the device sampler's block holds the penalties' window (or none applies)."""
    return not sampling.penalised or sampling.repeat_last_n <= THREADS


def picks(sampling: SamplingParams | None) -> bool:
    """Whether the device sampler draws from the host `Sampler`'s distribution for `sampling`
    (its random numbers aside), with a penalty window its block holds and a logit bias its
    table holds (MAX_BIAS entries): greedy; top-k 1..256; or top-k 0 with top-p 1 and min-p 0
    (every token kept). Top-k 0 with a top-p or min-p cut, and top-k past 256, are left to the
    host: the device keeps at most the 256 best there."""
    if sampling is None:
        return True
    if len(sampling.logit_bias) > MAX_BIAS:
        return False
    if sampling.greedy:
        return _window_held(sampling)
    every = sampling.top_k == 0 and sampling.top_p >= 1.0 and sampling.min_p <= 0.0
    return _window_held(sampling) and (1 <= sampling.top_k <= KMAX or every)


def may_fall_back(sampling: SamplingParams | None) -> bool:
    """Settings the batched engine's sampler draws on the device from its 256 best and every
    token's mass, handing the logits back to the host where the cut lies past those 256: top-k
    0 with a top-p or min-p cut (a penalty window its block holds, a bias its table holds).
    `picks` leaves them out: `generate` feeds each token on the device before it reads it."""
    if sampling is None or sampling.greedy or sampling.top_k != 0:
        return False
    return (_window_held(sampling) and len(sampling.logit_bias) <= MAX_BIAS
            and (sampling.top_p < 1.0 or sampling.min_p > 0.0))


class TokenRing:
    """Two pinned int32 slots a stream copies picked tokens into, each copy followed by its
    slot's event: token i in slot i % 2 (a slot is read before the copy of token i + 2 reuses
    it: the reader is never more than one token behind). With each token, the pick's NaN flag
    (`sampling`'s third state entry) where one is given: reading a token whose logits held a
    NaN raises, as the host `Sampler` does."""

    def __init__(self):
        from numba import cuda
        self.slots = cuda.pinned_array(2, np.int32)  # [2] i32
        self.flags = cuda.pinned_array(2, np.uint64)  # [2] u64, copies of the NaN flag
        self.flags[:] = 0
        self.events = (cuda.event(), cuda.event())

    def fetch(self, history, pos: int, i: int, stream, nan_flag=None):
        """Copy history[pos] (device int32) into slot i % 2 on `stream`, and `nan_flag`
        (device uint64 [1]) beside it; returns the slot's event."""
        s = i % 2
        history[pos:pos + 1].copy_to_host(self.slots[s:s + 1], stream=stream)
        if nan_flag is not None:
            nan_flag.copy_to_host(self.flags[s:s + 1], stream=stream)
        self.events[s].record(stream)
        return self.events[s]

    def read(self, i: int, event) -> int:
        event.synchronize()
        if self.flags[i % 2]:
            raise nan_error(f"generated token {i}")
        return int(self.slots[i % 2])


def nan_error(where: str) -> ValueError:
    """The error for a pick whose logits held a NaN (as the host `Sampler` refuses them)."""
    return ValueError(f"logits contain NaN ({where}): the engine produced invalid values; no "
                      f"token is picked from them")


def clear_nan(flag, stream) -> None:
    """Zero a pick's NaN flag (device uint64 [1]) on `stream`."""
    flag.copy_to_device(np.zeros(1, np.uint64), stream=stream)


def run_ahead(*, limit: int, first: Callable[[], object], step: Callable[[int], object],
              read: Callable[[int, object], int], can_step: Callable[[], bool],
              finish: Callable[[bool], None]) -> Iterator[int]:
    """Yield up to `limit` tokens. `first()` enqueues the pick of token 0 and its copy, and
    returns what `read(0, ...)` waits on; `step(i)` enqueues the step that feeds token i and
    the copy of token i+1, likewise; `can_step()` says whether the context holds one more fed
    token. `finish(undo)` runs once at the end (when the generator is closed or exhausted),
    undo True where the last token read was fed and that step must be taken back."""
    if limit < 1:  # here, not at the first token: the generator below starts lazily
        raise ValueError(f"limit must be at least 1, got {limit}")
    return _tokens(limit, first, step, read, can_step, finish)


def _tokens(limit, first, step, read, can_step, finish) -> Iterator[int]:
    pending, n_read, fed = first(), 0, 0
    try:
        while pending is not None:
            ahead = None
            if n_read + 1 < limit and can_step():
                ahead = step(n_read)
                fed += 1
            tok = read(n_read, pending)
            n_read += 1
            yield tok
            pending = ahead
    finally:
        finish(fed == n_read)
