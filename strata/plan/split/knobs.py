"""The split's command-line flags, defined once for every subcommand that plans over GPUs, and
the `SplitOptions` built from them. Light imports only."""

from __future__ import annotations

import argparse
import os

from strata.plan.options import OptionError
from strata.plan.split.options import (
    COVER_B_DEFAULT,
    HANDOFFS,
    SplitOptions,
    parse_floats,
    parse_gpus,
    parse_layer_split,
)

CARVE_ENV = "STRATA_WEIGHT_CARVE"  # 0: every stage loads every layer's dense weights (the A/B)
# The flags that mean something only to a layer split, with their defaults: given with one GPU
# they would be silently meaningless, so a plan for one GPU refuses them by name.
SPLIT_ONLY = (("layer_split", "--layer-split", "auto"), ("cover_b", "--cover-b", None),
              ("no_helper_tiers", "--no-helper-tiers", False), ("no_carve", "--no-carve", False),
              ("stage_cache", "--stage-cache", None), ("gpu_bandwidth", "--gpu-bandwidth", None),
              ("handoff", "--handoff", "auto"))


def add_split_knobs(p: argparse.ArgumentParser, *, gpus_help: str | None = None) -> None:
    g = p.add_argument_group("multi-GPU layer split")
    g.add_argument("--gpus", metavar="I,J,...",
                   help=gpus_help or "GPUs to split the layers over, in stage order (default: "
                        "all; with --gpu-mem, indices into its sizes)")
    g.add_argument("--layer-split", default="auto", metavar="auto|L1,L2,...",
                   help="auto (search every contiguous placement) or the first layer of the "
                        "second, third, ... stage")
    g.add_argument("--cover-b", type=float, metavar="B",
                   help=f"exponent of the coverage curve 1-(1-f)^B that scores placements "
                        f"(default: fitted to the routing profile's shares, else "
                        f"{COVER_B_DEFAULT:g})")
    g.add_argument("--no-helper-tiers", action="store_true",
                   help="leave VRAM the stages do not use empty instead of caching the hottest "
                        "pairs no stage cache holds")
    g.add_argument("--no-carve", action="store_true",
                   help=f"every stage holds every layer's dense weights (the carve's A/B; also "
                        f"${CARVE_ENV}=0)")
    g.add_argument("--stage-cache", metavar="N,N,...",
                   help="pin each stage's expert cache to N slots (the A/B keeps caches equal)")
    g.add_argument("--gpu-bandwidth", metavar="GBPS,...",
                   help="each GPU's memory read rate in GB/s (scores placements, orders the "
                        "helper tiers fastest first; default: equal)")
    g.add_argument("--handoff", choices=HANDOFFS, default="auto",
                   help="how the hidden state crosses from one stage's GPU to the next: auto "
                        "(peer-to-peer where the GPUs reach each other's memory, else pinned "
                        "host memory) or host (always pinned host memory: to measure it, or to "
                        "work around a peer-to-peer fault)")


def carve_enabled(args: argparse.Namespace, environ=None) -> bool:
    env = os.environ if environ is None else environ
    raw = env.get(CARVE_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise OptionError(f"${CARVE_ENV}={raw!r}: expected 0 or 1")
    return not (args.no_carve or raw == "0")


def split_from_args(args: argparse.Namespace, environ=None) -> SplitOptions:
    """`SplitOptions` from parsed flags; OptionError names a bad one."""
    stage = None
    if args.stage_cache:
        try:
            stage = tuple(int(x) for x in args.stage_cache.split(","))
        except ValueError:
            raise OptionError(f"--stage-cache {args.stage_cache!r}: expected slot counts "
                              f"separated by commas") from None
    bw = None
    if args.gpu_bandwidth:
        bw = tuple(v * 1e9 for v in parse_floats(args.gpu_bandwidth, "--gpu-bandwidth"))
    return SplitOptions(cuts=parse_layer_split(args.layer_split), cover_b=args.cover_b,
                        helper_tiers=not args.no_helper_tiers,
                        carve=carve_enabled(args, environ), stage_cache=stage, bandwidth=bw,
                        handoff=getattr(args, "handoff", "auto"))


def split_flags_given(args: argparse.Namespace) -> list[str]:
    """The split-only flags set away from their defaults, as spelled on the command line."""
    out = []
    for name, flag, default in SPLIT_ONLY:
        value = getattr(args, name, default)
        if name == "layer_split":
            value = default if parse_layer_split(value or default) is None else value
        if value != default:
            out.append(flag)
    return out


def refuse_split_flags(args: argparse.Namespace, gpu: int) -> None:
    """One GPU runs every layer: a split-only flag given with it is refused by name (as
    `strata generate` and `strata bench` refuse them), not silently ignored."""
    given = split_flags_given(args)
    if given:
        raise OptionError(f"{', '.join(given)}: a layer split's flag{'s' * (len(given) > 1)}, "
                          f"and one GPU runs every layer (GPU {gpu}; give several with "
                          f"--gpu-mem A,B or --gpus I,J,...)")


def gpu_listing(found: list) -> str:
    """'GPU 0 only', 'GPUs 0, 1', 'no GPU': what an error about a missing index lists."""
    have = [str(d.index) for d in found]
    if not have:
        return "no GPU"
    return f"GPU {have[0]} only" if len(have) == 1 else f"GPUs {', '.join(have)}"


def pick_gpus(found: list, gpus: str | None, *, seen: str = "NVML sees",
              hint: str = "") -> list:
    """The devices `--gpus` names, in its order (all of `found` without it). `seen`: what
    found them, as an error says it ("NVML sees", "--gpu-mem plans"); `hint`: said after."""
    if gpus is None:
        return list(found)
    by_index = {d.index: d for d in found}
    ids = parse_gpus(gpus)
    missing = [i for i in ids if i not in by_index]
    if missing:
        raise OptionError(f"--gpus {gpus}: no GPU {', '.join(map(str, missing))} ({seen} "
                          f"{gpu_listing(found)}{'; ' + hint if hint else ''})")
    return [by_index[i] for i in ids]
