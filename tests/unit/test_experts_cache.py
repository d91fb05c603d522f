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


class HeldCopies:
    """`Copies` the test completes by hand: the background refill's copies in flight."""

    def __init__(self, dev, items):
        self.dev, self.items, self.landed, self.waits = dev, items, False, 0

    def land(self):
        for slot, layer, expert in self.items:
            self.dev.slots[slot] = (layer, expert)
        self.landed = True

    def query(self):
        return self.landed

    def synchronize(self):
        self.waits += 1
        if not self.landed:
            self.land()


class BehindDevice(FakeDevice):
    """A device that queues a refill's copies behind the prompt (`load_behind`)."""

    def __init__(self, n_slots):
        super().__init__(n_slots)
        self.behind: list[HeldCopies] = []

    def load_behind(self, items):
        self.behind.append(HeldCopies(self, list(items)))
        return self.behind[-1]


def _behind_cache():
    cache, dev, profile = _cache()
    behind = BehindDevice(len(dev.slots))
    cache.device = behind
    return cache, behind


def test_background_refill_keeps_the_lent_pairs_missing_until_their_copies_land():
    cache, dev = _behind_cache()
    cache.fill()
    before = cache.table.copy()
    loan = cache.lend(5)
    dev.slots[7:] = [("prompt buffers",)] * 5
    assert cache.refill(background=True) == 5
    copies = dev.behind[-1]
    assert [i[0] for i in copies.items] == list(loan.slots)  # every held slot, none loaded yet
    assert dev.slots[7:] == [("prompt buffers",)] * 5 and not dev.loads[12:]
    for layer, expert in loan.pairs:  # still misses on the device while the bytes are in flight
        assert cache.slot_of(layer, expert) == -1 and dev.table[layer, expert] == -1
    cache.check()
    assert cache.settle(wait=False) is False and cache.pending is not None
    copies.land()
    assert cache.settle(wait=False) is True and cache.pending is None
    np.testing.assert_array_equal(cache.table, before)
    _device_agrees(cache, dev)
    assert copies.waits == 0  # polled, never waited for


@pytest.mark.parametrize("change", ["lend", "swap", "fill", "refill"])
def test_every_other_change_waits_for_a_background_refill_first(change):
    cache, dev = _behind_cache()
    cache.fill()
    before = cache.table.copy()
    cache.lend(4)
    cache.refill(background=True)
    copies = dev.behind[-1]
    if change == "lend":  # the next prompt: its slots must hold the refilled bytes first
        loan = cache.lend(4)
        assert copies.waits == 1 and cache.n_resident() == 8
        for slot, (layer, expert) in zip(loan.slots, loan.pairs):
            assert before[layer, expert] == slot
    elif change == "swap":
        layer = int(cache.layout.slot_layer[0])
        new = next(e for e in range(8) if before[layer, e] < 0)
        cache.swap(0, layer, new)
        assert copies.waits == 1 and cache.n_resident() == 12
    elif change == "fill":
        cache.fill()
        assert copies.waits == 1
        np.testing.assert_array_equal(cache.table, before)
    else:  # nothing lent: a refill returns 0 but the pending one is still settled by settle()
        assert cache.refill() == 0 and copies.waits == 0
        cache.settle()
        assert copies.waits == 1
        np.testing.assert_array_equal(cache.table, before)
    cache.check()
    _device_agrees(cache, dev)


def test_background_refill_falls_back_to_copies_in_place():
    """A device without `load_behind` (or nothing held in the lent slots) refills at once."""
    cache, dev, _ = _cache()
    cache.fill()
    before = cache.table.copy()
    cache.lend(3)
    assert cache.refill(background=True) == 3 and cache.pending is None
    np.testing.assert_array_equal(cache.table, before)
    _device_agrees(cache, dev)
    cache, dev = _behind_cache()
    cache.fill(cache.layout.pairs()[:6])  # slots 6.. empty: the tail's loan holds nothing
    cache.lend(4)
    assert cache.refill(background=True) == 0 and cache.pending is None and not dev.behind


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
