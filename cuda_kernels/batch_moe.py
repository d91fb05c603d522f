"""MoE decode for a small batch of tokens (2..8 sequences decoding together): every token's top-k
experts of one layer in two launches, whatever the batch size.

Formats with a lane decoding (the K-quant and IQ mixes) run `batch_moe_lanes`'s kernels: gate_up
grouped by expert (each selected expert's rows read once for all the tokens that chose it) and
down per token, each token's arithmetic the one-token lane kernels'. The generic kernels below
serve the other formats:

The expert blobs are found as in `moe` (slot table -> VRAM cache slot, or mapped host memory for a
miss; `ExpertLayout` gives the gate/up/down offsets), and hits/misses are counted per layer. Work
is laid out per (token, top-k position) entry, the entries on the grid's fastest axis, so the
blocks that read the same rows of one expert for different tokens run side by side and the
repeated reads come from L2: HBM traffic follows the distinct experts of the batch, not n_tok * k.

* gate_up: block (entry, row block); one warp per row of h: h[t, kk] = silu(gate x_t) * (up x_t);
* down: block (token, row block); one warp per output row: out[t] (+)= sum_kk w[t, kk] down h.

Each token's arithmetic is the same whatever else is in the batch (no cross-token sums), so a
sequence decoded in a batch gets bit-for-bit the values it gets decoded with these kernels alone.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, from_dtype, types

from .batch_moe_lanes import _where, launch_lanes, lanes_plan
from .batch_moe_tc import launch_tc, tc_moe_fits
from .elementwise import silu
from .intrinsics import warp_sum
from .launch import MAX_SHARED_BYTES, check_array, device_table, n_blocks, register_ptx
from .matvec import stage_table
from .moe import ExpertLayout
from .moe_slots import MAX_K
from .qformats import BY_NAME, FORMATS, get_format
from .xstage import XPAD, stage_x, staged_bytes

WARPS = 8
THREADS = 32 * WARPS
MAX_TOKENS = 8
MAX_STAGED_BYTES = MAX_SHARED_BYTES  # the x or h a kernel stages in shared memory
F0 = np.float32(0.0)

_CACHE: dict[tuple[str, int], object] = {}


def _gate_up_factory(fmt):
    dot32t = fmt.dot32t
    n_tab, tab_type, has_tab = fmt.table.size, fmt.table.dtype.type, fmt.has_table

    @cuda.jit
    def batch_gate_up(x, ids, k, slot_table, layer, cache, slot_off, host, host_off, counters,
                      row_bytes, n_groups, n_ff, up_off, h, tab):
        # x: [n_tok * n_embd] f32; ids: [n_tok * k] i32; h: [n_tok * k * n_ff] f32;
        # dynamic shared: [n_groups * XPAD] f32, the entry's token's x
        tab_s = cuda.shared.array(n_tab, tab_type)
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        entry = cuda.blockIdx.x
        t = entry // k
        xs = cuda.shared.array(0, types.float32)
        stage_x(x, t * n_groups * 32, n_groups * 32, xs, 0)
        cuda.syncthreads()
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.y * WARPS + (cuda.threadIdx.x >> 5)
        where, base = _where(slot_table, layer, ids[entry], slot_off, host_off)
        if cuda.blockIdx.y == 0 and cuda.threadIdx.x == 0:
            cuda.atomic.add(counters, (layer, where), 1)
        g = F0
        u = F0
        if row < n_ff:
            src = cache if where == 0 else host
            off = base + row * row_bytes
            for j in range(lane, n_groups, 32):
                g += dot32t(src, off, j, xs, j * XPAD, tab_s)
                u += dot32t(src, off + up_off, j, xs, j * XPAD, tab_s)
        g = warp_sum(g)
        u = warp_sum(u)
        if lane == 0 and row < n_ff:
            h[entry * n_ff + row] = silu(g) * u
    return batch_gate_up


def _down_factory(fmt):
    dot32t = fmt.dot32t
    n_tab, tab_type, has_tab = fmt.table.size, fmt.table.dtype.type, fmt.has_table

    @cuda.jit
    def batch_down(h, ids, weights, k, slot_table, layer, cache, slot_off, host, host_off,
                   down_off, row_bytes, n_groups, n_embd, accumulate, out, tab):
        # h: [n_tok * k * n_ff] f32; ids, weights: [n_tok * k]; out: [n_tok * n_embd] f32;
        # dynamic shared: [k * n_groups * XPAD] f32, the token's k h vectors
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        tab_s = cuda.shared.array(n_tab, tab_type)
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        t = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        hs = cuda.shared.array(0, types.float32)
        stage_x(h, t * k * n_groups * 32, k * n_groups * 32, hs, 0)
        if tid < k:
            where, base = _where(slot_table, layer, ids[t * k + tid], slot_off, host_off)
            s_where[tid] = where
            s_base[tid] = base + down_off
        cuda.syncthreads()
        lane = tid & 31
        row = cuda.blockIdx.y * WARPS + (tid >> 5)
        acc = F0
        if row < n_embd:
            for q in range(lane, k * n_groups, 32):
                kk = q // n_groups
                src = cache if s_where[kk] == 0 else host
                acc += weights[t * k + kk] * dot32t(src, s_base[kk] + row * row_bytes,
                                                    q - kk * n_groups, hs, q * XPAD, tab_s)
        acc = warp_sum(acc)
        if lane == 0 and row < n_embd:
            o = t * n_embd + row
            out[o] = out[o] + acc if accumulate else acc
    return batch_down


_FACTORIES = {"gate_up": _gate_up_factory, "down": _down_factory}


def _kernel(kind: str, ggml_type: int):
    key = (kind, ggml_type)
    if key not in _CACHE:
        _CACHE[key] = _FACTORIES[kind](FORMATS[ggml_type])
    return _CACHE[key]


def batch_moe_fits(layout: ExpertLayout, k: int, n_tok: int, tensor_cores: bool = False) -> bool:
    """Whether `batch_moe_decode` runs this layout for n_tok tokens of k experts: else (a
    token's k h vectors beyond one block's shared memory, as Qwen3-235B's 8 x 1536) the
    caller runs the tokens one by one through `moe.moe_decode`, which splits the experts."""
    if tensor_cores and tc_moe_fits(layout):
        return True
    if lanes_plan(layout, k, n_tok) is not None:
        return True
    return max(staged_bytes(layout.n_embd // 32),
               staged_bytes(k * layout.n_ff // 32)) <= MAX_STAGED_BYTES


def batch_moe_decode(x, ids, weights, *, layer: int, layout: ExpertLayout, slot_table, cache,
                     slot_off, host, host_off, h, out, counters, accumulate: bool = False,
                     stream=0, max_row_blocks: int | None = None,
                     tensor_cores: bool = False) -> None:
    """The MoE FFN of layer `layer` for n_tok tokens at once (see the module doc).

    x: float32 [n_tok, n_embd]; ids int32 and weights float32 [n_tok, k] (the router's output);
    h: float32 scratch [n_tok, k, n_ff]; out: float32 [n_tok, n_embd] (overwritten, or added to
    with `accumulate`); slot_table int32 [n_layer, n_expert], slot_off int64 [n_slot], cache and
    host uint8, host_off int64 [n_layer, n_expert], counters int64 [n_layer, 2] (hits, misses).
    `max_row_blocks` runs only the first row blocks of each kernel (simulator tests).
    `tensor_cores`: where both formats have them, the tensor-core kernels (`batch_moe_tc`: each
    expert's weights dequantized once for its tokens; float32 rounding, not bit for bit, against
    the one-token kernels), else the lane or generic kernels.
    """
    check_array("x", x, np.float32, (None, layout.n_embd))
    n_tok = x.shape[0]
    if not 1 <= n_tok <= MAX_TOKENS:
        raise ValueError(f"x: {n_tok} tokens, the batched MoE takes 1..{MAX_TOKENS}")
    check_array("ids", ids, np.int32, (n_tok, None))
    k = ids.shape[1]
    if not 1 <= k <= MAX_K:
        raise ValueError(f"ids: k = {k}, expected 1..{MAX_K}")
    check_array("weights", weights, np.float32, (n_tok, k))
    check_array("slot_table", slot_table, np.int32, (None, None))
    n_layer = slot_table.shape[0]
    if not 0 <= layer < n_layer:
        raise ValueError(f"layer {layer} outside the slot table's {n_layer} layers")
    check_array("cache", cache, np.uint8, (None,))
    check_array("slot_off", slot_off, np.int64, (None,))
    check_array("host", host, np.uint8, (None,))
    check_array("host_off", host_off, np.int64, tuple(slot_table.shape))
    check_array("h", h, np.float32, (n_tok, k, layout.n_ff))
    check_array("out", out, np.float32, (n_tok, layout.n_embd))
    check_array("counters", counters, np.int64, (n_layer, 2))
    def rows(n: int) -> int:
        return n if max_row_blocks is None else min(n, max_row_blocks)

    where = (slot_table, layer, cache, slot_off, host, host_off)
    h1 = h.reshape(h.size)
    ids1, w1, x1, out1 = ids.reshape(ids.size), weights.reshape(weights.size), x.reshape(x.size), \
        out.reshape(out.size)
    if tensor_cores and tc_moe_fits(layout):
        launch_tc(x1, ids1, w1, k, n_tok, layout=layout, where=where, counters=counters, h1=h1,
                  out1=out1, accumulate=accumulate, stream=stream, rows=rows)
        return
    lanes = lanes_plan(layout, k, n_tok)
    if lanes is not None:
        launch_lanes(lanes, x1, ids1, w1, k, n_tok, layout=layout, where=where,
                     counters=counters, h1=h1, out=out1, accumulate=accumulate, stream=stream,
                     rows=rows, tables=(device_table(lanes.gu), device_table(lanes.dn)))
        return
    x_bytes, h_bytes = staged_bytes(layout.n_embd // 32), staged_bytes(k * layout.n_ff // 32)
    if max(x_bytes, h_bytes) > MAX_STAGED_BYTES:
        raise ValueError(f"batched moe: n_embd {layout.n_embd} or k * n_ff {k * layout.n_ff} "
                         f"values exceed the {MAX_STAGED_BYTES} B of shared memory staged")
    gu, dn = get_format(layout.gate_up_type), get_format(layout.down_type)
    _kernel("gate_up", gu.ggml_type)[(n_tok * k, rows(n_blocks(layout.n_ff, WARPS))), THREADS,
                                     stream, x_bytes](
        x1, ids1, k, *where, counters, layout.gate_row_bytes, layout.n_embd // 32, layout.n_ff,
        layout.up_off, h1, device_table(gu))
    _kernel("down", dn.ggml_type)[(n_tok, rows(n_blocks(layout.n_embd, WARPS))), THREADS, stream,
                                  h_bytes](
        h1, ids1, w1, k, *where, layout.down_off, layout.down_row_bytes, layout.n_ff // 32,
        layout.n_embd, bool(accumulate), out1, device_table(dn))


_U8, _I32, _I64, _F32 = types.uint8[::1], types.int32[::1], types.int64[::1], types.float32[::1]
_I32_2D, _I64_2D = types.int32[:, ::1], types.int64[:, ::1]
_WHERE = (_I32_2D, types.int64, _U8, _I64, _U8, _I64_2D)
_GU_SIG = (_F32, _I32, types.int64) + _WHERE + (_I64_2D, types.int64, types.int64, types.int64,
                                                 types.int64, _F32)
_DN_SIG = (_F32, _I32, _F32, types.int64) + _WHERE + (types.int64, types.int64, types.int64,
                                                       types.int64, types.boolean, _F32)


def _tab_type(fmt):
    return types.Array(from_dtype(fmt.table.dtype), 1, "C")


# The expert formats of the llama.cpp mixes (and F16): every other format's dot32t is compiled
# by `moe`'s generic kernels, so these cover the batched kernels' own code at a third of the cost.
PTX_FORMATS = ("F16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_S")

for _f in (BY_NAME[n] for n in PTX_FORMATS):
    register_ptx("batch_moe", f"batch_gate_up_{_f.name}",
                 lambda f=_f: (_gate_up_factory(f).py_func, _GU_SIG + (_tab_type(f),)))
    register_ptx("batch_moe", f"batch_down_{_f.name}",
                 lambda f=_f: (_down_factory(f).py_func, _DN_SIG + (_tab_type(f),)))
