"""The expert cache's device side (`SlotWriter`) in the CUDA simulator: a background refill's
copies land in the right slots behind the compute stream, queued by a helper thread only after
the prompt is done, and the returned handle reports them done; the ExpertCache over it restores
the table only then."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from numba import cuda

from strata.engine.cuda.model import CopiesBehind, SlotWriter
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


class HeldEvent:
    """A prompt-done event the test fires by hand (the real path: a CUDA event with `query`)."""

    def __init__(self):
        self.fired = threading.Event()

    def query(self):
        return self.fired.is_set()

    def synchronize(self):
        assert self.fired.wait(10), "the prompt never finished"


def test_copies_behind_queue_only_after_the_prompt_and_report_when_done():
    """The helper thread waits for the prompt, then queues the copies; query() is False until
    then, synchronize() joins it, and an error in the thread is raised on the caller's."""
    rng = np.random.default_rng(11)
    store = Store(2, 4, rng)
    slot_off = np.arange(3, dtype=np.int64) * BLOB
    cache = cuda.to_device(np.zeros(3 * BLOB, np.uint8))
    writer = SlotWriter(None, cache, slot_off, store, cuda.stream(), cuda.stream())
    prompt = HeldEvent()
    copies = CopiesBehind(writer, prompt, [(2, 0, 1), (0, 1, 3)])
    assert copies.thread is not None and not copies.query()
    assert not cache.copy_to_host().any()  # nothing copied while the prompt runs
    prompt.fired.set()
    copies.synchronize()
    assert copies.query()
    got = cache.copy_to_host().reshape(3, BLOB)
    np.testing.assert_array_equal(got[2], store.blob(0, 1))
    np.testing.assert_array_equal(got[0], store.blob(1, 3))
    assert not got[1].any()
    bad = CopiesBehind(writer, prompt, [(0, 5, 0)])  # a layer the store does not have
    with pytest.raises(RuntimeError, match="background refill failed"):
        bad.synchronize()
