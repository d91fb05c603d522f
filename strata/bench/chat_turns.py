"""`python -m strata.bench.chat_turns -m FILE [--backend cuda|cpu]`: a chat's turns through
`strata serve`'s worker (the CUDA batch engine, or the CPU engine per slot as `serve --backend
cpu` runs it), with the KV of each finished turn reused by the next (serve's default) and
without it (`--no-prefix-cache`), on one loaded engine.

A conversation: a system prompt of `--system-tokens` random tokens, then `--turns` turns, each
`--user-tokens` new tokens and a greedy answer of exactly `--answer-tokens`. Each turn's prompt
is the whole history, as a chat client resends it. Both ways are fed the same prompts: the
histories are built from the answers of the run without reuse (the reference), so the prompts
are the same token for token; the run with reuse then finds its previous turn's KV for all but
where its own answer parted from the reference's (there: less reuse, never a wrong one).

Per turn: the prompt's length, the tokens the engine reused (`strata_prompt_cached_tokens_total`'s
increment), the time to the first token (submit to the first token's text) and the decode rate
after it, both ways; and how many answer tokens the reuse run shares with the reference (its
reused KV was written by decode steps, not a prefill, so its logits differ in float32 rounding
and a near-tie may part them). A warm-up conversation (other tokens) runs first, so compiles and
graph captures are not timed. One JSON object (date, commit, device, command) goes to --json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any

import numpy as np


def conversation(rng: np.random.Generator, n_vocab: int, *, system: int, turns: int,
                 user: int) -> tuple[list[int], list[list[int]]]:
    """(system prompt, each turn's user tokens): random ids (never 0, often a pad or bos id)."""
    draw = lambda n: rng.integers(1, n_vocab, n).tolist()  # noqa: E731
    return draw(system), [draw(user) for _ in range(turns)]


def run_turns(engine: Any, system: list[int], users: list[list[int]], answer: int, *,
              prefix_cache: bool, answers: list[list[int]] | None = None) -> list[dict]:
    """One conversation on a fresh worker over `engine`: turn t's prompt is the system prompt,
    then each earlier turn's user tokens and answer (`answers[t]` where given, else the answer
    this run produced), then turn t's user tokens. Returns per turn: prompt_tokens,
    cached_tokens, ttft_ms, decode_tok_s, answer (its token ids)."""
    from strata.bench.serve_batch import _Client, _Greedy
    from strata.serve.job import Job, Sampling
    from strata.serve.metrics import Metrics
    from strata.serve.worker import Worker

    metrics = Metrics()
    worker = Worker(engine, _Greedy(True), metrics, max_queue=1, prefix_cache=prefix_cache)
    worker.start()
    out, history = [], list(system)
    try:
        for t, user_t in enumerate(users):
            prompt = history + list(user_t)
            if len(prompt) + answer > engine.max_context:
                raise ValueError(f"turn {t + 1}: {len(prompt)} prompt tokens + {answer} answer "
                                 f"tokens exceed the engine's {engine.max_context}-token context")
            cached0 = metrics.prompt_cached_tokens
            c = _Client(prompt)
            c.t_submit = time.perf_counter()
            worker.submit(Job(prompt, Sampling(max_tokens=answer, temperature=0.0), c.sink))
            if not c.done.wait(600):
                raise RuntimeError(f"turn {t + 1} did not finish in 10 minutes")
            if c.reason != "length" or len(c.tokens) != answer:
                raise RuntimeError(f"turn {t + 1} ended early ({c.reason}, {len(c.tokens)} of "
                                   f"{answer} tokens)")
            dec_s = c.t_finish - c.t_first
            out.append({"turn": t + 1, "prompt_tokens": len(prompt),
                        "cached_tokens": metrics.prompt_cached_tokens - cached0,
                        "ttft_ms": (c.t_first - c.t_submit) * 1e3,
                        "decode_tok_s": (answer - 1) / dec_s if dec_s > 0 else None,
                        "answer": list(c.tokens)})
            history = prompt + (answers[t] if answers is not None else c.tokens)
    finally:
        worker.stop()
    return out


def measure(engine: Any, *, system: int, turns: int, user: int, answer: int,
            seed: int = 0) -> dict:
    """Warm-up, then the conversation without reuse (the reference) and with it, fed the same
    prompts. Returns {"whole": [...], "reuse": [...], "turns": the table rows}."""
    rng = np.random.default_rng(seed)
    n_vocab = engine.shape.n_vocab if hasattr(engine, "shape") else engine.n_vocab
    warm = conversation(rng, n_vocab, system=system, turns=min(turns, 2), user=user)
    for prefix in (False, True):  # compiles, captures, the prefill sizes both ways take
        run_turns(engine, *warm, answer, prefix_cache=prefix)
    sys_t, users = conversation(rng, n_vocab, system=system, turns=turns, user=user)
    whole = run_turns(engine, sys_t, users, answer, prefix_cache=False)
    ref = [r["answer"] for r in whole]
    reuse = run_turns(engine, sys_t, users, answer, prefix_cache=True, answers=ref)
    rows = []
    for w, r in zip(whole, reuse):
        same = next((i for i, (a, b) in enumerate(zip(w["answer"], r["answer"])) if a != b),
                    answer)
        rows.append({"turn": w["turn"], "prompt_tokens": w["prompt_tokens"],
                     "cached_tokens": r["cached_tokens"], "ttft_whole_ms": w["ttft_ms"],
                     "ttft_reuse_ms": r["ttft_ms"], "ttft_speedup": w["ttft_ms"] / r["ttft_ms"],
                     "decode_tok_s_whole": w["decode_tok_s"],
                     "decode_tok_s_reuse": r["decode_tok_s"],
                     "answer_tokens_equal_before_first_difference": same})
    return {"whole": whole, "reuse": reuse, "turns": rows}


def table(rows: list[dict]) -> str:
    lines = [f"{'turn':>4} {'prompt':>7} {'reused':>7} {'TTFT whole ms':>14} "
             f"{'TTFT reuse ms':>14} {'x':>6} {'dec tok/s':>10} {'same':>5}"]
    for r in rows:
        lines.append(f"{r['turn']:>4} {r['prompt_tokens']:>7} {r['cached_tokens']:>7} "
                     f"{r['ttft_whole_ms']:>14.1f} {r['ttft_reuse_ms']:>14.1f} "
                     f"{r['ttft_speedup']:>6.2f} {r['decode_tok_s_reuse'] or 0:>10.1f} "
                     f"{r['answer_tokens_equal_before_first_difference']:>5}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.chat_turns", description=__doc__)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--system-tokens", type=int, default=2048)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--user-tokens", type=int, default=64)
    p.add_argument("--answer-tokens", type=int, default=64)
    p.add_argument("--max-context", type=int, default=None,
                   help="per sequence (default: what the conversation needs, rounded up to 1K)")
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpu-mem", help="plan within this much VRAM (cuda)")
    p.add_argument("--prompt-steps", type=int, default=None, metavar="N",
                   help="cuda: prompts of up to N new tokens run as decode steps (0: never; "
                        "default: the plan's estimate)")
    p.add_argument("--json", metavar="FILE", help="write the result here")
    p.add_argument("--command", help="the command line to record (default: this one)")
    args = p.parse_args(argv)
    for name in ("system_tokens", "user_tokens"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.turns < 1 or args.answer_tokens < 2 or args.system_tokens + args.user_tokens < 1:
        p.error("need --turns >= 1, --answer-tokens >= 2 and a first prompt of >= 1 token")
    need = args.system_tokens + args.turns * (args.user_tokens + args.answer_tokens)
    ctx = args.max_context or -(-need // 1024) * 1024
    if need > ctx:
        p.error(f"the conversation needs {need} tokens of context; --max-context is {ctx}")

    if args.backend == "cpu" and args.gpu_mem:
        p.error("--gpu-mem plans VRAM: it applies to --backend cuda only")

    from strata.bench.engine_cuda import _commit
    from strata.gguf import open_model

    mf = open_model(args.model)
    t0 = time.perf_counter()
    if args.backend == "cpu":
        import platform

        from strata.engine.cpu import engine_factory
        from strata.serve.batch import PerSlotEngines
        engine = PerSlotEngines(engine_factory(mf, max_context=ctx), 1)
        device = f"CPU: {platform.processor() or platform.machine()}"
    else:
        from strata.bench.serve_batch import _device_name
        from strata.engine.cuda.batch import batch_options, load_batch
        from strata.plan.devices import parse_size
        from strata.plan.options import PlanOptions
        opts = batch_options(mf, 1, PlanOptions(max_context=ctx),
                             gpu_mem=parse_size(args.gpu_mem) if args.gpu_mem else None,
                             progress=False, prompt_steps=args.prompt_steps)
        engine = load_batch(mf, opts, log=lambda t: print(t, file=sys.stderr))
        device = _device_name()
    load_s = time.perf_counter() - t0
    res = measure(engine, system=args.system_tokens, turns=args.turns, user=args.user_tokens,
                  answer=args.answer_tokens)
    out = {"bench": "chat_turns", "model": args.model, "arch": mf.arch,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": _commit(), "device": device, "backend": args.backend,
           "command": args.command or " ".join(["python -m strata.bench.chat_turns"]
                                               + (argv if argv is not None else sys.argv[1:])),
           "max_context": ctx, "gpu_mem": args.gpu_mem, "load_seconds": load_s,
           "prompt_steps": getattr(engine, "prompt_steps", None), **res}
    print(table(res["turns"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
