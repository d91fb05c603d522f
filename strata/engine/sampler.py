"""`Sampler`: picks the next token from logits — greedy, or temperature sampling narrowed by
top-k, top-p and min-p, with a repeat penalty and a seed. Backend-independent (numpy).

Order, per token: repeat penalty on the logits of recent tokens; then, when temperature is 0,
the arg-max; otherwise top-k, softmax at the temperature, top-p (the smallest set of most likely
tokens whose probability reaches p), min-p (drop tokens below p times the most likely one's
probability), renormalise, draw.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. `temperature=0` is greedy; `top_k=0`, `top_p=1`, `min_p=0` and
    `repeat_penalty=1` turn those filters off; `seed=None` draws a fresh seed."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # how many recent tokens the penalty looks at
    seed: int | None = None

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
        if self.repeat_last_n < 0:
            raise ValueError(f"repeat_last_n must be >= 0, got {self.repeat_last_n}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_repeat_penalty(logits: np.ndarray, recent: np.ndarray, penalty: float) -> np.ndarray:
    """Logits of tokens in `recent` made less likely: divided by `penalty` when positive,
    multiplied when negative (each token once, however often it repeats)."""
    if penalty == 1.0 or recent.size == 0:
        return logits
    out = logits.copy()
    ids = np.unique(recent)
    vals = out[ids]
    out[ids] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution a non-greedy draw uses: float64[n_vocab], zero outside the filters."""
    z = logits.astype(np.float64)
    keep = np.isfinite(z)
    if p.top_k and p.top_k < z.size:
        kth = np.partition(z, -p.top_k)[-p.top_k]
        keep &= z >= kth
    z = np.where(keep, z / p.temperature, -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of the more likely tokens
        cut = np.zeros_like(probs, dtype=bool)
        cut[order[before >= p.top_p]] = True
        probs[cut] = 0.0
    if p.min_p > 0.0:
        probs[probs < p.min_p * probs.max()] = 0.0
    return probs / probs.sum()


class Sampler:
    """Callable on float32[n_vocab] logits -> token id. Remembers the tokens it chose (and
    those given to `accept`, e.g. the prompt) for the repeat penalty."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)
        self.recent: deque[int] = deque(maxlen=max(self.params.repeat_last_n, 1))

    def accept(self, tokens) -> None:
        """Count tokens (prompt or generated elsewhere) as recent, for the repeat penalty."""
        if self.params.repeat_last_n:
            self.recent.extend(int(t) for t in tokens)

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        recent = np.fromiter(self.recent, dtype=np.int64) if p.repeat_last_n else np.zeros(0, int)
        z = apply_repeat_penalty(np.asarray(logits, dtype=np.float32), recent, p.repeat_penalty)
        if p.greedy:
            token = int(np.argmax(z))
        else:
            probs = filtered_probs(z, p)
            token = int(self.rng.choice(probs.size, p=probs))
        self.accept([token])
        return token
