"""Probe (not part of the engine): prompts through numba's launch path and through direct
launches (cuda_kernels/direct_launch.py), alternated on one loaded engine, so both run on the
same machine at the same time.

    python bench/probes/direct_launch_engine.py MODEL.gguf OUT.json [REPS]

For a 4,096-token prompt (P0's) and a 32-token one (a chat turn's time to first token): per
setting, one warm-up prompt, then REPS prompts; the median seconds of the prefill call (the host
enqueuing the prompt) and of the whole prompt, tok/s, launches each way, and whether the last
position's logits are bit-identical across settings (the same kernels with the same arguments).
"""
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

    from strata.cuda_kernels import direct_launch as dl
    from strata.engine import load_engine
    from strata.gguf import open_model

    model = open_model(path)
    rng = np.random.default_rng(0)
    eng = load_engine(model, "cuda", max_context=4608)
    rows, same = [], True
    for n_tok in (4096, 32):
        prompt = rng.integers(0, model.shape.n_vocab, n_tok).tolist()
        logits = {}
        for enabled in (False, True, False, True):
            dl.ENABLED = enabled
            eng.reset()
            logits.setdefault(enabled, np.array(eng.prefill(prompt), copy=True))  # warm-up
            eng.synchronize()
            calls, walls = [], []
            c0 = dict(dl.COUNTS)
            for _ in range(reps):
                eng.reset()
                eng.synchronize()
                t0 = time.perf_counter()
                last = eng.prefill(prompt)
                t1 = time.perf_counter()
                eng.synchronize()
                walls.append(time.perf_counter() - t0)
                calls.append(t1 - t0)
                if not np.array_equal(np.asarray(last), logits[enabled]):
                    same = False  # a repeat of one setting must also agree with itself
            wall = statistics.median(walls)
            rows.append({"prompt_tokens": n_tok, "direct": enabled,
                         "median_prefill_call_s": round(statistics.median(calls), 4),
                         "median_prompt_s": round(wall, 4),
                         "median_tok_s": round(n_tok / wall, 1),
                         "launches_direct_per_prompt": (dl.COUNTS["direct"] - c0["direct"]) / reps,
                         "launches_numba_per_prompt": (dl.COUNTS["numba"] - c0["numba"]) / reps})
            print(rows[-1], flush=True)
        same = same and bool(np.array_equal(logits[True], logits[False]))
    dl.ENABLED = True
    print(f"last-position logits bit-identical across settings: {same}")
    dev = cuda.get_current_device().name
    eng.m.close()
    body = {"date": datetime.date.today().isoformat(),
            "commit": os.environ.get("STRATA_COMMIT", ""),
            "device": dev.decode() if isinstance(dev, bytes) else str(dev),
            "command": "python bench/probes/direct_launch_engine.py " + " ".join(sys.argv[1:]),
            "rows": rows, "logits_bit_identical": same}
    with open(out, "w") as f:
        json.dump(body, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
