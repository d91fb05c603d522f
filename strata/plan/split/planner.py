"""`plan_split(shape, devices, options, split) -> SplitPlan`: contiguous layer ranges, one stage
per GPU, each with its own arena; the placement searched (`--layer-split auto`) or given; the
helper tiers in what the stages leave. Pure: numbers in, a frozen plan out.

Order: the placement (every stage's budget for every range from the header alone: the carve's
weights, the range's KV, the session, the draft head on the first stage, context and reserve);
each stage's elastic part by the single-GPU policy over its own layers; one prompt chunk for all
stages (the hidden state of a chunk is handed stage to stage, so the smallest chunk any stage
can run is what every stage runs: the others are re-decided at that chunk and keep the bytes it
frees for their caches); then the helper tiers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from strata.gguf.shape import ModelShape
from strata.plan.budget import fixed_bytes, resolve
from strata.plan.capability import prompt_may_borrow
from strata.plan.devices import DeviceInfo
from strata.plan.layout import (
    draft_layout,
    kv_bytes_per_token,
    kv_layout,
    prompt_layout,
    ring_layout,
    ring_slot_bytes,
    session_layout,
)
from strata.plan.options import CHUNK_GRID, OptionError, PlanOptions, PrefillRequest
from strata.plan.policy import RING_MIN_SLOTS
from strata.plan.profile import RoutingProfile, coverage
from strata.plan.result import KvPlan, PlanInputError, Refusal
from strata.plan.split.carve import WeightCarve
from strata.plan.split.cost import fit_cover_b
from strata.plan.split.options import SplitOptions
from strata.plan.split.refusal import stage_knobs
from strata.plan.split.result import SplitPlan, Stage
from strata.plan.split.search import (
    CostInputs,
    Placement,
    StageTable,
    Walks,
    best_placement,
    explicit_placement,
    stage_table,
)
from strata.plan.split.stage import (
    StageDecision,
    decide_stage,
    device_plan,
    tier_budget,
)
from strata.plan.split.tiers import plan_tiers


def plan_split(shape: ModelShape, devices: Sequence[DeviceInfo],
               options: PlanOptions | None = None, split: SplitOptions | None = None, *,
               profile: RoutingProfile | None = None) -> SplitPlan:
    """Plan `shape` over `devices` (one stage each, in this order)."""
    options, split, devices = options or PlanOptions(), split or SplitOptions(), list(devices)
    if not devices:
        raise PlanInputError("no GPU to plan for")
    if profile is None:
        profile = RoutingProfile.uniform(shape.n_layer, shape.n_expert)
    elif (profile.n_layer, profile.n_expert) != (shape.n_layer, shape.n_expert):
        raise PlanInputError(f"the routing profile is [{profile.n_layer}, {profile.n_expert}], "
                             f"the model is [{shape.n_layer}, {shape.n_expert}]")
    split.check_devices(len(devices), shape.n_layer)
    if options.batch != 1 and len(devices) > 1:
        raise OptionError(f"--batch {options.batch}: a layer split decodes one sequence")
    s0, _, _ = resolve(shape, devices[0], options)
    if s0.resident_tokens < s0.max_context:
        raise OptionError(f"--kv-resident {options.kv_resident}: KV streamed from host memory "
                          f"runs on one GPU; a layer split keeps each stage's KV in VRAM")
    b = split.cover_b if split.cover_b is not None else fit_cover_b(profile)
    pinned = _pinned(split, options, len(devices))
    t0 = time.perf_counter()
    tables = stage_tables(shape, profile, devices, options, split, b=b, pinned=pinned)
    notes: list[str] = []
    if split.cuts is not None:
        placement = explicit_placement(tables, split.cuts)
    else:
        placement = best_placement(tables, started=t0)
        if not placement.feasible:
            even = even_cuts(shape.n_layer, len(devices))
            notes.append(f"no placement fits every stage's floor; planned the even split "
                         f"{','.join(map(str, even))} to show what is short")
            placement = replace(explicit_placement(tables, even), how="auto")
    decisions = _decide_all(shape, profile, devices, options, split, placement, pinned, notes)
    searched = None
    if split.cuts is not None and any(d.reason for d in decisions):
        auto = best_placement(tables)
        searched = auto.cuts if auto.feasible else None
    return _assemble(shape, profile, devices, options, split, placement, decisions, b, notes,
                     searched)


def even_cuts(n_layer: int, n_gpu: int) -> tuple[int, ...]:
    return tuple(round(n_layer * g / n_gpu) for g in range(1, n_gpu))


def _pinned(split: SplitOptions, options: PlanOptions, n: int) -> tuple[int, ...] | None:
    if split.stage_cache is not None:
        return split.stage_cache
    if options.expert_cache is not None:
        return (options.expert_cache,) * n
    return None


def _cache_flag(split: SplitOptions) -> str:
    """The flag the stage caches' pins came from, as refusals and notes name it."""
    return "--stage-cache" if split.stage_cache is not None else "--expert-cache"


def stage_tables(shape: ModelShape, profile: RoutingProfile, devices: list[DeviceInfo],
                 options: PlanOptions, split: SplitOptions, *, b: float,
                 pinned: tuple[int, ...] | None) -> list[StageTable]:
    """Every stage's score of every range (see `strata.plan.split.search`)."""
    n_l = shape.n_layer
    weights = WeightCarve(shape, options.embd_on_host, split.carve).table()
    kv_by_n = np.zeros(n_l + 1, np.int64)
    walks = Walks.build(shape, profile)
    cost = CostInputs.of(shape, b, split.host_bytes_per_s)
    head = sum(shape.tensors[n].vram_bytes for n in ("output.weight", "output_norm.weight")
               if n in shape.tensors) or shape.tensors["token_embd.weight"].vram_bytes
    tables = []
    for g, dev in enumerate(devices):
        s, _, _ = resolve(shape, dev, options)
        if g == 0:
            kv_by_n[1:] = [kv_layout(shape, kv_type=options.kv_type,
                                     resident_tokens=s.resident_tokens, lo=0, hi=n).total_bytes
                           for n in range(1, n_l + 1)]
        const = {"activations": session_layout(shape, batch=options.batch,
                                               max_context=s.max_context,
                                               kv_type=options.kv_type)}
        if options.spec and g == 0:
            const["draft"] = draft_layout(shape, options.spec, kv_type=options.kv_type,
                                          resident_tokens=s.resident_tokens)
        owned = 0 if prompt_may_borrow(options) else (
            prompt_layout(shape, CHUNK_GRID, kv_type=options.kv_type,
                          kv_stage_tokens=s.stage_tokens).total_bytes
            + ring_layout(shape, ring_bytes=RING_MIN_SLOTS * ring_slot_bytes(shape)).total_bytes)
        lo, hi = np.meshgrid(np.arange(n_l + 1), np.arange(n_l + 1), indexing="ij")
        budget = dev.free_bytes - fixed_bytes(const, s) - owned - weights - kv_by_n[
            np.clip(hi - lo, 0, n_l)]
        last = g == len(devices) - 1
        tables.append(stage_table(
            walks, cost, budget, bandwidth=split.bandwidth_of(g),
            pinned_slots=None if pinned is None else pinned[g],
            floor_per_layer=shape.n_expert_used if pinned is None else 0,
            extra_seconds=head / split.bandwidth_of(g) if last else 0.0))
    return tables


def _decide_all(shape, profile, devices, options, split, placement: Placement,
                pinned, notes: list[str]) -> list[StageDecision]:
    def one(g: int, opts: PlanOptions) -> StageDecision:
        lo, hi = placement.ranges[g]
        if pinned is not None:
            opts = replace(opts, expert_cache=pinned[g])
        return decide_stage(shape, profile, devices[g], opts, lo, hi, first=g == 0,
                            carve=split.carve, cache_flag=_cache_flag(split))

    out = [one(g, options) for g in range(len(devices))]
    chunks = [d.path.chunk for d in out if d.path is not None]
    if len(chunks) == len(out) and len(set(chunks)) > 1:
        c = min(chunks)
        fixed = replace(options, prefill=PrefillRequest(False, c))
        out = [d if d.path.chunk == c else one(g, fixed) for g, d in enumerate(out)]
        notes.append(f"prompt chunk {c} tokens on every stage (the smallest any stage can run; "
                     f"a chunk's hidden state is handed stage to stage)")
    return out


def _assemble(shape, profile, devices, options, split, placement, decisions, b,
              notes, searched=None) -> SplitPlan:
    s0, _, warnings = resolve(shape, devices[0], options)
    bad = next((g for g, d in enumerate(decisions) if d.reason is not None), None)
    accepted = bad is None
    tiers = [None] * len(devices)
    if accepted and split.helper_tiers:
        budgets = [(dev.index, tier_budget(d, dev)) for d, dev in zip(decisions, devices)]
        tiers = plan_tiers(shape, profile.ranked_pairs(), [d.cache.pairs() for d in decisions],
                           budgets, [split.bandwidth_of(g) for g in range(len(devices))],
                           min_bytes=split.tier_min_bytes)
    stages = []
    whole = WeightCarve(shape, options.embd_on_host, carve=False)
    for g, (d, dev) in enumerate(zip(decisions, devices)):
        tier = tiers[g]
        dp = device_plan(d, dev, None if tier is None else tier.cache)
        hit = None
        if d.cache is not None:
            own = np.zeros((0, 2), np.int32) if not d.cache.n_slots else d.cache.pairs()
            hit = _own_hit_rate(profile, own, d.lo, d.hi)
        stages.append(Stage(dp, d.path, tier, hit, whole.bytes(d.lo, d.hi), d.notes))
    refusal = None
    if not accepted:
        d, dev = decisions[bad], devices[bad]
        knobs = stage_knobs(shape, profile, devices, options, placement.cuts, bad,
                            carve=split.carve, needed=d.needed_bytes,
                            max_context=d.setting.max_context,
                            reserve_bytes=d.setting.reserve_bytes,
                            pinned=_pinned(split, options, len(devices)),
                            cache_flag=_cache_flag(split), searched=searched)
        refusal = Refusal(f"GPU {dev.index} (stage {bad}, layers {d.lo}-{d.hi - 1}): {d.reason}",
                          dev.index, dev.free_bytes, d.needed_bytes, knobs)
    stage_pairs = [s.device_plan.cache.pairs() for s in stages if s.device_plan.cache.n_slots]
    tier_pairs = [t.cache.pairs() for t in tiers if t is not None]
    hit_s = hit_t = None
    if accepted:
        hit_s = profile.hit_rate(_cat(stage_pairs))
        hit_t = profile.hit_rate(_cat(stage_pairs + tier_pairs))
    per_token = kv_bytes_per_token(shape, options.kv_type)
    kv_vram = sum(dp.regions["kv"] for dp in (s.device_plan for s in stages))
    kv = KvPlan(options.kv_type, s0.max_context, per_token, s0.resident_tokens, s0.stage_tokens,
                kv_vram, (s0.max_context - s0.resident_tokens) * per_token * options.batch,
                options.batch)
    chunk = min((d.path.chunk for d in decisions if d.path is not None), default=None)
    model = (f"coverage 1-(1-f)^{b:.3g} scores placements; hit rates from "
             f"{'the routing shares' if profile.share is not None else 'the coverage curve'}")
    return SplitPlan(accepted, tuple(stages), placement, options.prefill, chunk, kv, b, hit_t,
                     hit_s, model, refusal, options, split,
                     "device" if not options.embd_on_host else "host", tuple(notes),
                     tuple(warnings), shape, profile)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros((0, 2), np.int32)


def _own_hit_rate(profile: RoutingProfile, pairs: np.ndarray, lo: int, hi: int) -> float:
    """The stage cache's predicted hit rate over its own layers only."""
    held = np.zeros((profile.n_layer, profile.n_expert), bool)
    if len(pairs):
        held[pairs[:, 0], pairs[:, 1]] = True
    if profile.share is not None:
        return float(np.mean(np.sum(profile.share[lo:hi] * held[lo:hi], axis=1)))
    return float(np.mean(coverage(held[lo:hi].sum(axis=1) / profile.n_expert)))

