"""The layer split's pure part: the weight carve (price = layout over every range), the
vectorised stage tables against a plainly walked reference, the placement search against brute
force, and the coverage exponent's fit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers.moe_shapes import qwen3moe

from strata.gguf.shape import LayerTensors, ModelShape
from strata.gguf.tensors import TensorInfo
from strata.plan import RoutingProfile, weights_layout
from strata.plan.cache import slot_strides
from strata.plan.layout import ALIGN, align_up
from strata.plan.split import WeightCarve, stage_weight_names, stage_weights_layout
from strata.plan.split.cost import cover, fit_cover_b, layer_seconds
from strata.plan.split.search import (
    INF,
    CostInputs,
    StageTable,
    Walks,
    best_placement,
    ranges_of,
    score,
    stage_table,
)


def uneven_shape(rng, n_layer: int, *, tied: bool = False, n_expert: int = 6) -> ModelShape:
    """A shape whose tensors have odd, unaligned sizes and a varying count per layer."""
    off = [0]

    def t(name: str, n: int) -> TensorInfo:
        info = TensorInfo(name, 0, (n,), off[0], n)
        off[0] += n
        return info

    glob = [t("token_embd.weight", int(rng.integers(1, 9000))),
            t("output_norm.weight", int(rng.integers(1, 700)))]
    if not tied:
        glob.append(t("output.weight", int(rng.integers(1, 9000))))
    layers = []
    for i in range(n_layer):
        dense = tuple(t(f"blk.{i}.d{j}.weight", int(rng.integers(1, 3000)))
                      for j in range(int(rng.integers(1, 6))))
        per = int(rng.integers(1, 900))
        experts = tuple(t(f"blk.{i}.e{j}.weight", per * n_expert) for j in range(3))
        layers.append(LayerTensors(dense, experts))
    tensors = {x.name: x for x in glob}
    for layer in layers:
        tensors.update({x.name: x for x in layer.dense + layer.experts})
    return ModelShape("qwen3moe", n_layer, 64, 4, 2, 32, n_expert, 2, 32, 100, 4096, 1e6, 1e-6,
                      tuple(glob), tuple(layers), off[0], tensors)


# -- the carve -----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,tied,on_host", [(0, False, True), (1, False, False),
                                               (2, True, True), (3, True, False)])
def test_carve_price_is_the_layout_over_every_range(seed, tied, on_host):
    shape = uneven_shape(np.random.default_rng(seed), 9, tied=tied)
    carve = WeightCarve(shape, on_host)
    table = carve.table()
    n = shape.n_layer
    for lo in range(n):
        for hi in range(lo + 1, n + 1):
            lay = stage_weights_layout(shape, lo, hi, embd_on_host=on_host)
            assert carve.bytes(lo, hi) == lay.total_bytes == table[lo, hi]
            # the single-GPU layout of the same range, region for region
            ref = weights_layout(shape, lo, hi, embd_on_host=on_host)
            assert [(r.name, r.offset, r.n_bytes) for r in lay.regions] == \
                [(r.name, r.offset, r.n_bytes) for r in ref.regions]
            for r in lay.regions:
                assert r.offset % ALIGN == 0 and r.n_bytes == shape.tensors[r.name].n_bytes
            names = set(lay.names)
            want = {x.name for i in range(lo, hi) for x in shape.layers[i].dense}
            assert want <= names  # every dense tensor of the range, no expert tensor
            assert not any(x.name in names for i in range(n) if not lo <= i < hi
                           for x in shape.layers[i].dense)
            assert ("output.weight" in names) == (hi == n and not tied)
            assert ("output_norm.weight" in names) == (hi == n)
            embd = (lo == 0 and not on_host) or (hi == n and tied)
            assert ("token_embd.weight" in names) == embd
    assert table[np.tril_indices(n + 1)].sum() == 0


def test_a_partition_holds_every_dense_tensor_once():
    shape = uneven_shape(np.random.default_rng(5), 11)
    cuts = (3, 4, 9)
    held = [n for lo, hi in ranges_of(cuts, 11)
            for n in stage_weight_names(shape, lo, hi, embd_on_host=True)]
    dense = [x.name for layer in shape.layers for x in layer.dense]
    assert sorted(n for n in held if n.startswith("blk.")) == sorted(dense)
    assert held.count("output.weight") == held.count("output_norm.weight") == 1


def test_carve_off_holds_the_whole_model_on_every_stage():
    shape = uneven_shape(np.random.default_rng(6), 7)
    whole = WeightCarve(shape, True, carve=False)
    full = stage_weights_layout(shape, 0, 7, embd_on_host=True).total_bytes
    for lo, hi in [(0, 1), (2, 5), (6, 7)]:
        lay = stage_weights_layout(shape, lo, hi, embd_on_host=True, carve=False)
        assert lay.total_bytes == whole.bytes(lo, hi) == full
        assert WeightCarve(shape, True).bytes(lo, hi) < full
    assert (whole.table()[np.triu_indices(8, 1)] == full).all()


def test_carve_refuses_a_range_outside_the_model():
    shape = uneven_shape(np.random.default_rng(7), 4)
    for lo, hi in [(2, 2), (-1, 2), (0, 5)]:
        with pytest.raises(ValueError, match="not inside"):
            WeightCarve(shape, True).bytes(lo, hi)
        with pytest.raises(ValueError, match="not inside"):
            stage_weights_layout(shape, lo, hi, embd_on_host=True)


# -- stage tables against a plain walk ------------------------------------------------------------

def random_profile(rng, n_layer, n_expert, *, shares: bool) -> RoutingProfile:
    if shares:
        return RoutingProfile.from_counts(rng.gamma(0.5, size=(n_layer, n_expert)), n_layer,
                                          n_expert)
    rank = np.stack([rng.permutation(n_expert) for _ in range(n_layer)])
    return RoutingProfile.from_rank(rank, n_layer, n_expert)


def plain_walk(shape, profile, lo, hi, *, budget=None, slots=None):
    """Held experts per layer of range [lo, hi): its pairs hot-first until one does not fit."""
    held = np.zeros(shape.n_layer, np.int64)
    size = slot_strides(shape)
    used = 0
    for layer, _ in profile.ranked_pairs():
        if not lo <= layer < hi:
            continue
        if slots is not None and held.sum() >= slots:
            break
        if budget is not None and used + size[layer] > budget:
            break
        used += size[layer]
        held[layer] += 1
    return held, used


@pytest.mark.parametrize("seed", range(6))
def test_stage_table_matches_a_plain_walk(seed):
    rng = np.random.default_rng(100 + seed)
    n_l = int(rng.integers(2, 7))
    shape = uneven_shape(rng, n_l, n_expert=int(rng.integers(3, 7)))
    profile = random_profile(rng, n_l, shape.n_expert, shares=bool(seed % 2))
    walks = Walks.build(shape, profile)
    cost = CostInputs.of(shape, 2.5, 5e10)
    budget = rng.integers(-500, int(slot_strides(shape).sum() * shape.n_expert * 0.7),
                          size=(n_l + 1, n_l + 1))
    pinned = None if seed < 3 else int(rng.integers(0, n_l * shape.n_expert))
    floor = 1 if pinned is None else 0
    t = stage_table(walks, cost, budget, bandwidth=1e12, pinned_slots=pinned,
                    floor_per_layer=floor, extra_seconds=1e-6)
    for lo in range(n_l):
        for hi in range(lo + 1, n_l + 1):
            b = int(budget[lo, hi])
            held, used = plain_walk(shape, profile, lo, hi, budget=None if pinned else b,
                                    slots=pinned)
            ok = b >= 0 and used <= b and held.sum() >= floor * (hi - lo)
            assert t.held[lo, hi] == (held.sum() if b >= 0 or pinned is not None else 0)
            if not ok:
                assert t.seconds[lo, hi] == INF
                continue
            want = layer_seconds(held, n_expert=shape.n_expert, k=shape.n_expert_used, b=2.5,
                                 dense_bytes=cost.dense_bytes, blob_bytes=cost.blob_bytes,
                                 bandwidth=1e12, host_bandwidth=5e10)[lo:hi].sum() + 1e-6
            assert t.seconds[lo, hi] == pytest.approx(want, rel=1e-12)


# -- the search against brute force -------------------------------------------------------------

def brute_force(tables):
    n_l = tables[0].seconds.shape[0] - 1
    best = INF
    for cuts in itertools.combinations(range(1, n_l), len(tables) - 1):
        best = min(best, score(tables, cuts))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_search_finds_the_brute_force_minimum(seed):
    rng = np.random.default_rng(seed)
    n_gpu = int(rng.integers(1, 5))
    n_l = int(rng.integers(n_gpu, 10))
    tables = []
    for _ in range(n_gpu):
        s = rng.random((n_l + 1, n_l + 1)) * 10
        s[rng.random(s.shape) < 0.2] = INF  # ranges that do not fit
        s[np.tril_indices(n_l + 1)] = INF
        tables.append(StageTable(s, np.zeros_like(s, dtype=np.int64)))
    p = best_placement(tables)
    want = brute_force(tables)
    assert p.n_placements == len(list(itertools.combinations(range(1, n_l), n_gpu - 1)))
    if want == INF:
        assert not p.feasible
        return
    assert p.seconds_per_token == pytest.approx(want, rel=1e-12)
    assert score(tables, p.cuts) == pytest.approx(want, rel=1e-12)
    assert len(p.ranges) == n_gpu and all(a < b for a, b in p.ranges)
    assert p.ranges[0][0] == 0 and p.ranges[-1][1] == n_l


def test_search_on_real_tables_matches_brute_force():
    from strata.plan import PlanOptions, parse_gpu_mem
    from strata.plan.split.options import SplitOptions
    from strata.plan.split.planner import stage_tables

    shape = qwen3moe("q4_k_m", n_layer=12, n_expert=16)
    rng = np.random.default_rng(3)
    profile = random_profile(rng, 12, 16, shares=True)
    devs = parse_gpu_mem("2000MiB,2600MiB,1900MiB")
    tables = stage_tables(shape, profile, devs, PlanOptions(max_context=2048), SplitOptions(),
                          b=3.0, pinned=None)
    p = best_placement(tables)
    assert p.feasible and p.seconds_per_token == pytest.approx(brute_force(tables), rel=1e-12)


# -- the coverage exponent -----------------------------------------------------------------------

@pytest.mark.parametrize("b", [1.0, 3.0, 7.5])
def test_cover_b_is_recovered_from_shares_that_follow_the_curve(b):
    n_e = 64
    f = np.arange(n_e + 1) / n_e
    share = np.diff(cover(f, b))  # [n_expert]: the share of the expert of each rank
    rank = np.tile(np.arange(n_e), (4, 1))
    profile = RoutingProfile.from_rank(rank, 4, n_e, share)
    assert fit_cover_b(profile) == pytest.approx(b, rel=1e-3)
    assert fit_cover_b(RoutingProfile.uniform(4, n_e)) == 3.0


def test_layer_seconds_counts_misses_at_the_host_rate():
    dense, blob = np.array([1000.0]), np.array([200.0])
    none = layer_seconds(np.array([0]), n_expert=4, k=2, b=3.0, dense_bytes=dense,
                         blob_bytes=blob, bandwidth=1e3, host_bandwidth=1e2)
    every = layer_seconds(np.array([4]), n_expert=4, k=2, b=3.0, dense_bytes=dense,
                          blob_bytes=blob, bandwidth=1e3, host_bandwidth=1e2)
    assert none[0] == pytest.approx(1.0 + 2 * 200 / 1e2)
    assert every[0] == pytest.approx(1.0 + 2 * 200 / 1e3)
    assert align_up(1) == ALIGN
