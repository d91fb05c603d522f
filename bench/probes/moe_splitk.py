"""Probe (not part of the engine): the MoE in one launch without a barrier
(`cuda_kernels/moe_splitk.py`) beside the barrier kernel it may replace (`moe_fused`), in one
process: 12 layers in a CUDA graph, 8 of 128 experts, all hits, the 30B shape; its blocks a unit
(`n_split`) and the loads a warp keeps ahead (`moe_splitk.AHEAD`) varied, each output held to the
barrier kernel's (within 1e-5: other sums, in fixed point) and the time to a read of the same
bytes.

Run from the repository root: on a GPU machine `python bench/probes/moe_splitk.py [--json F]`;
on the CPU `NUMBA_ENABLE_CUDASIM=1 python bench/probes/moe_splitk.py --sim` (tiny shapes against
the engine's two launches).
"""
import argparse
import json
import sys

import numpy as np
from numba import cuda

sys.path.insert(0, ".")
from strata.bench.kernels import Ctx, moe_routing, moe_setup, time_same_size_read  # noqa: E402
from strata.cuda_kernels import moe, moe_splitk  # noqa: E402
from strata.cuda_kernels.lanes import lane_format  # noqa: E402
from strata.cuda_kernels.lanes_x8 import lanes_for  # noqa: E402

AHEAD = moe_splitk.AHEAD  # the module's setting, restored after the variants


class SplitK:
    """`moe_splitk`'s launch for one layout with its own state (zero), n_split blocks a unit."""

    def __init__(self, lay, k, *, n_split, ahead, stream=0):
        from strata.cuda_kernels.qformats import get_format
        self.gu = lanes_for(lane_format(get_format(lay.gate_up_type).ggml_type), True)
        self.dn = lane_format(get_format(lay.down_type).ggml_type)
        moe_splitk.AHEAD = ahead  # read when the kernel is made (its cache key holds it)
        self.lay, self.k, self.n_split = lay, k, n_split
        self.scratch = cuda.to_device(np.zeros(moe_splitk.scratch_len(lay.n_embd), np.int64),
                                      stream=stream)

    def __call__(self, x, ids, weights, *, layer, slot_table, cache, slot_off, host, host_off,
                 miss_list, counters, out, stream=0):
        where = (slot_table, layer, cache, slot_off, host, host_off, False)
        moe_splitk.launch(x, ids, weights, k=self.k, where=where, miss_list=miss_list,
                          counters=counters, layout=self.lay, gu=self.gu, dn=self.dn,
                          logits=x.reshape(1, self.lay.n_embd), n_route=0, norm_topk=True,
                          accumulate=False, out=out, scratch=self.scratch, stream=stream,
                          n_split=self.n_split)


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
        for n_split, ahead in ((2, 2), (1, 1)):
            y = cuda.device_array(lay.n_embd, np.float32)
            kern = SplitK(lay, 2, n_split=n_split, ahead=ahead)
            splitk_record(kern, x, ids, wts, tables, y)(0)
            e = rel_err(y.copy_to_host(), y_ref.copy_to_host())
            left = int(np.abs(kern.scratch.copy_to_host()).max())
            print(f"{gu}/{dn} n_split {n_split}, ahead {ahead}: max error {e:.2e} of the largest "
                  f"output, state left {left}")
            ok &= e < 1e-5 and left == 0
    return 0 if ok else 1


# (blocks a unit, loads ahead)
VARIANTS = [(1, 2), (2, 2), (3, 2), (4, 2), (3, 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--pairs", default="Q4_K/Q4_K,Q4_K/Q6_K")
    ap.add_argument("--variants", default=",".join(f"{n}:{a}" for n, a in VARIANTS),
                    help="blocks a unit:loads ahead, comma-separated")
    a = ap.parse_args()
    variants = [tuple(int(v) for v in item.split(":")) for item in a.variants.split(",")]
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
        print(f"{pair} moe_fused (barrier): {us_ref:6.2f} us a layer; a read of its bytes "
              f"{read_us:5.2f} us = {100 * read_us / us_ref:4.1f}%", flush=True)
        rows.append({"pair": pair, "kernel": "moe_fused (barrier)", "us": round(us_ref, 3),
                     "of the read": round(read_us / us_ref, 4), "read_us": round(read_us, 3)})
        for n_split, ahead in variants:
            y = cuda.device_array(lay.n_embd, np.float32)
            kern = SplitK(lay, k, n_split=n_split, ahead=ahead, stream=ctx.stream)
            us = ctx.time_graph(splitk_record(kern, x, ids, wts, tables, y), n_layer)
            err = rel_err(y.copy_to_host(), ref)
            name = f"moe_splitk, {n_split} blocks a unit, loads {ahead} ahead"
            print(f"{pair} {name:40s}: {us:6.2f} us a layer = {100 * read_us / us:4.1f}% of the "
                  f"read; against the barrier kernel's output {err:.1e}", flush=True)
            rows.append({"pair": pair, "kernel": name, "us": round(us, 3),
                         "of the read": round(read_us / us, 4), "max_rel_err": err})
    moe_splitk.AHEAD = AHEAD
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
