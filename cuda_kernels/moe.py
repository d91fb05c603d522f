"""MoE decode for one token: the router's top-k experts of a layer, each read from its VRAM cache
slot (hit) or from mapped pinned host memory (miss), or left to the CPU pool (miss, when asked),
with no host round trip.

Per expert, its bytes are one blob laid out by `ExpertLayout`: gate [n_ff, n_embd] and up
[n_ff, n_embd] in one format, down [n_embd, n_ff] in another, at byte offsets inside the blob.
Where the blob lives is read on the device:
  slot_table [n_layer, n_expert] int32: cache slot, or -1 for a miss
  slot_off [n_slot] int64: byte offset of each slot in `cache` (uint8, device memory)
  host_off [n_layer, n_expert] int64: byte offset of each expert in `host` (uint8, mapped host
  memory the GPU reads over PCIe)
With `cpu_misses` set a missed expert is skipped here and written to miss_list (its id, in its
top-k position; -1 elsewhere) for the CPU pool, which adds its share to the output itself.
counters [n_layer, 2] int64 counts hits and misses per layer.

Two kernels: gate_up (grid: row blocks x k experts, h = silu(gate x) * (up x)) and down (each
output row sums the router-weighted down rows of all k experts, optionally added to `out`).
Formats with a lane decoding (`lanes`) use lane kernels (`moe_lanes`), as matvec does: gate_up
is one launch for all k experts over at most MIN_LANE_BLOCKS blocks (one wave on an H200), each
block staging x once and its warps taking (h entry, expert) items in turn, each item the gate
and the up row of one h entry (rows of one step, e.g. 2048 columns of Q4_K: the next item's
loads issued before the current one is dotted; longer rows: the steps of one row pipelined);
the experts' slots are resolved by k threads at once (not one thread in turn; `moe_slots`); a
down warp takes two output rows and, per step, its lane groups take consecutive (cached
expert, super-block) units of them, the missed experts left out of the unit list. Other
formats use one warp per row (gate_up) or one warp per output row with lanes spread over all
(expert, 32-value group) pairs (down). A gate/up format with an 8-bit decoding (`lanes_x8`:
Q4_K) stages x rounded to 8 bits per 32 values, as the CPU engine does (`GATE_UP_X8`).

Given the router's logits instead of its top k (`route_logits`), every block of a lane gate_up
launch ranks them itself before it resolves the slots (`moe_slots.route_shared`), and block 0
writes ids and weights for down: no launch has to wait for one block to route alone.

Given the state of a grid barrier (`sync`), lane formats whose gate/up rows take one step and
whose k h vectors fit one block run gate/up and down as one launch (`moe_fused`), with the same
bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda, from_dtype, types

from .elementwise import silu
from .intrinsics import warp_sum
from .lanes import LANE_FORMATS, lane_format
from .launch import MAX_SHARED_BYTES, check_array, device_table, n_blocks, register_ptx
from .matvec import (LANE_THREADS, LANE_WARPS, MIN_LANE_BLOCKS, lane_jit_options, lane_split,
                     lanes_fit, stage_table)
from .lanes_x8 import X8_FORMATS, lanes_for
from . import moe_fused
from .moe_lanes import _down_lanes, _gate_up_lanes, _gate_up_lanes_rows
from .moe_slots import MAX_K, ROUTE_MAX_EXPERTS, resolve
from .qformats import FORMATS, get_format, is_planar
from .router import MAX_EXPERTS, route
from .xstage import XPAD, padded_bytes, padded_len, stage_x, staged_bytes

WARPS = 4
THREADS = 32 * WARPS
MAX_STAGED_BYTES = MAX_SHARED_BYTES  # the x or h a kernel stages in shared memory
# gate/up dots 8-bit x (`lanes_x8`) in the formats that have it, as the CPU engine does. Read
# at launch, so a benchmark can compare both in one process.
GATE_UP_X8 = True
F0 = np.float32(0.0)

_CACHE: dict[tuple[str, int], object] = {}


@dataclass(frozen=True, slots=True)
class ExpertLayout:
    """Shapes, formats and byte offsets of one expert's blob (gate, up, down)."""

    n_embd: int
    n_ff: int
    gate_up_type: int
    down_type: int
    up_off: int = -1     # default: right after gate
    down_off: int = -1   # default: right after up

    def __post_init__(self):
        gu = get_format(self.gate_up_type)
        gate_bytes = self.n_ff * gu.row_bytes(self.n_embd)
        if self.up_off < 0:
            object.__setattr__(self, "up_off", gate_bytes)
        if self.down_off < 0:
            object.__setattr__(self, "down_off", self.up_off + gate_bytes)
        if self.up_off < gate_bytes or self.down_off < self.up_off + gate_bytes:
            raise ValueError(f"expert layout overlaps: gate {gate_bytes} B at 0, up at "
                             f"{self.up_off}, down at {self.down_off}")
        for name, off, align in (("up_off", self.up_off, 16), ("down_off", self.down_off, 16)):
            if off % align:
                raise ValueError(f"expert layout: {name} {off} is not {align}-byte aligned")

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's blob."""
        return self.down_off + self.n_embd * get_format(self.down_type).row_bytes(self.n_ff)

    @property
    def gate_row_bytes(self) -> int:
        return get_format(self.gate_up_type).row_bytes(self.n_embd)

    @property
    def down_row_bytes(self) -> int:
        return get_format(self.down_type).row_bytes(self.n_ff)


def _gate_up_factory(fmt):
    dot32t = fmt.dot32t
    n_tab, tab_type, has_tab = fmt.table.size, fmt.table.dtype.type, fmt.has_table

    @cuda.jit
    def moe_gate_up(x, ids, slot_table, layer, cache, slot_off, host, host_off, cpu_misses,
                    miss_list, counters, row_bytes, n_groups, n_ff, up_off, h, tab):
        # x: [n_embd] f32; ids: [k] i32; h: [k * n_ff] f32 (silu(gate) * up per expert);
        # tab: the format's table; dynamic shared: [n_groups * XPAD] f32, the staged x
        tab_s = cuda.shared.array(n_tab, tab_type)
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        xs = cuda.shared.array(0, types.float32)
        stage_x(x, 0, n_groups * 32, xs, 0)
        cuda.syncthreads()
        kk = cuda.blockIdx.y
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * WARPS + (cuda.threadIdx.x >> 5)
        e = ids[kk]
        where, base = resolve(slot_table, layer, e, slot_off, host_off, cpu_misses)
        if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
            miss_list[kk] = e if where < 0 else -1
            cuda.atomic.add(counters, (layer, 0 if where == 0 else 1), 1)
        g = F0
        u = F0
        if where >= 0 and row < n_ff:
            src = cache if where == 0 else host
            off = base + row * row_bytes
            for j in range(lane, n_groups, 32):
                g += dot32t(src, off, j, xs, j * XPAD, tab_s)
                u += dot32t(src, off + up_off, j, xs, j * XPAD, tab_s)
        g = warp_sum(g)
        u = warp_sum(u)
        if lane == 0 and row < n_ff:
            h[kk * n_ff + row] = silu(g) * u if where >= 0 else F0
    return moe_gate_up


def _down_factory(fmt):
    dot32t = fmt.dot32t
    n_tab, tab_type, has_tab = fmt.table.size, fmt.table.dtype.type, fmt.has_table

    @cuda.jit
    def moe_down(h, ids, weights, k, slot_table, layer, cache, slot_off, host, host_off,
                 cpu_misses, down_off, row_bytes, n_groups, n_embd, accumulate, out, tab):
        # h: [k * n_ff] f32; weights: [k] f32; out: [n_embd] f32 (= or += sum_k w_k down_k h_k);
        # dynamic shared: [k * n_groups * XPAD] f32, the staged h
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        hs = cuda.shared.array(0, types.float32)
        stage_x(h, 0, k * n_groups * 32, hs, 0)
        tab_s = cuda.shared.array(n_tab, tab_type)
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        t = cuda.threadIdx.x
        if t < k:
            where, base = resolve(slot_table, layer, ids[t], slot_off, host_off, cpu_misses)
            s_where[t] = where
            s_base[t] = base + down_off
        cuda.syncthreads()
        lane = t & 31
        row = cuda.blockIdx.x * WARPS + (t >> 5)
        acc = F0
        if row < n_embd:
            for q in range(lane, k * n_groups, 32):
                kk = q // n_groups
                j = q - kk * n_groups
                where = s_where[kk]
                if where >= 0:
                    src = cache if where == 0 else host
                    acc += weights[kk] * dot32t(src, s_base[kk] + row * row_bytes, j, hs,
                                                q * XPAD, tab_s)
        acc = warp_sum(acc)
        if lane == 0 and row < n_embd:
            out[row] = out[row] + acc if accumulate else acc
    return moe_down


_FACTORIES = {"gate_up": _gate_up_factory, "down": _down_factory,
              "gate_up_lanes": _gate_up_lanes, "gate_up_lanes_rows": _gate_up_lanes_rows,
              "down_lanes": _down_lanes}


def _kernel(kind: str, ggml_type: int, x8: bool = False):
    key = (kind, ggml_type, x8)
    if key not in _CACHE:
        lanes = X8_FORMATS if x8 else LANE_FORMATS
        spec = lanes[ggml_type] if "_lanes" in kind else FORMATS[ggml_type]
        _CACHE[key] = _FACTORIES[kind](spec)
    return _CACHE[key]


def moe_decode(x, ids, weights, *, layer: int, layout: ExpertLayout, slot_table, cache,
               slot_off, host, host_off, h, out, miss_list, counters, cpu_misses: bool = False,
               accumulate: bool = False, route_logits=None, norm_topk: bool = True,
               x8: bool | None = None, sync=None, stream=0) -> None:
    """One token's MoE FFN of layer `layer` (see the module doc). x: float32 [n_embd]; ids int32
    and weights float32 [k] (the router's output, in device memory); h: float32 scratch [k, n_ff];
    out: float32 [n_embd] (overwritten, or added to with `accumulate`); miss_list: int32 [k].

    route_logits: float32 [n_expert], the router's logits: the MoE routes them itself (softmax
    top-k, renormalised with norm_topk, as `router.route`) and writes ids and weights (outputs
    then). Where `routes_itself` holds, the gate/up launch does it in every block, so no router
    block has to wait for all the others' logits; else a `router.route` launch comes first.

    x8: whether gate/up dots 8-bit x where its format can (None: GATE_UP_X8); the batched
    kernels dot float32 x, so a row of a batch run alone passes False to get the same bits.

    sync: int32 [2] in device memory, zero before its first use (then kept by the kernels): the
    state of the barrier that lets gate/up and down run as one launch (`moe_fused`, where the
    formats and shapes allow). Launches in flight at once need their own."""
    _moe_decode(x, ids, weights, layer=layer, layout=layout, slot_table=slot_table, cache=cache,
                slot_off=slot_off, host=host, host_off=host_off, h=h, out=out,
                miss_list=miss_list, counters=counters, cpu_misses=cpu_misses,
                accumulate=accumulate, route_logits=route_logits, norm_topk=norm_topk,
                x8=x8, sync=sync, stream=stream)


def _gate_up_lanes_for(layout: ExpertLayout, x8: bool | None = None):
    """The lane format the gate/up launch of `layout` runs (8-bit x where the format has one
    and x8, default GATE_UP_X8, holds), or None (the one-warp-a-row kernel)."""
    lf = lane_format(get_format(layout.gate_up_type).ggml_type)
    if lf is None or not lanes_fit(lf, layout.n_embd):
        return None
    return lanes_for(lf, GATE_UP_X8 if x8 is None else x8)


def routes_itself(layout: ExpertLayout, n_expert: int) -> bool:
    """Whether `moe_decode(route_logits=...)` routes inside its gate/up launch (lane formats, at
    most ROUTE_MAX_EXPERTS experts) rather than with a `route` launch before it."""
    return _gate_up_lanes_for(layout) is not None and 1 <= n_expert <= ROUTE_MAX_EXPERTS


def _moe_decode(x, ids, weights, *, layer, layout, slot_table, cache, slot_off, host, host_off,
                h, out, miss_list, counters, cpu_misses, accumulate, stream,
                route_logits=None, norm_topk=True, x8=None, sync=None,
                max_row_blocks: int | None = None) -> None:
    """moe_decode; with max_row_blocks, each kernel runs only its first row blocks (the
    simulator tests run one block of each: a whole grid costs minutes there)."""
    def rows(n):
        return n if max_row_blocks is None else min(n, max_row_blocks)
    check_array("x", x, np.float32, (layout.n_embd,))
    check_array("ids", ids, np.int32, (None,))
    k = ids.shape[0]
    if not 1 <= k <= MAX_K:
        raise ValueError(f"ids: k = {k}, expected 1..{MAX_K}")
    check_array("weights", weights, np.float32, (k,))
    check_array("slot_table", slot_table, np.int32, (None, None))
    n_layer = slot_table.shape[0]
    if not 0 <= layer < n_layer:
        raise ValueError(f"layer {layer} outside the slot table's {n_layer} layers")
    check_array("cache", cache, np.uint8, (None,))
    check_array("slot_off", slot_off, np.int64, (None,))
    check_array("host", host, np.uint8, (None,))
    check_array("host_off", host_off, np.int64, tuple(slot_table.shape))
    check_array("h", h, np.float32, (k, layout.n_ff))
    check_array("out", out, np.float32, (layout.n_embd,))
    check_array("miss_list", miss_list, np.int32, (k,))
    check_array("counters", counters, np.int64, (n_layer, 2))
    gu_lanes = _gate_up_lanes_for(layout, x8)
    n_route = 0  # experts the gate/up launch routes itself (0: ids is the router's)
    if route_logits is not None:
        check_array("route_logits", route_logits, np.float32, (None,))
        n_expert = route_logits.shape[0]
        if not k <= n_expert <= MAX_EXPERTS:
            raise ValueError(f"route_logits: {n_expert} experts, expected {k}..{MAX_EXPERTS} "
                             f"(k = {k})")
        if gu_lanes is not None and n_expert <= ROUTE_MAX_EXPERTS:  # routes_itself
            n_route = n_expert
        else:
            route(route_logits.reshape(1, n_expert), ids.reshape(1, k), weights.reshape(1, k),
                  norm_topk=norm_topk, stream=stream)
    gu_fmt, dn_fmt = get_format(layout.gate_up_type), get_format(layout.down_type)
    dn_lanes = lane_format(dn_fmt.ggml_type)
    dn_lanes = dn_lanes if dn_lanes is not None and lanes_fit(dn_lanes, layout.n_ff) else None
    if gu_lanes is None and staged_bytes(layout.n_embd // 32) > MAX_STAGED_BYTES:
        raise ValueError(f"moe: n_embd = {layout.n_embd} values of x exceed the "
                         f"{MAX_STAGED_BYTES} B of shared memory the gate_up kernel stages")
    if dn_lanes is not None:
        n_group = down_group(k, layout.n_ff, lambda g: lanes_fit(dn_lanes, g * layout.n_ff))
    else:
        n_group = down_group(k, layout.n_ff,
                             lambda g: staged_bytes(g * layout.n_ff // 32) <= MAX_STAGED_BYTES)
    h1 = h.reshape(h.size)
    where = (slot_table, layer, cache, slot_off, host, host_off, bool(cpu_misses))
    # n_route 0: logits are never read; x stands in (an argument the kernel never writes: host
    # arrays are copied back per argument, so a written one would be lost)
    logits = (route_logits if n_route else x).reshape(1, n_route or layout.n_embd)
    if gu_lanes is not None:
        n_sb = layout.n_embd // gu_lanes.sb_values
        n_items = k * min(layout.n_ff, rows(n_blocks(layout.n_ff, LANE_WARPS)) * LANE_WARPS)
        one_step = n_sb <= gu_lanes.sbs_per_step  # a row in one step of a warp's lanes
        if (sync is not None and moe_fused.FUSE_DOWN and one_step and dn_lanes is not None
                and n_group >= k and moe_fused.fuses(gu_lanes, dn_lanes)
                and moe_fused.fits(gu_lanes, dn_lanes, layout.n_embd, k, layout.n_ff)):
            check_array("sync", sync, np.int32, (2,))
            if moe_fused.launch(x, ids, weights, k=k, n_items=n_items, where=where,
                                miss_list=miss_list, counters=counters, layout=layout,
                                gu=gu_lanes, dn=dn_lanes, h1=h1, logits=logits,
                                n_route=n_route, norm_topk=norm_topk, accumulate=accumulate,
                                out=out, sync=sync, stream=stream, rows=rows):
                return
        _kernel("gate_up_lanes" if one_step else "gate_up_lanes_rows", gu_fmt.ggml_type,
                gu_lanes.x8)[
            rows(min(n_blocks(n_items, LANE_WARPS), MIN_LANE_BLOCKS)), LANE_THREADS, stream,
            gu_lanes.stage_bytes(layout.n_embd)](
            x, ids, k, n_items, *where, miss_list, counters, layout.gate_row_bytes, n_sb,
            layout.n_ff, layout.up_off, gu_lanes.stage_len(layout.n_embd), h1,
            device_table(gu_lanes), logits, n_route, bool(norm_topk), weights)
    else:
        _kernel("gate_up", gu_fmt.ggml_type)[
            (rows(n_blocks(layout.n_ff, WARPS)), k), THREADS, stream,
            staged_bytes(layout.n_embd // 32)](
            x, ids, *where, miss_list, counters, layout.gate_row_bytes, layout.n_embd // 32,
            layout.n_ff, layout.up_off, h1, device_table(gu_fmt))
    for g_ids, g_wts, g_h, g_k, first in expert_groups(ids, weights, h1, layout.n_ff, n_group):
        _down(g_h, g_ids, g_wts, g_k, where, layout, dn_fmt, dn_lanes, accumulate or not first,
              out, stream, rows)


def down_group(k: int, n_ff: int, fits) -> int:
    """Experts per down launch: all k where their h fits the kernel's shared memory, else as
    few launches as fit, shared evenly. Qwen3-235B's 8 x 1536 f32 h is 48 KiB: two launches of
    four, the second adding into the first's output. ValueError where one expert's does not."""
    g = k
    while g > 0 and not fits(g):
        g -= 1
    if g == 0:
        raise ValueError(f"moe: n_ff = {n_ff} values of one expert's h exceed the "
                         f"{MAX_STAGED_BYTES} B of shared memory the down kernel stages")
    n_launch = -(-k // g)
    return -(-k // n_launch)


def expert_groups(ids, weights, h1, n_ff: int, n_group: int):
    """(ids, weights, h, k, first) of each down launch: views of n_group experts at a time
    (the arrays themselves where one launch takes all k: a device slice costs host time)."""
    k = ids.shape[0]
    if n_group >= k:
        yield ids, weights, h1, k, True
        return
    for j0 in range(0, k, n_group):
        j1 = min(k, j0 + n_group)
        yield ids[j0:j1], weights[j0:j1], h1[j0 * n_ff:j1 * n_ff], j1 - j0, j0 == 0


def _down(h1, ids, weights, k, where, layout, dn_fmt, dn_lanes, accumulate, out, stream, rows):
    """One launch of the down kernel over k experts' h (ids, weights, h1 views of a group)."""
    if dn_lanes is not None:
        n_sb = layout.n_ff // dn_lanes.sb_values
        log = lane_split(dn_lanes, layout.n_embd, k * n_sb)  # as if every expert were cached
        _kernel("down_lanes", dn_fmt.ggml_type)[
            rows(n_blocks(layout.n_embd, 2 * (LANE_WARPS >> log))), LANE_THREADS, stream,
            padded_bytes(k * layout.n_ff, dn_lanes.pad, dn_lanes.sums)](
            h1, ids, weights, k, *where, layout.down_off, layout.down_row_bytes, n_sb,
            np.float32(1.0 / n_sb), layout.n_embd, bool(accumulate),
            padded_len(k * layout.n_ff, dn_lanes.pad), log, out, device_table(dn_lanes))
    else:
        _kernel("down", dn_fmt.ggml_type)[
            rows(n_blocks(layout.n_embd, WARPS)), THREADS, stream,
            staged_bytes(k * layout.n_ff // 32)](
            h1, ids, weights, k, *where, layout.down_off, layout.down_row_bytes,
            layout.n_ff // 32, layout.n_embd, bool(accumulate), out, device_table(dn_fmt))


_U8, _I32, _I64, _F32 = types.uint8[::1], types.int32[::1], types.int64[::1], types.float32[::1]
_I32_2D, _I64_2D = types.int32[:, ::1], types.int64[:, ::1]
_GU_SIG = (_F32, _I32, _I32_2D, types.int64, _U8, _I64, _U8, _I64_2D, types.boolean, _I32,
           _I64_2D, types.int64, types.int64, types.int64, types.int64, _F32)
_DN_SIG = (_F32, _I32, _F32, types.int64, _I32_2D, types.int64, _U8, _I64, _U8, _I64_2D,
           types.boolean, types.int64, types.int64, types.int64, types.int64, types.boolean, _F32)


def _tab_type(fmt):
    return types.Array(from_dtype(fmt.table.dtype), 1, "C")


_GUL_SIG = (_F32, _I32, types.int64, types.int64) + _GU_SIG[2:-1] + (types.int64, _F32)
_ROUTE_SIG = (types.float32[:, ::1], types.int64, types.boolean, _F32)  # logits .. weights
_DNL_SIG = _DN_SIG[:14] + (types.float32, types.int64, types.boolean, types.int64,
                          types.int64, _F32)

for _l in list(LANE_FORMATS.values()) + list(X8_FORMATS.values()):
    if is_planar(_l.ggml_type):
        continue
    _x8 = "x8_" if _l.x8 else ""
    register_ptx("moe", f"moe_gate_up_lanes_{_x8}{_l.name}",
                 lambda f=_l: (_gate_up_lanes(f).py_func,
                               _GUL_SIG + (_tab_type(f),) + _ROUTE_SIG),
                 options=lane_jit_options(_l))
    register_ptx("moe", f"moe_gate_up_lanes_rows_{_x8}{_l.name}",
                 lambda f=_l: (_gate_up_lanes_rows(f).py_func,
                               _GUL_SIG + (_tab_type(f),) + _ROUTE_SIG),
                 options=lane_jit_options(_l))
    if _l.x8:  # down dots float32 h
        continue
    register_ptx("moe", f"moe_down_lanes_{_l.name}",
                 lambda f=_l: (_down_lanes(f).py_func, _DNL_SIG + (_tab_type(f),)),
                 options=lane_jit_options(_l))
for _f in (f for f in FORMATS.values() if not is_planar(f.ggml_type)):
    register_ptx("moe", f"moe_gate_up_{_f.name}",
                 lambda f=_f: (_gate_up_factory(f).py_func, _GU_SIG + (_tab_type(f),)))
    register_ptx("moe", f"moe_down_{_f.name}",
                 lambda f=_f: (_down_factory(f).py_func, _DN_SIG + (_tab_type(f),)))
moe_fused.register()
