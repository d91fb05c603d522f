"""`plan(shape, devices, options) -> Plan`: every byte of every device decided before anything is
allocated. Pure: numbers in, a frozen plan out; no CUDA, no file I/O.

Order of decisions on a device: the fixed regions (weights, KV, activations, draft head, the
context allowance, the reserve) come first and never give way; what is left goes to the prompt
path and the expert cache. The cache is elastic and gives way first: it takes what the prompt
path leaves (owned), or lends its coldest tail to it (borrowed). A configuration with no room
for a 256-token prompt path beside the cache's floor is refused with the knobs that make room.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from strata.gguf.shape import ModelShape
from strata.plan.budget import (
    ALLOC_GRANULE, Setting, fixed_bytes, fixed_layouts, minimum_bytes, resolve,
)
from strata.plan.cache import CacheLayout, fill_cache
from strata.plan.devices import DeviceInfo, default_reserve_bytes, fmt_bytes
from strata.plan.elastic import decide
from strata.plan.layout import (
    Layout, LayoutBuilder, kv_bytes_per_token, kv_side_token_bytes, prompt_layout, ring_layout,
    ring_slot_bytes,
)
from strata.plan.options import PlanOptions
from strata.plan.policy import PromptPath, PromptPricing
from strata.plan.profile import RoutingProfile
from strata.plan.refusal import suggest_knobs
from strata.plan.result import DevicePlan, KvPlan, Plan, PlanInputError, Refusal

SYSMEM_FALLBACK_HINT = ('under WDDM the driver pages VRAM it runs out of into system memory '
                        'instead of failing (prefill then runs ~10-20x slower): set '
                        '"Prefer No Sysmem Fallback" for strata in the NVIDIA Control Panel '
                        '(Manage 3D settings > CUDA - Sysmem Fallback Policy)')


def plan(shape: ModelShape, devices: Sequence[DeviceInfo], options: PlanOptions | None = None,
         *, profile: RoutingProfile | None = None) -> Plan:
    """Plan `shape` on `devices`. A refused plan (`accepted` False) carries the refusal."""
    options = options or PlanOptions()
    devices = list(devices)
    if not devices:
        raise PlanInputError("no GPU to plan for")
    if len(devices) > 1:
        raise PlanInputError(
            f"{len(devices)} GPUs given to the one-GPU planner: plan a layer split with "
            f"strata.plan.split.plan_split (what `strata plan --gpu-mem A,B` does)")
    if profile is None:
        profile = RoutingProfile.uniform(shape.n_layer, shape.n_expert)
    elif (profile.n_layer, profile.n_expert) != (shape.n_layer, shape.n_expert):
        raise PlanInputError(f"the routing profile is [{profile.n_layer}, {profile.n_expert}], "
                             f"the model is [{shape.n_layer}, {shape.n_expert}]")
    return _plan_device(shape, devices[0], options, profile)


def _plan_device(shape: ModelShape, dev: DeviceInfo, options: PlanOptions,
                 profile: RoutingProfile) -> Plan:
    s, notes, warnings = resolve(shape, dev, options)
    fixed = fixed_layouts(shape, s, options)
    avail = dev.free_bytes - fixed_bytes(fixed, s)
    pricing = PromptPricing(shape, options.kv_type, s.stage_tokens, options.ring_bytes)
    outcome = decide(shape, profile, options, pricing, avail=avail, max_context=s.max_context,
                     notes=notes)
    kv = _kv_plan(shape, s, options, fixed["kv"],
                  fixed["kv_mapped"].total_bytes if "kv_mapped" in fixed else 0)
    embd = "device" if "token_embd.weight" in fixed["weights"] else "host"
    common = dict(request=options.prefill, kv=kv, options=options, token_embd=embd,
                  shape=shape, profile=profile)
    if isinstance(outcome, str):
        needed = minimum_bytes(shape, dev, options, profile)
        refusal = Refusal(outcome, dev.index, dev.free_bytes, needed,
                          suggest_knobs(shape, dev, options, profile, needed))
        empty = fill_cache(shape, profile, n_slots=0)
        dp = _device_plan(shape, dev, s, fixed, empty, None, pricing)
        return Plan(False, (dp,), prefill=None, predicted_hit_rate=None, hit_rate_model="",
                    refusal=refusal, notes=tuple(notes), warnings=tuple(warnings), **common)
    cache, path = outcome
    dp = _device_plan(shape, dev, s, fixed, cache, path, pricing)
    _warn_wddm(dev, dp, warnings)
    return Plan(True, (dp,), prefill=path, predicted_hit_rate=profile.hit_rate(cache.pairs()),
                hit_rate_model=_hit_model(profile), refusal=None, notes=tuple(notes),
                warnings=tuple(warnings), **common)


def _device_plan(shape: ModelShape, dev: DeviceInfo, s: Setting, fixed: dict[str, Layout],
                 cache: CacheLayout, path: PromptPath | None,
                 pricing: PromptPricing) -> DevicePlan:
    b = LayoutBuilder("arena")
    for name in ("weights", "kv", "activations", "draft"):
        if name in fixed:
            b.add_layout(name, fixed[name])
    prompt = ring = None
    if path is not None:
        prompt = prompt_layout(shape, path.chunk, kv_type=pricing.kv_type,
                               kv_stage_tokens=pricing.kv_stage_tokens)
        ring = ring_layout(shape, ring_bytes=path.ring_slots * ring_slot_bytes(shape))
        if path.mode == "owned":
            b.add_layout("prompt", prompt)
            if ring.total_bytes:
                b.add_layout("ring", ring)
    b.add_layout("expert_cache", cache.as_layout())
    end = b.build().total_bytes
    pad = -end % ALLOC_GRANULE
    if pad:
        b.add("pad", "uint8", (pad,))
    mapped = fixed.get("kv_mapped")
    return DevicePlan(dev, (0, shape.n_layer), b.build(), cache, prompt, ring,
                      s.reserve_bytes, s.context_bytes,
                      mapped.total_bytes if mapped is not None else 0)


def _kv_plan(shape: ModelShape, s: Setting, options: PlanOptions, kv: Layout,
             mapped_bytes: int = 0) -> KvPlan:
    per_token = kv_bytes_per_token(shape, options.kv_type)
    # every sequence of the batch has its own context: `kv` already holds n_seq of them
    n_seq = options.batch
    return KvPlan(options.kv_type, s.max_context, per_token, s.resident_tokens, s.stage_tokens,
                  kv.total_bytes + mapped_bytes,
                  # K and V rows past the resident ones (int8's scales stay in VRAM)
                  (s.max_context - s.resident_tokens) * shape.n_layer * 2
                  * kv_side_token_bytes(shape, options.kv_type) * n_seq, n_seq)


def _hit_model(profile: RoutingProfile) -> str:
    if profile.source == "counts":
        return "routing profile (measured counts)"
    if profile.share is not None:
        return "the file's expert ranking and routing shares"
    src = "the file's expert ranking" if profile.source == "expert_rank" else "uniform ranking"
    return f"coverage 1-(1-f)^3 per layer ({src})"


def _warn_wddm(dev: DeviceInfo, dp: DevicePlan, warnings: list[str]) -> None:
    if not dev.is_wddm:
        return
    free_after = dp.reserve_bytes + dp.headroom_bytes
    safe = default_reserve_bytes(dev)
    if free_after < safe:
        warnings.append(f"thin headroom under WDDM: {fmt_bytes(free_after)} stays free, "
                        f"{fmt_bytes(safe)} is the safe margin on this card; "
                        + SYSMEM_FALLBACK_HINT)


def replan(previous: Plan, *, free_bytes: int, device: int = 0) -> Plan:
    """The same model and knobs against less free VRAM on `device` (the post-touch correction):
    the fixed regions stay, the elastic cache shrinks, and the prompt path is chosen again by
    the same policy against the cache that results (a lost loan is repriced as owned)."""
    if previous.shape is None or previous.profile is None:
        raise PlanInputError("this plan does not carry its inputs and cannot be repriced")
    old = previous.device(device).device
    dev = replace(old, free_bytes=max(0, min(free_bytes, old.total_bytes)))
    return plan(previous.shape, [dev], previous.options, profile=previous.profile)
