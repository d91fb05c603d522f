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

Two kernels: gate_up (grid: n_ff/4 blocks x k experts, one warp per row, gate and up rows dotted
with x in one pass, h = silu(g) * u) and down (one warp per output row, its lanes spread over all
(expert, group) pairs, weighted by the router weights and summed, optionally added to `out`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda, from_dtype, types

from .elementwise import silu
from .intrinsics import warp_sum
from .launch import check_array, device_table, n_blocks, register_ptx
from .matvec import stage_table
from .xstage import XPAD, stage_x, staged_bytes
from .qformats import FORMATS, get_format

WARPS = 4
THREADS = 32 * WARPS
MAX_K = 16
MAX_STAGED_BYTES = 48 * 1024  # static limit of dynamic shared memory without an opt-in
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
        gu, dn = get_format(self.gate_up_type), get_format(self.down_type)
        gate_bytes = self.n_ff * gu.row_bytes(self.n_embd)
        down_bytes = self.n_embd * dn.row_bytes(self.n_ff)
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


@cuda.jit(device=True, inline="always")
def resolve(slot_table, layer, e, slot_off, host_off, cpu_misses):
    """(where, base): where 0 = cache, 1 = host, -1 = left to the CPU pool."""
    slot = slot_table[layer, e]
    if slot >= 0:
        return 0, slot_off[slot]
    if cpu_misses:
        return -1, np.int64(0)
    return 1, host_off[layer, e]


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


def _kernel(kind: str, ggml_type: int):
    key = (kind, ggml_type)
    if key not in _CACHE:
        factory = _gate_up_factory if kind == "gate_up" else _down_factory
        _CACHE[key] = factory(FORMATS[ggml_type])
    return _CACHE[key]


def moe_decode(x, ids, weights, *, layer: int, layout: ExpertLayout, slot_table, cache,
               slot_off, host, host_off, h, out, miss_list, counters, cpu_misses: bool = False,
               accumulate: bool = False, stream=0) -> None:
    """One token's MoE FFN of layer `layer` (see the module doc). x: float32 [n_embd]; ids int32
    and weights float32 [k] (the router's output, in device memory); h: float32 scratch [k, n_ff];
    out: float32 [n_embd] (overwritten, or added to with `accumulate`); miss_list: int32 [k]."""
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
    if staged_bytes(layout.n_embd // 32) > MAX_STAGED_BYTES:
        raise ValueError(f"moe: n_embd = {layout.n_embd} values of x exceed the "
                         f"{MAX_STAGED_BYTES} B of shared memory the gate_up kernel stages")
    if staged_bytes(k * layout.n_ff // 32) > MAX_STAGED_BYTES:
        raise ValueError(f"moe: k * n_ff = {k * layout.n_ff} values of h exceed the "
                         f"{MAX_STAGED_BYTES} B of shared memory the down kernel stages")
    gu = _kernel("gate_up", get_format(layout.gate_up_type).ggml_type)
    gu[(n_blocks(layout.n_ff, WARPS), k), THREADS, stream, staged_bytes(layout.n_embd // 32)](
        x, ids, slot_table, layer, cache, slot_off, host, host_off, bool(cpu_misses), miss_list,
        counters, layout.gate_row_bytes, layout.n_embd // 32, layout.n_ff, layout.up_off,
        h.reshape(h.size), device_table(get_format(layout.gate_up_type)))
    dn = _kernel("down", get_format(layout.down_type).ggml_type)
    dn[n_blocks(layout.n_embd, WARPS), THREADS, stream, staged_bytes(k * layout.n_ff // 32)](
        h.reshape(h.size), ids, weights, k, slot_table, layer, cache, slot_off, host, host_off,
        bool(cpu_misses), layout.down_off, layout.down_row_bytes, layout.n_ff // 32,
        layout.n_embd, bool(accumulate), out, device_table(get_format(layout.down_type)))


_U8, _I32, _I64, _F32 = types.uint8[::1], types.int32[::1], types.int64[::1], types.float32[::1]
_I32_2D, _I64_2D = types.int32[:, ::1], types.int64[:, ::1]
_GU_SIG = (_F32, _I32, _I32_2D, types.int64, _U8, _I64, _U8, _I64_2D, types.boolean, _I32,
           _I64_2D, types.int64, types.int64, types.int64, types.int64, _F32)
_DN_SIG = (_F32, _I32, _F32, types.int64, _I32_2D, types.int64, _U8, _I64, _U8, _I64_2D,
           types.boolean, types.int64, types.int64, types.int64, types.int64, types.boolean, _F32)


def _tab_type(fmt):
    return types.Array(from_dtype(fmt.table.dtype), 1, "C")


for _f in FORMATS.values():
    register_ptx("moe", f"moe_gate_up_{_f.name}",
                 lambda f=_f: (_gate_up_factory(f).py_func, _GU_SIG + (_tab_type(f),)))
    register_ptx("moe", f"moe_down_{_f.name}",
                 lambda f=_f: (_down_factory(f).py_func, _DN_SIG + (_tab_type(f),)))
