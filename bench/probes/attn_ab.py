"""Probe (not part of the engine): decode tok/s of one loaded model with decode attention as two
launches (pass 1, then the combine) against one (the tensor-core kernel's last block per KV head
merges the splits: `DecodeStep.fuse_attention`), at splits of at least 16 or 64 keys
(`DecodeStep.attn_min_split`), in one process, rounds alternating so drift hits every arm alike.
Every arm must decode the same greedy tokens.

    python bench/probes/attn_ab.py MODEL.gguf [--prompt 512] [--gen 128] [--rounds 3] [--out F]

Run from the repository root on a GPU machine (the model: `strata synth qwen3-30b-a3b --quant
Q4_K_M --skew 3`, the D1 file). The context stays at 4,096 so the plan's partials hold the
splits of both floors (64 at any length)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone

import numpy as np

ARMS = {"two-launch m16": (False, 16), "fused m16": (True, 16), "fused m64": (True, 64),
        "two-launch m64": (False, 64)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--out")
    a = p.parse_args()
    from numba import cuda

    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.plan.options import PlanOptions

    m = CudaModel(open_model(a.model), CudaOptions(plan=PlanOptions(max_context=a.max_context),
                                                   graph=True, progress=False))
    eng = CudaEngine(m, use_graph=True)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, m.shape.n_vocab, a.prompt).tolist()
    eng.prefill(prompt[:300])
    eng.decode_tokens(4)  # compiles; marks the step warm (the next run captures)
    rows, tokens = [], {}
    first = next(iter(ARMS))
    for r in range(a.rounds):
        for arm, (fused, min_split) in ARMS.items():
            eng.step.fuse_attention, eng.step.attn_min_split = fused, min_split
            eng.step.graphs.clear()  # captured again with this arm's launches
            eng.reset()
            eng.prefill(prompt)
            eng.decode_tokens(2)  # captures
            nodes = dict(eng.step.n_graph_nodes)
            eng.reset()
            eng.prefill(prompt)
            cuda.synchronize()
            t0 = time.perf_counter()
            toks = eng.decode_tokens(a.gen)
            dt = time.perf_counter() - t0
            tps = (a.gen - 1) / dt
            tokens.setdefault(arm, toks)
            same = toks == tokens[first]
            left = eng.step.attn_done.copy_to_host()
            rows.append({"round": r, "arm": arm, "fused": fused, "min_split": min_split,
                         "tokens_per_s": tps, "step_ms": 1e3 * dt / (a.gen - 1),
                         "graph_nodes": nodes, "same_tokens": same,
                         "counts_left": int(left.sum())})
            print(f"round {r} {arm:15s} {tps:7.1f} tok/s  step {1e3 * dt / (a.gen - 1):.3f} ms"
                  f"  nodes {nodes}  same tokens {same}  counts left {int(left.sum())}",
                  flush=True)
    med = {arm: float(np.median([x["tokens_per_s"] for x in rows if x["arm"] == arm]))
           for arm in ARMS}
    base = med[first]
    print("median: " + ", ".join(f"{arm} {v:.1f} tok/s ({v / base - 1:+.1%})"
                                 for arm, v in med.items()))
    ok = all(x["same_tokens"] and x["counts_left"] == 0 for x in rows)
    if a.out:
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        json.dump({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "commit": os.environ.get("STRATA_COMMIT"), "device": name,
                   "command": "python bench/probes/attn_ab.py " + " ".join(sys.argv[1:]),
                   "median_tokens_per_s": med, "same_tokens_and_counts_zero": ok,
                   "first_tokens": tokens[first][:16], "rows": rows},
                  open(a.out, "w"), indent=1)
    m.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
