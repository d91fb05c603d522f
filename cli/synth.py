"""`strata synth`: write a synthetic GGUF model of a real shape (random weights, a real tokenizer,
a chosen routing skew). Imports nothing heavy: numpy, gguf and rich only, inside run()."""

from __future__ import annotations

import argparse

EPILOG = """\
mixes:
  Q8_0, Q4_0, Q4_K_M, IQ4_XS, IQ3_S, F16   llama.cpp's per-tensor choices for these file types
                                           (e.g. Q4_K_M: Q6_K for output and half the attn_v /
                                           ffn_down layers), with its fallbacks for rows that
                                           are not whole 256-value blocks
  IQ_MIX      IQ4_NL / IQ3_S / IQ4_XS across tensors
  LEGACY_MIX  Q5_0 / Q4_0 / F16 / Q8_0 across tensors
  norms and routers are F32 in every mix

routing skew (--skew B):
  the top fraction f of each layer's experts (ranked by how often they are chosen) receives
  about 1-(1-f)^B of all expert selections made by random tokens; B=1 (the default) is uniform,
  B=3 resembles Qwen3-30B-A3B. It is made by reserving a few hidden dimensions for routing:
  the token embedding writes them (a shared direction plus per-token noise), no layer writes
  them, and each router reads only them, with per-expert biases along the shared direction
  fitted so the selection rates follow the curve. Each layer ranks its experts by a random
  permutation, stored in the file as strata.synth.expert_rank (and the intended shares as
  strata.synth.expert_share) for use as a routing profile.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("preset", help="model shape: tiny, qwen3-30b-a3b or qwen3-235b-a22b")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="GGUF file to write")
    p.add_argument("--quant", default="Q8_0", metavar="MIX",
                   help="quantization mix (default Q8_0; see below)")
    p.add_argument("--layers", type=int, metavar="N",
                   help="keep only the first N layers (depth only; default: the preset's)")
    p.add_argument("--skew", type=float, metavar="B",
                   help="routing skew exponent, 1 (uniform, default) to 64; see below")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="random seed, 0..4294967295: the same arguments and seed give the "
                        "same file")
    p.add_argument("--header-only", action="store_true",
                   help="write the header and a sparse, full-size data region (no weights): "
                        "instant files of any size for planning")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _config(args):
    from strata.errors import UsageError
    from strata.synth.config import preset

    cfg = preset(args.preset)
    if args.layers is not None:
        if not 1 <= args.layers <= cfg.n_layer:
            raise UsageError(f"--layers must be between 1 and {cfg.n_layer} for preset "
                             f"{cfg.name!r}, got {args.layers}")
        cfg = cfg.with_layers(args.layers)
    return cfg


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from strata.cli.flags import flag_checks
    from strata.synth.errors import SynthError
    from strata.synth.mixes import check_mix
    from strata.synth.routing import check_skew
    from strata.synth.writer import check_seed, write_model

    with flag_checks(SynthError):  # here about a flag's value; from the writer, a failure
        cfg = _config(args)
        check_mix(args.quant)
        check_skew(args.skew)
        check_seed(args.seed, "--seed")
    report = write_model(args.output, cfg, mix=args.quant, seed=args.seed, skew=args.skew,
                         progress=not args.quiet, header_only=args.header_only)
    what = "header only (sparse)" if report.header_only else f"{report.gb_per_s:.2f} GB/s"
    Console(stderr=True).print(
        f"wrote {report.path}: {cfg.name}, {cfg.n_layer} layers, {args.quant}, "
        f"{report.file_bytes / 1e9:.3f} GB in {report.seconds:.2f} s ({what})")
    return 0
