"""A plan for people: one table per device (every region in MiB, budget, headroom), the
decisions, notes, warnings and, for a refused plan, the refusal with its knobs."""

from __future__ import annotations

from typing import IO

from strata.plan.devices import MiB, fmt_bytes
from strata.plan.result import DevicePlan, Plan

_WHAT = {
    "weights": "dense weights (raw GGUF bytes)",
    "kv": "KV cache (VRAM part)",
    "activations": "decode buffers, slot table, counters",
    "draft": "draft head: one block + verify buffers",
    "prompt": "prompt path: chunk buffers (owned)",
    "ring": "prefill ring (owned)",
    "expert_cache": "expert cache (elastic)",
    "pad": "allocation granule (2 MiB)",
    "context": "CUDA context allowance (kept free)",
    "reserve": "reserve (kept free)",
}


def _mib(n: int) -> str:
    return f"{n / MiB:,.1f}"


def _detail(plan: Plan, dp: DevicePlan, name: str) -> str:
    p, kv = plan.prefill, plan.kv
    if name == "weights":
        lo, hi = dp.layers
        return f"layers {lo}-{hi - 1}; token_embd in {plan.token_embd} memory"
    if name == "kv":
        stream = f", {kv.max_context - kv.resident_tokens} streamed" if kv.host_bytes else ""
        return f"{kv.type}, {kv.resident_tokens} tokens resident{stream}"
    if name == "activations":
        return f"batch {plan.options.batch}"
    if name == "expert_cache":
        c = dp.cache
        lo, hi = dp.layers
        return f"{c.n_slots} of {(hi - lo) * plan.shape.n_expert} pairs" if plan.shape else ""
    if name in ("prompt", "ring") and p is not None and p.mode == "borrowed":
        return "borrowed: inside the expert cache's tail"
    return ""


def device_table(plan: Plan, dp: DevicePlan):
    from rich.table import Table
    from rich.text import Text

    d = dp.device
    title = (f"GPU {d.index}: {d.name} ({d.driver_model}), {fmt_bytes(d.free_bytes)} free of "
             f"{fmt_bytes(d.total_bytes)}")
    t = Table(title=Text(title), title_justify="left")
    t.add_column("region")
    t.add_column("MiB", justify="right")
    t.add_column("what")
    for name, n in dp.regions.items():
        detail = _detail(plan, dp, name)
        t.add_row(name, _mib(n) if n else "-",
                  Text(_WHAT.get(name, "")) + Text(f"  {detail}" if detail else "", style="dim"))
    t.add_section()
    t.add_row("planned", _mib(dp.planned_bytes), "sum of the regions")
    t.add_row("budget", _mib(d.free_bytes), "free VRAM")
    t.add_row("headroom", _mib(dp.headroom_bytes), "budget - planned")
    return t


def decisions(plan: Plan) -> list[str]:
    """The decisions as sentences."""
    p, kv, out = plan.prefill, plan.kv, []
    if p is not None:
        loan = (f", lends {p.lend_slots} cache slots ({fmt_bytes(p.lend_bytes)})"
                if p.mode == "borrowed" else "")
        out.append(f"prefill {plan.request}: chunk {p.chunk} tokens, {p.mode}{loan}; "
                   f"ring {p.ring_slots} slots")
    for dp in plan.devices:
        if plan.accepted:
            c = dp.cache
            lo, hi = (int(c.slot_bytes.min()), int(c.slot_bytes.max())) if c.n_slots else (0, 0)
            sizes = f" of {fmt_bytes(lo)}-{fmt_bytes(hi)}" if c.n_slots else ""
            out.append(f"GPU {dp.device.index}: expert cache {c.n_slots} slots{sizes}")
    if plan.predicted_hit_rate is not None:
        out.append(f"predicted decode hit rate {plan.predicted_hit_rate:.1%} "
                   f"({plan.hit_rate_model})")
    out.append(f"KV {kv.type}: {kv.max_context} tokens, {kv.bytes_per_token} B/token, "
               f"{kv.resident_tokens} resident"
               + (f", {fmt_bytes(kv.host_bytes)} in host memory" if kv.host_bytes else ""))
    return out


def render(plan: Plan, *, model_name: str = "", extra_notes: list[str] | None = None,
           file: IO[str] | None = None) -> None:
    """Print the plan (rich tables) to `file` (stdout by default)."""
    from rich.console import Console

    con = Console(file=file, highlight=False, soft_wrap=False)
    if not con.is_terminal:
        con.width = max(con.width, 110)  # pipes and files get whole rows
    s = plan.shape
    if s is not None:
        con.print(f"{model_name}: {s.arch}, {s.n_layer} layers, {s.n_expert} experts "
                  f"(top {s.n_expert_used}), file {fmt_bytes(s.file_bytes)}",
                  markup=False, style="bold")
    for dp in plan.devices:
        con.print(device_table(plan, dp))
    for line in decisions(plan):
        con.print(f"  {line}", markup=False)
    for line in (extra_notes or []) + list(plan.notes):
        con.print(f"  note: {line}", markup=False)
    for line in plan.warnings:
        con.print(f"  warning: {line}", markup=False, style="yellow")
    if plan.refusal is not None:
        con.print(plan.refusal.message(), markup=False, style="red")
    else:
        con.print("accepted", style="green")
