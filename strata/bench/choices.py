"""`python -m strata.bench.choices -m FILE [--backend cuda|cpu]`: a request's `n` choices through
`strata serve`'s worker, their shared prompt computed once and copied to the other choices
(serve's default) against computed once per choice (`--no-prefix-cache`), on one loaded engine.

`--choices` greedy jobs of one prompt of `--prompt-tokens` random tokens are queued together, as
`Choices` submits them, on an engine of as many slots (all decode side by side). Per run: the
time from submitting until every choice has its first token (every prompt has run), until all
have finished, the prompt tokens each choice found in K/V another computed, and whether every
choice's `--answer-tokens` greedy tokens are the same (they must be: one prompt, one greedy
rule) and the same as the other run's. A warm-up (another prompt) runs both ways first, so
compiles and graph captures are not timed. One JSON object (date, commit, device, command) goes
to --json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any

import numpy as np


def run_choices(engine: Any, prompt: list[int], n: int, answer: int, *,
                prefix_cache: bool) -> dict:
    """`n` greedy jobs of `prompt` queued on a fresh worker over `engine` before it starts (one
    admission round, as a request's choices arrive); waits for all. Returns all_first_ms (submit
    to the last choice's first token), all_done_ms, cached_tokens (per choice), answers."""
    from strata.bench.serve_batch import run_clients

    if n > engine.n_slots:
        raise ValueError(f"{n} choices need {n} slots; the engine has {engine.n_slots}")
    clients = run_clients(engine, [list(prompt)] * n, answer, prefix_cache=prefix_cache)
    t0 = min(c.t_submit for c in clients)
    return {"all_first_ms": (max(c.t_first for c in clients) - t0) * 1e3,
            "all_done_ms": (max(c.t_finish for c in clients) - t0) * 1e3,
            "cached_tokens": [c.n_cached for c in clients],
            "answers": [list(c.tokens) for c in clients]}


def measure(engine: Any, *, prompt_tokens: int, n: int, answer: int, seed: int = 0) -> dict:
    """Warm-up both ways, then the choices computed whole and shared, on one random prompt.
    Returns {"whole": run, "shared": run, "row": the table's row}."""
    rng = np.random.default_rng(seed)
    n_vocab = engine.shape.n_vocab
    draw = lambda: rng.integers(1, n_vocab, prompt_tokens).tolist()  # noqa: E731 (never 0)
    warm = draw()
    for prefix in (False, True):
        run_choices(engine, warm, n, answer, prefix_cache=prefix)
    prompt = draw()
    whole = run_choices(engine, prompt, n, answer, prefix_cache=False)
    shared = run_choices(engine, prompt, n, answer, prefix_cache=True)
    same = lambda r: all(a == r["answers"][0] for a in r["answers"])  # noqa: E731
    row = {"choices": n, "prompt_tokens": prompt_tokens,
           "cached_tokens_shared": shared["cached_tokens"],
           "all_first_whole_ms": whole["all_first_ms"],
           "all_first_shared_ms": shared["all_first_ms"],
           "first_speedup": whole["all_first_ms"] / shared["all_first_ms"],
           "all_done_whole_ms": whole["all_done_ms"], "all_done_shared_ms": shared["all_done_ms"],
           "choices_agree_whole": same(whole), "choices_agree_shared": same(shared),
           "shared_answers_equal_whole": shared["answers"] == whole["answers"]}
    return {"whole": whole, "shared": shared, "row": row}


def table(row: dict) -> str:
    return "\n".join([
        f"{'n':>3} {'prompt':>7} {'copied':>7} {'all first, whole ms':>20} "
        f"{'shared ms':>10} {'x':>6} {'done whole ms':>14} {'shared ms':>10} {'agree':>6}",
        f"{row['choices']:>3} {row['prompt_tokens']:>7} {sum(row['cached_tokens_shared']):>7} "
        f"{row['all_first_whole_ms']:>20.1f} {row['all_first_shared_ms']:>10.1f} "
        f"{row['first_speedup']:>6.2f} {row['all_done_whole_ms']:>14.1f} "
        f"{row['all_done_shared_ms']:>10.1f} "
        f"{str(row['choices_agree_shared'] and row['shared_answers_equal_whole']):>6}"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.choices", description=__doc__)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--choices", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpu-mem", help="plan within this much VRAM (cuda)")
    p.add_argument("--json", metavar="FILE", help="write the result here")
    p.add_argument("--command", help="the command line to record (default: this one)")
    args = p.parse_args(argv)
    if not 2 <= args.choices <= 16:
        p.error("--choices must be in 2..16 (a request's n)")
    if args.prompt_tokens < 2 or args.answer_tokens < 2:
        p.error("need --prompt-tokens >= 2 and --answer-tokens >= 2")
    if args.backend == "cpu" and args.gpu_mem:
        p.error("--gpu-mem plans VRAM: it applies to --backend cuda only")
    ctx = -(-(args.prompt_tokens + args.answer_tokens) // 256) * 256

    from strata.bench.engine_cuda import _commit
    from strata.gguf import open_model

    mf = open_model(args.model)
    t0 = time.perf_counter()
    if args.backend == "cpu":
        import platform

        from strata.engine.cpu import engine_factory
        from strata.serve.batch import PerSlotEngines
        engine = PerSlotEngines(engine_factory(mf, max_context=ctx), args.choices)
        device = f"CPU: {platform.processor() or platform.machine()}"
    else:
        from strata.bench.serve_batch import _device_name
        from strata.engine.cuda.batch import batch_options, load_batch
        from strata.plan.devices import parse_size
        from strata.plan.options import PlanOptions
        opts = batch_options(mf, args.choices, PlanOptions(max_context=ctx),
                             gpu_mem=parse_size(args.gpu_mem) if args.gpu_mem else None,
                             progress=False)
        engine = load_batch(mf, opts, log=lambda t: print(t, file=sys.stderr))
        device = _device_name()
    load_s = time.perf_counter() - t0
    res = measure(engine, prompt_tokens=args.prompt_tokens, n=args.choices,
                  answer=args.answer_tokens)
    out = {"bench": "choices", "model": args.model, "arch": mf.arch,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": _commit(), "device": device, "backend": args.backend,
           "command": args.command or " ".join(["python -m strata.bench.choices"]
                                               + (argv if argv is not None else sys.argv[1:])),
           "max_context": ctx, "gpu_mem": args.gpu_mem, "load_seconds": load_s, **res}
    print(table(res["row"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
