"""`Sampler`: picks the next token from logits — greedy, or temperature sampling narrowed by
top-k, top-p and min-p, with a logit bias, repeat, presence and frequency penalties and a seed.
Backend-independent (numpy). `token_logprobs`: what a token's logits said of it (the API's
`logprobs`).

Order, per token: the logit bias (added to the named tokens' logits, as OpenAI defines it);
the penalties on the logits of the tokens among the last `repeat_last_n` of
the sequence (prompt included, as llama.cpp counts them): the repeat penalty (divide a positive
logit, multiply a negative one), then minus presence + frequency * the token's count there;
then, when temperature is 0, the arg-max; otherwise top-k, softmax at the temperature, top-p
(the smallest set of most likely tokens whose probability reaches p), min-p (drop tokens below
p times the most likely one's probability), renormalise, draw.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np


PENALTY_LAST_N = 64  # the recent tokens the penalties look at by default (llama.cpp's window)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. `temperature=0` is greedy; `top_k=0`, `top_p=1`, `min_p=0`,
    `repeat_penalty=1` and the presence and frequency penalties 0 turn those off; `seed=None`
    draws a fresh seed."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = PENALTY_LAST_N  # how many recent tokens the penalties look at
    seed: int | None = None
    presence_penalty: float = 0.0   # subtracted once from a recent token's logit
    frequency_penalty: float = 0.0  # subtracted per occurrence among the recent tokens
    # (token id, bias) pairs added to those tokens' logits before anything else; ids unique
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not (np.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (np.isfinite(self.repeat_penalty) and self.repeat_penalty > 0):
            raise ValueError(f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite (0 = off), got {getattr(self, name)}")
        if self.repeat_last_n < 0:
            raise ValueError(f"repeat_last_n must be >= 0, got {self.repeat_last_n}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        ids = [int(t) for t, _ in self.logit_bias]
        if any(t < 0 for t in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"logit_bias: token ids must be >= 0 and unique, got {ids}")
        if not all(np.isfinite(b) for _, b in self.logit_bias):
            raise ValueError("logit_bias: every bias must be finite")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        """Whether any penalty changes the logits of recent tokens."""
        return (self.repeat_last_n > 0 and (self.repeat_penalty != 1.0
                                            or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0))


def apply_logit_bias(logits: np.ndarray, bias: tuple[tuple[int, float], ...]) -> np.ndarray:
    """float32 logits with each named token's bias added (a copy where any is given)."""
    logits = np.asarray(logits, dtype=np.float32)
    if not bias:
        return logits
    ids = np.array([t for t, _ in bias], np.int64)
    if ids.max() >= logits.size:
        raise ValueError(f"logit_bias: token id {int(ids.max())} is outside the vocabulary "
                         f"(0..{logits.size - 1})")
    out = logits.copy()
    out[ids] += np.array([b for _, b in bias], np.float32)
    return out


LOGPROB_FLOOR = -9999.0  # what a token of probability 0 reports (OpenAI's value; JSON has no -inf)


def token_logprobs(logits: np.ndarray, token: int, n_top: int
                   ) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The log-probability of `token` under the softmax of `logits` (the model's own
    distribution: before bias, penalties, temperature and filters, as vLLM reports it by
    default), and the `n_top` most likely tokens with theirs, most likely first (ties by id);
    none below LOGPROB_FLOOR. The exponentials in float32 (the logits' own precision), summed
    and subtracted in float64: 0.33-0.56 ms a token at 152K logits on the 2-core CPU, against
    1.0 for a bare float64 log-softmax (bench/probes/constraint_costs.py)."""
    z = np.asarray(logits, dtype=np.float32)  # [n_vocab]
    top = z.max() if z.size else np.float32(np.nan)  # NaN wherever one is
    if not np.isfinite(top):
        raise ValueError("logits hold NaN, +inf or no finite value: no log-probabilities "
                         "from them")
    lse = float(top) + math.log(float(np.exp(z - top).sum(dtype=np.float64)))
    pairs: tuple[tuple[int, float], ...] = ()
    n = min(n_top, z.size)
    if n > 0:
        cut = np.partition(z, z.size - n)[z.size - n]  # the n-th largest
        cand = np.flatnonzero(z >= cut)  # every tie at the cut, to take the lowest ids
        order = cand[np.lexsort((cand, -z[cand]))][:n]  # by logit, then id
        pairs = tuple((int(i), max(float(z[i]) - lse, LOGPROB_FLOOR)) for i in order)
    return max(float(z[int(token)]) - lse, LOGPROB_FLOOR), pairs


def apply_penalties(logits: np.ndarray, recent: np.ndarray, repeat: float,
                    presence: float = 0.0, frequency: float = 0.0) -> np.ndarray:
    """float32 logits with those of the tokens in `recent` made less likely (a negative presence
    or frequency penalty, more): divided by `repeat` when positive, multiplied when negative (once
    per token, however often it repeats), then minus presence + frequency * its count in
    `recent`, in float32 as the device sampler does it."""
    logits = np.asarray(logits, dtype=np.float32)
    if recent.size == 0 or (repeat == 1.0 and presence == 0.0 and frequency == 0.0):
        return logits
    out = logits.copy()
    ids, counts = np.unique(recent, return_counts=True)
    vals = out[ids]
    with np.errstate(over="ignore", divide="ignore"):  # a huge boost is +inf: see filtered_support
        if repeat != 1.0:
            vals = np.where(vals > 0, vals / np.float32(repeat), vals * np.float32(repeat))
        if presence != 0.0 or frequency != 0.0:
            vals = vals - (np.float32(presence) + np.float32(frequency) * counts.astype(np.float32))
    out[ids] = vals
    return out


# A top-p cut is looked for among the most likely 1024, then 16384 tokens; only where they hold
# less than p (a flat distribution), or tie with a token outside them, is the whole vocabulary
# sorted. Sorting all 152k probabilities took 4.8 ms a token (20 ms without top-k), more than a
# batched decode step of 8 sequences on the GPU.
TOP_P_CANDIDATES = (1024, 16384)


def _top_p_keep(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Positions (into `probs`) of the smallest set of most likely tokens whose probability
    reaches top_p, ties taken in position order."""
    for n_cand in TOP_P_CANDIDATES:
        if probs.size <= n_cand:
            break
        cand = np.argpartition(-probs, n_cand - 1)[:n_cand]
        if probs[cand].sum() < top_p:
            continue
        rest = np.ones(probs.size, bool)
        rest[cand] = False
        if probs[cand].min() > probs[rest].max():
            order = cand[np.lexsort((cand, -probs[cand]))]  # by probability, then position
            before = np.cumsum(probs[order]) - probs[order]  # mass of the more likely tokens
            return order[before < top_p]
        break
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]
    return order[before < top_p]


def filtered_support(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The distribution a non-greedy draw uses, as its support: (token ids ascending, int64;
    their probabilities, float64, summing to 1). Every step works on the tokens still kept, so
    only top-p without top-k touches the whole vocabulary more than a few times."""
    z = np.asarray(logits)
    if np.isposinf(z).any():  # +inf (a repeat penalty's overflow) is the limit: those, shared
        z = np.where(np.isposinf(z), 0.0, -np.inf)
    keep = np.isfinite(z)
    if p.top_k and p.top_k < z.size:
        kth = np.partition(np.where(keep, z, -np.inf), -p.top_k)[-p.top_k]
        keep &= z >= kth
    ids = np.flatnonzero(keep)
    if ids.size == 0:
        raise ValueError("no finite logit to sample from")
    zz = z[ids].astype(np.float64)
    # Shifted before it is scaled: a tiny temperature (5e-324 passes every range check) would
    # turn z / t into inf and inf - inf into NaN; (z - max) / t only reaches -inf, exp 0.
    with np.errstate(over="ignore", divide="ignore"):
        probs = np.exp((zz - zz.max()) / p.temperature)
    probs /= probs.sum()
    if p.top_p < 1.0:
        kept = np.sort(_top_p_keep(probs, p.top_p))
        ids, probs = ids[kept], probs[kept]
    if p.min_p > 0.0:
        kept = probs >= p.min_p * probs.max()
        ids, probs = ids[kept], probs[kept]
    return ids, probs / probs.sum()


def filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution a non-greedy draw uses: float64[n_vocab], zero outside the filters."""
    ids, probs = filtered_support(logits, p)
    out = np.zeros(np.asarray(logits).size, np.float64)
    out[ids] = probs
    return out


class Constraint(Protocol):
    """What tokens may come next (a grammar's view of the text so far)."""

    def allows(self, token: int) -> bool: ...

    def advance(self, token: int) -> None: ...


GREEDY_CANDIDATES = 64  # a constrained arg-max tries the most likely 64 before sorting them all


def constrained_argmax(z: np.ndarray, constraint: Constraint) -> int:
    """The most likely token the constraint allows (ties by id). The best 64 are tried first;
    past them, the constraint's `candidates()` where it has them (else every token), most
    likely first."""
    n = min(GREEDY_CANDIDATES, z.size)
    cand = np.argpartition(-z, n - 1)[:n]
    ordered = [cand[np.lexsort((cand, -z[cand]))]]
    if n < z.size:  # none of the best allowed
        pool = (constraint.candidates() if hasattr(constraint, "candidates")
                else np.arange(z.size))
        ordered.append(pool[np.lexsort((pool, -z[pool]))])
    for order in ordered:
        for t in order:
            if z[t] > -np.inf and constraint.allows(int(t)):  # never a token of probability 0
                return int(t)
    raise ValueError("no token the model can give continues the constrained text")


def constrained_draw(z: np.ndarray, p: SamplingParams, rng: np.random.Generator,
                     constraint: Constraint) -> int:
    """A draw from the filtered distribution restricted to the tokens the constraint allows:
    draw, and where the token is not allowed, drop it, renormalise, draw again (exactly the
    restricted distribution). Where no token of the filtered support is allowed, the most
    likely allowed token of the whole vocabulary."""
    ids, probs = filtered_support(z, p)
    probs = probs.copy()
    for _ in range(ids.size):
        i = int(rng.choice(ids.size, p=probs))
        if constraint.allows(int(ids[i])):
            return int(ids[i])
        probs[i] = 0.0
        total = probs.sum()
        if total <= 0.0:
            break
        probs /= total
    return constrained_argmax(z, constraint)


class Sampler:
    """Callable on float32[n_vocab] logits -> token id. Remembers the tokens it chose (and
    those given to `accept`, e.g. the prompt) for the penalties. A `constraint` (e.g. a JSON
    object's grammar) narrows every pick to the tokens it allows, after the penalties and the
    filters, and is advanced by each token picked."""

    def __init__(self, params: SamplingParams | None = None,
                 constraint: Constraint | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)
        self.recent: deque[int] = deque(maxlen=max(self.params.repeat_last_n, 1))
        self.constraint = constraint

    def accept(self, tokens) -> None:
        """Count tokens (prompt or generated elsewhere) as recent, for the penalties."""
        if self.params.repeat_last_n:  # only the window's worth of a long prompt
            self.recent.extend(int(t) for t in list(tokens)[-self.recent.maxlen:])

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        recent = np.fromiter(self.recent, dtype=np.int64) if p.repeat_last_n else np.zeros(0, int)
        z = apply_penalties(apply_logit_bias(logits, p.logit_bias), recent, p.repeat_penalty,
                            p.presence_penalty, p.frequency_penalty)
        if np.isnan(z).any():  # an engine fault: never a token picked from it
            raise ValueError(f"logits contain NaN at {np.flatnonzero(np.isnan(z))[:8].tolist()}")
        if self.constraint is not None:
            token = (constrained_argmax(z, self.constraint) if p.greedy
                     else constrained_draw(z, p, self.rng, self.constraint))
            self.constraint.advance(token)
        elif p.greedy:
            token = int(np.argmax(z))
        else:
            ids, probs = filtered_support(z, p)
            token = int(ids[self.rng.choice(ids.size, p=probs)])
        self.accept([token])
        return token
