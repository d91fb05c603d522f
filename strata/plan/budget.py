"""The fixed part of a device's budget: the knobs resolved against the model and the card, the
regions that do not give way (weights, KV, activations, draft head, context, reserve), and the
least VRAM a configuration can work in (what a refusal reports as 'needed')."""

from __future__ import annotations

from dataclasses import dataclass

from strata.gguf.shape import ModelShape
from strata.plan.cache import fill_cache
from strata.plan.capability import DRAFT_UNRUN, kv_streams, prompt_may_borrow
from strata.plan.devices import DeviceInfo, default_reserve_bytes
from strata.plan.layout import (
    Layout, draft_layout, kv_layout, kv_map_unit, kv_mapped_layout, prompt_layout, ring_layout,
    ring_slot_bytes, session_layout, weights_layout,
)
from strata.plan.options import CHUNK_GRID, DEFAULT_MAX_CONTEXT, OptionError, PlanOptions
from strata.plan.policy import RING_MIN_SLOTS, loan_limit
from strata.plan.profile import RoutingProfile

ALLOC_GRANULE = 2 << 20  # the driver rounds an allocation up to 2 MiB: priced once, for the arena


@dataclass(frozen=True, slots=True)
class Setting:
    """The knobs resolved for one model and device."""

    max_context: int
    resident_tokens: int
    stage_tokens: int
    reserve_bytes: int
    context_bytes: int


def resolve(shape: ModelShape, device: DeviceInfo, options: PlanOptions
            ) -> tuple[Setting, list[str], list[str]]:
    """Defaults filled in; returns (setting, notes, warnings)."""
    notes: list[str] = []
    warnings: list[str] = []
    train = shape.n_ctx_train if shape.n_ctx_train > 0 else DEFAULT_MAX_CONTEXT
    ctx = options.max_context or max(CHUNK_GRID, min(train, DEFAULT_MAX_CONTEXT))
    if ctx > train:
        warnings.append(f"--max-context {ctx} is beyond the model's training context ({train})")
    resident = ctx
    if options.kv_resident is not None:
        if kv_streams(options, ctx):
            if options.batch > 1:
                raise OptionError(f"--kv-resident {options.kv_resident} streams one sequence's "
                                  f"KV from host memory; --batch {options.batch} keeps every "
                                  f"sequence's whole context in VRAM (drop one of them)")
            unit = kv_map_unit(shape, options.kv_type, device.map_granule_bytes)
            resident = options.kv_resident // unit * unit
            notes.append(f"--kv-resident {options.kv_resident}: the KV of the first {resident} "
                         f"tokens in VRAM (a multiple of {unit}, the driver's mapping granule), "
                         f"of the other {ctx - resident} in host memory; decode reads those "
                         f"over PCIe, the prompt path copies a layer's in at a time")
        else:
            notes.append(f"--kv-resident {options.kv_resident} covers the whole context: "
                         f"all KV stays in VRAM")
    if options.spec:
        warnings.append(f"--spec {options.spec} sizes a draft region, but {DRAFT_UNRUN}")
    stage = ctx if resident < ctx else 0  # the prompt path's VRAM copy of one layer's context
    reserve = (options.vram_reserve_mib << 20 if options.vram_reserve_mib is not None
               else default_reserve_bytes(device))
    return Setting(ctx, resident, stage, reserve, device.context_bytes), notes, warnings


def fixed_layouts(shape: ModelShape, s: Setting, options: PlanOptions, *,
                  lo: int = 0, hi: int | None = None) -> dict[str, Layout]:
    """The regions that never give way, for layers [lo, hi)."""
    hi = shape.n_layer if hi is None else hi
    out = {
        "weights": weights_layout(shape, lo, hi, embd_on_host=options.embd_on_host),
        # one resident context per decoded sequence ([L, batch * T, H, row])
        "kv": kv_layout(shape, kv_type=options.kv_type,
                        resident_tokens=s.resident_tokens * options.batch, lo=lo, hi=hi,
                        max_context=s.max_context * options.batch),
        "activations": session_layout(shape, batch=options.batch, max_context=s.max_context,
                                      kv_type=options.kv_type),
    }
    if s.resident_tokens < s.max_context:  # priced here, mapped outside the arena
        out["kv_mapped"] = kv_mapped_layout(shape, kv_type=options.kv_type,
                                            resident_tokens=s.resident_tokens, lo=lo, hi=hi)
    if options.spec:
        out["draft"] = draft_layout(shape, options.spec, kv_type=options.kv_type,
                                    resident_tokens=s.resident_tokens)
    return out


def fixed_bytes(layouts: dict[str, Layout], s: Setting) -> int:
    """Everything that does not give way: the fixed regions, the allocation granule, the
    context allowance and the reserve."""
    return sum(x.total_bytes for x in layouts.values()) + ALLOC_GRANULE + s.context_bytes \
        + s.reserve_bytes


def n_pairs(shape: ModelShape) -> int:
    return shape.n_layer * shape.n_expert


def cache_floor_slots(shape: ModelShape, options: PlanOptions) -> int:
    """The smallest cache a configuration may run with. Explicit `--expert-cache N` is the
    user's choice; `auto` must hold one token's experts in every layer (n_layer x top-k),
    below which the GPU holds less than a single decode step routes to and decode degenerates
    into host-side expert compute."""
    if options.expert_cache is not None:
        return min(options.expert_cache, n_pairs(shape))
    return min(shape.n_layer * shape.n_expert_used, n_pairs(shape))


def minimum_bytes(shape: ModelShape, device: DeviceInfo, options: PlanOptions,
                  profile: RoutingProfile) -> int:
    """The least VRAM this configuration can work in: the fixed part, the smallest cache it may
    have, and the smallest prompt path: nothing more when that cache can lend a 256-token chunk
    and a two-slot ring, else an owned one (no ring when every expert is resident)."""
    s, _, _ = resolve(shape, device, options)
    fixed = fixed_bytes(fixed_layouts(shape, s, options), s)
    prompt = prompt_layout(shape, CHUNK_GRID, kv_type=options.kv_type,
                           kv_stage_tokens=s.stage_tokens).total_bytes
    ring = ring_layout(shape, ring_bytes=RING_MIN_SLOTS * ring_slot_bytes(shape)).total_bytes
    floor = cache_floor_slots(shape, options)
    cache = fill_cache(shape, profile, n_slots=floor)
    loan = loan_limit(cache, lend_pct=options.lend_pct, floor_slots=options.lend_floor_slots) \
        if prompt_may_borrow(options) else None
    if loan is not None and loan.max_bytes >= prompt + ring:
        general = cache.total_bytes
    else:
        general = cache.total_bytes + prompt + (ring if floor < n_pairs(shape) else 0)
    if options.expert_cache is not None:
        return fixed + general
    every = fill_cache(shape, profile, n_slots=n_pairs(shape)).total_bytes + prompt
    return fixed + min(general, every)
