"""`ExpertCache`: which expert sits in which VRAM slot, owned in ONE place.

The plan fixes the slots (sizes and offsets, hot first, the coldest tail lendable). This object
keeps the host mirror of the device slot table, `table[layer, expert]` = slot or -1 (miss), and
its inverse `pair[slot]` = (layer, expert) or (-1, -1); every change goes through it and is
pushed to the device by the injected `CacheDevice`, so the table the kernels read and the map
the host plans with cannot drift apart.

The prompt path's loan: `lend(k)` marks the experts of the last k slots not resident (table first,
so no kernel reads a slot the prompt's buffers are about to overwrite) and remembers them;
`refill()` copies them back into their slots, then restores the table. Consecutive prompts start
from the restored residency.

Stream ordering: the device's `write_table` and `load` are enqueued on the engine's compute
stream, so a lend's table write precedes every prompt kernel and a refill's copies precede the
restored table's first reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from strata.plan.cache import CacheLayout

MISS = -1


class CacheDevice(Protocol):
    """What the cache needs from the GPU side (a fake records calls in the tests)."""

    def write_table(self, table: np.ndarray) -> None:
        """Make the device slot table equal `table` ([n_layer, n_expert] int32)."""

    def load(self, slot: int, layer: int, expert: int) -> None:
        """Copy the blob of (layer, expert) from host memory into cache slot `slot`."""


class CacheStateError(RuntimeError):
    """A loan or swap used out of order (a bug in the caller, never user input)."""


@dataclass(frozen=True, slots=True)
class Loan:
    """The slots lent to one prompt and the (layer, expert) pairs they held."""

    slots: np.ndarray  # [k] int64, the cache's tail
    pairs: np.ndarray  # [k, 2] int32; (-1, -1) for a slot that was empty

    @property
    def n_slots(self) -> int:
        return len(self.slots)


class ExpertCache:
    """The expert cache's residency: slot table (host mirror), inverse map, the loan."""

    def __init__(self, layout: CacheLayout, n_layer: int, n_expert: int, device: CacheDevice):
        self.layout = layout
        self.n_layer, self.n_expert = n_layer, n_expert
        self.device = device
        self.table = np.full((n_layer, n_expert), MISS, np.int32)  # [n_layer, n_expert] int32
        self.pair = np.full((layout.n_slots, 2), MISS, np.int32)  # [n_slot, 2] (layer, expert)
        self.loan: Loan | None = None
        self.n_loads = 0  # blobs copied into slots (fills, refills, swaps)

    @property
    def n_slots(self) -> int:
        return self.layout.n_slots

    # -- queries ------------------------------------------------------------------------------

    def slot_of(self, layer: int, expert: int) -> int:
        """The slot holding (layer, expert), or -1."""
        return int(self.table[layer, expert])

    def resident(self, layer: int) -> np.ndarray:
        """bool [n_expert]: which experts of `layer` are in VRAM now."""
        return self.table[layer] >= 0

    def n_resident(self) -> int:
        return int(np.count_nonzero(self.table >= 0))

    def slot_offsets(self) -> np.ndarray:
        """int64 [n_slot]: each slot's byte offset inside the cache region."""
        return self.layout.slot_offset.astype(np.int64)

    # -- changes ------------------------------------------------------------------------------

    def fill(self, pairs: np.ndarray | None = None) -> int:
        """Load `pairs` ([n, 2] (layer, expert), hot first; default the layout's own fill) into
        slots 0..n-1 in order, each into a slot of its own layer's size. Returns pairs loaded."""
        if self.loan is not None:
            raise CacheStateError("fill while slots are lent to a prompt")
        pairs = self.layout.pairs() if pairs is None else np.asarray(pairs, np.int32)
        if len(pairs) > self.n_slots:
            raise ValueError(f"{len(pairs)} pairs for {self.n_slots} cache slots")
        self.table.fill(MISS)
        self.pair.fill(MISS)
        for slot, (layer, expert) in enumerate(pairs):
            if layer < 0:
                continue
            self._check_pair(int(layer), int(expert))
            if self.layout.slot_layer[slot] != layer:
                raise ValueError(f"slot {slot} is sized for layer {self.layout.slot_layer[slot]},"
                                 f" not for layer {layer}")
            if self.table[layer, expert] >= 0:
                raise ValueError(f"(layer {layer}, expert {expert}) listed twice")
            self._place(slot, int(layer), int(expert))
        self.device.write_table(self.table)
        return int(np.count_nonzero(pairs[:, 0] >= 0)) if len(pairs) else 0

    def lend(self, n_slots: int) -> Loan:
        """Lend the last `n_slots` slots to the prompt path: their experts become misses (the
        device table is written before this returns)."""
        if self.loan is not None:
            raise CacheStateError("the cache is already lent; refill() first")
        if not 0 <= n_slots <= self.n_slots:
            raise ValueError(f"cannot lend {n_slots} of {self.n_slots} slots")
        slots = np.arange(self.n_slots - n_slots, self.n_slots, dtype=np.int64)
        pairs = self.pair[slots].copy()
        for layer, expert in pairs:
            if layer >= 0:
                self.table[layer, expert] = MISS
        self.pair[slots] = MISS
        self.loan = Loan(slots, pairs)
        self.device.write_table(self.table)
        return self.loan

    def refill(self) -> int:
        """Copy the lent experts back into their slots, then restore the table; returns blobs
        copied (0 when nothing was lent)."""
        loan = self.loan
        if loan is None:
            return 0
        n = 0
        for slot, (layer, expert) in zip(loan.slots, loan.pairs):
            if layer >= 0:
                self.device.load(int(slot), int(layer), int(expert))
                self.pair[slot] = (layer, expert)
                self.table[layer, expert] = slot
                n += 1
        self.n_loads += n
        self.loan = None
        self.device.write_table(self.table)
        return n

    def swap(self, slot: int, layer: int, expert: int) -> tuple[int, int]:
        """Put (layer, expert) into `slot` (which must be sized for `layer`), evicting what it
        held; returns the evicted pair ((-1, -1) if none). The table is written afterwards."""
        if self.loan is not None:
            raise CacheStateError("swap while slots are lent to a prompt")
        self._check_pair(layer, expert)
        if self.layout.slot_layer[slot] != layer:
            raise ValueError(f"slot {slot} holds layer {self.layout.slot_layer[slot]} blobs")
        if self.table[layer, expert] >= 0:
            raise ValueError(f"(layer {layer}, expert {expert}) is already in slot "
                             f"{self.table[layer, expert]}")
        old = tuple(int(v) for v in self.pair[slot])
        if old[0] >= 0:
            self.table[old] = MISS
        self.table[layer, expert] = MISS  # a miss while its bytes are in flight
        self.device.write_table(self.table)
        self._place(slot, layer, expert)
        self.device.write_table(self.table)
        return old

    def check(self) -> None:
        """Raise AssertionError-like CacheStateError if the table and its inverse disagree."""
        for slot, (layer, expert) in enumerate(self.pair):
            if layer >= 0 and self.table[layer, expert] != slot:
                raise CacheStateError(f"slot {slot} holds ({layer}, {expert}) but the table "
                                      f"says {self.table[layer, expert]}")
        held = np.argwhere(self.table >= 0)
        for layer, expert in held:
            slot = self.table[layer, expert]
            if tuple(self.pair[slot]) != (layer, expert):
                raise CacheStateError(f"the table maps ({layer}, {expert}) to slot {slot}, "
                                      f"which holds {tuple(self.pair[slot])}")

    def _place(self, slot: int, layer: int, expert: int) -> None:
        self.device.load(slot, layer, expert)
        self.n_loads += 1
        self.pair[slot] = (layer, expert)
        self.table[layer, expert] = slot

    def _check_pair(self, layer: int, expert: int) -> None:
        if not (0 <= layer < self.n_layer and 0 <= expert < self.n_expert):
            raise ValueError(f"(layer {layer}, expert {expert}) is outside the model's "
                             f"[{self.n_layer}, {self.n_expert}]")
