"""The engine's VRAM knobs as command-line flags, defined once for every subcommand that plans
(`plan`, and later `generate`, `serve`), and the routing profile a plan ranks the cache by.

Light imports only: `strata plan` must start without numba.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from strata.errors import StrataError
from strata.plan.layout import KV_TYPES
from strata.plan.options import (
    AUTO_CEILING_DEFAULT, LEND_FLOOR_SLOTS, LEND_PCT_DEFAULT, OptionError, PlanOptions,
    PrefillRequest,
)
from strata.plan.profile import EXPERT_RANK_KEY, EXPERT_SHARE_KEY, RoutingProfile

RING_ENV = "STRATA_RING_MIB"


# No subcommand drafts tokens: `--spec` sizes a draft head's room in `strata plan` only (a what-if
# for a card's budget). The engine's subcommands refuse a nonzero N by name rather than reserve
# VRAM that nothing would use.
NO_DRAFT = "no subcommand decodes with a draft yet; --spec only sizes `strata plan`'s draft region"


def _no_spec(text: str) -> int:
    """--spec's value where nothing drafts: 0 alone."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n != 0:
        raise argparse.ArgumentTypeError(f"{n}: {NO_DRAFT}")
    return 0


def add_engine_knobs(p: argparse.ArgumentParser, draft: bool = False) -> None:
    """The flags `PlanOptions` is built from. draft: `--spec N` plans a draft region (`strata
    plan`); else `--spec` is hidden and refuses any N but 0 (see NO_DRAFT)."""
    g = p.add_argument_group("VRAM knobs")
    g.add_argument("--max-context", type=int, metavar="TOKENS",
                   help="longest sequence (default: the model's training context, at most "
                        "32768); at least 256 where a VRAM plan sizes it, else 2")
    g.add_argument("--kv", choices=KV_TYPES, default="f16", help="KV cache type (default f16)")
    g.add_argument("--kv-resident", type=int, metavar="TOKENS",
                   help="tokens of KV kept in VRAM; the rest is streamed from host memory")
    g.add_argument("--prefill", default="auto", metavar="auto|auto:CEILING|N",
                   help=f"prompt chunk: auto (largest that fits, up to {AUTO_CEILING_DEFAULT}), "
                        f"auto:CEILING, or N tokens (a multiple of 256)")
    g.add_argument("--expert-cache", default="auto", metavar="auto|N",
                   help="expert-cache slots: auto (what is left) or N")
    g.add_argument("--vram-reserve-mib", type=int, metavar="MIB",
                   help="VRAM left free (default 512; under WDDM max(1024, 5%% of the card))")
    g.add_argument("--ring-mib", type=int, metavar="MIB",
                   help=f"prefill ring budget (default 1024, or ${RING_ENV})")
    if draft:
        g.add_argument("--spec", type=int, default=0, metavar="N",
                       help="draft tokens per step: room for a draft head and its verify "
                            "buffers (planning only: nothing drafts yet; default 0: none)")
    else:
        g.add_argument("--spec", type=_no_spec, default=0, metavar="N", help=argparse.SUPPRESS)
    g.add_argument("--batch", type=int, default=1, metavar="N", help="decode sequences")
    g.add_argument("--no-prefill-borrow", action="store_true",
                   help="the prompt path never borrows expert-cache slots")
    g.add_argument("--embd-on-gpu", action="store_true",
                   help="keep token_embd in VRAM (default: looked up in host memory)")
    g.add_argument("--lend-pct", type=int, default=LEND_PCT_DEFAULT, metavar="PCT",
                   help=f"share of the cache the prompt path may borrow "
                        f"(default {LEND_PCT_DEFAULT})")
    g.add_argument("--lend-floor-slots", type=int, default=LEND_FLOOR_SLOTS, metavar="N",
                   help=f"cache slots never lent (default {LEND_FLOOR_SLOTS})")
    g.add_argument("--profile", metavar="FILE.npy",
                   help="routing counts [n_layer, n_expert] to rank the cache's fill by")


def knob_flags(args: argparse.Namespace) -> list[str]:
    """The engine knobs of `args` that differ from their defaults, as command-line flags (a
    benchmark records the command it ran)."""
    p = argparse.ArgumentParser(add_help=False)
    add_engine_knobs(p, draft=True)
    flags = []
    for a in p._actions:  # the one parser whose actions these are: built just above
        value = getattr(args, a.dest, a.default)
        if value == a.default:
            continue
        flag = a.option_strings[0]
        flags += [flag] if a.nargs == 0 else [flag, str(value)]
    return flags


def _ring_mib(args: argparse.Namespace, environ) -> int | None:
    if args.ring_mib is not None:
        return args.ring_mib
    raw = environ.get(RING_ENV, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise OptionError(f"${RING_ENV}={raw!r}: expected a whole number of MiB") from None


def _expert_cache(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise OptionError(f"--expert-cache {text!r}: expected auto or a number of slots") from None


def options_from_args(args: argparse.Namespace, environ=None) -> PlanOptions:
    """`PlanOptions` from parsed flags; OptionError names a bad one."""
    env = os.environ if environ is None else environ
    return PlanOptions(
        max_context=args.max_context, kv_type=args.kv, kv_resident=args.kv_resident,
        prefill=PrefillRequest.parse(args.prefill), expert_cache=_expert_cache(args.expert_cache),
        vram_reserve_mib=args.vram_reserve_mib, ring_mib=_ring_mib(args, env), spec=args.spec,
        batch=args.batch, prefill_borrow=not args.no_prefill_borrow,
        embd_on_host=not args.embd_on_gpu, lend_pct=args.lend_pct,
        lend_floor_slots=args.lend_floor_slots)


def load_profile(metadata: Any, n_layer: int, n_expert: int,
                 path: str | None = None, source: str | None = None) -> RoutingProfile:
    """The cache's fill order: `path` (counts .npy) if given, else the file's
    strata.synth.expert_rank (with expert_share when present), else uniform. `source`: the
    model file's path, which starts the message of a ranking it holds that is refused."""
    try:
        if path:
            try:
                counts = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise StrataError(f"--profile {path}: cannot read a .npy array ({e})") from None
            return RoutingProfile.from_counts(counts, n_layer, n_expert)
        rank = metadata.get(EXPERT_RANK_KEY)
        if rank is not None:
            return RoutingProfile.from_rank(rank, n_layer, n_expert,
                                            metadata.get(EXPERT_SHARE_KEY), source=source)
    except ValueError as e:
        if isinstance(e, StrataError):
            raise
        raise StrataError(f"routing profile: {e}") from None
    return RoutingProfile.uniform(n_layer, n_expert)
