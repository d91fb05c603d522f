"""The split plan: helper tiers against a plainly written reference (hundreds of random cases),
per-stage plans (own layers only, one chunk, every byte a region within budget), the carve's
A/B, the placement search on the 235B shape, and the knobs' errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers.moe_shapes import QWEN3_235B, qwen3moe

from strata.plan import PlanOptions, RoutingProfile, parse_gpu_mem
from strata.plan.budget import ALLOC_GRANULE
from strata.plan.options import OptionError
from strata.plan.split import SplitOptions, plan_split
from strata.plan.split.tiers import plan_tiers, select_tier_pairs

S30_Q8 = qwen3moe("q8_0")
S235 = qwen3moe("q4_k_m", **QWEN3_235B)


# -- helper tiers --------------------------------------------------------------------------------

def reference_tier(ranked, claimed, size, budget):
    """The obvious way: hottest first, skip what is claimed or does not fit."""
    out, left = [], budget
    for layer, expert in ranked:
        if claimed[layer, expert] or size[layer] > left:
            continue
        out.append((layer, expert))
        claimed[layer, expert] = True
        left -= size[layer]
    return np.array(out, np.int32).reshape(-1, 2)


@pytest.mark.parametrize("seed", range(300))
def test_tier_selection_matches_the_reference(seed):
    rng = np.random.default_rng(seed)
    n_l, n_e = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    ranked = np.array([(l, e) for l in range(n_l) for e in range(n_e)], np.int32)
    ranked = ranked[rng.permutation(len(ranked))]
    size = rng.choice([256, 512, 768, 2560], size=n_l).astype(np.int64)
    claimed = rng.random((n_l, n_e)) < rng.random()
    budget = int(rng.integers(0, int(size.sum()) * n_e // 2 + 2))
    ref_claimed = claimed.copy()
    got = select_tier_pairs(ranked, claimed, size, budget)
    want = reference_tier(ranked, ref_claimed, size, budget)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(claimed, ref_claimed)
    assert size[got[:, 0]].sum() <= budget


@pytest.mark.parametrize("seed", range(100))
def test_tiers_are_disjoint_fastest_first_and_within_budget(seed):
    rng = np.random.default_rng(1000 + seed)
    shape = qwen3moe("q4_k_m", n_layer=int(rng.integers(2, 9)), n_expert=8, n_embd=256,
                     n_head=2, n_head_kv=1, head_dim=128, n_ff=256, n_vocab=256)
    profile = RoutingProfile.from_counts(rng.random((shape.n_layer, 8)), shape.n_layer, 8)
    ranked = profile.ranked_pairs()
    stage = [ranked[rng.random(len(ranked)) < 0.3]]
    n_dev = int(rng.integers(1, 5))
    budgets = [(int(i), int(rng.integers(0, 3_000_000))) for i in rng.permutation(8)[:n_dev]]
    bw = list(rng.choice([1.0, 2.0, 3.0], size=n_dev))
    tiers = plan_tiers(shape, ranked, stage, budgets, bw, min_bytes=200_000)
    # the reference: one claimed bitmap, cards opened fastest first (then by index)
    claimed = np.zeros((shape.n_layer, 8), bool)
    claimed[stage[0][:, 0], stage[0][:, 1]] = True
    size = np.array([-(-shape.expert_slot_bytes(i) // 256) * 256 for i in range(shape.n_layer)])
    for i in sorted(range(n_dev), key=lambda i: (-bw[i], budgets[i][0])):
        dev, budget = budgets[i]
        want = reference_tier(ranked, claimed, size, budget) if budget >= 200_000 else \
            np.zeros((0, 2), np.int32)
        t = tiers[i]
        if not len(want):
            assert t is None
            continue
        assert t.device == dev and t.cache.total_bytes <= budget
        np.testing.assert_array_equal(t.cache.pairs(), want)


# -- per-stage plans -----------------------------------------------------------------------------

def check_split(p):
    assert p.accepted and p.refusal is None
    n_l = p.shape.n_layer
    assert p.placement.ranges[0][0] == 0 and p.placement.ranges[-1][1] == n_l
    held = np.zeros((n_l, p.shape.n_expert), int)
    for st in p.stages:
        dp, (lo, hi) = st.device_plan, st.layers
        assert sum(dp.regions.values()) == dp.planned_bytes <= dp.device.free_bytes
        assert dp.arena_bytes % ALLOC_GRANULE == 0
        spl = np.array(dp.cache.slots_per_layer)
        assert spl[:lo].sum() == spl[hi:].sum() == 0  # a stage caches its own layers only
        assert spl[lo:hi].sum() == dp.cache.n_slots
        assert ((dp.cache.slot_layer >= lo) & (dp.cache.slot_layer < hi)).all()
        assert st.prefill.chunk == p.chunk  # one chunk on every stage
        for c in [dp.cache] + ([st.tier.cache] if st.tier else []):
            if c.n_slots:
                np.add.at(held, (c.slot_layer, c.slot_expert), 1)
        if st.tier is not None:
            assert dp.regions["helper_tier"] == st.tier.cache.total_bytes > 0
    assert held.max() <= 1  # stage caches and tiers are disjoint


def test_two_cards_q8_split_with_own_caches():
    p = plan_split(S30_Q8, parse_gpu_mem("8GiB,8GiB"), PlanOptions(max_context=4096))
    check_split(p)
    assert len(p.stages) == 2 and p.placement.how == "auto"
    assert p.placement.n_placements == 47
    for st in p.stages:  # each stage's cache took its card's room: no tier opens
        assert st.tier is None and st.device_plan.headroom_bytes < 8 << 20
    d = p.to_dict()
    assert [dev["layers"] for dev in d["devices"]] == [list(r) for r in p.placement.ranges]
    assert d["split"]["cuts"] == list(p.placement.cuts)
    assert all(dev["stage"]["carve_frees_bytes"] > 0 for dev in d["devices"])


def test_four_unequal_cards_235b():
    p = plan_split(S235, parse_gpu_mem("12GiB,12GiB,16GiB,16GiB"),
                   PlanOptions(max_context=8192))
    check_split(p)
    assert p.placement.n_placements == 129766  # C(93, 3)
    n = [hi - lo for lo, hi in p.placement.ranges]
    assert n[2] + n[3] > n[0] + n[1]  # the larger cards run more layers
    assert 0 < p.predicted_hit_rate < 1


def test_leftover_vram_opens_a_helper_tier():
    # the second card runs one layer whose every expert it holds: the rest of it is a tier
    split = SplitOptions(cuts=(47,))
    p = plan_split(S30_Q8, parse_gpu_mem("16GiB,12GiB"), PlanOptions(max_context=4096), split)
    check_split(p)
    last = p.stages[1]
    assert last.device_plan.cache.n_slots == 128 and last.tier is not None
    assert last.tier.cache.total_bytes >= 4 << 30
    tier_layers = set(last.tier.cache.slot_layer.tolist())
    assert tier_layers <= set(range(47))  # pairs no stage cache held
    assert p.predicted_hit_rate > p.predicted_hit_rate_stages
    off = plan_split(S30_Q8, parse_gpu_mem("16GiB,12GiB"), PlanOptions(max_context=4096),
                     replace(split, helper_tiers=False))
    check_split(off)
    assert off.stages[1].tier is None and off.predicted_hit_rate == off.predicted_hit_rate_stages


def test_the_carve_ab_changes_only_the_weights():
    opts = PlanOptions(max_context=4096)
    split = SplitOptions(cuts=(24,), stage_cache=(900, 900), helper_tiers=False)
    on = plan_split(S30_Q8, parse_gpu_mem("10GiB,10GiB"), opts, split)
    off = plan_split(S30_Q8, parse_gpu_mem("10GiB,10GiB"), opts, replace(split, carve=False))
    check_split(on)
    check_split(off)
    for a, b in zip(on.stages, off.stages):
        assert a.device_plan.cache.n_slots == b.device_plan.cache.n_slots == 900
        np.testing.assert_array_equal(a.device_plan.cache.pairs(), b.device_plan.cache.pairs())
        freed = b.device_plan.regions["weights"] - a.device_plan.regions["weights"]
        assert freed == a.weight_bytes_whole - a.device_plan.regions["weights"] > 0
        assert b.device_plan.regions["weights"] == b.weight_bytes_whole


def test_explicit_split_and_a_short_card_is_refused():
    opts = PlanOptions(max_context=4096)
    p = plan_split(S30_Q8, parse_gpu_mem("8GiB,8GiB"), opts, SplitOptions(cuts=(10,)))
    check_split(p)
    assert p.placement.how == "explicit" and p.placement.ranges == ((0, 10), (10, 48))
    bad = plan_split(S30_Q8, parse_gpu_mem("8GiB,1200MiB"), opts, SplitOptions(cuts=(10,)))
    assert not bad.accepted and bad.refusal.device_index == 1
    assert "layers 10-47" in bad.refusal.reason and bad.refusal.short_by_bytes > 0


@pytest.mark.parametrize("split,match", [
    (SplitOptions(cuts=(10, 20)), "need 1 stage starts"),
    (SplitOptions(cuts=(48,)), "past the model's last layer"),
    (SplitOptions(stage_cache=(1, 2, 3)), "3 values for 2 GPUs"),
])
def test_split_knobs_checked_against_the_gpus(split, match):
    with pytest.raises(OptionError, match=match):
        plan_split(S30_Q8, parse_gpu_mem("8GiB,8GiB"), PlanOptions(), split)


def test_split_options_validate():
    with pytest.raises(OptionError, match="strictly increasing"):
        SplitOptions(cuts=(5, 5))
    with pytest.raises(OptionError, match="cover-b"):
        SplitOptions(cover_b=0)
    with pytest.raises(OptionError, match="3 GPUs for 2 layers"):
        plan_split(qwen3moe("f32", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32,
                            n_expert=4, n_expert_used=2, n_ff=32, n_vocab=64),
                   parse_gpu_mem("1GiB,1GiB,1GiB"))


def test_a_stage_plan_is_a_single_device_plan_on_its_own_gpu():
    from strata.engine.multi.model import stage_plan
    from strata.plan import check_runtime_use, runtime_use

    p = plan_split(S30_Q8, parse_gpu_mem("8GiB,8GiB"), PlanOptions(max_context=4096))
    for st, dev in zip(p.stages, (3, 5)):
        sp = stage_plan(p, st, dev)
        assert sp.accepted and sp.devices[0].device.index == dev
        assert sp.devices[0].layers == st.layers and sp.prefill is st.prefill
        assert sp.kv.vram_bytes == st.device_plan.regions["kv"]
        use = check_runtime_use(sp, runtime_use(sp, 1000, device=dev))
        assert use.chunk == 1024 and use.mode == st.prefill.mode


def test_a_refused_stage_offers_knobs_that_make_room():
    opts = PlanOptions(max_context=4096)
    devs = parse_gpu_mem("8GiB,2GiB")
    bad = plan_split(S30_Q8, devs, opts, SplitOptions(cuts=(10,)))
    assert not bad.accepted
    knobs = bad.refusal.knobs
    assert [k.frees_bytes for k in knobs] == sorted((k.frees_bytes for k in knobs), reverse=True)
    search = next(k for k in knobs if "search" in k.flag)
    assert search.note == "" and search.frees_bytes >= bad.refusal.short_by_bytes
    cuts = tuple(int(x) for x in search.flag.split()[1].split(","))
    check_split(plan_split(S30_Q8, devs, opts, SplitOptions(cuts=cuts)))
    kv = next(k for k in knobs if k.flag == "--kv int8")
    assert kv.note == "not enough alone"
    assert any(k.flag.startswith("--layer-split 11 ") for k in knobs)


@pytest.mark.parametrize("n_layer,n_stages,want", [
    (48, 4, (12, 24, 36)), (10, 4, (3, 6, 8)), (5, 2, (3,)), (4, 4, (1, 2, 3))])
def test_even_cuts_share_the_layers_evenly(n_layer, n_stages, want):
    from strata.engine.multi.bench import even_cuts

    cuts = even_cuts(n_layer, n_stages)
    assert cuts == want
    sizes = np.diff([0, *cuts, n_layer])
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == n_layer


def test_even_split_of_four_unequal_cards_is_planned_and_predicted_slower():
    from strata.engine.multi.bench import even_cuts

    gpus, knobs = parse_gpu_mem("12GiB,12GiB,16GiB,16GiB"), PlanOptions(max_context=4096)
    s48 = qwen3moe("q4_k_m", **{**QWEN3_235B, "n_layer": 48})  # the 4-GPU run's file
    auto = plan_split(s48, gpus, knobs)
    even = plan_split(s48, gpus, knobs, SplitOptions(cuts=even_cuts(48, 4)))
    check_split(auto)
    check_split(even)
    assert even.placement.cuts == (12, 24, 36) and auto.placement.cuts != (12, 24, 36)
    # the search's optimum is never worse than the even split it also scored
    assert auto.placement.seconds_per_token <= even.placement.seconds_per_token
