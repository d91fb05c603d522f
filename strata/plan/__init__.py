"""The VRAM planner: one pure plan of every device byte before anything is allocated.

`plan(shape, devices, options) -> Plan`; `strata plan --dry-run` prints it. Layouts
(`strata.plan.layout`, `strata.plan.cache`) are the one definition of every buffer's bytes and
offsets, shared with the arena that carves them; `check_runtime_use` is the runtime contract.
"""

from strata.plan.cache import CacheLayout, cache_layout, fill_cache, select_pairs
from strata.plan.capability import kv_streams, prompt_may_borrow
from strata.plan.contract import PromptUse, RuntimeContractError, check_runtime_use, runtime_use
from strata.plan.devices import DeviceInfo, parse_gpu_mem, parse_size
from strata.plan.layout import (
    Layout, LayoutBuilder, Region, draft_layout, kv_layout, prompt_layout, ring_layout,
    session_layout, weights_layout,
)
from strata.plan.options import PlanOptions, PrefillRequest
from strata.plan.planner import plan, replan
from strata.plan.policy import PromptPath, choose_prompt_path
from strata.plan.profile import RoutingProfile
from strata.plan.result import DevicePlan, Knob, Plan, PlanInputError, Refusal

__all__ = [
    "CacheLayout", "DeviceInfo", "DevicePlan", "Knob", "Layout", "LayoutBuilder", "Plan",
    "PlanInputError", "PlanOptions", "PrefillRequest", "PromptPath", "PromptUse", "Refusal",
    "Region", "RoutingProfile", "RuntimeContractError", "cache_layout", "check_runtime_use",
    "choose_prompt_path", "draft_layout", "fill_cache", "kv_layout", "kv_streams",
    "parse_gpu_mem", "parse_size", "plan", "prompt_layout", "prompt_may_borrow", "replan",
    "ring_layout", "runtime_use", "select_pairs", "session_layout", "weights_layout",
]
