"""Probe (not part of the engine): decode tok/s of one loaded model with the q/k/v launches of a
second weight format forked onto the side stream (`DecodeStep.fork_formats`, the default) and
without, in one process, rounds alternating so drift hits both alike. Both must decode the same
greedy tokens.

    python bench/probes/fork_ab.py MODEL.gguf [--prompt 512] [--gen 128] [--rounds 3] [--out F]

Run from the repository root on a GPU machine (the model: `strata synth qwen3-30b-a3b --quant
Q4_K_M --skew 3`, the D1 file, whose attn_v is Q6_K in half the layers)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone

import numpy as np


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
    for r in range(a.rounds):
        for variant in ("forked", "serial"):
            eng.step.fork_formats = variant == "forked"
            eng.step.graphs.clear()  # captured again under this variant
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
            tokens.setdefault(variant, toks)
            same = toks == tokens["forked"]
            rows.append({"round": r, "variant": variant, "tokens_per_s": tps,
                         "step_ms": 1e3 * dt / (a.gen - 1), "graph_nodes": nodes,
                         "same_tokens": same})
            print(f"round {r} {variant:7s} {tps:7.1f} tok/s  step {1e3 * dt / (a.gen - 1):.3f} ms"
                  f"  nodes {nodes}  same tokens {same}", flush=True)
    med = {v: float(np.median([x["tokens_per_s"] for x in rows if x["variant"] == v]))
           for v in ("forked", "serial")}
    print(f"median: forked {med['forked']:.1f} tok/s, serial {med['serial']:.1f} "
          f"({med['forked'] / med['serial'] - 1:+.1%})")
    ok = all(x["same_tokens"] for x in rows)
    if a.out:
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        json.dump({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "commit": os.environ.get("STRATA_COMMIT"), "device": name,
                   "command": "python bench/probes/fork_ab.py " + " ".join(sys.argv[1:]),
                   "median_tokens_per_s": med, "same_tokens": ok,
                   "first_tokens": tokens["forked"][:16], "rows": rows},
                  open(a.out, "w"), indent=1)
    m.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
