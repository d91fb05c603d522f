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
    "helper_tier": "helper tier: hottest pairs no stage holds",
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
        seqs = f" x {kv.n_seq} sequences" if kv.n_seq > 1 else ""
        return f"{kv.type}, {kv.resident_tokens} tokens resident{stream}{seqs}"
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
    out.append(host_line(plan))
    return out


def host_line(plan) -> str:
    """The host memory a plan's run takes: the expert store (`strata.plan.host`)."""
    embd = ", token_embd's rows" if plan.token_embd == "host" else ""
    if plan.keeps_experts:
        return (f"host memory: expert store {fmt_bytes(plan.host_store_bytes)} (every "
                f"expert{embd}; page-locked)")
    rows = f" ({fmt_bytes(plan.host_store_bytes)} for token_embd's rows)" if embd else ""
    return (f"host memory: no expert store{rows}: the cache holds every expert and the prompt "
            f"path never borrows it, so it is filled from the file (--adaptive-cache keeps one)")


def _split_detail(sp, st, name: str) -> str:
    lo, hi = st.layers
    if name == "weights":
        freed = st.weight_bytes_whole - st.device_plan.regions["weights"]
        return (f"layers {lo}-{hi - 1} only; {fmt_bytes(freed)} carved off" if sp.split.carve
                else "every layer (carve off)")
    if name == "kv":
        return f"{sp.kv.type}, layers {lo}-{hi - 1}, {sp.kv.resident_tokens} tokens"
    if name == "expert_cache":
        n = (hi - lo) * sp.shape.n_expert
        return f"stage cache: {st.device_plan.cache.n_slots} of {n} pairs"
    if name == "helper_tier":
        return f"{st.tier.n_slots} slots" if st.tier is not None else ""
    p = st.prefill
    if name in ("prompt", "ring") and p is not None and p.mode == "borrowed":
        return "borrowed: inside the stage cache's tail"
    return ""


def split_table(sp, st):
    """One device of a layer split: its range, regions, stage cache and helper tier."""
    from rich.table import Table
    from rich.text import Text

    dp, d = st.device_plan, st.device_plan.device
    lo, hi = st.layers
    title = (f"GPU {d.index}: {d.name} ({d.driver_model}), {fmt_bytes(d.free_bytes)} free of "
             f"{fmt_bytes(d.total_bytes)}; layers {lo}-{hi - 1} ({hi - lo})")
    t = Table(title=Text(title), title_justify="left")
    t.add_column("region")
    t.add_column("MiB", justify="right")
    t.add_column("what")
    regions = dict(dp.regions)
    regions.setdefault("helper_tier", 0)
    order = [n for n in regions if n not in ("pad", "context", "reserve")] + \
        ["pad", "context", "reserve"]
    for name in order:
        n = regions[name]
        detail = _split_detail(sp, st, name)
        t.add_row(name, _mib(n) if n else "-",
                  Text(_WHAT.get(name, "")) + Text(f"  {detail}" if detail else "", style="dim"))
    t.add_section()
    t.add_row("planned", _mib(dp.planned_bytes), "sum of the regions")
    t.add_row("budget", _mib(d.free_bytes), "free VRAM")
    t.add_row("headroom", _mib(dp.headroom_bytes), "budget - planned")
    return t


def split_decisions(sp) -> list[str]:
    """A layer split's decisions as sentences."""
    pl, out = sp.placement, []
    ranges = ", ".join(f"{a}-{b - 1}" for a, b in pl.ranges)
    places = f"{pl.n_placements:,} placement{'' if pl.n_placements == 1 else 's'}"
    how = (f"searched {places} in {pl.search_seconds * 1e3:.0f} ms"
           if pl.how == "auto" else "given by --layer-split")
    pred = (f"; predicted {pl.seconds_per_token * 1e3:.2f} ms per token" if pl.feasible else "")
    out.append(f"layer split {','.join(map(str, pl.cuts))} (layers {ranges}): {how}{pred}")
    out.append("hidden state handed stage to stage " + (
        "through pinned host memory (--handoff host)" if sp.split.handoff == "host" else
        "peer-to-peer where the GPUs reach each other, else through pinned host memory"))
    if sp.chunk is not None:
        out.append(f"prefill {sp.request}: chunk {sp.chunk} tokens on every stage; "
                   + "; ".join(f"GPU {s.index} {s.prefill.mode}, ring {s.prefill.ring_slots} "
                               f"slots" for s in sp.stages if s.prefill is not None))
    for s in sp.stages:
        hit = "" if s.predicted_hit_rate is None else \
            f", {s.predicted_hit_rate:.1%} of its layers' routing"
        tier = f"; helper tier {s.tier.n_slots} slots" if s.tier is not None else ""
        out.append(f"GPU {s.index}: stage cache {s.device_plan.cache.n_slots} slots{hit}{tier}")
    if sp.predicted_hit_rate is not None:
        out.append(f"predicted decode hit rate {sp.predicted_hit_rate:.1%} with helper tiers, "
                   f"{sp.predicted_hit_rate_stages:.1%} stage caches alone ({sp.hit_rate_model})")
    out.append(host_line(sp))
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
    split = hasattr(plan, "stages")
    if split:
        for st in plan.stages:
            con.print(split_table(plan, st))
    else:
        for dp in plan.devices:
            con.print(device_table(plan, dp))
    for line in (split_decisions(plan) if split else decisions(plan)):
        con.print(f"  {line}", markup=False)
    for line in (extra_notes or []) + list(plan.notes):
        con.print(f"  note: {line}", markup=False)
    for line in plan.warnings:
        con.print(f"  warning: {line}", markup=False, style="yellow")
    if plan.refusal is not None:
        con.print(plan.refusal.message(), markup=False, style="red")
    else:
        con.print("accepted", style="green")
