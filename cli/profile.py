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
                   help="positions per prompt (default: the model's, at most 4096)")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from strata.cli.output import check_output, npy_path, write_atomic
    from strata.engine.cpu import CpuEngine, CpuModel
    from strata.errors import StrataError
    from strata.experts.profile import RoutingCounts, coverage_table, read_prompts, record
    from strata.gguf import open_model
    from strata.tokenizer import Tokenizer

    if args.n_predict < 0:
        raise StrataError(f"-n must be >= 0, got {args.n_predict}")
    if args.max_context is not None and args.max_context < 1:
        raise StrataError(f"--max-context must be at least 1, got {args.max_context}")
    model = open_model(args.model)
    model.check_weights()  # a header-only file (zero weights) is for `strata plan` alone
    prompts = read_prompts(args.prompts)
    # the name RoutingCounts.save would give, checked before the prompts run
    path = npy_path(args.output or f"{args.model}.profile")
    check_output(path, "-o")
    tok = Tokenizer.from_metadata(model.metadata)
    s = model.shape
    counts = RoutingCounts(s.n_layer, s.n_expert)
    engine = CpuEngine(CpuModel(model), max_context=args.max_context, cb=counts.callback())
    n = record(engine, (tok.encode(p) for p in prompts), counts, n_predict=args.n_predict)
    write_atomic(path, "-o", lambda f: np.save(f, counts.counts, allow_pickle=False))
    cov = coverage_table(counts.counts)
    print(f"recorded {_count(len(prompts), 'prompt')}, {_count(n, 'token')}, "
          f"{_count(s.n_layer, 'layer')} x {_count(s.n_expert, 'expert')} -> {path}")
    print(f"hottest 25% of experts take {cov[:, 0].mean():.1%} of routed tokens, hottest 50% "
          f"take {cov[:, 1].mean():.1%} (mean over layers)", file=sys.stderr)
    return 0
