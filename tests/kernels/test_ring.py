"""The ring's stream ordering, without a GPU: a fake RingOps records every copy / record / wait per
stream, then a random scheduler executes the streams in any order the events allow, and every
compute step must find its own blob in its slot (not yet overwritten, already landed). The
fake's events are re-recorded as the ring reuses them, with CUDA's semantics for a wait."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cuda_kernels.ring import ExpertRing, RingSlot


class FakeOps:
    """Events as CUDA's: made once, recorded again at every use; a wait takes the record that
    is the event's latest when the wait is enqueued (a wait on an event never recorded is
    no wait)."""

    def __init__(self):
        self.queues: dict[str, list] = {"copy": [], "compute": []}
        self.n_records: dict[int, int] = {}

    def events(self, n):
        return list(range(n))

    def copy(self, dst, dst_offset, src, stream):
        self.queues[stream].append(("copy", dst_offset, int(src[0])))

    def record(self, event, stream):
        self.n_records[event] = self.n_records.get(event, 0) + 1
        self.queues[stream].append(("record", (event, self.n_records[event])))

    def wait(self, stream, event):
        n = self.n_records.get(event, 0)
        if n:
            self.queues[stream].append(("wait", (event, n)))

    def use(self, stream, slot: RingSlot, blob_id: int):
        self.queues[stream].append(("use", slot.offset, blob_id))

    def run(self, rng) -> list[str]:
        """Execute in a random legal interleaving; return the violations seen."""
        memory, reached, heads, bad = {}, set(), {s: 0 for s in self.queues}, []
        while True:
            ready = [s for s, q in self.queues.items() if heads[s] < len(q)
                     and not (q[heads[s]][0] == "wait" and q[heads[s]][1] not in reached)]
            if not ready:
                break
            s = ready[rng.integers(len(ready))]
            op = self.queues[s][heads[s]]
            heads[s] += 1
            if op[0] == "copy":
                memory[op[1]] = op[2]
            elif op[0] == "record":
                reached.add(op[1])
            elif op[0] == "use" and memory.get(op[1]) != op[2]:
                bad.append(f"blob {op[2]} read {memory.get(op[1])} at offset {op[1]}")
        stuck = [s for s, q in self.queues.items() if heads[s] < len(q)]
        return bad + [f"stream {s} deadlocked" for s in stuck]


def _drive(ops, n_slots, n_blobs, *, lookahead, acquire=True):
    """Stage `lookahead` blobs ahead of the one being computed, as the engine's loop does."""
    ring = ExpertRing(np.zeros(n_slots * 256, np.uint8), 256, "copy", ops=ops)
    slots = {}
    for i in range(n_blobs + lookahead):
        if i < n_blobs:
            slots[i] = ring.stage(np.full(16, i, np.uint8))
        j = i - lookahead
        if j >= 0:
            if acquire:
                ring.acquire(slots[j], "compute")
            ops.use("compute", slots[j], j)
            ring.release(slots[j], "compute")
    return ring


@pytest.mark.parametrize("n_slots,lookahead", [(2, 1), (3, 2), (4, 1)])
def test_every_interleaving_reads_its_own_blob(n_slots, lookahead):
    rng = np.random.default_rng(n_slots * 10 + lookahead)
    for _ in range(200):
        ops = FakeOps()
        ring = _drive(ops, n_slots, 9, lookahead=lookahead)
        assert ops.run(rng) == []
    assert ring.n_staged == 9 and ring.bytes_staged == 9 * 16


def test_checker_catches_a_missing_wait():
    rng = np.random.default_rng(0)
    bad = []
    for _ in range(50):
        ops = FakeOps()
        _drive(ops, 2, 6, lookahead=1, acquire=False)
        bad += ops.run(rng)
    assert any("read" in b for b in bad)


def test_staging_over_an_unreleased_slot_is_refused():
    ring = ExpertRing(np.zeros(512, np.uint8), 256, "copy", ops=FakeOps())
    a = ring.stage(np.zeros(8, np.uint8))
    b = ring.stage(np.zeros(8, np.uint8))
    with pytest.raises(RuntimeError, match="still in use"):
        ring.stage(np.zeros(8, np.uint8))
    ring.acquire(a, "compute")
    ring.release(a, "compute")
    assert ring.stage(np.zeros(8, np.uint8)).offset == 0
    ring.release(b, "compute")
    with pytest.raises(RuntimeError, match="not staged"):
        ring.release(b, "compute")


def test_ring_rejects_bad_geometry():
    with pytest.raises(ValueError, match="at least 2 slots"):
        ExpertRing(np.zeros(300, np.uint8), 256, "copy", ops=FakeOps())
    with pytest.raises(ValueError, match="multiple of 256"):
        ExpertRing(np.zeros(1000, np.uint8), 100, "copy", ops=FakeOps())
    ring = ExpertRing(np.zeros(512, np.uint8), 256, "copy", ops=FakeOps())
    with pytest.raises(ValueError, match="exceeds"):
        ring.stage(np.zeros(300, np.uint8))
