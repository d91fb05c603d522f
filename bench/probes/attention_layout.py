"""Probe (not part of the engine): is decode attention's pass 1 at 32K keys bound by where its
bytes lie, by the work per tile, or by the combine?

The cache is [n_ctx, n_kv_head, head_dim]: a pass-1 block (one KV head, one split) reads 256 of
every 1,024 bytes of its keys' rows at the 30B shape (4 KV heads), the other heads' blocks the
rest. The same bytes with one KV head (8 query heads over n_ctx x 4 keys) are contiguous for each
block, with the same grid (512 blocks of 256 keys) and the same tiles a warp. If pass 1 runs
much faster there, the interleaved rows cost DRAM efficiency and a head-major cache would pay;
if not, the kernel's own chain per tile is what bounds it.

Rows (pass 1 alone, graph replays over two layers' caches, as `strata.bench.kernels_prefill`'s
decode_attn cases): f16 and int8 KV, 4/2/1 KV heads over 32K/64K/128K keys (the same bytes), and
the 30B shape with the combine at the launcher's split (512 keys for f16 since 2026-12-04) and
with splits of 256, 512 and 1,024 keys, and at 64K keys; last, a read of the same bytes (`strata.bench.kernels`' ceiling read kernel, two 64 MiB buffers in turn).

    python bench/probes/attention_layout.py --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from strata.bench.kernels import Ctx, time_same_size_read
from strata.bench.kernels_attention import bench_decode_attention


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--formats", default="f16,int8")
    a = ap.parse_args()
    rows = []
    for fmt in a.formats.split(","):
        cases = [dict(n_kv=4, n_head=32, n_ctx=32768, combine=False, max_split=256,
                      tag="_kv4_pass1"),
                 dict(n_kv=2, n_head=16, n_ctx=65536, combine=False, max_split=256,
                      tag="_kv2_pass1"),
                 dict(n_kv=1, n_head=8, n_ctx=131072, combine=False, max_split=256,
                      tag="_kv1_pass1"),
                 dict(n_kv=4, n_head=32, n_ctx=32768, combine=True, tag="_kv4"),
                 dict(n_kv=4, n_head=32, n_ctx=32768, combine=True, max_split=256,
                      tag="_kv4_s256"),
                 dict(n_kv=4, n_head=32, n_ctx=32768, combine=True, max_split=512,
                      tag="_kv4_s512"),
                 dict(n_kv=4, n_head=32, n_ctx=32768, combine=False, max_split=512,
                      tag="_kv4_s512_pass1"),
                 dict(n_kv=4, n_head=32, n_ctx=32768, combine=True, max_split=1024, n_target=32,
                      tag="_kv4_s1024"),
                 dict(n_kv=4, n_head=32, n_ctx=65536, combine=True, tag="_kv4_64k"),
                 dict(n_kv=4, n_head=32, n_ctx=65536, combine=True, max_split=256,
                      tag="_kv4_64k_s256")]
        for c in cases:
            if c["combine"]:  # the launcher (its own launch bounds): what the engine runs
                c = {**c}
                c.pop("combine")
            r = bench_decode_attention(fmt=fmt, n_layer=2, **c)
            rows.append(r)
            print(f"{r['name']:40s} {r['ms'] * 1e3:7.2f} us  {r['gbps'] / 1e3:5.2f} TB/s  "
                  f"splits {r['n_used']} of {r['split_len']}", flush=True)
    ctx = Ctx()
    n_bytes = 2 * 32768 * 4 * 128 * 2  # a layer's f16 K and V at the 30B shape
    views = [ctx.upload(ctx.rng.integers(0, 256, n_bytes, dtype=np.uint8)) for _ in range(2)]
    us = time_same_size_read(ctx, views, 4)
    rows.append({"name": "read of a layer's f16 K and V", "ms": us / 1e3, "kv_bytes": n_bytes,
                 "gbps": n_bytes / (us * 1e3)})
    print(f"{rows[-1]['name']:40s} {us:7.2f} us  {rows[-1]['gbps'] / 1e3:5.2f} TB/s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
