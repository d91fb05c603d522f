"""The routing profile: which (layer, expert) pairs are hot, the cache's fill order, and the
decode hit rate a cache of given slots is expected to reach.

Three sources, best first: measured per-(layer, expert) counts; a hot-first ranking per layer
without counts (a synthetic file's `strata.synth.expert_rank`); nothing (uniform). Without counts
the hit rate follows the coverage curve H(f) = 1 - (1 - f)^3 of the fraction f of a layer's
experts held: routing is skewed enough that a cache holding half of a layer's experts catches
about 7/8 of its routed tokens (REFERENCE.md: ~65 of 128 experts cover 90% on Qwen3-30B-A3B).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

COVERAGE_EXPONENT = 3
EXPERT_RANK_KEY = "strata.synth.expert_rank"
EXPERT_SHARE_KEY = "strata.synth.expert_share"


def coverage(f: np.ndarray | float) -> np.ndarray | float:
    """The default hit-rate curve: share of routed tokens caught when holding fraction f."""
    return 1.0 - (1.0 - np.clip(f, 0.0, 1.0)) ** COVERAGE_EXPONENT


@dataclass(frozen=True, slots=True, eq=False)
class RoutingProfile:
    """Per layer, the experts in hot-first order (`rank`), and optionally their routing share."""

    rank: np.ndarray  # [n_layer, n_expert] int32: expert ids, hottest first
    share: np.ndarray | None  # [n_layer, n_expert] f64: routed share (rows sum to 1), or None
    source: str  # "counts", "expert_rank" or "uniform"
    _ranked: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.rank.ndim != 2:
            raise ValueError(f"expert ranking must be [n_layer, n_expert], got {self.rank.shape}")
        want = np.arange(self.rank.shape[1])
        for layer, row in enumerate(self.rank):
            if not np.array_equal(np.sort(row), want):
                raise ValueError(f"expert ranking of layer {layer} is not a permutation of "
                                 f"0..{self.rank.shape[1] - 1}")
        ranked = self._rank_pairs()
        ranked.setflags(write=False)
        object.__setattr__(self, "_ranked", ranked)

    @property
    def n_layer(self) -> int:
        return self.rank.shape[0]

    @property
    def n_expert(self) -> int:
        return self.rank.shape[1]

    @classmethod
    def uniform(cls, n_layer: int, n_expert: int) -> "RoutingProfile":
        rank = np.tile(np.arange(n_expert, dtype=np.int32), (n_layer, 1))
        return cls(rank, None, "uniform")

    @classmethod
    def from_rank(cls, rank: np.ndarray, n_layer: int, n_expert: int,
                  share_by_rank: np.ndarray | None = None, *,
                  source: str | None = None) -> "RoutingProfile":
        """A ranking (flat, row-major by (layer, rank), or [n_layer, n_expert]), e.g. a synthetic
        file's metadata; with `share_by_rank` [n_expert] (the share of selections the expert of
        each rank gets, the same in every layer) the hit rate is exact instead of the curve.
        `source` (the file it came from) starts the message of a ranking refused."""
        key = f"{source}: {EXPERT_RANK_KEY}" if source else EXPERT_RANK_KEY
        a = np.asarray(rank)
        if a.size != n_layer * n_expert:
            raise ValueError(f"{key}: {a.size} values, expected n_layer * n_expert "
                             f"= {n_layer} * {n_expert} = {n_layer * n_expert}")
        if a.size and a.dtype.kind not in "iu":
            raise ValueError(f"{key}: expert ids must be integers, got {a.dtype}")
        # checked before any use as an index (put_along_axis below), in the file's own type:
        # a uint32 past int32 would wrap to a negative id that indexes from the end
        flat = a.reshape(-1)
        out = np.flatnonzero((flat < 0) | (flat >= n_expert))
        if out.size:
            i = int(out[0])
            raise ValueError(f"{key}: value {int(flat[i])} (layer {i // n_expert}, rank "
                             f"{i % n_expert}) is not an expert id 0..{n_expert - 1}")
        r = a.reshape(n_layer, n_expert).astype(np.int32)
        want = np.arange(n_expert)
        for layer, row in enumerate(r):
            if not np.array_equal(np.sort(row), want):
                raise ValueError(f"{key}: layer {layer} is not a permutation of "
                                 f"0..{n_expert - 1}")
        share = None
        if share_by_rank is not None:
            s = np.asarray(share_by_rank, dtype=np.float64).reshape(-1)
            if s.size != n_expert or not np.all(np.isfinite(s)) or np.any(s < 0) or s.sum() <= 0:
                raise ValueError(f"{EXPERT_SHARE_KEY}: expected {n_expert} non-negative shares, "
                                 f"got {s.size} values")
            share = np.empty((n_layer, n_expert))
            np.put_along_axis(share, r, np.broadcast_to(s / s.sum(), r.shape), axis=1)
        return cls(r, share, "expert_rank")

    @classmethod
    def from_counts(cls, counts: np.ndarray, n_layer: int, n_expert: int) -> "RoutingProfile":
        """Measured routing counts [n_layer, n_expert] (any non-negative numbers)."""
        c = np.asarray(counts, dtype=np.float64)
        if c.shape != (n_layer, n_expert):
            raise ValueError(f"routing profile is {list(c.shape)}, this model needs "
                             f"[{n_layer}, {n_expert}]")
        if not np.all(np.isfinite(c)) or np.any(c < 0):
            raise ValueError("routing profile counts must be finite and non-negative")
        tot = c.sum(axis=1, keepdims=True)
        share = np.where(tot > 0, c / np.where(tot > 0, tot, 1), 1.0 / n_expert)
        rank = np.argsort(-share, axis=1, kind="stable").astype(np.int32)
        return cls(rank, share, "counts")

    def ranked_pairs(self) -> np.ndarray:
        """Every (layer, expert) pair, hot-first across layers: [n_layer * n_expert, 2] int32.
        (Computed once; do not modify.)"""
        return self._ranked

    def _rank_pairs(self) -> np.ndarray:
        """The fill order.

        Pairs are ordered by routing share; equal shares (always, without counts) go by their
        rank inside their layer, then by layer, so layers are interleaved fairly.
        """
        n_l, n_e = self.rank.shape
        layer = np.repeat(np.arange(n_l), n_e)
        j = np.tile(np.arange(n_e), n_l)  # rank inside the layer
        expert = self.rank.reshape(-1)
        if self.share is None:
            order = np.lexsort((layer, j))
        else:
            s = self.share[layer, expert]
            order = np.lexsort((layer, j, -s))
        return np.stack([layer[order], expert[order]], axis=1).astype(np.int32)

    def hit_rate(self, cached: np.ndarray) -> float:
        """Expected decode hit rate of a cache holding `cached` [n_pairs, 2] (layer, expert):
        the routed share it holds, averaged over layers."""
        n_l, n_e = self.rank.shape
        held = np.zeros((n_l, n_e), dtype=bool)
        if len(cached):
            held[cached[:, 0], cached[:, 1]] = True
        if self.share is not None:
            return float(np.mean(np.sum(self.share * held, axis=1)))
        return float(np.mean(coverage(held.sum(axis=1) / n_e)))
