"""The elastic part of a device: the expert cache and the prompt path, decided together in the
bytes the fixed regions leave (`avail`).

* `--expert-cache N`: exactly N slots (clamped to the model's pairs, with a note); the prompt
  path borrows from them or owns what is left; N that does not fit is refused.
* auto, every expert resident: when the whole model's experts fit with an owned prompt path of
  the owned default chunk (auto) or the requested chunk (fixed), no ring is needed at all.
* auto, otherwise: the cache takes everything, at least its floor (one token's experts in every
  layer); the prompt path borrows its coldest tail, or owns room the cache gives up for it.
  If that fails but every expert fits with a smaller chunk, that is taken instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.gguf.shape import ModelShape
from strata.plan.budget import cache_floor_slots, n_pairs
from strata.plan.cache import CacheLayout, fill_cache
from strata.plan.capability import prompt_may_borrow
from strata.plan.devices import fmt_bytes
from strata.plan.options import CHUNK_GRID, PlanOptions
from strata.plan.policy import (
    OWNED_AUTO_CHUNK, Loan, PromptPath, PromptPricing, choose_prompt_path, loan_limit,
)
from strata.plan.profile import RoutingProfile


@dataclass(slots=True)
class _Choice:
    cache: CacheLayout
    path: PromptPath
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Chooser:
    """The policy bound to this plan's knobs and prices."""

    options: PlanOptions
    pricing: PromptPricing
    max_context: int

    def loan(self, cache: CacheLayout) -> Loan | None:
        if not prompt_may_borrow(self.options):
            return None
        return loan_limit(cache, lend_pct=self.options.lend_pct,
                          floor_slots=self.options.lend_floor_slots)

    def path(self, loan: Loan | None, room: int, *, ring: bool,
             notes: list[str]) -> PromptPath | None:
        return choose_prompt_path(self.options.prefill, self.pricing, max_chunk=self.max_context,
                                  loan=loan, owned_room=room, ring=ring, notes=notes)


def decide(shape: ModelShape, profile: RoutingProfile, options: PlanOptions,
           pricing: PromptPricing, *, avail: int, max_context: int, notes: list[str],
           cache_flag: str = "--expert-cache", pairs: str = "the model has"
           ) -> tuple[CacheLayout, PromptPath] | str:
    """The cache and the prompt path in `avail` bytes (notes appended), or why they do not fit.
    `cache_flag`: the flag an explicit cache size came from, as the reason and notes name it (a
    layer split's stage pinned by `--stage-cache`); `pairs`: whose (layer, expert) pairs those
    of `shape` are, as the clamp's note says it ("the model has"; a stage: "layers 0-23 have")."""
    if avail < 0:
        return ("the fixed regions (dense weights, KV cache, activations, draft head, context "
                "and reserve) do not fit")
    chooser = _Chooser(options, pricing, max_context)
    if options.expert_cache is not None:
        choice = _explicit(shape, profile, options, chooser, avail, cache_flag, pairs)
    else:
        resident = _all_resident(shape, profile, options, chooser, avail)
        if resident is not None and _reaches_target(resident.path, options, max_context):
            choice = resident
        else:
            choice = _general(shape, profile, options, chooser, avail)
            if isinstance(choice, str) and resident is not None:
                choice = resident  # every expert resident with a small chunk beats a refusal
    if isinstance(choice, str):
        return choice
    notes.extend(choice.notes)
    return choice.cache, choice.path


def _explicit(shape, profile, options, chooser: _Chooser, avail: int, flag: str,
              pairs: str) -> _Choice | str:
    n = cache_floor_slots(shape, options)
    out: list[str] = []
    if n < options.expert_cache:
        out.append(f"{flag} {options.expert_cache}: {pairs} only {n} "
                   f"(layer, expert) pairs; clamped to {n}")
    cache = fill_cache(shape, profile, n_slots=n)
    if cache.total_bytes > avail:
        clamped = f" (clamped to {n})" if n < options.expert_cache else ""
        return (f"{flag} {options.expert_cache}{clamped} needs {fmt_bytes(cache.total_bytes)}, "
                f"but only {fmt_bytes(avail)} is left beside the fixed regions")
    path = chooser.path(chooser.loan(cache), avail - cache.total_bytes,
                        ring=n < n_pairs(shape), notes=out)
    return _Choice(cache, path, out) if path else f"no prompt path fits beside {flag} {n}"


def _all_resident(shape, profile, options, chooser: _Chooser, avail: int) -> _Choice | None:
    """Every expert in VRAM and an owned prompt path without a ring, or None."""
    every = fill_cache(shape, profile, n_slots=n_pairs(shape))
    if every.total_bytes > avail:
        return None
    out: list[str] = []
    path = chooser.path(None, avail - every.total_bytes, ring=False, notes=out)
    return _Choice(every, path, out) if path else None


def _reaches_target(path: PromptPath, options: PlanOptions, max_context: int) -> bool:
    """Whether a ring-less owned path is as good as asked: the owned default (auto) or the
    requested chunk (fixed), each capped by the context."""
    req, cap = options.prefill, max(CHUNK_GRID, max_context // CHUNK_GRID * CHUNK_GRID)
    target = min(req.ceiling, cap, OWNED_AUTO_CHUNK) if req.auto else min(req.tokens, cap)
    return path.chunk >= target


def _general(shape, profile, options, chooser: _Chooser, avail: int) -> _Choice | str:
    """A cache of at least its floor, the prompt path borrowed from it or owned beside it."""
    floor = cache_floor_slots(shape, options)
    floor_bytes = fill_cache(shape, profile, n_slots=floor).total_bytes
    if floor_bytes > avail:
        return (f"the expert cache's floor ({floor} slots: one token's experts in every layer, "
                f"{fmt_bytes(floor_bytes)}) does not fit beside the fixed regions")
    cache = fill_cache(shape, profile, budget_bytes=avail)
    out: list[str] = []
    path = chooser.path(chooser.loan(cache), avail - floor_bytes, ring=True, notes=out)
    if path is None:
        return "no prompt path (256 tokens and a 2-slot ring) fits beside the expert cache's floor"
    if path.mode == "owned":
        cache = fill_cache(shape, profile, budget_bytes=avail - path.owned_bytes)
    return _Choice(cache, path, out)
