"""The expert cache's bookkeeping: fill from the plan's ranked pairs, one owner of the slot
table (every change pushed to the device fake), lend/refill for borrowed prompts, swaps."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.moe_shapes import tiny
from strata.experts import CacheStateError, ExpertCache
from strata.plan import RoutingProfile, fill_cache


class FakeDevice:
    """Records the device side: the table it holds and the blob in each slot."""

    def __init__(self, n_slots: int):
        self.table = None
        self.slots = [None] * n_slots
        self.writes = 0
        self.loads: list[tuple[int, int, int]] = []

    def write_table(self, table):
        self.table = np.array(table, copy=True)
        self.writes += 1

    def load(self, slot, layer, expert):
        self.slots[slot] = (layer, expert)
        self.loads.append((slot, layer, expert))


def _cache(n_slots=12, n_layer=3, n_expert=8, seed=0):
    shape = tiny(n_layer=n_layer, n_expert=n_expert)
    rng = np.random.default_rng(seed)
    rank = np.stack([rng.permutation(n_expert) for _ in range(n_layer)])
    profile = RoutingProfile.from_rank(rank, n_layer, n_expert)
    layout = fill_cache(shape, profile, n_slots=n_slots)
    dev = FakeDevice(layout.n_slots)
    return ExpertCache(layout, n_layer, n_expert, dev), dev, profile


def _device_agrees(cache, dev):
    """The device table equals the host mirror, and every slot the table names holds the pair
    the table says."""
    np.testing.assert_array_equal(dev.table, cache.table)
    for layer, expert in np.argwhere(cache.table >= 0):
        assert dev.slots[cache.table[layer, expert]] == (layer, expert)


def test_fill_takes_the_ranked_pairs_in_order():
    cache, dev, profile = _cache()
    n = cache.fill()
    assert n == 12 and cache.n_resident() == 12
    hot = profile.ranked_pairs()[:12]
    for slot, (layer, expert) in enumerate(hot):
        assert cache.slot_of(layer, expert) == slot
    cache.check()
    _device_agrees(cache, dev)
    assert dev.writes == 1  # one table write for the whole fill


def test_lend_marks_the_tail_missing_before_anything_else_and_refill_restores():
    cache, dev, _ = _cache()
    cache.fill()
    before = cache.table.copy()
    loan = cache.lend(5)
    assert list(loan.slots) == [7, 8, 9, 10, 11]
    for layer, expert in loan.pairs:
        assert cache.slot_of(layer, expert) == -1
        assert dev.table[layer, expert] == -1  # the device saw the misses
    assert cache.n_resident() == 7
    cache.check()
    with pytest.raises(CacheStateError):
        cache.lend(1)
    with pytest.raises(CacheStateError):
        cache.swap(0, 0, 0)
    dev.slots[7:] = [("prompt buffers",)] * 5  # the prompt overwrites the lent slots
    assert cache.refill() == 5
    np.testing.assert_array_equal(cache.table, before)
    _device_agrees(cache, dev)
    assert cache.refill() == 0


def test_two_prompts_back_to_back_start_from_restored_residency():
    cache, dev, _ = _cache()
    cache.fill()
    first = cache.table.copy()
    for _ in range(2):
        loan = cache.lend(4)
        assert cache.n_resident() == 8
        cache.refill()
        np.testing.assert_array_equal(cache.table, first)
        _device_agrees(cache, dev)
        assert loan.n_slots == 4


def test_lend_zero_and_everything():
    cache, dev, _ = _cache()
    cache.fill()
    assert cache.lend(0).n_slots == 0
    cache.refill()
    cache.lend(12)
    assert cache.n_resident() == 0 and (dev.table == -1).all()
    assert cache.refill() == 12 and cache.n_resident() == 12
    with pytest.raises(ValueError, match="cannot lend 13"):
        cache.lend(13)


def test_swap_evicts_and_keeps_both_maps_in_sync():
    cache, dev, _ = _cache()
    cache.fill()
    slot = 3
    layer = int(cache.layout.slot_layer[slot])
    old = tuple(int(v) for v in cache.pair[slot])
    new = next(e for e in range(8) if cache.slot_of(layer, e) < 0)
    assert cache.swap(slot, layer, new) == old
    assert cache.slot_of(*old) == -1 and cache.slot_of(layer, new) == slot
    cache.check()
    _device_agrees(cache, dev)
    other = (layer + 1) % 3
    with pytest.raises(ValueError, match="holds layer"):
        cache.swap(slot, other, 0)
    with pytest.raises(ValueError, match="already in slot"):
        cache.swap(slot, layer, new)


def test_fill_refuses_bad_pairs():
    cache, _, _ = _cache()
    pairs = cache.layout.pairs().copy()
    pairs[1] = pairs[0]
    with pytest.raises(ValueError):
        cache.fill(pairs)
    bad = cache.layout.pairs().copy()
    bad[0, 1] = 99
    with pytest.raises(ValueError, match="outside"):
        cache.fill(bad)


def test_check_catches_a_drifted_table():
    cache, _, _ = _cache()
    cache.fill()
    layer, expert = cache.pair[0]
    cache.table[layer, expert] = 5
    with pytest.raises(CacheStateError):
        cache.check()
