"""Kernel microbenchmarks: what each decode kernel achieves against the ceiling measured in the
same run (HBM read bandwidth and device-to-device copy), and what a CUDA graph saves over plain
launches for a whole decode step.

    python -m strata.bench.kernels [--out DIR] [--only ceilings,matvec,moe,decode_step]
                                   [--formats Q4_K,IQ3_S] [--no-ab]

Every timing is a CUDA-graph replay (plain Python launches cost more than these kernels run),
after a warm-up, median of several replays, on random (never zero) data, rotating through enough
weight copies that the 50 MB L2 cannot hold them. Groups are registered with `@bench(name)`;
`strata.bench.kernels_prefill` (when present) adds its own. Prints one table and writes JSON
(date, commit, device, command, ceilings, results) to --out; the matvec and MoE groups also
print each row, and rewrite the JSON, as it is measured. `--no-ab` times only their default
kernels (and the read of each row's bytes), not the variants timed beside them.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

EXTRA_MODULES = ("strata.bench.kernels_prefill", "strata.bench.kernels_decode")
REGISTRY: dict[str, Callable[["Ctx"], list["Result"]]] = {}
MIB = 1 << 20


def bench(group: str):
    """Register `fn(ctx) -> list[Result]` as benchmark group `group`."""
    def deco(fn):
        REGISTRY[group] = fn
        return fn
    return deco


@dataclass(frozen=True, slots=True)
class Result:
    group: str
    name: str
    shape: str
    us: float                 # per launch (or per step)
    bytes_moved: int          # the fewest bytes the operation must move
    ceiling_gbps: float       # the measured ceiling it is compared with
    target: float = 0.0       # fraction of the ceiling it aims at (0: none)
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.bytes_moved / (self.us * 1e-6) / 1e9 if self.us > 0 else 0.0

    @property
    def frac(self) -> float:
        return self.gbps / self.ceiling_gbps if self.ceiling_gbps else 0.0


class Ctx:
    """Shared state of one run: the stream, the measured ceilings, timing helpers."""

    def __init__(self, seed: int = 0):
        from numba import cuda
        self.cuda = cuda
        self.stream = cuda.stream()
        self.rng = np.random.default_rng(seed)
        self.read_gbps = 0.0
        self.copy_gbps = 0.0
        self.notes: list[str] = []
        self.formats: tuple[str, ...] | None = None  # --formats: the weight formats to run
        # --no-ab: each row's default only (and the read of its bytes), none of the variants
        # the matvec and MoE groups time beside it: on a fresh machine each variant is a
        # compile, and a whole matvec group's ran past a 220 s budget without a row out
        self.ab = True
        self.reported: list[Result] = []  # the running group's rows so far (`report`)
        self.on_report: Callable[[], None] | None = None

    def report(self, r: Result) -> Result:
        """Keep r and print its row now, so a run cut short still shows (and, through
        on_report, writes) what it measured."""
        self.reported.append(r)
        print(row_line(r), flush=True)
        if self.on_report is not None:
            self.on_report()
        return r

    def wanted(self, formats) -> list[str]:
        """Those of `formats` this run takes (--formats), in their order."""
        return [f for f in formats if self.formats is None or f in self.formats]

    def events_ms(self, fn: Callable[[], None], reps: int) -> float:
        """Milliseconds of `reps` calls of fn (which enqueues work on self.stream)."""
        start, stop = self.cuda.event(), self.cuda.event()
        start.record(self.stream)
        for _ in range(reps):
            fn()
        stop.record(self.stream)
        stop.synchronize()
        return self.cuda.event_elapsed_time(start, stop)

    def time_graph(self, record: Callable[[object], None], n_launch: int, *,
                   reps: int = 10, trials: int = 5) -> float:
        """Microseconds per launch of a graph of `record(stream)` (which makes n_launch
        launches), after running record once plainly (compilation) and two warm replays."""
        from strata.cuda_kernels.graph import capture
        record(self.stream)
        self.stream.synchronize()
        try:
            g = capture(record, self.stream)
        except Exception as e:  # reported, and the plain timing stands in (marked in notes)
            self.notes.append(f"graph capture failed ({type(e).__name__}: {e}); plain timing")
            print(self.notes[-1], file=sys.stderr)
            return self.time_plain(record, n_launch)
        for _ in range(2):
            g.replay(self.stream)
        times = [self.events_ms(lambda: g.replay(self.stream), reps) for _ in range(trials)]
        return float(np.median(times)) * 1e3 / (reps * n_launch)

    def time_plain(self, record: Callable[[object], None], n_launch: int, reps: int = 3) -> float:
        record(self.stream)
        self.stream.synchronize()
        times = [self.events_ms(lambda: record(self.stream), 1) for _ in range(reps)]
        return float(np.median(times)) * 1e3 / n_launch

    def upload(self, host: np.ndarray):
        return self.cuda.to_device(np.ascontiguousarray(host), stream=self.stream)

    def replicate(self, host_u8, n_copies: int):
        """A device uint8 buffer holding n_copies back-to-back copies of host_u8 (a host or
        device array)."""
        n = host_u8.size
        dev = self.cuda.device_array(n * n_copies, np.uint8, stream=self.stream)
        first = dev[:n]
        first.copy_to_device(host_u8, stream=self.stream)
        for c in range(1, n_copies):
            dev[c * n:(c + 1) * n].copy_to_device(first, stream=self.stream)
        self.stream.synchronize()
        return dev


def n_rotation(n_bytes: int, floor_bytes: int = 512 * MIB, cap: int = 64) -> int:
    """Copies to rotate through so the set is well past the L2."""
    return max(1, min(cap, math.ceil(floor_bytes / max(1, n_bytes))))


# ---- ceilings --------------------------------------------------------------------------------

def _read_kernel():
    from numba import cuda
    from strata.cuda_kernels.intrinsics import ld_nc_u32x4

    @cuda.jit
    def read_all(buf, n16, out):
        t = cuda.grid(1)
        acc = 0
        for c in range(t, n16, cuda.gridsize(1)):
            a, b, c2, d = ld_nc_u32x4(buf, c * 16)
            acc ^= a ^ b ^ c2 ^ d
        if acc == 0x5EED5EED:  # keeps the loads; practically never true
            out[0] = acc
    return read_all


@bench("ceilings")
def ceilings(ctx: Ctx) -> list[Result]:
    n = 4 << 30  # 4 GiB
    src = ctx.cuda.device_array(n, np.uint8, stream=ctx.stream)
    chunk = ctx.rng.integers(0, 256, 64 * MIB, dtype=np.uint8)
    for off in range(0, n, chunk.size):
        src[off:off + chunk.size].copy_to_device(chunk, stream=ctx.stream)
    out = ctx.cuda.device_array(1, np.uint32, stream=ctx.stream)
    k = _read_kernel()
    n_sm = ctx.cuda.get_current_device().MULTIPROCESSOR_COUNT
    us_read = ctx.time_graph(lambda s: k[n_sm * 8, 512, s](src, n // 16, out), 1, reps=3)
    ctx.read_gbps = n / (us_read * 1e-6) / 1e9
    dst = ctx.cuda.device_array(n // 2, np.uint8, stream=ctx.stream)
    half = src[:n // 2]
    dst.copy_to_device(half, stream=ctx.stream)
    ms = np.median([ctx.events_ms(lambda: dst.copy_to_device(half, stream=ctx.stream), 3)
                    for _ in range(3)])
    us_copy = ms * 1e3 / 3
    ctx.copy_gbps = 2 * (n // 2) / (us_copy * 1e-6) / 1e9
    return [Result("ceilings", "HBM read (ld.global.nc.v4)", "4 GiB", us_read, n, ctx.read_gbps),
            Result("ceilings", "device-to-device copy (read+write)", "2 GiB", us_copy, n,
                   ctx.copy_gbps)]


def same_size_reads(cuda, views, rounds: int = 1, stream=0):
    """record(s): `rounds` launches of the ceiling's read kernel over each of `views` (uint8
    device arrays of one size, 16-byte aligned) in turn on stream s, with a grid sized to the
    data: a read of the same bytes, the yardstick of the matvec, MoE and attention rows."""
    k = _read_kernel()
    out = cuda.device_array(1, np.uint32, stream=stream)
    n16 = views[0].size // 16
    n_sm = cuda.get_current_device().MULTIPROCESSOR_COUNT
    grid = max(1, min(n_sm * 8, -(-n16 // 512)))

    def record(s):
        for _ in range(rounds):
            for v in views:
                k[grid, 512, s](v, n16, out)
    return record


def time_same_size_read(ctx: Ctx, views, rounds: int) -> float:
    """Microseconds per launch of `same_size_reads` over `views`."""
    return ctx.time_graph(same_size_reads(ctx.cuda, views, rounds, ctx.stream),
                          rounds * len(views))


# ---- matvec ----------------------------------------------------------------------------------

# Q6_K_P8: the engine's VRAM layout of dense Q6_K (`strata.quant.planar`), beside GGUF's Q6_K
# (which expert slots and the kernels' other callers keep)
MATVEC_FORMATS = ("Q4_K", "Q6_K", "Q6_K_P8", "Q8_0", "IQ4_XS", "IQ3_S")
MATVEC_SHAPES = (("4096x4096", 4096, 4096), ("8192x8192", 8192, 8192),
                 ("2048->4096", 4096, 2048), ("4096->2048", 2048, 4096),
                 ("2048->151936", 151936, 2048))  # (label, n_rows, n_cols)
# lane matvec grid caps timed beside the default (`matvec.LANE_GRID_BLOCKS`): two waves of two
# blocks an SM, and no cap (a warp a row pair: the grid before rounds)
LANE_GRID_AB = (512, 1 << 30)


def random_weights(ctx: Ctx, ggml_type: str, n_rows: int, n_cols: int) -> np.ndarray:
    """[bytes] u8 of a random tensor as `ggml_type`'s kernels read it (a planar type: its GGUF
    base's blocks, packed)."""
    from strata.cuda_kernels.qformats import get_format
    from strata.quant import planar
    from strata.quant.random_blocks import random_blocks
    fmt = get_format(ggml_type)
    p = planar.BY_TYPE.get(fmt.ggml_type)
    base = fmt.name if p is None else get_format(p.base_type).name
    blocks = random_blocks(base, n_rows * n_cols // fmt.block_values, ctx.rng, scale=0.02)
    return blocks.reshape(-1) if p is None else p.pack(blocks.reshape(-1))


@bench("matvec")
def matvec_group(ctx: Ctx) -> list[Result]:
    from strata.cuda_kernels import lanes_x8
    from strata.cuda_kernels import matvec as mv
    from strata.cuda_kernels.lanes import lane_format
    from strata.cuda_kernels.lanes_x8 import x8_format
    from strata.cuda_kernels.matvec import matvec
    from strata.cuda_kernels.qformats import get_format
    out = []
    n_max = max(r * c for _, r, c in MATVEC_SHAPES)
    for name in ctx.wanted(MATVEC_FORMATS):
        # one random tensor per format; each shape rotates copies of a prefix of it
        big = ctx.upload(random_weights(ctx, name, n_max // 2048, 2048))
        for label, n_rows, n_cols in MATVEC_SHAPES:
            w_bytes = n_rows * get_format(name).row_bytes(n_cols)
            n_copies = n_rotation(w_bytes)
            dev = ctx.replicate(big[:w_bytes], n_copies)
            views = [dev[c * w_bytes:(c + 1) * w_bytes] for c in range(n_copies)]
            x = ctx.upload(ctx.rng.standard_normal(n_cols).astype(np.float32))
            y = ctx.cuda.device_array(n_rows, np.float32, stream=ctx.stream)
            rounds = max(1, 64 // n_copies)

            def record(s, views=views, x=x, y=y, name=name, rounds=rounds):
                for _ in range(rounds):
                    for v in views:
                        matvec(v, name, x, y, stream=s)
            us = ctx.time_graph(record, rounds * n_copies)
            extra = {}
            if ctx.ab and lane_format(get_format(name).ggml_type) is not None:
                # the lane kernel's grid settings: the default cap against others (rounds of
                # row pairs against a warp a pair)
                default = mv.LANE_GRID_BLOCKS
                extra["grid cap"] = mv.lane_grid_blocks()  # the default's, on this device
                for cap in LANE_GRID_AB:
                    mv.LANE_GRID_BLOCKS = cap
                    try:
                        extra[f"us at grid cap {cap}"] = round(
                            ctx.time_graph(record, rounds * n_copies), 2)
                    finally:
                        mv.LANE_GRID_BLOCKS = default
            if ctx.ab and get_format(name).ggml_type in lanes_x8.GRID_COPIES:
                # the rounds' grid in copies, one a lane (the default), against the grid once
                saved, lanes_x8.COPY_GRIDS = lanes_x8.COPY_GRIDS, False
                try:
                    extra["us with the grid once"] = round(
                        ctx.time_graph(record, rounds * n_copies), 2)
                finally:
                    lanes_x8.COPY_GRIDS = saved
            if ctx.ab and x8_format(get_format(name).ggml_type) is not None:
                saved, mv.LANE_X8 = mv.LANE_X8, False  # the 8-bit decoding against float32 x
                try:
                    extra["us with float32 x"] = round(ctx.time_graph(record, rounds * n_copies),
                                                       2)
                finally:
                    mv.LANE_X8 = saved
            # the read kernel over the same bytes: what one launch reading this little can reach
            # (the target stays against the 4 GiB read's ceiling, as the issue states it)
            extra["us reading the same bytes"] = round(time_same_size_read(ctx, views, rounds),
                                                        2)
            out.append(ctx.report(Result("matvec", f"matvec {name}", label, us,
                                         w_bytes + 4 * (n_cols + n_rows), ctx.read_gbps, 0.70,
                                         extra)))
            del dev, views
        del big
    return out


# ---- MoE -------------------------------------------------------------------------------------

def moe_setup(ctx: Ctx, gu: str, dn: str, *, n_layer: int, n_expert: int, n_embd: int = 2048,
              n_ff: int = 768, n_slot_layer: int = 0):
    """A VRAM cache of n_layer layers x n_slot_layer distinct random experts (default: all
    n_expert), every expert a hit: expert e of layer l sits in slot l*n_slot_layer + e % that."""
    from strata.cuda_kernels.moe import ExpertLayout
    lay = ExpertLayout(n_embd, n_ff, gu, dn)
    n_sl = n_slot_layer or n_expert
    one_layer = np.zeros((n_sl, lay.expert_bytes), np.uint8)
    g = random_weights(ctx, gu, n_sl * n_ff, n_embd).reshape(n_sl, -1)
    u = random_weights(ctx, gu, n_sl * n_ff, n_embd).reshape(n_sl, -1)
    d = random_weights(ctx, dn, n_sl * n_embd, n_ff).reshape(n_sl, -1)
    one_layer[:, :g.shape[1]] = g
    one_layer[:, lay.up_off:lay.up_off + u.shape[1]] = u
    one_layer[:, lay.down_off:lay.down_off + d.shape[1]] = d
    cache = ctx.replicate(one_layer.reshape(-1), n_layer)
    table = (np.arange(n_layer, dtype=np.int32)[:, None] * n_sl
             + np.arange(n_expert, dtype=np.int32)[None, :] % n_sl)
    slot_table = ctx.upload(table.astype(np.int32))
    slot_off = ctx.upload(np.arange(n_layer * n_sl, dtype=np.int64) * lay.expert_bytes)
    host_off = ctx.upload(np.zeros((n_layer, n_expert), np.int64))
    return lay, cache, slot_table, slot_off, host_off


def moe_routing(ctx: Ctx, n_layer: int, n_expert: int, k: int):
    ids = [ctx.upload(ctx.rng.permutation(n_expert)[:k].astype(np.int32)) for _ in range(n_layer)]
    w = ctx.rng.random((n_layer, k)).astype(np.float32)
    w /= w.sum(1, keepdims=True)
    return ids, [ctx.upload(r) for r in w]


@bench("moe")
def moe_group(ctx: Ctx) -> list[Result]:
    """MoE decode, 30B shape, all hits: one launch (`moe_fused`: gate/up, a grid barrier, down)
    and two (`moe_fused.FUSE_DOWN` off), in one process; gate/up formats with an 8-bit decoding
    (`lanes_x8`) also with float32 x (`moe.GATE_UP_X8` off)."""
    import strata.cuda_kernels.moe as moe_mod
    import strata.cuda_kernels.moe_fused as fused_mod
    from strata.cuda_kernels.lanes_x8 import x8_format
    from strata.cuda_kernels.moe import moe_decode
    from strata.cuda_kernels.qformats import get_format
    out = []
    n_layer, n_expert, k = 12, 128, 8
    pairs = (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q8_0", "Q8_0"), ("IQ4_XS", "IQ4_XS"),
             ("IQ3_S", "IQ3_S"), ("Q6_K", "Q6_K"))
    wanted = ctx.wanted(gu for gu, _ in pairs)
    for gu, dn in (pair for pair in pairs if pair[0] in wanted):
        lay, cache, slot_table, slot_off, host_off = moe_setup(
            ctx, gu, dn, n_layer=n_layer, n_expert=n_expert)
        ids, wts = moe_routing(ctx, n_layer, n_expert, k)
        x = ctx.upload(ctx.rng.standard_normal(lay.n_embd).astype(np.float32))
        h = ctx.cuda.device_array((k, lay.n_ff), np.float32, stream=ctx.stream)
        y = ctx.cuda.device_array(lay.n_embd, np.float32, stream=ctx.stream)
        miss = ctx.cuda.device_array(k, np.int32, stream=ctx.stream)
        counters = ctx.upload(np.zeros((n_layer, 2), np.int64))
        sync = ctx.upload(np.zeros(2, np.int32))  # [2] i32: the fused launch's barrier

        def record(s, lay=lay, cache=cache, slot_table=slot_table, slot_off=slot_off,
                   host_off=host_off, ids=ids, wts=wts, x=x, h=h, y=y, miss=miss,
                   counters=counters, sync=sync):
            for layer in range(n_layer):
                moe_decode(x, ids[layer], wts[layer], layer=layer, layout=lay,
                           slot_table=slot_table, cache=cache, slot_off=slot_off, host=cache,
                           host_off=host_off, h=h, out=y, miss_list=miss, counters=counters,
                           sync=sync, stream=s)
        # the read kernel over as many bytes (each layer's first k experts, one launch a layer):
        # what a launch reading this little can reach, beside the 4 GiB read's ceiling
        span = k * lay.expert_bytes
        layer_bytes = n_expert * lay.expert_bytes
        reads = [cache[i * layer_bytes:i * layer_bytes + span] for i in range(n_layer)]
        same_read_us = round(time_same_size_read(ctx, reads, 1), 2)
        both = x8_format(get_format(gu).ggml_type) is not None
        x8s = (True, False) if both and ctx.ab else (moe_mod.GATE_UP_X8,)
        for x8, fused in [(x8, True) for x8 in x8s] + ([(x8s[0], False)] if ctx.ab else []):
            saved = moe_mod.GATE_UP_X8, fused_mod.FUSE_DOWN
            moe_mod.GATE_UP_X8, fused_mod.FUSE_DOWN = x8, fused
            try:
                us = ctx.time_graph(record, n_layer)
            finally:
                moe_mod.GATE_UP_X8, fused_mod.FUSE_DOWN = saved
            how = ((" x8" if x8 else " f32 x") if both else "") + ("" if fused else " 2 launches")
            extra = {"us reading the same bytes": same_read_us}
            if ctx.ab and fused and x8 == x8s[0]:  # the one launch for a third block an SM
                saved = moe_mod.GATE_UP_X8, fused_mod.BLOCKS_AN_SM
                moe_mod.GATE_UP_X8, fused_mod.BLOCKS_AN_SM = x8, 3
                try:
                    extra["us at 3 blocks an SM"] = round(ctx.time_graph(record, n_layer), 2)
                finally:
                    moe_mod.GATE_UP_X8, fused_mod.BLOCKS_AN_SM = saved
            out.append(ctx.report(Result("moe", f"moe {gu}/{dn} 8 of 128 hits{how}", "2048x768",
                                         us, span, ctx.read_gbps, 0.60, extra)))
        del cache, reads
    return out


@bench("route_moe")
def route_moe_group(ctx: Ctx) -> list[Result]:
    """A layer's router and MoE (30B shape: F32 router 128 x 2048, top-8, Q4_K/Q6_K experts, all
    hits) two ways, in one graph each: the router's last block routing (route=True), and the
    router writing logits only with every gate/up block routing them (`route_logits`)."""
    from strata.cuda_kernels.moe import moe_decode
    from strata.cuda_kernels.router_normed import router_normed
    n_layer, n_expert, k, gu, dn = 12, 128, 8, "Q4_K", "Q6_K"
    lay, cache, slot_table, slot_off, host_off = moe_setup(ctx, gu, dn, n_layer=n_layer,
                                                           n_expert=n_expert)
    n_embd = lay.n_embd
    ws = [ctx.upload((ctx.rng.standard_normal((n_expert, n_embd)) / np.sqrt(n_embd))
                     .astype(np.float32).view(np.uint8).reshape(-1)) for _ in range(n_layer)]
    x = ctx.upload(ctx.rng.standard_normal(n_embd).astype(np.float32))
    norm_w = ctx.upload(ctx.rng.uniform(0.5, 1.5, n_embd).astype(np.float32))
    xn = ctx.cuda.device_array(n_embd, np.float32, stream=ctx.stream)
    logits = ctx.cuda.device_array(n_expert, np.float32, stream=ctx.stream)
    ids = ctx.cuda.device_array(k, np.int32, stream=ctx.stream)
    wts = ctx.cuda.device_array(k, np.float32, stream=ctx.stream)
    done = ctx.upload(np.zeros(1, np.int32))
    h = ctx.cuda.device_array((k, lay.n_ff), np.float32, stream=ctx.stream)
    y = ctx.cuda.device_array(n_embd, np.float32, stream=ctx.stream)
    miss = ctx.cuda.device_array(k, np.int32, stream=ctx.stream)
    counters = ctx.upload(np.zeros((n_layer, 2), np.int64))
    sync = ctx.upload(np.zeros(2, np.int32))  # [2] i32: the fused MoE launch's barrier
    out, picks = [], {}
    for in_moe in (False, True):
        def record(s, in_moe=in_moe):
            for layer in range(n_layer):
                router_normed(x, norm_w, ws[layer], ggml_type="F32", eps=1e-6, normed_out=xn,
                              logits=logits, ids=ids, weights=wts, done=done,
                              route=not in_moe, stream=s)
                moe_decode(xn, ids, wts, layer=layer, layout=lay, slot_table=slot_table,
                           cache=cache, slot_off=slot_off, host=cache, host_off=host_off, h=h,
                           out=y, miss_list=miss, counters=counters,
                           route_logits=logits if in_moe else None, sync=sync, stream=s)
        us = ctx.time_graph(record, n_layer)
        ctx.stream.synchronize()
        picks[in_moe] = ids.copy_to_host().tolist()
        name = "router, MoE routing" if in_moe else "router routing, MoE"
        out.append(Result("route_moe", name, "128x2048 + 2048x768", us,
                          k * lay.expert_bytes + n_expert * n_embd * 4, ctx.read_gbps, 0.0))
    if picks[False] != picks[True]:
        raise RuntimeError(f"route_moe: the two ways picked {picks[False]} and {picks[True]}")
    out[-1].extra["same picks"] = str(picks[True])
    return out


# ---- output ----------------------------------------------------------------------------------

def _commit() -> str:
    from .engine_cuda import _commit as commit_id  # STRATA_COMMIT, else git
    return commit_id() or "unknown"


def print_table(results: list[Result]) -> None:
    print(f"\n{'group':<12} {'kernel':<36} {'shape':<14} {'us':>9} {'GB/s':>8} {'ceiling':>8} "
          f"{'achieved':>8} {'target':>7}")
    for r in results:
        print(row_line(r))


def row_line(r: Result) -> str:
    """r's row of the table (its extras on the lines below)."""
    target = f"{r.target:.0%}" if r.target else "-"
    mark = "" if not r.target else ("ok" if r.frac >= r.target else "MISS")
    return "\n".join([f"{r.group:<12} {r.name:<36} {r.shape:<14} {r.us:>9.2f} {r.gbps:>8.0f} "
                      f"{r.ceiling_gbps:>8.0f} {r.frac:>8.0%} {target:>7} {mark}"]
                     + [f"{'':<12}   {key}: {val}" for key, val in r.extra.items()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="kernel microbenchmarks against measured ceilings")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--only", default="", help="comma-separated groups (ceilings always runs)")
    p.add_argument("--formats", default="",
                   help="comma-separated weight formats the matvec and MoE groups run (MoE: "
                        "by gate/up format); default all of theirs")
    p.add_argument("--no-ab", action="store_true",
                   help="time each matvec and MoE row's default kernel only, not the variants "
                        "beside it (fewer compiles on a fresh machine)")
    a = p.parse_args(argv)
    for m in EXTRA_MODULES:
        if importlib.util.find_spec(m) is not None:
            importlib.import_module(m)
    wanted = [g for g in a.only.split(",") if g] or [g for g in REGISTRY if g != "ceilings"]
    unknown = [g for g in wanted if g not in REGISTRY]
    if unknown:
        print(f"unknown groups {unknown}; known: {list(REGISTRY)}", file=sys.stderr)
        return 2
    from strata.cuda_kernels.qformats import BY_NAME
    formats = tuple(f for f in a.formats.split(",") if f)
    bad = [f for f in formats if f not in BY_NAME]
    if bad:
        print(f"unknown formats {bad}; known: {sorted(BY_NAME)}", file=sys.stderr)
        return 2
    ctx = Ctx()
    ctx.formats = formats or None
    ctx.ab = not a.no_ab
    results = list(REGISTRY["ceilings"](ctx))
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "kernels_bench.json")
    command = "python -m strata.bench.kernels " + " ".join(argv or sys.argv[1:])
    # after each reported row and each group: a run cut short keeps what it measured
    ctx.on_report = lambda: _write(path, ctx, command, results + ctx.reported)
    for g in wanted:
        if g != "ceilings":
            print(f"[bench] {g} ...", flush=True)
            results += REGISTRY[g](ctx)
            ctx.reported.clear()
            _write(path, ctx, command, results)
    print_table(results)
    _write(path, ctx, command, results)
    print(f"wrote {path}")
    return 0


def _write(path: str, ctx: Ctx, command: str, results: list[Result]) -> None:
    dev = ctx.cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": _commit(), "device": name, "command": command,
           "ceilings": {"read_gbps": ctx.read_gbps, "copy_gbps": ctx.copy_gbps},
           "notes": ctx.notes,
           "results": [asdict(r) | {"gbps": r.gbps, "frac": r.frac} for r in results]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    # run main() of the importable module, so groups other modules register land in its REGISTRY
    sys.exit(importlib.import_module("strata.bench.kernels").main())
