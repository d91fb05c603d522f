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
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np


def main() -> int:
    path, out = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    from numba import cuda

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
            walls = []
            for _ in range(reps):
                eng.reset()
                eng.synchronize()
                t0 = time.perf_counter()
                eng.prefill(prompt)
                eng.synchronize()
                walls.append(time.perf_counter() - t0)
            wall = statistics.median(walls)
            rows.append({"prompt_tokens": n_tok, "small_tiles": small,
                         "taken": small and takes_small_tile(n_tok * s.n_expert_used,
                                                             s.n_expert),
                         "median_prompt_s": round(wall, 4),
                         "median_tok_s": round(n_tok / wall, 1)})
            print(rows[-1], flush=True)
        same = same and bool(np.array_equal(logits[True], logits[False]))
    print(f"last-position logits bit-identical across settings: {same}")
    dev = cuda.get_current_device().name
    eng.m.close()
    body = {"date": datetime.date.today().isoformat(),
            "commit": os.environ.get("STRATA_COMMIT", ""),
            "device": dev.decode() if isinstance(dev, bytes) else str(dev),
            "command": "python bench/probes/small_tiles_engine.py " + " ".join(sys.argv[1:]),
            "rows": rows, "logits_bit_identical": same}
    with open(out, "w") as f:
        json.dump(body, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
