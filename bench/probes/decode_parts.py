"""Probe (not part of the engine): where a latency-bound decode layer's time goes on the GPU.

Each row is one CUDA graph of N launches in a row (48 layers' worth, weights past the L2 where
it matters), replayed after warm-up; the time printed is per launch (or per layer, where a
layer is two launches). Rows:
* floor: an empty kernel (1 block); a kernel of 256 blocks whose threads read one device
  scalar and write one value; the same with two dependent reads.
* decode attention (f16 KV, 32 query heads, 4 KV heads, d 128, 4K cache, 48 layers): pass 1 and
  the combine together, pass 1 alone, the combine alone, at 600 and 4096 live keys; and at 600
  keys with fewer splits aimed at (n_target 16 and 8: longer splits).
* MoE decode (8 of 128 experts, 2048x768, 12 layers): gate/up alone, down alone, both.

Run from the repository root on a GPU machine: `python bench/probes/decode_parts.py [--out F]`.
"""
import argparse
import json
import math
import sys

import numpy as np
from numba import cuda

sys.path.insert(0, ".")
from strata.bench.kernels import Ctx, moe_routing, moe_setup  # noqa: E402
from strata.bench.kernels_attention import _kv_sides  # noqa: E402
from strata.cuda_kernels import attention, moe  # noqa: E402
from strata.plan import attn_split  # noqa: E402


@cuda.jit
def empty(out):
    pass


@cuda.jit
def one_load(src, out):
    v = src[0]
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x] = v + 1


@cuda.jit
def two_loads(idx, src, out):
    v = src[idx[0]]
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x] = v + 1


def floors(ctx, rows):
    src = ctx.upload(np.arange(4, dtype=np.int32))
    out = ctx.cuda.device_array(256, np.int32)
    n = 48
    rows.append(("floor", "empty kernel, 1 block", ctx.time_graph(
        lambda s: [empty[1, 32, s](out) for _ in range(n)], n)))
    rows.append(("floor", "one load, 256 x 256", ctx.time_graph(
        lambda s: [one_load[256, 256, s](src, out) for _ in range(n)], n)))
    rows.append(("floor", "two dependent loads, 256 x 256", ctx.time_graph(
        lambda s: [two_loads[256, 256, s](src, src, out) for _ in range(n)], n)))


def attn(ctx, rows):
    n_head, n_kv, hd, n_ctx, n_layer = 32, 4, 128, 4096, 48
    rng = np.random.default_rng(2)
    q = ctx.upload(rng.standard_normal((n_head, hd)).astype(np.float32))
    out = ctx.cuda.device_array((n_head, hd), np.float32)
    scale = np.float32(1.0 / math.sqrt(hd))
    group = n_head // n_kv
    max_split = attention.SPLIT_LEN
    kern = attention.decode_kernel("f16", "f16", hd, group, max_split)
    layers = [_kv_sides("f16", n_ctx, n_kv, hd, 4096, rng) for _ in range(n_layer)]
    for length, n_target in ((600, None), (4096, None), (600, 16), (600, 8)):
        t = n_target or attn_split.split_target(n_kv)
        parts = attention.allocate_partials(n_head, hd, n_ctx, n_kv_head=n_kv,
                                            max_split=max_split, n_target=t)
        seq = ctx.upload(np.array([length - 1], np.int32))
        n_split = attention.n_splits(n_ctx, t, max_split, attn_split.SPLIT_K_MIN)
        tag = (f"L {length}, split "
               f"{attn_split.split_len(length, t, max_split, attn_split.SPLIT_K_MIN)}, "
               f"{attn_split.n_used(length, t, max_split, attn_split.SPLIT_K_MIN)} splits")

        def step(s, p1=True, comb=True, parts=parts, seq=seq, t=t, n_split=n_split):
            for _, (k, v) in layers:
                if p1:
                    kern[(n_kv, n_split), attention.THREADS, s](
                        q, k.data, k.scale, v.data, v.scale, seq, 1, n_ctx, t, scale, *parts)
                if comb:
                    attention._combine[(n_head, hd // 32), attention.COMBINE_THREADS, s](
                        *parts, seq, 1, n_ctx, t, max_split, attn_split.SPLIT_K_MIN, out)
        rows.append(("attention", f"pass 1 + combine, {tag}", ctx.time_graph(step, n_layer)))
        if n_target is None:
            rows.append(("attention", f"pass 1 alone, {tag}", ctx.time_graph(
                lambda s: step(s, comb=False), n_layer)))
            rows.append(("attention", f"combine alone, {tag}", ctx.time_graph(
                lambda s: step(s, p1=False), n_layer)))


class _NoLaunch:
    def __getitem__(self, _):
        return lambda *a: None


def moe_case(ctx, gu, dn, n_layer=12, n_expert=128, k=8, fused=False):
    """`record(stream)`: one token's MoE decode over n_layer layers of a VRAM cache holding every
    expert (random weights, gate/up format gu, down dn), k of n_expert experts a layer; fused:
    given the barrier's words, as the engine does, so gate/up and down run as one launch
    (`moe_fused`) where the formats allow."""
    lay, cache, slot_table, slot_off, host_off = moe_setup(
        ctx, gu, dn, n_layer=n_layer, n_expert=n_expert)
    ids, wts = moe_routing(ctx, n_layer, n_expert, k)
    x = ctx.upload(ctx.rng.standard_normal(lay.n_embd).astype(np.float32))
    h = ctx.upload(ctx.rng.standard_normal((k, lay.n_ff)).astype(np.float32))
    y = ctx.cuda.device_array(lay.n_embd, np.float32)
    miss = ctx.cuda.device_array(k, np.int32)
    counters = ctx.upload(np.zeros((n_layer, 2), np.int64))
    sync = ctx.upload(np.zeros(2, np.int32)) if fused else None  # [2] i32

    def record(s):
        for layer in range(n_layer):
            moe.moe_decode(x, ids[layer], wts[layer], layer=layer, layout=lay,
                           slot_table=slot_table, cache=cache, slot_off=slot_off, host=cache,
                           host_off=host_off, h=h, out=y, miss_list=miss, counters=counters,
                           sync=sync, stream=s)
    record.out = y  # the last layer's output (a probe compares variants by it)
    # each layer's first k experts' bytes: a read of as many (`time_same_size_read`)
    span, layer_bytes = k * lay.expert_bytes, n_expert * lay.expert_bytes
    record.reads = [cache[i * layer_bytes:i * layer_bytes + span] for i in range(n_layer)]
    return record


def moe_parts(ctx, rows):
    n_layer = 12
    real_kernel, real_down = moe._kernel, moe._down
    for gu, dn in (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K")):
        record = moe_case(ctx, gu, dn, n_layer)
        for what in ("both", "gate/up alone", "down alone"):
            moe._down = (lambda *a, **kw: None) if what == "gate/up alone" else real_down
            moe._kernel = ((lambda kind, *a: _NoLaunch() if kind.startswith("gate_up")
                            else real_kernel(kind, *a)) if what == "down alone" else real_kernel)
            try:
                us = ctx.time_graph(record, n_layer)
            finally:
                moe._kernel, moe._down = real_kernel, real_down
            rows.append(("moe", f"{gu}/{dn} {what}", us))
        del record  # the cache with it


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    ctx = Ctx()
    rows = []
    for part in (floors, attn, moe_parts):
        part(ctx, rows)
    print(f"{'group':10s} {'what':60s} {'us/launch':>10s}")
    for g, w, us in rows:
        print(f"{g:10s} {w:60s} {us:10.2f}")
    if a.out:
        name = cuda.get_current_device().name
        device = name.decode() if isinstance(name, bytes) else str(name)
        with open(a.out, "w") as f:
            json.dump({"device": device,
                       "rows": [{"group": g, "what": w, "us": us} for g, w, us in rows]}, f,
                      indent=1)


if __name__ == "__main__":
    main()
