"""Helper tiers: VRAM a card has left after its stage is planned holds the globally hottest
(layer, expert) pairs that no stage cache holds, and any stage's misses can hit it.

Tiers are disjoint by construction: one `claimed` bitmap starts as every stage cache's pairs and
each tier marks what it takes. They are opened fastest card first (the order only decides whose
link serves the hottest leftover pairs). Selection is by byte budget: slots differ in size by
layer, so a pair that does not fit is skipped, not a stop (a colder, smaller one may still fit).
Under `tier_min_bytes` of leftover no tier opens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.gguf.shape import ModelShape
from strata.plan.cache import CacheLayout, cache_layout, slot_strides


@dataclass(frozen=True, slots=True, eq=False)
class HelperTier:
    """One card's helper tier: the pairs it holds, as sized slots."""

    device: int  # the GPU's index
    budget_bytes: int  # the leftover it was given
    cache: CacheLayout  # its slots (global layer indices)

    @property
    def n_slots(self) -> int:
        return self.cache.n_slots

    def to_dict(self) -> dict:
        return {"device": self.device, "budget_bytes": self.budget_bytes,
                "slots": self.cache.n_slots, "bytes": self.cache.total_bytes,
                "slots_per_layer": list(self.cache.slots_per_layer)}


def select_tier_pairs(ranked: np.ndarray, claimed: np.ndarray, slot_bytes: np.ndarray,
                      budget_bytes: int) -> np.ndarray:
    """The hottest unclaimed pairs of `ranked` [n, 2] whose slots (`slot_bytes` [n_layer],
    aligned) fit `budget_bytes`, walked hot-first, skipping a pair that does not fit. Marks them
    in `claimed` [n_layer, n_expert] bool. Returns [m, 2] int32 in walk order."""
    free = ranked[~claimed[ranked[:, 0], ranked[:, 1]]]
    size = slot_bytes[free[:, 0]]
    cum = np.cumsum(size)
    n = int(np.searchsorted(cum, budget_bytes, side="right"))  # the prefix that fits
    left = budget_bytes - (int(cum[n - 1]) if n else 0)
    keep = list(range(n))
    if n < len(free) and left >= int(size[n:].min()):
        for i in range(n, len(free)):
            if size[i] <= left:
                keep.append(i)
                left -= int(size[i])
    out = free[keep].astype(np.int32).reshape(-1, 2)
    claimed[out[:, 0], out[:, 1]] = True
    return out


def tier_order(budgets: list[tuple[int, int]], bandwidth: list[float]) -> list[int]:
    """Positions of `budgets` [(device index, bytes)] in opening order: fastest card first,
    then the lower index."""
    return sorted(range(len(budgets)), key=lambda i: (-bandwidth[i], budgets[i][0]))


def plan_tiers(shape: ModelShape, ranked: np.ndarray, stage_pairs: list[np.ndarray],
               budgets: list[tuple[int, int]], bandwidth: list[float], *,
               min_bytes: int) -> list[HelperTier | None]:
    """One tier (or None) per entry of `budgets` [(device index, leftover bytes)], in the same
    order; `stage_pairs` are the pairs the stage caches hold (claimed from the start)."""
    claimed = np.zeros((shape.n_layer, shape.n_expert), bool)
    for p in stage_pairs:
        claimed[p[:, 0], p[:, 1]] = True
    strides = slot_strides(shape)
    out: list[HelperTier | None] = [None] * len(budgets)
    for i in tier_order(budgets, bandwidth):
        dev, budget = budgets[i]
        if budget < min_bytes:
            continue
        pairs = select_tier_pairs(ranked, claimed, strides, budget)
        if not len(pairs):
            continue
        counts = np.bincount(pairs[:, 0], minlength=shape.n_layer)
        lay = cache_layout(shape, tuple(int(c) for c in counts), order=pairs[:, 0],
                           experts=pairs[:, 1])
        out[i] = HelperTier(dev, budget, lay)
    return out
