"""One GPU's stage: its own arena over its own layers [lo, hi).

The fixed regions are the range's: the carved dense weights (`carve`), the range's KV, the
decode session (the whole model's tables: slot table, counters), the draft head on the first
stage. The elastic part (stage cache and prompt path) is decided by the single-GPU policy
(`strata.plan.elastic.decide`) over the range alone: a shape and a routing profile of just its
layers, so its cache holds only its own layers' pairs, its floor is one token's experts in each
of ITS layers, and its ring slots are its own largest blob. The cache comes back with global
layer indices.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from strata.gguf.shape import ModelShape
from strata.plan.budget import (
    ALLOC_GRANULE,
    Setting,
    fixed_bytes,
    fixed_layouts,
    minimum_bytes,
    resolve,
)
from strata.plan.cache import CacheLayout
from strata.plan.devices import DeviceInfo
from strata.plan.elastic import decide
from strata.plan.layout import (
    Layout,
    LayoutBuilder,
    draft_layout,
    kv_layout,
    prompt_layout,
    ring_layout,
    ring_slot_bytes,
    session_layout,
)
from strata.plan.options import PlanOptions
from strata.plan.policy import PromptPath, PromptPricing
from strata.plan.profile import RoutingProfile
from strata.plan.result import DevicePlan
from strata.plan.split.carve import stage_weights_layout


def stage_shape(shape: ModelShape, lo: int, hi: int) -> ModelShape:
    """The model as a stage sees its experts: layers [lo, hi) only (renumbered from 0)."""
    return replace(shape, n_layer=hi - lo, layers=shape.layers[lo:hi])


def stage_profile(profile: RoutingProfile, lo: int, hi: int) -> RoutingProfile:
    share = None if profile.share is None else profile.share[lo:hi]
    return RoutingProfile(profile.rank[lo:hi], share, profile.source)


def stage_fixed(shape: ModelShape, s: Setting, options: PlanOptions, lo: int, hi: int, *,
                first: bool, carve: bool) -> dict[str, Layout]:
    """The regions of a stage that never give way."""
    out = {
        "weights": stage_weights_layout(shape, lo, hi, embd_on_host=options.embd_on_host,
                                        carve=carve),
        "kv": kv_layout(shape, kv_type=options.kv_type, resident_tokens=s.resident_tokens,
                        lo=lo, hi=hi),
        "activations": session_layout(shape, batch=options.batch, max_context=s.max_context,
                                      kv_type=options.kv_type),
    }
    if options.spec and first:
        out["draft"] = draft_layout(shape, options.spec, kv_type=options.kv_type,
                                    resident_tokens=s.resident_tokens)
    return out


def globalize(cache: CacheLayout, lo: int, n_layer: int) -> CacheLayout:
    """A stage cache laid out over a sub-shape, with the model's layer indices."""
    spl = [0] * n_layer
    spl[lo:lo + len(cache.slots_per_layer)] = cache.slots_per_layer
    return CacheLayout(cache.slot_layer + lo, cache.slot_expert, cache.slot_offset,
                       cache.slot_bytes, tuple(spl), cache.total_bytes)


@dataclass(frozen=True, slots=True, eq=False)
class StageDecision:
    """A stage's elastic decision (or why there is none) and what its fixed part costs."""

    lo: int
    hi: int
    n_layer: int  # the model's
    setting: Setting
    fixed: dict[str, Layout]
    cache: CacheLayout | None  # global layer indices
    path: PromptPath | None
    pricing: PromptPricing
    avail_bytes: int  # what the fixed part leaves for cache and prompt path
    needed_bytes: int  # the least this stage works in
    reason: str | None  # why it does not fit (None: it does)
    notes: tuple[str, ...]


def decide_stage(shape: ModelShape, profile: RoutingProfile, dev: DeviceInfo,
                 options: PlanOptions, lo: int, hi: int, *, first: bool,
                 carve: bool, cache_flag: str = "--expert-cache") -> StageDecision:
    """The single-GPU policy over layers [lo, hi) on `dev`; `cache_flag`: the flag a pinned
    cache came from (`--stage-cache` or `--expert-cache`), as the stage's reason names it."""
    s, notes, _ = resolve(shape, dev, options)
    fixed = stage_fixed(shape, s, options, lo, hi, first=first, carve=carve)
    avail = dev.free_bytes - fixed_bytes(fixed, s)
    sub, sub_p = stage_shape(shape, lo, hi), stage_profile(profile, lo, hi)
    # the prompt path is priced on the whole model's shape: its buffers do not depend on the
    # layer count, and its ring slots are the model's largest blob, as the runtime carves them
    pricing = PromptPricing(shape, options.kv_type, s.stage_tokens, options.ring_bytes)
    held = f"layer {lo} has" if hi - lo == 1 else f"layers {lo}-{hi - 1} have"
    outcome = decide(sub, sub_p, options, pricing, avail=avail, max_context=s.max_context,
                     notes=notes, cache_flag=cache_flag, pairs=held)
    # the least VRAM: this stage's fixed part plus the elastic minimum of its range (the
    # sub-shape's minimum less the sub-shape's own fixed part)
    sub_fixed = fixed_bytes(fixed_layouts(sub, s, options), s)
    needed = fixed_bytes(fixed, s) + minimum_bytes(sub, dev, options, sub_p) - sub_fixed
    if isinstance(outcome, str):
        return StageDecision(lo, hi, shape.n_layer, s, fixed, None, None, pricing, avail,
                             needed, outcome, tuple(notes))
    cache, path = outcome
    return StageDecision(lo, hi, shape.n_layer, s, fixed, globalize(cache, lo, shape.n_layer),
                         path, pricing, avail, needed, None, tuple(notes))


def arena_end(d: StageDecision) -> int:
    """Bytes of the stage's regions before the helper tier and the granule pad."""
    return _builder(d, None).build().total_bytes


def _builder(d: StageDecision, tier: CacheLayout | None) -> LayoutBuilder:
    b = LayoutBuilder("arena")
    for name in ("weights", "kv", "activations", "draft"):
        if name in d.fixed:
            b.add_layout(name, d.fixed[name])
    p = d.path
    if p is not None and p.mode == "owned":
        b.add_layout("prompt", _prompt(d))
        ring = _ring(d)
        if ring.total_bytes:
            b.add_layout("ring", ring)
    cache = d.cache if d.cache is not None else _empty(d)
    b.add_layout("expert_cache", cache.as_layout())
    if tier is not None and tier.total_bytes:
        b.add_layout("helper_tier", tier.as_layout())
    return b


def _prompt(d: StageDecision) -> Layout:
    return prompt_layout(d.pricing.shape, d.path.chunk, kv_type=d.pricing.kv_type,
                         kv_stage_tokens=d.pricing.kv_stage_tokens)


def _ring(d: StageDecision) -> Layout:
    sh = d.pricing.shape
    return ring_layout(sh, ring_bytes=d.path.ring_slots * ring_slot_bytes(sh))


def _empty(d: StageDecision) -> CacheLayout:
    z = np.zeros(0, np.int64)
    return CacheLayout(z.astype(np.int32), z.astype(np.int32), z, z, (0,) * d.n_layer, 0)


def device_plan(d: StageDecision, dev: DeviceInfo, tier: CacheLayout | None) -> DevicePlan:
    """The stage's arena: fixed regions, owned prompt path, stage cache, helper tier, pad."""
    b = _builder(d, tier)
    pad = -b.build().total_bytes % ALLOC_GRANULE
    if pad:
        b.add("pad", "uint8", (pad,))
    prompt = _prompt(d) if d.path is not None else None
    ring = _ring(d) if d.path is not None else None
    cache = d.cache if d.cache is not None else _empty(d)
    return DevicePlan(dev, (d.lo, d.hi), b.build(), cache, prompt, ring,
                      d.setting.reserve_bytes, d.setting.context_bytes)


def tier_budget(d: StageDecision, dev: DeviceInfo) -> int:
    """The most bytes a helper tier may take on this card: what keeps the arena, rounded to
    the allocation granule, within the budget less context and reserve."""
    room = dev.free_bytes - d.setting.context_bytes - d.setting.reserve_bytes
    return room // ALLOC_GRANULE * ALLOC_GRANULE - arena_end(d)
