"""The routing-adaptive cache (`AdaptiveRanks`) over the real `ExpertCache` and a device fake:
hot newcomers displace cold incumbents of their own layer, noise below the margin does not
churn, empty slots fill first, the swap budget takes the largest gains, counts decay, and the
device table stays the host's."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.moe_shapes import tiny
from strata.experts import ExpertCache
from strata.experts.adaptive import AdaptiveConfig, AdaptiveRanks
from strata.plan import RoutingProfile, fill_cache
from strata.plan.cache import cache_layout
from test_experts_cache import FakeDevice, _device_agrees

N_LAYER, N_EXPERT = 2, 8


def _cache(n_slots=6):
    shape = tiny(n_layer=N_LAYER, n_expert=N_EXPERT)
    rank = np.tile(np.arange(N_EXPERT), (N_LAYER, 1))  # experts 0, 1, 2 ... hottest first
    layout = fill_cache(shape, RoutingProfile.from_rank(rank, N_LAYER, N_EXPERT),
                        n_slots=n_slots)
    dev = FakeDevice(layout.n_slots)
    cache = ExpertCache(layout, N_LAYER, N_EXPERT, dev)
    cache.fill()
    return cache, dev


def _held(cache, layer):
    return set(np.flatnonzero(cache.table[layer] >= 0).tolist())


def test_hot_newcomers_replace_the_coldest_of_their_layer():
    cache, dev = _cache()
    assert _held(cache, 0) == _held(cache, 1) == {0, 1, 2}
    ranks = AdaptiveRanks(N_LAYER, N_EXPERT, AdaptiveConfig(decay=0.5))
    ranks.observe(0, [5, 1, 4, 0, 0, 0, 9, 7])  # layer 0 now prefers 6 and 7 over 1 and 2
    ranks.observe(1, [3, 3, 3, 0, 0, 0, 0, 1])  # layer 1: its residents stay the hottest
    assert ranks.adapt(cache) == 2
    assert _held(cache, 0) == {0, 6, 7} and _held(cache, 1) == {0, 1, 2}
    cache.check()
    _device_agrees(cache, dev)
    slot_layers = cache.layout.slot_layer[cache.table[0][[6, 7]]]
    assert (slot_layers == 0).all()  # a slot keeps its layer
    np.testing.assert_allclose(ranks.counts[0], np.array([5, 1, 4, 0, 0, 0, 9, 7]) * 0.5)
    assert ranks.n_swaps == 2 and ranks.n_adapts == 1


def test_noise_within_the_margin_does_not_churn():
    cache, dev = _cache()
    ranks = AdaptiveRanks(N_LAYER, N_EXPERT, AdaptiveConfig(margin=1.5, min_count=2))
    ranks.observe(0, [4, 4, 4, 5, 0, 0, 0, 0])  # 5 < 1.5 x 4
    ranks.observe(1, [1, 1, 1, 2, 0, 0, 0, 0])  # 2 - 1 < min_count
    n_writes = dev.writes
    assert ranks.plan_swaps(cache) == [] and ranks.adapt(cache) == 0
    assert dev.writes == n_writes  # nothing pushed


def test_empty_slots_fill_first_and_the_budget_takes_the_largest_gains():
    shape = tiny(n_layer=N_LAYER, n_expert=N_EXPERT)
    layout = cache_layout(shape, (2, 2))  # no experts named: the slots start empty
    dev = FakeDevice(layout.n_slots)
    cache = ExpertCache(layout, N_LAYER, N_EXPERT, dev)
    ranks = AdaptiveRanks(N_LAYER, N_EXPERT, AdaptiveConfig(max_swaps=3, min_count=1))
    ranks.observe(0, [0, 9, 0, 0, 2, 0, 0, 0])
    ranks.observe(1, [0, 0, 0, 50, 0, 0, 30, 0])
    swaps = ranks.plan_swaps(cache)
    assert [(layer, e) for _, layer, e in swaps] == [(1, 3), (1, 6), (0, 1)]  # gain order
    ranks.adapt(cache)
    assert _held(cache, 0) == {1} and _held(cache, 1) == {3, 6}
    cache.check()
    _device_agrees(cache, dev)


def test_bad_input_refused():
    with pytest.raises(ValueError, match="margin"):
        AdaptiveConfig(margin=0.9)
    with pytest.raises(ValueError, match="decay"):
        AdaptiveConfig(decay=1.5)
    with pytest.raises(ValueError, match="shape"):
        AdaptiveRanks(N_LAYER, N_EXPERT).observe(0, [1, 2])


def test_stream_bench_adaptive_gains_where_the_fill_is_wrong():
    """The bench's skewed stream (small): a uniform fill starts at slots/experts and adapts
    to about the skew's prediction; a right profile loses nothing; shares sum to one."""
    from types import SimpleNamespace

    from strata.bench.adaptive_cache import run_scenario, skew_shares

    shares = skew_shares(32, 3.0)
    assert shares.sum() == pytest.approx(1.0) and (np.diff(shares) < 0).all()
    args = SimpleNamespace(seed=1, layers=3, experts=32, k=4, slots_per_layer=6, skew=3.0,
                           requests=8, prompt=256, decode=64)
    rows = {(f, ad): run_scenario(args, fill=f, adaptive=ad)
            for f in ("uniform", "profile") for ad in (False, True)}
    predicted = 1 - (1 - 6 / 32) ** 3  # about 46%
    assert rows["uniform", False]["hit_rate"] == pytest.approx(6 / 32, abs=0.05)
    assert rows["uniform", True]["hit_rate_last_half"] == pytest.approx(predicted, abs=0.08)
    assert rows["profile", True]["hit_rate_last_half"] >= (
        rows["profile", False]["hit_rate_last_half"] - 0.03)
    assert rows["uniform", True]["swaps"] > 0 and rows["uniform", False]["swaps"] == 0
