"""What the split planner returns: `SplitPlan` (one `Stage` per GPU, the placement, the helper
tiers, the predictions) and its JSON form: each device as in the single-GPU contract (its
`layers` range included) plus its stage and its helper tier."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strata.gguf.shape import ModelShape
from strata.plan.host import store_bytes
from strata.plan.options import PlanOptions, PrefillRequest
from strata.plan.policy import PromptPath
from strata.plan.profile import RoutingProfile
from strata.plan.result import DevicePlan, KvPlan, Refusal
from strata.plan.split.options import SplitOptions
from strata.plan.split.search import Placement
from strata.plan.split.tiers import HelperTier


def _path_dict(p: PromptPath | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {"chunk": p.chunk, "mode": p.mode, "lend_slots": p.lend_slots,
            "lend_bytes": p.lend_bytes, "ring_slots": p.ring_slots,
            "prompt_bytes": p.prompt_bytes, "ring_bytes": p.ring_bytes}


@dataclass(frozen=True, slots=True, eq=False)
class Stage:
    """One GPU running layers [lo, hi): its arena (stage cache and helper tier included), its
    prompt path, and what its cache is predicted to catch of its own layers' routing."""

    device_plan: DevicePlan
    prefill: PromptPath | None
    tier: HelperTier | None
    predicted_hit_rate: float | None  # the stage cache over its own layers
    weight_bytes_whole: int  # what its dense weights would be without the carve
    notes: tuple[str, ...] = ()

    @property
    def layers(self) -> tuple[int, int]:
        return self.device_plan.layers

    @property
    def index(self) -> int:
        return self.device_plan.device.index

    def to_dict(self) -> dict[str, Any]:
        d = self.device_plan.to_dict()
        d["regions"].setdefault("helper_tier", 0)
        weights = d["regions"]["weights"]
        d["stage"] = {"layers": list(self.layers), "prefill": _path_dict(self.prefill),
                      "predicted_hit_rate": self.predicted_hit_rate,
                      "weights_bytes": weights,
                      "weights_bytes_without_carve": self.weight_bytes_whole,
                      "carve_frees_bytes": self.weight_bytes_whole - weights}
        d["helper_tier"] = None if self.tier is None else self.tier.to_dict()
        return d


@dataclass(frozen=True, slots=True, eq=False)
class SplitPlan:
    """The whole multi-GPU plan. `accepted` False: `refusal` says which stage does not fit."""

    accepted: bool
    stages: tuple[Stage, ...]
    placement: Placement
    request: PrefillRequest
    chunk: int | None  # the prompt chunk every stage runs (the smallest any stage can)
    kv: KvPlan
    cover_b: float
    predicted_hit_rate: float | None  # stage caches and helper tiers together
    predicted_hit_rate_stages: float | None  # stage caches alone
    hit_rate_model: str
    refusal: Refusal | None
    options: PlanOptions
    split: SplitOptions
    token_embd: str
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    shape: ModelShape | None = field(default=None, repr=False)
    profile: RoutingProfile | None = field(default=None, repr=False)

    @property
    def keeps_experts(self) -> bool:
        """A layer split's stages share one store of every expert (their helper tiers and
        caches are filled from it)."""
        return True

    @property
    def host_store_bytes(self) -> int:
        """Host memory the engine's expert store takes (every expert, and token_embd where it
        is looked up in host memory; `strata.plan.host.store_bytes`); 0 without a shape."""
        return 0 if self.shape is None else store_bytes(self.shape, self.token_embd == "host")

    @property
    def devices(self) -> tuple[DevicePlan, ...]:
        return tuple(s.device_plan for s in self.stages)

    @property
    def tiers(self) -> tuple[HelperTier, ...]:
        return tuple(s.tier for s in self.stages if s.tier is not None)

    def stage_of(self, layer: int) -> Stage:
        for s in self.stages:
            lo, hi = s.layers
            if lo <= layer < hi:
                return s
        raise KeyError(f"no stage runs layer {layer}")

    def to_dict(self) -> dict[str, Any]:
        pl = self.placement
        return {
            "accepted": self.accepted,
            "devices": [s.to_dict() for s in self.stages],
            "split": {"how": pl.how, "cuts": list(pl.cuts), "ranges": [list(r) for r in pl.ranges],
                      "n_placements": pl.n_placements, "search_seconds": pl.search_seconds,
                      "predicted_seconds_per_token": pl.seconds_per_token
                      if pl.feasible else None,
                      "stage_seconds": [x if x != float("inf") else None
                                        for x in pl.stage_seconds],
                      "cover_b": self.cover_b, "carve": self.split.carve,
                      "helper_tiers": self.split.helper_tiers,
                      "handoff": self.split.handoff},
            "prefill": {"request": str(self.request), "chunk": self.chunk},
            "kv": self.kv.to_dict(),
            "predicted": {"expert_hit_rate": self.predicted_hit_rate,
                          "expert_hit_rate_stage_caches": self.predicted_hit_rate_stages,
                          "model": self.hit_rate_model},
            "token_embd": self.token_embd,
            "host_store_bytes": self.host_store_bytes,
            "notes": list(self.notes), "warnings": list(self.warnings),
            "refusal": None if self.refusal is None else self.refusal.to_dict(),
        }
