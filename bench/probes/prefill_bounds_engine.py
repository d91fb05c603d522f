"""Probe (not part of the engine): a 4,096-token prompt (P0's) with the prefill GEMMs at one or
two blocks an SM, on one loaded engine, alternated, so both run on the same machine at the same
time (a prompt's rate also depends on the host's launch speed, which differs between machines).

    python bench/probes/prefill_bounds_engine.py MODEL.gguf OUT.json [REPS]

Each setting: one warm-up prompt (its kernels compile), then REPS prompts; the best and the
median tok/s, and whether the last position's logits are bit-identical across settings (launch
bounds change register allocation, not arithmetic).
"""
import dataclasses
import statistics
import sys

import numpy as np
from ab_engine import finish, time_prompt


def main() -> int:
    path, out = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    from strata.cuda_kernels import tile_shapes  # tc_tile reads its TC_TILE
    from strata.engine import load_engine
    from strata.gguf import open_model

    model = open_model(path)
    prompt = np.random.default_rng(0).integers(0, model.shape.n_vocab, 4096).tolist()
    eng = load_engine(model, "cuda", max_context=4608)
    default = tile_shapes.TC_TILE
    rows, logits = [], {}
    for mb in (2, 0, 2, 0):
        tile_shapes.TC_TILE = dataclasses.replace(default, min_blocks=mb)
        eng.reset()
        logits.setdefault(mb, np.array(eng.prefill(prompt), copy=True))  # warm-up (compiles)
        eng.synchronize()
        enq, walls = time_prompt(eng, prompt, reps)
        rates = [len(prompt) / w for w in walls]
        rows.append({"min_blocks": mb, "best_tok_s": round(max(rates), 1),
                     "median_tok_s": round(statistics.median(rates), 1),
                     "median_prefill_call_s": round(statistics.median(enq), 4)})
        print(rows[-1], flush=True)
    tile_shapes.TC_TILE = default
    same = bool(np.array_equal(logits[2], logits[0]))
    return finish(eng, out, "prefill_bounds_engine.py", same, prompt_tokens=len(prompt),
                  rows=rows)


if __name__ == "__main__":
    sys.exit(main())
