"""Expert layers whose gate and up matrices are in different formats (the IQ_MIX and LEGACY_MIX
files: e.g. gate IQ3_S, up IQ4_XS), which the fused gate/up kernels of `strata.cuda_kernels`
cannot read (one decoder for both).

Decode: `moe_decode_mixed` — a projection kernel of one format run for gate, then for up (one
warp per h entry; x staged in shared memory; the second pass takes the first's h and applies
SwiGLU), and a down kernel (one warp per output row over all (expert, 32-value group) pairs),
each expert found like the fused kernels find it: cache slot, mapped host memory, or left to the
CPU pool; hits and misses counted. One kernel a format, so the binary's kernel bundle carries
every one (`register_ptx` below).

Prefill: `gate_up_unfused` — the grouped GEMM run twice as a plain (gather-free) grouped GEMM
over the chunk's rows copied into expert order: g = x_p @ gate_e^T, h = silu(g); g = x_p @ up_e^T,
h *= g. Scratch: the down projection's output buffer (`expert_out`, f32 [entries, n_embd]) is
free until the down GEMM, so its first half holds the gathered rows (f16) and its second half
g (f32 [entries, n_ff]): this needs n_embd >= 2 * n_ff, checked at load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, from_dtype, types

from strata.cuda_kernels.intrinsics import warp_sum
from strata.cuda_kernels.launch import (
    check_array,
    device_table,
    flat,
    n_blocks,
    register_ptx,
)
from strata.cuda_kernels.matmul import QuantWeights, moe_down
from strata.cuda_kernels.moe import MAX_STAGED_BYTES, down_group, expert_groups
from strata.cuda_kernels.moe_slots import resolve
from strata.cuda_kernels.qformats import FORMATS, get_format, is_planar
from strata.cuda_kernels.xstage import XPAD, stage_x, staged_bytes

WARPS = 4
THREADS = 32 * WARPS
MAX_K = 16
F0 = np.float32(0.0)
F1 = np.float32(1.0)
_CACHE: dict[tuple, object] = {}


@dataclass(frozen=True, slots=True)
class MixedLayout:
    """One layer's expert blob with gate, up and down each in its own format."""

    n_embd: int
    n_ff: int
    gate_type: int
    up_type: int
    down_type: int
    up_off: int
    down_off: int

    @property
    def gate_row_bytes(self) -> int:
        return get_format(self.gate_type).row_bytes(self.n_embd)

    @property
    def up_row_bytes(self) -> int:
        return get_format(self.up_type).row_bytes(self.n_embd)

    @property
    def down_row_bytes(self) -> int:
        return get_format(self.down_type).row_bytes(self.n_ff)


@cuda.jit(device=True, inline="always")
def _stage_tab(tab, tab_s, n):
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        tab_s[i] = tab[i]


def _proj_factory(f):
    dot = f.dot32t
    n_t, t_type, has_t = f.table.size, f.table.dtype.type, f.has_table

    @cuda.jit
    def proj_mixed(x, ids, slot_table, layer, cache, slot_off, host, host_off, cpu_misses,
                   miss_list, counters, row_bytes, part_off, n_groups, n_ff, second, h, tab):
        # One of gate/up (format f) for every expert of ids: x: [n_embd] f32; ids: [k] i32;
        # h: [k * n_ff] f32. First pass: h = gate x (and the expert's miss and count); second
        # (second = True, up's rows at part_off): h = silu(h) * (up x). A missed expert: 0.
        # Dynamic shared: [n_groups * XPAD] f32, the staged x.
        ts = cuda.shared.array(n_t, t_type)
        if has_t:
            _stage_tab(tab, ts, n_t)
        xs = cuda.shared.array(0, types.float32)
        stage_x(x, 0, n_groups * 32, xs, 0)
        cuda.syncthreads()
        kk = cuda.blockIdx.y
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * WARPS + (cuda.threadIdx.x >> 5)
        e = ids[kk]
        where, base = resolve(slot_table, layer, e, slot_off, host_off, cpu_misses)
        if not second and cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
            miss_list[kk] = e if where < 0 else -1
            cuda.atomic.add(counters, (layer, 0 if where == 0 else 1), 1)
        v = F0
        if where >= 0 and row < n_ff:
            src = cache if where == 0 else host
            off = base + part_off + row * row_bytes
            for j in range(lane, n_groups, 32):
                v += dot(src, off, j, xs, j * XPAD, ts)
        v = warp_sum(v)
        if lane == 0 and row < n_ff:
            i = kk * n_ff + row
            if where < 0:
                h[i] = F0
            elif second:
                g = h[i]
                h[i] = g / (F1 + math.exp(-g)) * v
            else:
                h[i] = v
    return proj_mixed


def _down_factory(fd):
    dot_d = fd.dot32t
    n_t, t_type, has_t = fd.table.size, fd.table.dtype.type, fd.has_table

    @cuda.jit
    def down_mixed(h, ids, weights, k, slot_table, layer, cache, slot_off, host, host_off,
                   cpu_misses, down_off, row_bytes, n_groups, n_embd, out, tab):
        # h: [k * n_ff] f32; weights: [k] f32; out: [n_embd] f32 += sum_k w_k down_k h_k;
        # dynamic shared: [k * n_groups * XPAD] f32, the staged h
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        ts = cuda.shared.array(n_t, t_type)
        if has_t:
            _stage_tab(tab, ts, n_t)
        hs = cuda.shared.array(0, types.float32)
        stage_x(h, 0, k * n_groups * 32, hs, 0)
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
                if s_where[kk] >= 0:
                    src = cache if s_where[kk] == 0 else host
                    acc += weights[kk] * dot_d(src, s_base[kk] + row * row_bytes, j, hs,
                                               q * XPAD, ts)
        acc = warp_sum(acc)
        if lane == 0 and row < n_embd:
            out[row] += acc
    return down_mixed


_FACTORIES = {"proj": _proj_factory, "down": _down_factory}


def _kernel(kind: str, ggml_type: int):
    key = (kind, ggml_type)
    if key not in _CACHE:
        _CACHE[key] = _FACTORIES[kind](FORMATS[ggml_type])
    return _CACHE[key]


def moe_decode_mixed(x, ids, weights, *, layer: int, layout: MixedLayout, slot_table, cache,
                     slot_off, host, host_off, h, out, miss_list, counters,
                     cpu_misses: bool = False, stream=0) -> None:
    """One token's MoE FFN of a mixed-format layer, added into `out` (as `moe_decode` with
    accumulate=True). x f32 [n_embd]; ids i32, weights f32 [k]; h f32 scratch [k, n_ff]."""
    check_array("x", x, np.float32, (layout.n_embd,))
    check_array("ids", ids, np.int32, (None,))
    k = ids.shape[0]
    if not 1 <= k <= MAX_K:
        raise ValueError(f"ids: k = {k}, expected 1..{MAX_K}")
    check_array("weights", weights, np.float32, (k,))
    check_array("h", h, np.float32, (k, layout.n_ff))
    check_array("out", out, np.float32, (layout.n_embd,))
    fg, fu, fd = (get_format(t) for t in (layout.gate_type, layout.up_type, layout.down_type))
    where = (slot_table, layer, cache, slot_off, host, host_off, bool(cpu_misses))
    h1 = h.reshape(h.size)
    n_groups = layout.n_embd // 32
    # gate, then up into the same h: one kernel a format, not one a (gate, up) pair, so the
    # binary's bundle holds every file's (21 formats, not 420 pairs)
    for f, row_bytes, off, second in ((fg, layout.gate_row_bytes, 0, False),
                                      (fu, layout.up_row_bytes, layout.up_off, True)):
        _kernel("proj", f.ggml_type)[
            (n_blocks(layout.n_ff, WARPS), k), THREADS, stream, staged_bytes(n_groups)](
            x, ids, *where, miss_list, counters, row_bytes, off, n_groups, layout.n_ff, second,
            h1, device_table(f))
    n_groups = layout.n_ff // 32
    n_group = down_group(k, layout.n_ff,
                         lambda g: staged_bytes(g * n_groups) <= MAX_STAGED_BYTES)
    for g_ids, g_wts, g_h, g_k, _ in expert_groups(ids, weights, h1, layout.n_ff, n_group):
        # each launch adds its experts into out
        _kernel("down", fd.ggml_type)[n_blocks(layout.n_embd, WARPS), THREADS, stream,
                                      staged_bytes(g_k * n_groups)](
            g_h, g_ids, g_wts, g_k, *where, layout.down_off, layout.down_row_bytes, n_groups,
            layout.n_embd, out, device_table(fd))


# -- prefill -----------------------------------------------------------------------------------

@cuda.jit
def gather_rows_kernel(x, perm, k, n_rows, n_cols, out):
    # x: [n_tokens * n_cols] f16; perm: [n_rows] i32 (entry at each position); out: [n_rows *
    # n_cols] f16: row p = x's row perm[p] // k (positions no entry fills are left alone)
    p = cuda.blockIdx.x
    src = perm[p]
    if src < 0 or src >= n_rows:
        return
    t = src // k
    for c in range(cuda.threadIdx.x, n_cols, cuda.blockDim.x):
        out[p * n_cols + c] = x[t * n_cols + c]


@cuda.jit
def swiglu_part_kernel(g, h, n, second):
    # g: [n] f32; h: [n] f16. First pass h = silu(g); second pass h *= g.
    i = cuda.grid(1)
    if i < n:
        v = g[i]
        if second:
            h[i] = np.float16(np.float32(h[i]) * v)
        else:
            h[i] = np.float16(v / (F1 + math.exp(-v)))


def check_prefill_room(n_embd: int, n_ff: int) -> None:
    """The unfused prompt path keeps its scratch in the down output's buffer (module doc)."""
    if n_embd < 2 * n_ff:
        raise ValueError(f"expert width {n_ff} over model width {n_embd}: the unfused gate/up "
                         f"prompt path needs n_embd >= 2 * n_ff for its scratch")


def gate_up_unfused(x16, gate: QuantWeights, up: QuantWeights, routing, h, scratch, *,
                    tile=None, stream=0) -> None:
    """h[p] = silu(x[t] @ gate_e^T) * (x[t] @ up_e^T) for gate and up in different formats.
    x16 f16 [n_tokens, n_embd]; h f16 [n_entries, n_ff]; scratch f32 [n_entries, n_embd];
    `tile`: the grouped GEMMs' tile (None: each format's default)."""
    ne, n_embd = routing.n_entries, x16.shape[1]
    n_ff = gate.n_rows
    check_prefill_room(n_embd, n_ff)
    check_array("x16", x16, np.float16, (routing.n_tokens, n_embd))
    check_array("h", h, np.float16, (ne, n_ff))
    check_array("scratch", scratch, np.float32, (ne, n_embd))
    raw = scratch.reshape(scratch.size).view(np.uint8)
    half = ne * n_embd * 2
    xp = raw[:half].view(np.float16).reshape(ne, n_embd)  # [entries, n_embd] f16, expert order
    g = raw[half:half + ne * n_ff * 4].view(np.float32).reshape(ne, n_ff)  # [entries, n_ff] f32
    gather_rows_kernel[ne, 256, stream](flat(x16), routing.perm, routing.k_top, ne, n_embd,
                                        flat(xp))
    for second, w in ((False, gate), (True, up)):
        moe_down(xp, w, routing, g, tile=tile, stream=stream)
        swiglu_part_kernel[n_blocks(ne * n_ff, 256), 256, stream](flat(g), flat(h), ne * n_ff,
                                                                   second)


_U8, _I32, _I64, _F32 = types.uint8[::1], types.int32[::1], types.int64[::1], types.float32[::1]
_F16 = types.float16[::1]
_I32_2D, _I64_2D, _INT = types.int32[:, ::1], types.int64[:, ::1], types.int64
# where an expert is: slot_table, layer, cache, slot_off, host, host_off, cpu_misses
_WHERE = (_I32_2D, _INT, _U8, _I64, _U8, _I64_2D, types.boolean)


def _tab(f):
    return types.Array(from_dtype(f.table.dtype), 1, "C")


# every format an expert matrix can hold (planar layouts are dense-only)
for _f in (f for f in FORMATS.values() if not is_planar(f.ggml_type)):
    register_ptx("engine", f"proj_mixed_{_f.name}", lambda f=_f: (_proj_factory(f).py_func, (
        _F32, _I32) + _WHERE + (_I32, _I64_2D, _INT, _INT, _INT, _INT, types.boolean, _F32,
                                _tab(f))))
    register_ptx("engine", f"down_mixed_{_f.name}", lambda f=_f: (_down_factory(f).py_func, (
        _F32, _I32, _F32, _INT) + _WHERE + (_INT, _INT, _INT, _INT, _F32, _tab(f))))
register_ptx("engine", "gather_rows", lambda: (gather_rows_kernel.py_func, (
    _F16, _I32, types.int64, types.int64, types.int64, _F16)))
register_ptx("engine", "swiglu_part", lambda: (swiglu_part_kernel.py_func, (
    _F32, _F16, types.int64, types.boolean)))
