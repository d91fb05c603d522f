"""One definition of each capability, read by the planner and the runtime alike.

A capability decided in two places drifts: the earlier engine built the loan's residency
bookkeeping only inside one optional setup path, so a borrowed plan silently became owned
buffers nobody had budgeted. Here each yes/no is one function of the options.
"""

from __future__ import annotations

from strata.plan.options import PlanOptions


def prompt_may_borrow(options: PlanOptions) -> bool:
    """Whether the prompt path may run its chunk buffers and ring inside lent expert-cache slots.

    The residency bookkeeping a loan needs (the device slot table, which marks lent slots as
    misses and is restored on refill) is part of every session, so the only thing that turns
    borrowing off is the user (`--no-prefill-borrow`). Whether a given cache has slots to lend
    is the policy's question, not this one.
    """
    return options.prefill_borrow


def kv_streams(options: PlanOptions, max_context: int) -> bool:
    """Whether part of the KV cache lives in host memory (`--kv-resident` below the context)."""
    return options.kv_resident is not None and options.kv_resident < max_context


# Said where a plan or a refusal offers a knob whose cost is not VRAM (streamed KV: time), or
# what the engines cannot run yet (a plan is a pure function of the options, so it prices
# these, and says so rather than let a user follow a suggestion the engine then refuses).
KV_STREAM_NOTE = ("decode then reads the KV past that many tokens from host memory over PCIe "
                  "(one GPU, one sequence)")
DRAFT_UNRUN = "nothing decodes with a draft yet"
