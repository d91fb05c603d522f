"""The routing profile: fill order (hot first across layers, fair interleave on ties, skip a pair
that does not fit instead of stopping) and the predicted decode hit rate."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.moe_shapes import qwen3moe
from strata.plan import RoutingProfile, fill_cache, select_pairs
from strata.plan.cache import slot_strides
from strata.plan.profile import coverage


def test_uniform_order_interleaves_layers():
    pairs = RoutingProfile.uniform(3, 4).ranked_pairs()
    assert pairs[:6].tolist() == [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]]
    assert len({tuple(p) for p in pairs}) == 12


def test_counts_order_hot_first_ties_fair():
    counts = np.array([[5, 1, 9, 0], [9, 9, 0, 2]], dtype=float)
    pairs = RoutingProfile.from_counts(counts, 2, 4).ranked_pairs().tolist()
    # shares: layer 0: 9/15, 5/15, 1/15, 0 ; layer 1: 9/20, 9/20, 2/20, 0
    assert pairs[:4] == [[0, 2], [1, 0], [1, 1], [0, 0]]
    # a dead layer (all zero) is uniform, and its pairs tie with each other fairly
    flat = RoutingProfile.from_counts(np.zeros((2, 3)), 2, 3).ranked_pairs().tolist()
    assert flat[:2] == [[0, 0], [1, 0]]


def test_rank_profile_validation_and_shares():
    rank = np.array([[2, 0, 1], [1, 2, 0]])
    p = RoutingProfile.from_rank(rank.ravel(), 2, 3)
    assert p.ranked_pairs().tolist()[:2] == [[0, 2], [1, 1]]
    with pytest.raises(ValueError, match="5 values, expected"):
        RoutingProfile.from_rank(np.arange(5), 2, 3)
    with pytest.raises(ValueError, match="not a permutation"):
        RoutingProfile.from_rank(np.array([0, 0, 1, 0, 1, 2]), 2, 3)
    shared = RoutingProfile.from_rank(rank, 2, 3, share_by_rank=np.array([0.6, 0.3, 0.1]))
    # the hottest expert of each layer holds 60% of its routed share
    assert shared.hit_rate(np.array([[0, 2], [1, 1]])) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="non-negative shares"):
        RoutingProfile.from_rank(rank, 2, 3, share_by_rank=np.array([1.0, -1.0, 0.5]))
    with pytest.raises(ValueError, match=r"\[2, 4\]"):
        RoutingProfile.from_counts(np.ones((3, 4)), 2, 4)


def test_hit_rate_models():
    n_l, n_e = 4, 8
    uni = RoutingProfile.uniform(n_l, n_e)
    half = uni.ranked_pairs()[: n_l * n_e // 2]
    assert uni.hit_rate(half) == pytest.approx(1 - 0.5 ** 3)  # coverage curve at f = 1/2
    assert uni.hit_rate(np.zeros((0, 2), dtype=np.int32)) == 0.0
    assert coverage(1.0) == 1.0
    counts = np.arange(1, n_e + 1, dtype=float)[None, :].repeat(n_l, 0)  # expert e: e+1
    prof = RoutingProfile.from_counts(counts, n_l, n_e)
    top2 = prof.ranked_pairs()[: 2 * n_l]  # experts 7 and 6 of every layer
    assert prof.hit_rate(top2) == pytest.approx((8 + 7) / 36)


def test_fill_skips_a_pair_that_does_not_fit():
    s = qwen3moe()  # layer 0: 3,059,712 B slots; layer 6: 2,654,208 B
    small, big = 2654208, 3059712
    counts = np.zeros((48, 128))
    counts[6, 0], counts[6, 1] = 30, 10  # shares .75 and .25
    counts[0, 0], counts[0, 1] = 5, 5  # .5 each: between them
    prof = RoutingProfile.from_counts(counts, 48, 128)
    assert prof.ranked_pairs()[:4].tolist() == [[6, 0], [0, 0], [0, 1], [6, 1]]
    budget = 2 * small + 100  # after (6, 0) the big layer-0 slots do not fit; (6, 1) does
    pairs = select_pairs(s, prof, budget_bytes=budget)
    assert pairs.tolist()[:2] == [[6, 0], [6, 1]]
    assert slot_strides(s)[pairs[:, 0]].sum() <= budget
    assert select_pairs(s, prof, budget_bytes=small + big).tolist() == [[6, 0], [0, 0]]
    cache = fill_cache(s, prof, budget_bytes=budget)
    assert cache.slots_per_layer[6] >= 2 and cache.slots_per_layer[0] == 0
    assert cache.pairs().tolist()[:2] == [[6, 0], [6, 1]]
    assert len(select_pairs(s, prof, n_slots=5)) == 5
    with pytest.raises(ValueError, match="exactly one"):
        select_pairs(s, prof)
