"""Probe (not part of the engine): prompts through numba's launch path and through direct
launches (cuda_kernels/direct_launch.py), alternated on one loaded engine, so both run on the
same machine at the same time.

    python bench/probes/direct_launch_engine.py MODEL.gguf OUT.json [REPS]

For a 4,096-token prompt (P0's) and a 32-token one (a chat turn's time to first token): per
setting, one warm-up prompt, then REPS prompts; the median seconds of the prefill call (the host
enqueuing the prompt) and of the whole prompt, tok/s, launches each way, and whether the last
position's logits are bit-identical across settings (the same kernels with the same arguments).
"""
import statistics
import sys

import numpy as np
from ab_engine import finish, time_prompt


def main() -> int:
    path, out = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
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
            c0 = dict(dl.COUNTS)
            calls, walls = time_prompt(eng, prompt, reps)
            call, wall = statistics.median(calls), statistics.median(walls)
            rows.append({"prompt_tokens": n_tok, "direct": enabled,
                         "median_prefill_call_s": round(call, 4),
                         "median_prompt_s": round(wall, 4),
                         "median_tok_s": round(n_tok / wall, 1),
                         "launches_direct_per_prompt": (dl.COUNTS["direct"] - c0["direct"]) / reps,
                         "launches_numba_per_prompt": (dl.COUNTS["numba"] - c0["numba"]) / reps})
            print(rows[-1], flush=True)
        same = same and bool(np.array_equal(logits[True], logits[False]))
    dl.ENABLED = True
    return finish(eng, out, "direct_launch_engine.py", same, rows=rows)


if __name__ == "__main__":
    sys.exit(main())
