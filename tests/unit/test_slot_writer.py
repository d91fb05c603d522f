"""The expert cache's device side (`SlotWriter`) in the CUDA simulator: a background refill's
copies land in the right slots behind the compute stream, and the returned handle reports them
done; the ExpertCache over it restores the table only then."""

from __future__ import annotations

import numpy as np
from numba import cuda

from strata.engine.cuda.model import SlotWriter
from strata.experts import ExpertCache
from strata.plan import RoutingProfile, fill_cache
from helpers.moe_shapes import tiny

BLOB = 48


class Store:
    """Host blobs with distinct random bytes per (layer, expert)."""

    def __init__(self, n_layer, n_expert, rng):
        self.raw = rng.integers(1, 256, (n_layer, n_expert, BLOB), dtype=np.uint8)

    def blob(self, layer, expert):
        return self.raw[layer, expert]


def test_load_behind_lands_every_blob_in_its_slot():
    rng = np.random.default_rng(7)
    n_layer, n_expert, n_slots = 2, 4, 5
    store = Store(n_layer, n_expert, rng)
    slot_off = np.arange(n_slots, dtype=np.int64) * BLOB
    cache = cuda.to_device(np.zeros(n_slots * BLOB, np.uint8))
    table = cuda.to_device(np.full((n_layer, n_expert), -1, np.int32))
    writer = SlotWriter(table, cache, slot_off, store, cuda.stream(), cuda.stream())
    items = [(4, 1, 3), (0, 0, 2), (2, 1, 0)]
    done = writer.load_behind(items)
    done.synchronize()
    assert done.query()
    got = cache.copy_to_host().reshape(n_slots, BLOB)
    for slot, layer, expert in items:
        np.testing.assert_array_equal(got[slot], store.blob(layer, expert))
    assert not got[[1, 3]].any()  # slots not named stay untouched


def test_cache_over_the_slot_writer_refills_in_the_background():
    rng = np.random.default_rng(3)
    n_layer, n_expert = 3, 8
    shape = tiny(n_layer=n_layer, n_expert=n_expert)
    rank = np.stack([rng.permutation(n_expert) for _ in range(n_layer)])
    layout = fill_cache(shape, RoutingProfile.from_rank(rank, n_layer, n_expert), n_slots=9)
    store = Store(n_layer, n_expert, rng)
    slot_off = np.asarray(layout.slot_offset, np.int64)
    n_bytes = int(slot_off.max()) + BLOB
    dev_cache = cuda.to_device(np.zeros(n_bytes, np.uint8))
    dev_table = cuda.to_device(np.full((n_layer, n_expert), -1, np.int32))
    stream = cuda.stream()
    writer = SlotWriter(dev_table, dev_cache, slot_off, store, stream, cuda.stream())
    cache = ExpertCache(layout, n_layer, n_expert, writer)
    cache.fill()
    before = cache.table.copy()
    loan = cache.lend(4)
    for slot in loan.slots:  # the prompt's buffers over the lent slots
        off = int(slot_off[slot])
        dev_cache[off:off + BLOB].copy_to_device(np.full(BLOB, 0xEE, np.uint8), stream=stream)
    assert cache.refill(background=True) == 4 and cache.pending is not None
    assert cache.settle() and cache.pending is None
    np.testing.assert_array_equal(cache.table, before)
    np.testing.assert_array_equal(dev_table.copy_to_host(), before)
    got = dev_cache.copy_to_host()
    for slot, (layer, expert) in zip(loan.slots, loan.pairs):
        off = int(slot_off[slot])
        np.testing.assert_array_equal(got[off:off + BLOB], store.blob(layer, expert))
