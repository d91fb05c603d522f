"""The placement search: every contiguous placement of L layers on G GPUs (C(L-1, G-1) of them,
each GPU running one non-empty range, in GPU order) scored by predicted seconds per decode token.

A stage's score depends only on its own range and its own card (each ranked pair belongs to the
one stage that owns its layer, and a stage's cache is its own budget's hot-first walk over its
own layers' pairs, stopping at the first pair that does not fit), so it is computed once per
(stage, range) into a table, and a placement's score is the sum of its stages' entries. The
tables are filled for all ranges at once from prefix tables of the walk (`Walks`); the best
placement is then a min-plus pass over the cut points, which finds the minimum over every
placement exactly (a test checks it against scoring each placement by brute force).

The walk a stage is scored by is the prefix of its hot-first walk; the stage's real cache
(`strata.plan.cache.select_pairs`) may add the few colder pairs a smaller blob lets fit in the
last partial slot's bytes, which the score ignores.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from strata.gguf.shape import ModelShape
from strata.plan.cache import slot_strides
from strata.plan.profile import RoutingProfile
from strata.plan.split.cost import layer_seconds

INF = float("inf")


@dataclass(frozen=True, slots=True, eq=False)
class Walks:
    """Prefix tables of the global hot-first walk: after the first p ranked pairs, how many of
    each layer's experts are taken (`count`), and, summed over layers < l, their count and
    their slots' bytes (`cum_count`, `cum_bytes`). A range [lo, hi)'s walk after p pairs holds
    cum_*[p, hi] - cum_*[p, lo]."""

    count: np.ndarray  # [n_pairs + 1, n_layer] int32
    cum_count: np.ndarray  # [n_pairs + 1, n_layer + 1] int64
    cum_bytes: np.ndarray  # [n_pairs + 1, n_layer + 1] int64

    @classmethod
    def build(cls, shape: ModelShape, profile: RoutingProfile) -> Walks:
        layer = profile.ranked_pairs()[:, 0]
        n, n_l = len(layer), shape.n_layer
        count = np.zeros((n + 1, n_l), np.int32)
        count[np.arange(1, n + 1), layer] = 1
        np.cumsum(count, axis=0, out=count)
        zero = np.zeros((n + 1, 1), np.int64)
        cum_count = np.concatenate([zero, np.cumsum(count, axis=1, dtype=np.int64)], axis=1)
        per = count.astype(np.int64) * slot_strides(shape)[None, :]
        cum_bytes = np.concatenate([zero, np.cumsum(per, axis=1)], axis=1)
        return cls(count, cum_count, cum_bytes)

    @property
    def n_pairs(self) -> int:
        return self.count.shape[0] - 1

    def prefix(self, lo: np.ndarray, hi: np.ndarray, limit: np.ndarray, *,
               by_slots: bool) -> np.ndarray:
        """For each range, the largest p whose walk holds at most `limit` bytes (or slots, with
        `by_slots`); vectorised bisection. A negative limit gives 0."""
        t = self.cum_count if by_slots else self.cum_bytes
        a = np.zeros(len(lo), np.int64)
        b = np.full(len(lo), self.n_pairs, np.int64)
        while True:
            live = a < b
            if not live.any():
                return a
            mid = (a + b + 1) // 2
            ok = t[mid, hi] - t[mid, lo] <= limit
            a = np.where(live & ok, mid, a)
            b = np.where(live & ~ok, mid - 1, b)


@dataclass(frozen=True, slots=True, eq=False)
class StageTable:
    """One stage's score of every range: seconds per token (inf where the range does not fit
    its card) and the pairs its cache holds. Indexed [lo, hi]."""

    seconds: np.ndarray  # [n_layer + 1, n_layer + 1] f64
    held: np.ndarray  # [n_layer + 1, n_layer + 1] int64


@dataclass(frozen=True, slots=True)
class CostInputs:
    """What a stage's score needs besides its budget."""

    n_expert: int
    k: int
    b: float
    dense_bytes: np.ndarray  # [n_layer] per-layer dense bytes read per token
    blob_bytes: np.ndarray  # [n_layer] one expert's bytes
    host_bandwidth: float

    @classmethod
    def of(cls, shape: ModelShape, b: float, host_bandwidth: float) -> CostInputs:
        dense = np.array([shape.layer_dense_bytes(i) for i in range(shape.n_layer)], np.float64)
        blob = np.array([shape.expert_slot_bytes(i) for i in range(shape.n_layer)], np.float64)
        return cls(shape.n_expert, shape.n_expert_used, b, dense, blob, host_bandwidth)


def stage_table(walks: Walks, cost: CostInputs, budget: np.ndarray, *, bandwidth: float,
                pinned_slots: int | None = None, floor_per_layer: int = 0,
                extra_seconds: float = 0.0) -> StageTable:
    """Score every range of one stage. `budget[lo, hi]` is the bytes its cache may take with
    that range (the card less the range's fixed regions); `pinned_slots` fixes the cache's size
    instead; a range whose walk holds fewer than `floor_per_layer` pairs per layer (or whose
    pinned cache does not fit) gets inf. `extra_seconds` is added to every range (the head on
    the last stage)."""
    n_l = walks.count.shape[1]
    lo, hi = np.triu_indices(n_l + 1, k=1)
    lim = budget[lo, hi]
    if pinned_slots is None:
        p = walks.prefix(lo, hi, lim, by_slots=False)
        ok = lim >= 0
    else:
        p = walks.prefix(lo, hi, np.full(len(lo), pinned_slots), by_slots=True)
        ok = walks.cum_bytes[p, hi] - walks.cum_bytes[p, lo] <= lim
    held = walks.cum_count[p, hi] - walks.cum_count[p, lo]
    ok &= held >= floor_per_layer * (hi - lo)
    per_layer = layer_seconds(walks.count[np.unique(p)], n_expert=cost.n_expert, k=cost.k,
                              b=cost.b, dense_bytes=cost.dense_bytes, blob_bytes=cost.blob_bytes,
                              bandwidth=bandwidth, host_bandwidth=cost.host_bandwidth)
    rows = np.searchsorted(np.unique(p), p)
    cum = np.concatenate([np.zeros((len(per_layer), 1)), np.cumsum(per_layer, axis=1)], axis=1)
    secs = cum[rows, hi] - cum[rows, lo] + extra_seconds
    seconds = np.full((n_l + 1, n_l + 1), INF)
    seconds[lo, hi] = np.where(ok, secs, INF)
    held_t = np.zeros((n_l + 1, n_l + 1), np.int64)
    held_t[lo, hi] = held
    return StageTable(seconds, held_t)


@dataclass(frozen=True, slots=True)
class Placement:
    """The chosen contiguous placement: `cuts` are the first layers of stages 1..G-1."""

    cuts: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]
    seconds_per_token: float  # predicted (inf: no placement fits)
    stage_seconds: tuple[float, ...]
    n_placements: int  # C(L-1, G-1): every placement the minimum was taken over
    search_seconds: float
    how: str  # "auto" | "explicit"

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.seconds_per_token)


def ranges_of(cuts: tuple[int, ...], n_layer: int) -> tuple[tuple[int, int], ...]:
    edges = (0, *cuts, n_layer)
    return tuple(itertools.pairwise(edges))


def score(tables: list[StageTable], cuts: tuple[int, ...]) -> float:
    """The predicted seconds per token of one placement."""
    n_l = tables[0].seconds.shape[0] - 1
    return float(sum(t.seconds[a, b] for t, (a, b) in zip(tables, ranges_of(cuts, n_l))))


def best_placement(tables: list[StageTable], *, started: float | None = None) -> Placement:
    """The placement of least predicted time over all C(L-1, G-1) (ties: earliest cuts)."""
    t0 = time.perf_counter() if started is None else started
    g_n, n_l = len(tables), tables[0].seconds.shape[0] - 1
    best = tables[0].seconds[0].copy()  # [n_layer + 1]: stage 0 ends at b
    back = []
    for t in tables[1:]:
        total = best[:, None] + t.seconds  # [a, b]: the previous stages end at a, this at b
        arg = np.argmin(total, axis=0)
        best = total[arg, np.arange(n_l + 1)]
        back.append(arg)
    cuts, end = [], n_l
    for arg in reversed(back):
        end = int(arg[end])
        cuts.append(end)
    cuts_t = tuple(reversed(cuts))
    return _placement(tables, cuts_t, "auto", math.comb(n_l - 1, g_n - 1), t0)


def explicit_placement(tables: list[StageTable], cuts: tuple[int, ...]) -> Placement:
    return _placement(tables, cuts, "explicit", 1, time.perf_counter())


def _placement(tables, cuts, how, n, t0) -> Placement:
    n_l = tables[0].seconds.shape[0] - 1
    rs = ranges_of(cuts, n_l)
    per = tuple(float(t.seconds[a, b]) for t, (a, b) in zip(tables, rs))
    return Placement(cuts, rs, float(sum(per)), per, n, time.perf_counter() - t0, how)
