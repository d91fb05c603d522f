"""The expert cache's layout: sized slots at exact offsets, and which pairs fill them.

Slots differ in size by layer (a Q4_K_M file stores some layers' down projections as Q6_K), so
the cache is a list of slots, each as big as its own layer's expert blob (256-byte aligned), laid
out in fill order: hot first, so the coldest slots form the contiguous tail the prompt path can
borrow, and a loan's bytes are the exact suffix of that tail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.gguf.shape import ModelShape
from strata.plan.layout import Layout, LayoutBuilder, align_up
from strata.plan.profile import RoutingProfile


def slot_strides(shape: ModelShape) -> np.ndarray:
    """Aligned bytes of one cache slot per layer: [n_layer] int64."""
    return np.array([align_up(shape.expert_slot_bytes(i)) for i in range(shape.n_layer)],
                    dtype=np.int64)


@dataclass(frozen=True, slots=True, eq=False)
class CacheLayout:
    """Slots in layout order. `slot_expert` is the pair each slot is first filled with (-1 when
    the layout was made from counts alone)."""

    slot_layer: np.ndarray  # [n_slot] int32
    slot_expert: np.ndarray  # [n_slot] int32
    slot_offset: np.ndarray  # [n_slot] int64, bytes from the cache's start
    slot_bytes: np.ndarray  # [n_slot] int64, exact blob bytes (before alignment)
    slots_per_layer: tuple[int, ...]
    total_bytes: int

    @property
    def n_slots(self) -> int:
        return len(self.slot_layer)

    def offset(self, layer: int, j: int) -> int:
        """Byte offset of the j-th slot of `layer`."""
        idx = np.flatnonzero(self.slot_layer == layer)
        if not 0 <= j < len(idx):
            raise IndexError(f"layer {layer} has {len(idx)} cache slots, no slot {j}")
        return int(self.slot_offset[idx[j]])

    def suffix_bytes(self, k: int) -> int:
        """Bytes of the last k slots (a loan of k slots), exact."""
        if k <= 0:
            return 0
        k = min(k, self.n_slots)
        return self.total_bytes - int(self.slot_offset[self.n_slots - k])

    def slots_to_cover(self, n_bytes: int) -> int:
        """The fewest tail slots whose bytes hold `n_bytes` (n_slots + 1 if none do)."""
        if n_bytes <= 0:
            return 0
        tail = self.total_bytes - self.slot_offset[::-1]  # suffix_bytes(1), (2), ...
        k = int(np.searchsorted(tail, n_bytes, side="left")) + 1
        return k

    def pairs(self) -> np.ndarray:
        """[n_slot, 2] (layer, expert) of the initial fill."""
        return np.stack([self.slot_layer, self.slot_expert], axis=1)

    def as_layout(self) -> Layout:
        b = LayoutBuilder("expert_cache")
        if self.total_bytes:
            b.add("slots", np.uint8, (self.total_bytes,))  # sized slots at slot_offset
        return b.build()


def _round_robin(slots_per_layer: tuple[int, ...]) -> np.ndarray:
    # j-th slot of every layer, then the (j+1)-th: each layer's coldest slots end up last.
    counts = np.asarray(slots_per_layer)
    return np.array([layer for j in range(int(counts.max(initial=0)))
                     for layer in range(len(counts)) if j < counts[layer]], dtype=np.int32)


def cache_layout(shape: ModelShape, slots_per_layer: tuple[int, ...] | list[int], *,
                 order: np.ndarray | None = None, experts: np.ndarray | None = None
                 ) -> CacheLayout:
    """Sized slots: `slots_per_layer[l]` slots of layer l's blob each. `order` gives the layer
    of each slot in layout order (default: round-robin by slot rank); `experts` the expert each
    slot starts with."""
    spl = tuple(int(x) for x in slots_per_layer)
    if len(spl) != shape.n_layer:
        raise ValueError(f"{len(spl)} slot counts for {shape.n_layer} layers")
    if any(not 0 <= x <= shape.n_expert for x in spl):
        raise ValueError(f"slot counts must be in 0..{shape.n_expert} per layer, got {spl}")
    layer = _round_robin(spl) if order is None else np.asarray(order, dtype=np.int32)
    if not np.array_equal(np.bincount(layer, minlength=shape.n_layer), spl):
        raise ValueError("slot order does not match the slot counts")
    strides = slot_strides(shape)[layer]
    offsets = np.zeros(len(layer), dtype=np.int64)
    np.cumsum(strides[:-1], out=offsets[1:])
    exact = np.array([shape.expert_slot_bytes(i) for i in range(shape.n_layer)],
                     dtype=np.int64)[layer]
    exp = np.full(len(layer), -1, np.int32) if experts is None else np.asarray(experts, np.int32)
    return CacheLayout(layer, exp, offsets, exact, spl, int(strides.sum()))


def select_pairs(shape: ModelShape, profile: RoutingProfile, *, budget_bytes: int | None = None,
                 n_slots: int | None = None) -> np.ndarray:
    """Take (layer, expert) pairs hot-first until `budget_bytes` run out (a pair whose slot does
    not fit is skipped, not a stop: a smaller blob further down may still fit) or `n_slots` are
    taken. Returns [n, 2] int32 in fill order."""
    if (budget_bytes is None) == (n_slots is None):
        raise ValueError("give exactly one of budget_bytes and n_slots")
    ranked = profile.ranked_pairs()
    if n_slots is not None:
        return ranked[:max(0, n_slots)]
    size = slot_strides(shape)[ranked[:, 0]]
    cum = np.cumsum(size)
    n = int(np.searchsorted(cum, budget_bytes, side="right"))  # the prefix that fits
    left = budget_bytes - (int(cum[n - 1]) if n else 0)
    taken = [ranked[:n]]
    if n < len(ranked) and left >= int(size[n:].min()):
        keep = []
        for i in range(n, len(ranked)):
            if size[i] <= left:
                keep.append(i)
                left -= int(size[i])
        taken.append(ranked[keep])
    return np.concatenate(taken).astype(np.int32)


def fill_cache(shape: ModelShape, profile: RoutingProfile, *, budget_bytes: int | None = None,
               n_slots: int | None = None) -> CacheLayout:
    """The cache layout holding the pairs `select_pairs` takes, in fill order."""
    pairs = select_pairs(shape, profile, budget_bytes=budget_bytes, n_slots=n_slots)
    counts = np.bincount(pairs[:, 0], minlength=shape.n_layer) if len(pairs) else \
        np.zeros(shape.n_layer, dtype=np.int64)
    return cache_layout(shape, tuple(counts), order=pairs[:, 0], experts=pairs[:, 1])
