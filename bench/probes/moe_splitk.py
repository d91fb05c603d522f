"""Probe (not part of the engine): one token's MoE with no barrier, down split along its columns.

The fused kernel (`cuda_kernels/moe_fused.py`) runs gate/up over the whole grid, waits at a grid
barrier, stages all k h vectors in every block, then runs down. Its stamps (H100, 2026-12-06)
put ~3 us of a 15.5 us layer between gate/up's end and the barrier's opening and 1.45 us in
staging h after it. Here each block owns a unit (expert c, down super-block sb, down lane part p)
and needs no other block's h: it computes the h entries of its part (its gate and up rows), then
that part's slice of every down row (or of 1/n_split of them; the n_split blocks of a unit
compute its gate/up alike, the copies after the first read from L2), and adds each row's
weighted dot into a shared accumulator. The sums are int64 fixed point (2^-32; integer adds
commute, so the result does not depend on which block adds first: same bits every run), and
the block that arrives last (a ticket) converts them into out and zeroes them for the next
launch. Mode "f32" adds float32 straight into out (a different rounding per run; for timing
the ticket's cost only).

Run from the repository root: on a GPU machine `python bench/probes/moe_splitk.py [--json F]`
(the fused kernel and the variants in one process, 12 layers in a CUDA graph, all hits); on the
CPU `NUMBA_ENABLE_CUDASIM=1 python bench/probes/moe_splitk.py --sim` (tiny shapes against the
engine's two-launch MoE).
"""
import argparse
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, types

sys.path.insert(0, ".")
from strata.bench.kernels import Ctx, moe_routing, moe_setup, time_same_size_read  # noqa: E402
from strata.cuda_kernels import moe, moe_splitk  # noqa: E402
from strata.cuda_kernels.elementwise import silu  # noqa: E402
from strata.cuda_kernels.intrinsics import SIMULATED, warp_sum  # noqa: E402
from strata.cuda_kernels.lanes import lane_format, pair_step  # noqa: E402
from strata.cuda_kernels.lanes_x8 import lanes_for, stager  # noqa: E402
from strata.cuda_kernels.launch import device_table  # noqa: E402
from strata.cuda_kernels.matvec import LANE_THREADS, LANE_WARPS, stage_table  # noqa: E402
from strata.cuda_kernels.moe_slots import MAX_K, route_resolve  # noqa: E402

FIX = np.float32(2.0 ** 32)
UNFIX = np.float32(2.0 ** -32)
_CACHE = {}


def _splitk(gu, dn, blocks_an_sm, mode, ahead):
    load_pair, dot_pair = pair_step(gu)
    stage_x, xs_type = stager(gu)[0], gu.xs_type
    gu_values = gu.sb_values
    n_tg, tg_type, has_tg = gu.table.size, gu.table.dtype.type, gu.has_table
    n_td, td_type, has_td = dn.table.size, dn.table.dtype.type, dn.has_table
    dn_load, dn_dot = dn.load, dn.dot
    parts, sbv, sb_bytes = dn.lanes, dn.sb_values, dn.sb_bytes
    n_pv = sbv // parts  # h entries of one part
    pa_a, pa_pa, pa_b, pa_pb = dn.pad
    pad_sb = dn.padded_sb
    hs_len = pad_sb + sbv // 16
    q6 = dn.ggml_type == int(T.Q6_K)
    if dn.ggml_type not in (int(T.Q4_K), int(T.Q6_K)):
        raise ValueError(f"splitk: no part layout for {dn.name}")
    fixed = mode == "fixed"
    two = ahead == 2  # loads issued two items (rows) ahead, not one
    jit = {} if SIMULATED else {"launch_bounds": (LANE_THREADS, blocks_an_sm)}

    @cuda.jit(device=True, inline="always")
    def part_value(p, j):
        # value j < n_pv of lane part p of a super-block (`lanes_k`'s slices)
        if q6:
            base = 128 * (p >> 2) + 32 * ((p >> 1) & 1) + 16 * (p & 1)
            return base + j if j < 16 else base + 48 + j
        return n_pv * p + j

    @cuda.jit(device=True, inline="always")
    def pad(v):
        return v + pa_pa * (v >> pa_a) + pa_pb * (v >> pa_b)

    @cuda.jit(**jit)
    def moe_splitk(x, ids, weights, k, slot_table, layer, cache, slot_off, host, host_off,
                   cpu_misses, miss_list, counters, gu_row_bytes, gu_n_sb, up_off, gu_sums_off,
                   tab_gu, logits, n_route, norm_topk, down_off, dn_row_bytes, dn_n_sb, n_embd,
                   accumulate, n_split, acc64, ticket, out, tab_dn):
        # acc64: [n_embd] int64, zero between launches; ticket: [1] int32, zero between launches
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        tab_g = cuda.shared.array(n_tg, tg_type)
        tab_d = cuda.shared.array(n_td, td_type)
        hs = cuda.shared.array(hs_len, types.float32)  # one super-block of h, padded, + sums
        s_last = cuda.shared.array(1, types.int32)
        xs = cuda.shared.array(0, xs_type)
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5
        route_resolve(logits, n_route, k, norm_topk, ids, weights, slot_table, layer, slot_off,
                      host_off, cpu_misses, miss_list, counters, s_where, s_base, True)
        u = cuda.blockIdx.x // n_split
        s = cuda.blockIdx.x - u * n_split
        per_c = dn_n_sb * parts
        c = u // per_c
        rem = u - c * per_c
        sb = rem // parts
        p = rem - sb * parts
        for i in range(t, hs_len, LANE_THREADS):
            hs[i] = np.float32(0.0)
        cuda.syncthreads()
        where = s_where[c]  # the same in the whole block
        src = cache if where == 0 else host
        base = s_base[c]
        j = w
        off = base + (sb * sbv + part_value(p, j)) * gu_row_bytes
        cur = load_pair(src, off, off + up_off, gu_n_sb, 0)  # in flight while x is staged
        nx1 = cur
        if two and w + LANE_WARPS < n_pv:
            off1 = base + (sb * sbv + part_value(p, w + LANE_WARPS)) * gu_row_bytes
            nx1 = load_pair(src, off1, off1 + up_off, gu_n_sb, 0)
        if has_tg:
            stage_table(tab_gu, tab_g, n_tg)
        if has_td:
            stage_table(tab_dn, tab_d, n_td)
        stage_x(x, gu_n_sb * gu_values, xs, gu_sums_off)
        cuda.syncthreads()
        if where >= 0:
            while j < n_pv:
                j1 = j + (2 * LANE_WARPS if two else LANE_WARPS)
                nxt = nx1 if two else cur
                if j1 < n_pv:
                    off1 = base + (sb * sbv + part_value(p, j1)) * gu_row_bytes
                    nxt = load_pair(src, off1, off1 + up_off, gu_n_sb, 0)
                g, uu = dot_pair(cur, gu_n_sb, 0, xs, gu_sums_off, tab_g)
                g = warp_sum(g)
                uu = warp_sum(uu)
                if lane == 0:
                    hs[pad(part_value(p, j))] = silu(g) * uu
                if two:
                    cur = nx1
                    nx1 = nxt
                else:
                    cur = nxt
                j += LANE_WARPS
        rows_per = (n_embd + n_split - 1) // n_split
        r0 = s * rows_per
        r1 = min(r0 + rows_per, n_embd)
        dbase = base + down_off + sb * sb_bytes
        r = r0 + t
        cur_d = dn_load(src, dbase + min(r, r1 - 1) * dn_row_bytes, p)  # across the barrier
        nd1 = cur_d
        if two and r + LANE_THREADS < r1:
            nd1 = dn_load(src, dbase + (r + LANE_THREADS) * dn_row_bytes, p)
        cuda.syncthreads()
        if t < sbv // 16:  # the 16-value sums of h (zero outside the part)
            acc = np.float32(0.0)
            for i in range(16):
                acc += hs[pad(16 * t + i)]
            hs[pad_sb + t] = acc
        cuda.syncthreads()
        if where >= 0:
            wt = weights[c]
            while r < r1:
                r_n = r + (2 * LANE_THREADS if two else LANE_THREADS)
                nxt_d = nd1 if two else cur_d
                if r_n < r1:
                    nxt_d = dn_load(src, dbase + r_n * dn_row_bytes, p)
                d = dn_dot(cur_d, p, hs, 0, pad_sb, tab_d) * wt
                if fixed:
                    cuda.atomic.add(acc64, r, np.int64(d * FIX))
                else:
                    cuda.atomic.add(out, r, d)
                if two:
                    cur_d = nd1
                    nd1 = nxt_d
                else:
                    cur_d = nxt_d
                r += LANE_THREADS
        if fixed:
            cuda.syncthreads()
            if t == 0:
                cuda.threadfence()
                tk = cuda.atomic.add(ticket, 0, 1)
                s_last[0] = 1 if tk == cuda.gridDim.x - 1 else 0
            cuda.syncthreads()
            if s_last[0] != 0:
                cuda.threadfence()
                for i in range(t, n_embd, LANE_THREADS):
                    v = cuda.atomic.exch(acc64, i, np.int64(0))
                    f = np.float32(v) * UNFIX
                    out[i] = out[i] + f if accumulate else f
                if t == 0:
                    ticket[0] = 0
    return moe_splitk


class SplitK:
    """The probe kernel's launcher for one layout (its scratch made once, zero); mode "engine":
    `cuda_kernels/moe_splitk.py` instead, its AHEAD as set."""

    def __init__(self, lay, k, *, n_split=1, blocks_an_sm=2, mode="fixed", ahead=1, stream=0):
        from strata.cuda_kernels.qformats import get_format
        self.gu = lanes_for(lane_format(get_format(lay.gate_up_type).ggml_type), True)
        self.dn = lane_format(get_format(lay.down_type).ggml_type)
        self.engine = mode == "engine"
        if self.engine:
            moe_splitk.AHEAD = ahead
            self.lay, self.k, self.n_split = lay, k, n_split
            self.scratch = cuda.to_device(np.zeros(lay.n_embd + 1, np.int64), stream=stream)
            return
        key = (self.gu.ggml_type, self.dn.ggml_type, blocks_an_sm, mode, ahead)
        if key not in _CACHE:
            _CACHE[key] = _splitk(self.gu, self.dn, blocks_an_sm, mode, ahead)
        self.kern, self.lay, self.k, self.n_split = _CACHE[key], lay, k, n_split
        self.acc64 = cuda.to_device(np.zeros(lay.n_embd, np.int64), stream=stream)
        self.ticket = cuda.to_device(np.zeros(1, np.int32), stream=stream)

    def __call__(self, x, ids, weights, *, layer, slot_table, cache, slot_off, host, host_off,
                 miss_list, counters, out, accumulate=False, stream=0):
        lay, gu, dn = self.lay, self.gu, self.dn
        if self.engine:
            where = (slot_table, layer, cache, slot_off, host, host_off, False)
            moe_splitk.launch(x, ids, weights, k=self.k, where=where, miss_list=miss_list,
                              counters=counters, layout=lay, gu=gu, dn=dn,
                              logits=x.reshape(1, lay.n_embd), n_route=0, norm_topk=True,
                              accumulate=accumulate, out=out, scratch=self.scratch,
                              stream=stream, n_split=self.n_split)
            return
        gu_n_sb, dn_n_sb = lay.n_embd // gu.sb_values, lay.n_ff // dn.sb_values
        grid = self.k * dn_n_sb * dn.lanes * self.n_split
        self.kern[grid, LANE_THREADS, stream, gu.stage_bytes(lay.n_embd)](
            x, ids, weights, self.k, slot_table, layer, cache, slot_off, host, host_off, False,
            miss_list, counters, lay.gate_row_bytes, gu_n_sb, lay.up_off,
            gu.stage_len(lay.n_embd), device_table(gu), x.reshape(1, lay.n_embd), 0, True,
            lay.down_off, lay.down_row_bytes, dn_n_sb, lay.n_embd, bool(accumulate),
            self.n_split, self.acc64, self.ticket, out, device_table(dn))


def case(ctx, gu, dn, *, n_layer, n_expert, k, n_embd, n_ff):
    lay, cache, slot_table, slot_off, host_off = moe_setup(
        ctx, gu, dn, n_layer=n_layer, n_expert=n_expert, n_embd=n_embd, n_ff=n_ff)
    ids, wts = moe_routing(ctx, n_layer, n_expert, k)
    x = ctx.upload(ctx.rng.standard_normal(lay.n_embd).astype(np.float32))
    h = ctx.cuda.device_array((k, lay.n_ff), np.float32)
    miss = ctx.cuda.device_array(k, np.int32)
    counters = ctx.upload(np.zeros((n_layer, 2), np.int64))
    tables = dict(slot_table=slot_table, cache=cache, slot_off=slot_off, host=cache,
                  host_off=host_off, miss_list=miss, counters=counters)
    span, layer_bytes = k * lay.expert_bytes, n_expert * lay.expert_bytes
    reads = [cache[i * layer_bytes:i * layer_bytes + span] for i in range(n_layer)]
    return lay, x, ids, wts, h, tables, reads


def engine_record(lay, x, ids, wts, h, tables, y, sync):
    def record(s):
        for layer in range(len(ids)):
            moe.moe_decode(x, ids[layer], wts[layer], layer=layer, layout=lay, h=h, out=y,
                           sync=sync, stream=s, **tables)
    return record


def splitk_record(kern, x, ids, wts, tables, y):
    def record(s):
        for layer in range(len(ids)):
            kern(x, ids[layer], wts[layer], layer=layer, out=y, stream=s, **tables)
    return record


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def sim() -> int:
    ctx = Ctx()
    ok = True
    for gu, dn in (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K")):
        ctx.rng = np.random.default_rng(3)
        lay, x, ids, wts, h, tables, _ = case(ctx, gu, dn, n_layer=1, n_expert=4, k=2,
                                              n_embd=512, n_ff=256)
        y_ref = cuda.device_array(lay.n_embd, np.float32)
        engine_record(lay, x, ids, wts, h, tables, y_ref, None)(0)  # two launches
        for mode, n_split, ahead in (("engine", 2, 2), ("engine", 1, 1)):
            y = cuda.device_array(lay.n_embd, np.float32)
            kern = SplitK(lay, 2, n_split=n_split, ahead=ahead, mode=mode)
            splitk_record(kern, x, ids, wts, tables, y)(0)
            e = rel_err(y.copy_to_host(), y_ref.copy_to_host())
            left = int(np.abs(kern.scratch.copy_to_host()).max())
            print(f"{gu}/{dn} {mode} n_split {n_split}, ahead {ahead}: max error {e:.2e} of the largest "
                  f"output, "
                  f"scratch left {left}")
            ok &= e < 1e-5 and left == 0
    return 0 if ok else 1


# (mode, blocks a unit, blocks an SM, loads ahead)
VARIANTS = [("fixed", 2, 2, 1), ("f32", 2, 2, 2), ("engine", 1, 2, 2), ("engine", 2, 2, 2),
            ("engine", 3, 2, 2), ("engine", 4, 2, 2)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--pairs", default="Q4_K/Q4_K,Q4_K/Q6_K")
    a = ap.parse_args()
    if a.sim:
        return sim()
    ctx = Ctx()
    rows = []
    for pair in a.pairs.split(","):
        gu, dn = pair.split("/")
        ctx.rng = np.random.default_rng(7)
        n_layer, k = 12, 8
        lay, x, ids, wts, h, tables, reads = case(ctx, gu, dn, n_layer=n_layer, n_expert=128,
                                                  k=k, n_embd=2048, n_ff=768)
        y_ref = cuda.device_array(lay.n_embd, np.float32)
        sync = ctx.upload(np.zeros(moe.sync_len(lay.n_embd), np.int64))
        rec = engine_record(lay, x, ids, wts, h, tables, y_ref, sync)
        saved, moe_splitk.USE = moe_splitk.USE, False  # the barrier kernel (moe_fused)
        try:
            us_ref = ctx.time_graph(rec, n_layer)
        finally:
            moe_splitk.USE = saved
        ref = y_ref.copy_to_host()
        read_us = time_same_size_read(ctx, reads, 1)
        print(f"{pair} fused (engine): {us_ref:6.2f} us a layer; a read of its bytes "
              f"{read_us:5.2f} us = {100 * read_us / us_ref:4.1f}%", flush=True)
        rows.append({"pair": pair, "kernel": "fused (engine)", "us": round(us_ref, 3),
                     "of the read": round(read_us / us_ref, 4), "read_us": round(read_us, 3)})
        for mode, n_split, bps, ahead in VARIANTS:
            y = cuda.device_array(lay.n_embd, np.float32)
            kern = SplitK(lay, k, n_split=n_split, blocks_an_sm=bps, mode=mode, ahead=ahead,
                          stream=ctx.stream)
            try:
                us = ctx.time_graph(splitk_record(kern, x, ids, wts, tables, y), n_layer)
            except Exception as e:  # noqa: BLE001 - a probe: say which and go on
                print(f"{pair} {mode} split {n_split} {bps}/SM ahead {ahead}: "
                      f"{type(e).__name__}: {e}")
                continue
            err = rel_err(y.copy_to_host(), ref) if mode != "f32" else float("nan")
            name = f"splitk {mode}, {n_split} a unit, {bps} an SM, {ahead} ahead"
            print(f"{pair} {name:38s}: {us:6.2f} us a layer = {100 * read_us / us:4.1f}% of the "
                  f"read; error vs fused {err:.1e}", flush=True)
            rows.append({"pair": pair, "kernel": name, "us": round(us, 3),
                         "of the read": round(read_us / us, 4), "max_rel_err": err})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
