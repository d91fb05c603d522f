"""What the planner returns: `Plan` (per-device `DevicePlan`s, the decisions, a refusal) and its
JSON form, the contract `strata plan --json` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strata.errors import StrataError
from strata.gguf.shape import ModelShape
from strata.plan.cache import CacheLayout
from strata.plan.devices import DeviceInfo, fmt_bytes
from strata.plan.host import keeps_experts, store_bytes
from strata.plan.layout import Layout
from strata.plan.options import PlanOptions, PrefillRequest
from strata.plan.policy import PromptPath
from strata.plan.profile import RoutingProfile

# JSON region names, in arena order; "context" and "reserve" are kept free, not allocated.
ARENA_REGIONS = ("weights", "kv", "activations", "draft", "prompt", "ring", "expert_cache", "pad")


class PlanInputError(StrataError, ValueError):
    """Input the planner does not accept (e.g. several GPUs before layer split exists)."""


@dataclass(frozen=True, slots=True)
class Knob:
    """One change that makes room, with the bytes it frees on the tightest device."""

    flag: str  # e.g. "--max-context 16384"
    frees_bytes: int
    note: str = ""

    def __str__(self) -> str:
        tail = f"; {self.note}" if self.note else ""
        return f"{self.flag} (frees {fmt_bytes(self.frees_bytes)}{tail})"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a configuration cannot work, with the budget and the knobs that make room."""

    reason: str
    device_index: int
    free_bytes: int
    needed_bytes: int
    knobs: tuple[Knob, ...]

    @property
    def short_by_bytes(self) -> int:
        return self.needed_bytes - self.free_bytes

    def message(self) -> str:
        lines = [f"refused: {self.reason}",
                 f"  GPU {self.device_index}: free {fmt_bytes(self.free_bytes)}, needed "
                 f"{fmt_bytes(self.needed_bytes)}, short by {fmt_bytes(self.short_by_bytes)}"]
        if self.knobs:
            lines.append("  to make room (largest effect first):")
            lines += [f"    {k}" for k in self.knobs]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "device": self.device_index,
                "free_bytes": self.free_bytes, "needed_bytes": self.needed_bytes,
                "short_by_bytes": self.short_by_bytes, "knobs": [str(k) for k in self.knobs],
                "knob_bytes": [{"knob": k.flag, "frees_bytes": k.frees_bytes, "note": k.note}
                               for k in self.knobs]}


@dataclass(frozen=True, slots=True)
class KvPlan:
    type: str
    max_context: int
    bytes_per_token: int  # all layers, VRAM or host
    resident_tokens: int  # tokens whose KV is in VRAM
    stage_tokens: int  # streamed KV: the prompt path's VRAM copy of one layer (0: no stream)
    vram_bytes: int
    host_bytes: int  # the streamed part, in host memory
    n_seq: int = 1  # sequences (--batch): the KV holds n_seq regions of the sizes above

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "max_context": self.max_context,
                "bytes_per_token": self.bytes_per_token, "resident_tokens": self.resident_tokens,
                "streamed": self.host_bytes > 0, "stage_tokens": self.stage_tokens,
                "vram_bytes": self.vram_bytes, "host_bytes": self.host_bytes,
                "sequences": self.n_seq}


@dataclass(frozen=True, slots=True, eq=False)
class DevicePlan:
    """One GPU: its arena (one allocation), what stays free, and the cache and prompt layouts."""

    device: DeviceInfo
    layers: tuple[int, int]
    arena: Layout  # allocation order; each region holds a family's layout
    cache: CacheLayout
    prompt: Layout | None  # the prompt path's buffers (owned region or inside the loan)
    ring: Layout | None
    reserve_bytes: int
    context_bytes: int
    # streamed KV's VRAM rows: mapped beside their host rows outside the arena (`kv_mapped`)
    kv_mapped_bytes: int = 0

    @property
    def arena_bytes(self) -> int:
        """The one allocation's size."""
        return self.arena.total_bytes

    @property
    def regions(self) -> dict[str, int]:
        sizes = {name: 0 for name in ARENA_REGIONS}
        sizes.update(self.arena.sizes())
        sizes["kv"] += self.kv_mapped_bytes
        sizes["context"] = self.context_bytes
        sizes["reserve"] = self.reserve_bytes
        return sizes

    @property
    def planned_bytes(self) -> int:
        return self.arena_bytes + self.kv_mapped_bytes + self.context_bytes + self.reserve_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.device.free_bytes - self.planned_bytes

    def to_dict(self) -> dict[str, Any]:
        d = self.device
        slot_sizes = self.cache.slot_bytes
        return {
            "index": d.index, "name": d.name, "driver_model": d.driver_model,
            "total_bytes": d.total_bytes, "budget_bytes": d.free_bytes,
            "planned_bytes": self.planned_bytes, "headroom_bytes": self.headroom_bytes,
            "arena_bytes": self.arena_bytes, "kv_mapped_bytes": self.kv_mapped_bytes,
            "layers": list(self.layers),
            "regions": self.regions,
            "expert_cache_slots": self.cache.n_slots,
            "expert_slot_bytes": int(slot_sizes.max()) if len(slot_sizes) else 0,
            "expert_slot_bytes_min": int(slot_sizes.min()) if len(slot_sizes) else 0,
            "expert_cache_slots_per_layer": list(self.cache.slots_per_layer),
        }


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """The whole plan. `accepted` False means `refusal` says why; nothing may be allocated."""

    accepted: bool
    devices: tuple[DevicePlan, ...]
    request: PrefillRequest
    prefill: PromptPath | None
    kv: KvPlan
    predicted_hit_rate: float | None
    hit_rate_model: str
    refusal: Refusal | None
    options: PlanOptions
    token_embd: str  # "host" | "device"
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    shape: ModelShape | None = field(default=None, repr=False)
    profile: RoutingProfile | None = field(default=None, repr=False)

    @property
    def keeps_experts(self) -> bool:
        """Whether the engine's host store holds the experts (`strata.plan.host.keeps_experts`:
        not where the cache holds every pair and the prompt path never borrows; a refused plan
        is priced as if it did)."""
        if self.shape is None or not self.accepted:
            return True
        p, s = self.prefill, self.shape
        return keeps_experts(sum(d.cache.n_slots for d in self.devices), s.n_layer * s.n_expert,
                             None if p is None else p.mode, 0 if p is None else p.lend_slots)

    @property
    def host_store_bytes(self) -> int:
        """Host memory the engine's expert store takes (the experts where it keeps them, and
        token_embd where it is looked up in host memory; `strata.plan.host.store_bytes`); 0
        without a shape."""
        return 0 if self.shape is None else store_bytes(self.shape, self.token_embd == "host",
                                                        self.keeps_experts)

    def device(self, index: int = 0) -> DevicePlan:
        for d in self.devices:
            if d.device.index == index:
                return d
        raise KeyError(f"the plan has no GPU {index}")

    def to_dict(self) -> dict[str, Any]:
        p = self.prefill
        return {
            "accepted": self.accepted,
            "devices": [d.to_dict() for d in self.devices],
            "prefill": None if p is None else {
                "request": str(self.request), "chunk": p.chunk, "mode": p.mode,
                "lend_slots": p.lend_slots, "lend_bytes": p.lend_bytes,
                "ring_slots": p.ring_slots, "prompt_bytes": p.prompt_bytes,
                "ring_bytes": p.ring_bytes},
            "kv": self.kv.to_dict(),
            "predicted": {"expert_hit_rate": self.predicted_hit_rate,
                          "model": self.hit_rate_model},
            "token_embd": self.token_embd,
            "host_store_bytes": self.host_store_bytes,
            "notes": list(self.notes), "warnings": list(self.warnings),
            "refusal": None if self.refusal is None else self.refusal.to_dict(),
        }
