"""`strata profile -m FILE --prompts FILE`: record which experts each layer routes to while the
prompts run (on the CPU engine), and save the counts as a routing profile (`--profile` of
`strata plan`, `generate`, `bench` ranks the expert cache by it)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, metavar="FILE", help="GGUF model file")
    p.add_argument("--prompts", required=True, metavar="FILE",
                   help="UTF-8 text file, one prompt per line")
    p.add_argument("-o", "--output", metavar="FILE.npy",
                   help="where to write the counts (default: MODEL.profile.npy)")
    p.add_argument("-n", "--n-predict", type=int, default=0, metavar="N",
                   help="greedy tokens generated after each prompt, counted too (default 0)")
    p.add_argument("--max-context", type=int, default=None, metavar="N",
                   help="positions per prompt and its -n tokens (default: the model's, at most "
                        "4096); a longer prompt is refused, -n stops at the end")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _refuse_past_context(prompts: list[tuple[int, list[int]]], ctx: int, args, shape) -> None:
    """A prompt longer than the context is refused, as `strata generate` refuses one, before
    any prompt runs: its routing would be counted for only part of it."""
    from strata.errors import StrataError

    over = [(line, len(ids)) for line, ids in prompts if len(ids) > ctx]
    if not over:
        return
    line, n = max(over, key=lambda o: o[1])
    trained = f"; the model was trained for {shape.n_ctx_train}" if shape.n_ctx_train > 0 else ""
    which = f"line {line} has {n}" if len(over) == 1 else f"the longest, line {line}, has {n}"
    raise StrataError(f"--prompts {args.prompts}: {len(over)} of {_count(len(prompts), 'prompt')} "
                      f"{'has' if len(over) == 1 else 'have'} more tokens than the context holds "
                      f"({ctx}); {which} (raise --max-context{trained})")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from strata.cli.output import check_output, npy_path, write_atomic
    from strata.engine.cpu import CpuEngine, CpuModel
    from strata.engine.cpu.engine import default_max_context
    from strata.errors import UsageError
    from strata.experts.profile import (RoutingCounts, coverage_table, read_prompt_lines,
                                        record)
    from strata.gguf import open_model
    from strata.plan.options import check_max_context
    from strata.tokenizer import Tokenizer

    if args.n_predict < 0:
        raise UsageError(f"-n must be >= 0, got {args.n_predict}")
    check_max_context(args.max_context)
    model = open_model(args.model)
    model.check_weights()  # a header-only file (zero weights) is for `strata plan` alone
    lines = read_prompt_lines(args.prompts)
    # the name RoutingCounts.save would give, checked before the prompts run
    path = npy_path(args.output or f"{args.model}.profile")
    check_output(path, "-o")
    tok = Tokenizer.from_metadata(model.metadata)
    s = model.shape
    ctx = default_max_context(s) if args.max_context is None else args.max_context
    prompts = [(line, tok.encode(text)) for line, text in lines]
    _refuse_past_context(prompts, ctx, args, s)
    counts = RoutingCounts(s.n_layer, s.n_expert)
    engine = CpuEngine(CpuModel(model), max_context=ctx, cb=counts.callback())
    done = record(engine, (ids for _, ids in prompts), counts, n_predict=args.n_predict)
    write_atomic(path, "-o", lambda f: np.save(f, counts.counts, allow_pickle=False))
    cov = coverage_table(counts.counts)
    print(f"recorded {_count(len(prompts), 'prompt')}, {_count(done.tokens, 'token')}, "
          f"{_count(s.n_layer, 'layer')} x {_count(s.n_expert, 'expert')} -> {path}")
    if done.cut_short:  # as generate says where the context stopped it
        print(f"note: {done.cut_short} of {_count(len(prompts), 'prompt')} reached the end of "
              f"the context ({ctx} tokens) before their -n {args.n_predict} tokens: fewer were "
              f"generated and counted (raise --max-context)", file=sys.stderr)
    print(f"hottest 25% of experts take {cov[:, 0].mean():.1%} of routed tokens, hottest 50% "
          f"take {cov[:, 1].mean():.1%} (mean over layers)", file=sys.stderr)
    return 0
