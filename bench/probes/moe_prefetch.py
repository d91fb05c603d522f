"""Probe (not part of the engine): the one-launch MoE decode kernel (`cuda_kernels/moe_fused.py`)
with L2 prefetches issued once its experts are resolved, against none.

Its stamps (`moe_fused_stamps.py`, 2026-12-04) put 1.4 us of a 16 us layer (Q4_K, 30B shape, 8 of
128 experts, all hits) in resolving the slots, 5.6 in gate/up, ~2.5 in the wait at the barrier
and 4.4 in down: down's rows are read after the barrier as a chain of dependent steps a warp,
and the memory idles while the blocks wait. Variants: the block's down rows of every cached
expert prefetched (a line an instruction, or one bulk prefetch a span), the rows of the
block's later gate/up items prefetched, and both. 12 layers in a CUDA graph; each variant's
output compared with the first's (a prefetch changes no value, so bit for bit).

Run from the repository root on a GPU machine:
`python bench/probes/moe_prefetch.py [--json FILE]`; prints the best variant last as
`best: PREFETCH_DOWN=N PREFETCH_GU=B`.
"""
import argparse
import json
import sys

import numpy as np

sys.path.insert(0, ".")
from decode_parts import moe_case  # noqa: E402  (this folder: the script's, first on the path)

from strata.bench.kernels import Ctx  # noqa: E402
from strata.cuda_kernels import moe_fused  # noqa: E402

VARIANTS = [(0, False), (1, False), (2, False), (0, True), (1, True), (2, True)]
PAIRS = (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q6_K", "Q6_K"))


def run(ctx, gu, dn, pf_down, pf_gu):
    moe_fused.PREFETCH_DOWN, moe_fused.PREFETCH_GU = pf_down, pf_gu
    moe_fused._CACHE.clear()  # the kernels are made with the constants they read
    ctx.rng = np.random.default_rng(7)  # the same weights, x and experts for every variant
    record = moe_case(ctx, gu, dn, 12, fused=True)
    us = ctx.time_graph(record, 12)
    out = record.out.copy_to_host()
    del record
    return us, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--variants", default=",".join(f"{d}:{int(g)}" for d, g in VARIANTS),
                    help="DOWN:GU pairs, the first the baseline (default: all six)")
    ap.add_argument("--pairs", default=",".join(f"{g}/{d}" for g, d in PAIRS))
    a = ap.parse_args()
    variants = [(int(v.split(":")[0]), bool(int(v.split(":")[1])))
                for v in a.variants.split(",")]
    pairs = [tuple(p.split("/")) for p in a.pairs.split(",")]
    ctx = Ctx()
    rows, total = [], {v: 0.0 for v in variants}
    for gu, dn in pairs:
        base = None
        for v in variants:
            us, out = run(ctx, gu, dn, *v)
            same = True if base is None else bool(np.array_equal(out, base))
            base = out if base is None else base
            if not same:
                raise RuntimeError(f"{gu}/{dn} prefetch {v}: output differs from no prefetch")
            total[v] += us
            rows.append({"pair": f"{gu}/{dn}", "prefetch_down": v[0], "prefetch_gu": v[1],
                         "us": us})
            print(f"{gu}/{dn:5s} down {v[0]} gu {int(v[1])}: {us:7.2f} us a layer", flush=True)
    best = min(variants, key=lambda v: total[v])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "best": {"prefetch_down": best[0], "prefetch_gu": best[1]}},
                      f, indent=1)
    print(f"best: PREFETCH_DOWN={best[0]} PREFETCH_GU={best[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
