"""Helper tiers at run time: each card's tier filled with its planned pairs at load, and every
stage's decode misses and prompt experts able to hit any tier its GPU can reach.

A stage's MoE kernels read a resident expert at `cache[slot_off[slot]]`, one uint8 array. So a
stage with tiers reads through a *window*: one uint8 device array from the lowest to the highest
address among its own arena and the tiers it reaches (one virtual address space: a tier on
another card is readable once peer access is enabled, and unified addressing gives every
allocation of the process its own addresses). Its own cache slots keep their numbers (their
offsets shifted by where the arena starts in the window); the tier pairs of its layers get the
slots after them, offsets pointing into the tier's arena. The slot table the kernels read is the
cache's own table with those tier slots where the cache has a miss (a prompt's loan of cache
slots leaves the tier entries alone). Only the bytes of the arenas are ever read; the gaps
between allocations inside the window never are.

Reach: a tier on the stage's own card always; a tier on another card where peer access between
the two GPUs is possible (enabled here); otherwise that tier serves only its own card's stage.

Tier hits are counted on the device per (layer, card holding the tier) by a one-warp kernel
launched before each layer's MoE (`TierDecodeStep`); the MoE kernel's own counters count every
VRAM hit, tiers included, so `hits - tier hits` are the stage cache's.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda, types

from strata.cuda_kernels.intrinsics import SIMULATED
from strata.cuda_kernels.launch import check_array, register_ptx
from strata.engine.cuda.decode import DecodeStep
from strata.engine.cuda.hostmem import device_address
from strata.engine.multi.handoff import peer_reachable


@dataclass(slots=True)
class StageTiers:
    """What one stage reaches: the window and, per tier slot, where it lives."""

    window: Any  # uint8 device array over [base, end)
    shift: int  # window offset of the stage's arena's first byte
    tier_off: np.ndarray  # [n_layer, n_expert] int64 window offset of a tier-held pair, else -1
    slot_tier: Any  # [n_slot_all] int32 device: -1 own cache slot, else the holding stage
    counts: Any  # [n_layer, n_stages] int64 device: tier hits per layer and holding stage
    reached: tuple[int, ...]  # stages whose tiers this stage reads
    n_pairs: int  # tier pairs of this stage's layers it reaches


class TierTable:
    """The expert cache's device side with tier slots merged into every table it writes."""

    def __init__(self, inner, tier_slot: np.ndarray):
        self.inner, self.tier_slot = inner, tier_slot  # [n_layer, n_expert] int32, -1 none

    def write_table(self, table: np.ndarray) -> None:
        self.inner.write_table(np.where(table >= 0, table, self.tier_slot).astype(np.int32))

    def load(self, slot: int, layer: int, expert: int) -> None:
        self.inner.load(slot, layer, expert)


def fill_tiers(sm) -> list[int]:
    """Copy each card's planned tier pairs from the host store into its arena's helper_tier
    region (on that stage's stream). Returns the pairs copied per stage."""
    out = []
    for m, st, dev in zip(sm.stages, sm.plan.stages, sm.devices):
        if st.tier is None or not st.tier.n_slots:
            out.append(0)
            continue
        lay = st.tier.cache
        top = m.arena.device_plan.arena.region("helper_tier").offset
        with _on(dev):
            for j in range(lay.n_slots):
                blob = sm.store.blob(int(lay.slot_layer[j]), int(lay.slot_expert[j]))
                off = top + int(lay.slot_offset[j])
                m.arena.buffer[off:off + blob.size].copy_to_device(blob, stream=m.stream)
            m.stream.synchronize()
        out.append(lay.n_slots)
    return out


def _tier_range(m) -> tuple[int, int]:
    """(address, bytes) of the stage's helper tier."""
    top = m.arena.device_plan.arena.region("helper_tier")
    return device_address(m.arena.buffer) + top.offset, int(top.n_bytes)


def attach_tiers(sm) -> list[StageTiers | None]:
    """Point every stage at the tiers it reaches (see the module doc); None where a stage reaches
    no tier pair of its layers."""
    held = [(c, st.tier.cache) for c, st in enumerate(sm.plan.stages)
            if st.tier is not None and st.tier.n_slots]
    out: list[StageTiers | None] = []
    for g, m in enumerate(sm.stages):
        lo, hi = m.layers
        reach = [(c, lay) for c, lay in held
                 if c == g or peer_reachable(sm.devices[g], sm.devices[c])]
        mine = [(c, lay, np.flatnonzero((lay.slot_layer >= lo) & (lay.slot_layer < hi)))
                for c, lay in reach]
        mine = [(c, lay, idx) for c, lay, idx in mine if len(idx)]
        if not mine:
            out.append(None)
            continue
        with _on(sm.devices[g]):
            out.append(_attach(sm, g, m, mine))
    return out


def _attach(sm, g: int, m, mine) -> StageTiers:
    s = m.shape
    arena_at = device_address(m.arena.buffer)
    spans = [(arena_at, int(m.arena.buffer.nbytes))]
    spans += [_tier_range(sm.stages[c]) for c, _, _ in mine]
    base = min(a for a, _ in spans)
    end = max(a + n for a, n in spans)
    window = _window(base, end - base)
    shift = arena_at - base
    own = m.cache.layout
    n_own = own.n_slots
    n_tier = sum(len(idx) for _, _, idx in mine)
    slot_off = np.zeros(s.n_layer * s.n_expert, np.int64)  # [n_layer * n_expert] int64
    if n_own + n_tier > slot_off.size:
        raise RuntimeError(f"{n_own} cache and {n_tier} tier slots exceed the slot table")
    slot_off[:n_own] = shift + m.cache_base + own.slot_offset
    slot_tier = np.full(n_own + n_tier, -1, np.int32)  # [n_slot_all] int32
    tier_slot = np.full((s.n_layer, s.n_expert), -1, np.int32)  # [n_layer, n_expert]
    tier_off = np.full((s.n_layer, s.n_expert), -1, np.int64)  # [n_layer, n_expert]
    nxt = n_own
    for c, lay, idx in mine:
        at = _tier_range(sm.stages[c])[0] - base
        for j in idx:
            layer, expert = int(lay.slot_layer[j]), int(lay.slot_expert[j])
            slot_off[nxt] = tier_off[layer, expert] = at + int(lay.slot_offset[j])
            tier_slot[layer, expert], slot_tier[nxt] = nxt, c
            nxt += 1
    m.acts["slot_off"].copy_to_device(slot_off, stream=m.stream)
    m.cache.device = TierTable(m.cache.device, tier_slot)
    m.cache.device.write_table(m.cache.table)
    m.cache_bytes = window  # the decode kernels' `cache`
    m.expert_window, m.window_shift, m.tier_off = window, shift, tier_off
    counts = cuda.to_device(np.zeros((s.n_layer, len(sm.stages)), np.int64), stream=m.stream)
    st = StageTiers(window, shift, tier_off, cuda.to_device(slot_tier, stream=m.stream), counts,
                    tuple(c for c, _, _ in mine), n_tier)
    m.stream.synchronize()
    return st


def _window(base: int, n_bytes: int):
    """A uint8 device array over addresses [base, base + n_bytes) of the current context."""
    if SIMULATED:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        ptr = ctypes.cast(base, ctypes.POINTER(ctypes.c_uint8))
        return FakeCUDAArray(np.ctypeslib.as_array(ptr, shape=(n_bytes,)))
    from numba.cuda.cudadrv import devicearray
    from numba.cuda.cudadrv import driver as drv
    mem = drv.MemoryPointer(weakref.proxy(cuda.current_context()), ctypes.c_void_p(base),
                            n_bytes)
    return devicearray.DeviceNDArray((n_bytes,), (1,), np.dtype(np.uint8), gpu_data=mem)


@cuda.jit
def _count_tier_hits(ids, slot_table, layer, slot_tier, counts):
    # ids: [k] i32 the router's picks; counts: [n_layer, n_stages] i64; one warp
    t = cuda.threadIdx.x
    if t < ids.shape[0]:
        slot = slot_table[layer, ids[t]]
        if slot >= 0:
            c = slot_tier[slot]
            if c >= 0:
                cuda.atomic.add(counts, (layer, c), 1)


def count_tier_hits(ids, slot_table, layer: int, slot_tier, counts, *, stream=0) -> None:
    """counts[layer, c] += the entries of `ids` ([k] i32, k <= 32) whose slot in `slot_table`
    ([n_layer, n_expert] i32) is a tier slot of stage c (`slot_tier` [n_slot] i32, -1: none)."""
    check_array("ids", ids, np.int32, (None,))
    if not 1 <= ids.shape[0] <= 32:
        raise ValueError(f"ids: k = {ids.shape[0]}, expected 1..32 (one warp)")
    check_array("slot_table", slot_table, np.int32, (None, None))
    check_array("slot_tier", slot_tier, np.int32, (None,))
    check_array("counts", counts, np.int64, (slot_table.shape[0], None))
    _count_tier_hits[1, 32, stream](ids, slot_table, int(layer), slot_tier, counts)


_I32 = types.int32[::1]
register_ptx("engine", "count_tier_hits", lambda: (_count_tier_hits.py_func, (
    _I32, types.int32[:, ::1], types.int64, _I32, types.int64[:, ::1])))


class TierDecodeStep(DecodeStep):
    """The decode step of a stage with tiers: each layer's tier hits counted before its MoE."""

    route_in_moe = False  # the count reads the router's ids before the MoE launch

    def __init__(self, m, tiers: StageTiers, **kw):
        self.tiers = tiers
        super().__init__(m, **kw)

    def _moe(self, il: int, stream, *, cpu_misses: bool) -> None:
        a = self.m.acts
        count_tier_hits(a["topk_ids"][0], a["slot_table"], il, self.tiers.slot_tier,
                        self.tiers.counts, stream=stream)
        super()._moe(il, stream, cpu_misses=cpu_misses)


def _on(device: int):
    from strata.engine.multi.model import _on as on
    return on(device)
