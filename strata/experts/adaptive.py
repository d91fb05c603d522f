"""`AdaptiveRanks`: a routing-adaptive expert cache — live routing counts re-rank the cache and
swap slots between requests.

The cache is first filled in the rank order of a profile (or the synthetic file's skew, or
uniform ranks); live traffic may route differently. The prompt path already reads each chunk's
per-expert token counts back to the host (it decides what to stream from them), so they are
recorded here per (layer, expert) at no extra cost. After a prompt (its loan refilled, before
the first decode step and outside any CUDA graph) `adapt` swaps, per layer, the hottest
non-resident experts into the slots of the coldest resident ones — only where the newcomer's
count beats the incumbent's by `margin` and `min_count`, so noise does not churn the cache,
and at most `max_swaps` per call (each swap copies one expert blob over PCIe). Counts decay by
`decay` per call, so the ranks follow the recent requests. A slot keeps its layer (the plan
sized it for that layer's blob), so slots move between experts of one layer, never across
layers. Every change goes through `ExpertCache.swap` (the slot table's one owner).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.experts.cache import ExpertCache


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """`margin`: a newcomer's count must exceed margin x the incumbent's; `min_count`: and the
    incumbent's by at least this many routings; `max_swaps`: per `adapt`; `decay`: the counts'
    factor per `adapt` (0: only the last request counts, 1: never forget)."""

    margin: float = 1.25
    min_count: float = 2.0
    max_swaps: int = 256
    decay: float = 0.5

    def __post_init__(self) -> None:
        if self.margin < 1.0:
            raise ValueError(f"margin {self.margin}: must be >= 1 (below 1 two experts could "
                             f"swap back and forth)")
        if self.min_count < 0 or self.max_swaps < 0:
            raise ValueError("min_count and max_swaps must be >= 0")
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"decay {self.decay}: expected a factor in [0, 1]")


class AdaptiveRanks:
    """Decayed routing counts per (layer, expert) and the slot swaps they call for."""

    def __init__(self, n_layer: int, n_expert: int, config: AdaptiveConfig | None = None):
        self.config = config or AdaptiveConfig()
        self.counts = np.zeros((n_layer, n_expert), np.float64)  # [n_layer, n_expert]
        self.n_swaps = 0
        self.n_adapts = 0

    def observe(self, layer: int, counts: np.ndarray) -> None:
        """Add one chunk's (or step's) routings of `layer`: counts [n_expert], tokens per
        expert."""
        counts = np.asarray(counts)
        if counts.shape != self.counts.shape[1:]:
            raise ValueError(f"counts of shape {counts.shape}, expected "
                             f"({self.counts.shape[1]},)")
        self.counts[layer] += counts

    def plan_swaps(self, cache: ExpertCache) -> list[tuple[int, int, int]]:
        """(slot, layer, expert) swaps, largest gain first, at most `max_swaps`."""
        c = self.config
        found: list[tuple[float, int, int, int]] = []
        for layer in np.unique(cache.layout.slot_layer):
            slots = np.flatnonzero(cache.layout.slot_layer == layer)
            held = cache.pair[slots, 1]  # -1: an empty slot
            score = self.counts[layer]
            inc = np.where(held >= 0, score[np.maximum(held, 0)], -np.inf)
            inc_order = np.argsort(inc, kind="stable")  # coldest slot first
            outside = np.flatnonzero(cache.table[layer] < 0)
            new = outside[np.argsort(-score[outside], kind="stable")]  # hottest first
            for j, e in zip(inc_order, new):
                s_in, s_out = score[e], inc[j]
                if s_in <= 0 or s_in < c.margin * s_out or s_in - s_out < c.min_count:
                    break  # the rest of the newcomers are colder, the incumbents hotter
                found.append((s_in - (s_out if np.isfinite(s_out) else 0.0), int(slots[j]),
                              int(layer), int(e)))
        found.sort(key=lambda t: -t[0])
        return [(slot, layer, e) for _, slot, layer, e in found[:c.max_swaps]]

    def adapt(self, cache: ExpertCache) -> int:
        """Apply the planned swaps to `cache` (no loan may be out), then decay the counts;
        returns the swaps made."""
        swaps = self.plan_swaps(cache)
        for slot, layer, expert in swaps:
            cache.swap(slot, layer, expert)
        self.counts *= self.config.decay
        self.n_swaps += len(swaps)
        self.n_adapts += 1
        return len(swaps)
