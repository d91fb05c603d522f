"""Probe: why `strata bench`'s decode (every step enqueued, one read at the end:
`CudaEngine.decode_tokens`) measured fewer tok/s than `generate` (each token read back one step
behind: `device_tokens`) on the same file. Both loops on one loaded engine, alternated, greedy,
after the same 512-token prompt; also the bench's own engine (`strata.bench.engine_cuda`'s
options) with both loops, in case the two loads differ.

    python bench/probes/decode_loop_ab.py MODEL.gguf OUT.json MODE [REPS]

On the H200 (one process, 2026-12-02): the `load_engine` engine 413.9 / 411.5 / 411.5 tok/s
(queued / generate / one behind), the bench's options loaded second 395.3 / 392.2 / 392.8: the
loop is not the difference; the load is (the modes test which part of it).
"""
import datetime
import json
import os
import sys
import time

import numpy as np


def loops(eng, prompt, n_gen):
    from strata.engine import Sampler, SamplingParams, generate

    eng.reset()
    eng.prefill(prompt)
    eng.synchronize()
    t0 = time.perf_counter()
    a = eng.decode_tokens(n_gen, None)
    queued = (n_gen - 1) / (time.perf_counter() - t0)
    g = generate(eng, prompt, n_predict=n_gen, sampler=Sampler(SamplingParams(temperature=0)))
    eng.reset()
    eng.prefill(prompt)
    eng.synchronize()
    t0 = time.perf_counter()
    b = list(eng.device_tokens(None, n_gen))
    behind = (n_gen - 1) / (time.perf_counter() - t0)
    return {"queued": round(queued, 1), "generate": round(g.decode_tokens_per_s, 1),
            "one_behind": round(behind, 1), "same_tokens": a == g.tokens == b}


def main() -> int:
    """MODE: "plain" (`load_engine`, the first allocation of the process), "bw_first" (the
    bench's bandwidth buffers made and freed first, as `strata bench` does) or "bench_options"
    (the model loaded with the bench's own options). One mode a process."""
    path, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    from numba import cuda

    from strata.engine import load_engine
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.plan.knobs import options_from_args

    model = open_model(path)
    prompt = np.random.default_rng(0).integers(0, model.shape.n_vocab, 512).tolist()
    rows = []
    if mode == "bw_first":
        from strata.bench.engine_cuda import _bandwidths
        print(_bandwidths(), flush=True)
    if mode in ("plain", "bw_first"):
        eng = load_engine(model, "cuda", max_context=4096)
    else:
        from strata.cli.main import _parser_for

        argv = ["bench", "--backend", "cuda", "-m", path, "--max-context", "4096"]
        args = _parser_for(argv)[0].parse_args(argv)  # the bench's own flags and defaults
        m = CudaModel(model, CudaOptions(plan=options_from_args(args), gpu_mem=None,
                                         graph=not args.no_graph, profile_path=args.profile,
                                         progress=False), log=lambda t: None)
        eng = CudaEngine(m)
    eng.prefill(prompt[:64])
    eng.decode_tokens(4, None)
    for r in range(reps):
        rows.append({"engine": mode, "rep": r, **loops(eng, prompt, 128)})
        print(rows[-1], flush=True)
    eng.m.close()
    dev = cuda.get_current_device().name
    res = {"date": datetime.date.today().isoformat(), "commit": os.environ.get("STRATA_COMMIT"),
           "device": dev.decode() if isinstance(dev, bytes) else str(dev),
           "command": "python " + " ".join(sys.argv), "rows": rows}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'engine':14s} {'queued':>8s} {'generate':>9s} {'behind':>8s} same")
    for r in rows:
        print(f"{r['engine']:14s} {r['queued']:8.1f} {r['generate']:9.1f} {r['one_behind']:8.1f} "
              f"{r['same_tokens']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
