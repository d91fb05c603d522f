"""Probe: `generate` on the CUDA engine (what `strata generate` runs), each token picked on the
device (`CudaEngine.device_tokens`: the next step launched before the token is read back)
against the host choosing from every step's logits (`generation.DEVICE_PICK = False`: 608 KB
of logits copied back, then numpy), greedy and at `strata generate`'s default sampling
(temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), on one loaded model, no budget cap.

    python bench/probes/generate_pick.py MODEL.gguf OUT.json [N_PREDICT]
"""
import datetime
import json
import os
import sys

import numpy as np


def main() -> int:
    path, out = sys.argv[1], sys.argv[2]
    n_predict = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    from numba import cuda

    import strata.engine.generation as generation
    from strata.engine import Sampler, SamplingParams, generate, load_engine
    from strata.gguf import open_model

    model = open_model(path)
    eng = load_engine(model, "cuda", max_context=4096)
    prompt = np.random.default_rng(0).integers(0, model.shape.n_vocab, 512).tolist()
    rows = []
    for name, params in (("greedy", SamplingParams(temperature=0)),
                         ("default (t 0.8, top-k 40)", SamplingParams(seed=7))):
        for pick in ("device", "host"):
            generation.DEVICE_PICK = pick == "device"
            generate(eng, prompt[:64], n_predict=8, sampler=Sampler(params))  # graphs captured
            g = generate(eng, prompt, n_predict=n_predict, sampler=Sampler(params))
            rows.append({"sampling": name, "pick": pick, "tokens": len(g.tokens),
                         "stop_reason": g.stop_reason,
                         "decode_tokens_per_s": round(g.decode_tokens_per_s, 1),
                         "first_tokens": g.tokens[:16]})
            print(rows[-1], flush=True)
    generation.DEVICE_PICK = True
    res = {"date": datetime.date.today().isoformat(), "commit": os.environ.get("STRATA_COMMIT"),
           "device": cuda.get_current_device().name.decode()
           if isinstance(cuda.get_current_device().name, bytes)
           else str(cuda.get_current_device().name),
           "command": "python " + " ".join(sys.argv), "model": path, "rows": rows,
           "greedy_tokens_equal": rows[0]["first_tokens"] == rows[1]["first_tokens"]}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'sampling':28s} {'pick':7s} {'tok/s':>8s}")
    for r in rows:
        print(f"{r['sampling']:28s} {r['pick']:7s} {r['decode_tokens_per_s']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
