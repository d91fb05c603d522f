"""The runtime contract: the accepted plan is what the runtime runs.

The runtime may run LESS than the plan (a shorter prompt, so a smaller chunk, a smaller loan),
never more and never another mode: a borrowed plan never turns into owned buffers at the first
prompt, an owned 768-token chunk never grows back to 1024. The engine calls
`check_runtime_use` before every prompt-path use and refuses rather than allocate outside the
plan (nothing outside the arena may allocate device memory anyway).
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.errors import StrataError
from strata.plan.capability import prompt_may_borrow
from strata.plan.options import CHUNK_GRID
from strata.plan.result import Plan


class RuntimeContractError(StrataError):
    """The runtime asked for a prompt path the accepted plan does not contain."""


@dataclass(frozen=True, slots=True)
class PromptUse:
    """What the runtime is about to use for one prompt step."""

    chunk: int  # tokens in this step's buffers
    mode: str  # "owned" | "borrowed"
    ring_slots: int
    lend_slots: int = 0
    lend_bytes: int = 0
    device: int = 0


def runtime_use(plan: Plan, n_tokens: int, *, device: int = 0) -> PromptUse:
    """The use for a prompt of `n_tokens`: the plan's chunk, or less for a shorter prompt (on the
    256 grid); same mode, ring and loan (a loan is never re-scanned at run time)."""
    p = _accepted_path(plan)
    if n_tokens < 1:
        raise RuntimeContractError(f"a prompt needs at least one token, got {n_tokens}")
    chunk = min(p.chunk, -(-n_tokens // CHUNK_GRID) * CHUNK_GRID)
    return PromptUse(chunk, p.mode, p.ring_slots, p.lend_slots, p.lend_bytes, device)


def check_runtime_use(plan: Plan, requested: PromptUse) -> PromptUse:
    """Return `requested` if the accepted plan allows it; raise RuntimeContractError naming the
    departure otherwise."""
    p = _accepted_path(plan)
    if requested.device not in {d.device.index for d in plan.devices}:
        raise RuntimeContractError(f"GPU {requested.device} is not in the accepted plan")
    if requested.mode != p.mode:
        raise RuntimeContractError(
            f"the prompt path is {p.mode} in the accepted plan; running it {requested.mode} "
            f"would place buffers the budget never counted")
    if requested.mode == "borrowed" and not prompt_may_borrow(plan.options):
        raise RuntimeContractError("borrowing is off (--no-prefill-borrow) but a loan was asked")
    checks = (("chunk", requested.chunk, p.chunk), ("ring slots", requested.ring_slots,
              p.ring_slots), ("lent slots", requested.lend_slots, p.lend_slots),
              ("lent bytes", requested.lend_bytes, p.lend_bytes))
    for what, got, limit in checks:
        if got > limit:
            raise RuntimeContractError(
                f"{what} {got} exceeds the accepted plan's {limit}: the runtime may run less "
                f"than the plan, never more")
    if requested.chunk < 1 or requested.ring_slots < 0 or requested.lend_slots < 0:
        raise RuntimeContractError(f"invalid prompt use {requested}")
    return requested


def _accepted_path(plan: Plan):
    if not plan.accepted or plan.prefill is None:
        raise RuntimeContractError("the plan was refused: nothing may run on it")
    return plan.prefill
