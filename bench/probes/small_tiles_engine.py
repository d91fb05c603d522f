"""Probe (not part of the engine): short prompts with the grouped GEMMs on the default 128-row
tiles and on 16-row tiles (`CudaOptions.prefill_small_tiles`), alternated on one loaded engine.

    python bench/probes/small_tiles_engine.py MODEL.gguf OUT.json [REPS]

Per prompt length (8, 32, 128, 512 tokens) and setting: one warm-up prompt, then REPS prompts;
the median seconds of the whole prompt, whether the small tile was taken (a chunk with more than
`SMALL_TILE_ROWS_PER_EXPERT` entries an expert keeps the default), and whether the last
position's logits are bit-identical across settings (a tile's rows change which MMAs run, not
any value's sum).
"""
import dataclasses
import statistics
import sys

import numpy as np
from ab_engine import finish, time_prompt


def main() -> int:
    path, out = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    from strata.cuda_kernels.matmul_tiles import takes_small_tile
    from strata.engine import load_engine
    from strata.gguf import open_model

    model = open_model(path)
    s = model.shape
    rng = np.random.default_rng(0)
    eng = load_engine(model, "cuda", max_context=4608)
    rows, same = [], True
    for n_tok in (8, 32, 128, 512):
        prompt = rng.integers(0, s.n_vocab, n_tok).tolist()
        logits = {}
        for small in (False, True, False, True):
            eng.m.options = dataclasses.replace(eng.m.options, prefill_small_tiles=small)
            eng.reset()
            logits.setdefault(small, np.array(eng.prefill(prompt), copy=True))  # warm-up
            eng.synchronize()
            wall = statistics.median(time_prompt(eng, prompt, reps)[1])
            rows.append({"prompt_tokens": n_tok, "small_tiles": small,
                         "taken": small and takes_small_tile(n_tok * s.n_expert_used,
                                                             s.n_expert),
                         "median_prompt_s": round(wall, 4),
                         "median_tok_s": round(n_tok / wall, 1)})
            print(rows[-1], flush=True)
        same = same and bool(np.array_equal(logits[True], logits[False]))
    return finish(eng, out, "small_tiles_engine.py", same, rows=rows)


if __name__ == "__main__":
    sys.exit(main())
