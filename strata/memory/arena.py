"""The per-GPU arena: ONE device allocation, exactly the plan's size, carved into the plan's
regions as typed views; then validated by touching it.

Why touch: an allocation that succeeds proves nothing. Under Windows WDDM the driver may back it
with system memory (a prefill of ~105 tok/s instead of ~2,000), and a desktop or another process
may have taken VRAM since the plan was made. So after the carve every page is written and free
VRAM is read again: it must still hold the plan's reserve. A shortfall shrinks the elastic expert
cache (a re-plan against the VRAM that is really there: the prompt path is re-chosen against the
cache that results, a lost loan repriced as owned) and the new arena is validated the same way.
Shrinks are bounded; validation is not: the last allowed arena is accepted on its numbers or
refused with the full budget. `STRATA_TEST_POSTTOUCH_SHORTFALL=<MiB>` subtracts that much from
every post-touch reading, to drive this path deterministically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from strata.errors import StrataError
from strata.plan.contract import PromptUse, check_runtime_use
from strata.plan.devices import MiB, DeviceInfo, fmt_bytes
from strata.plan.layout import Layout, prompt_layout, ring_layout, ring_slot_bytes
from strata.plan.planner import replan
from strata.plan.refusal import knobs_for_shortfall
from strata.plan.result import DevicePlan, Plan, Refusal
from strata.memory.backend import DeviceBackend

MAX_SHRINKS = 6
SHRINK_SLACK_BYTES = 64 * MiB  # a shrink takes this much more than the shortfall it saw (at
SHRINK_SLACK_SHARE = 100  # most 1/100 of the budget), so a desktop still growing is outrun
SHORTFALL_ENV = "STRATA_TEST_POSTTOUCH_SHORTFALL"


class ArenaError(StrataError):
    """The arena cannot be opened as planned (bad test setting, refused plan)."""


class ArenaRefusedError(ArenaError):
    """Even the shrunk plans did not hold their reserve: the budget and what was tried."""

    def __init__(self, refusal: Refusal, attempts: tuple["Attempt", ...]):
        self.refusal = refusal
        self.attempts = attempts
        tried = "\n".join(f"  try {i}: {a}" for i, a in enumerate(attempts))
        super().__init__(refusal.message() + ("\n" + tried if tried else ""))


@dataclass(frozen=True, slots=True)
class Attempt:
    """One opened (or pre-checked) arena and what the card said about it."""

    arena_bytes: int
    cache_slots: int
    prefill: str  # e.g. "16384 borrowed"
    free_before: int
    free_after: int | None  # None: not allocated, the pre-check already saw the shortfall
    reserve_bytes: int

    @property
    def short_bytes(self) -> int:
        free = self.free_before - self.arena_bytes if self.free_after is None else self.free_after
        return self.reserve_bytes - free

    def __str__(self) -> str:
        got = "not allocated" if self.free_after is None else \
            f"free after touch {fmt_bytes(self.free_after)}"
        verdict = "ok" if self.short_bytes <= 0 else f"short by {fmt_bytes(self.short_bytes)}"
        return (f"arena {fmt_bytes(self.arena_bytes)} ({self.cache_slots} cache slots, prompt "
                f"{self.prefill}), free before {fmt_bytes(self.free_before)}, {got}, reserve "
                f"{fmt_bytes(self.reserve_bytes)}: {verdict}")


def simulated_shortfall_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The simulated post-touch shortfall from STRATA_TEST_POSTTOUCH_SHORTFALL (MiB), or 0."""
    env = os.environ if environ is None else environ
    raw = env.get(SHORTFALL_ENV, "").strip()
    if not raw:
        return 0
    try:
        mib = float(raw)
    except ValueError:
        mib = -1.0
    if not mib >= 0:
        raise ArenaError(f"{SHORTFALL_ENV}={raw!r}: expected a number of MiB >= 0")
    return int(mib * MiB)


def live_device_info(backend: DeviceBackend, *, name: str = "",
                     driver_model: str = "linux") -> DeviceInfo:
    """The device as the live context sees it: its context is already paid for."""
    free, total = backend.memory_info()
    return DeviceInfo(backend.index, name or f"GPU {backend.index}", min(free, total), total,
                      driver_model, context_bytes=0)


def _describe(p: Plan) -> str:
    return "none" if p.prefill is None else f"{p.prefill.chunk} {p.prefill.mode}"


def _changes(old: Plan, new: Plan, short: int) -> str:
    o, n = old.device(), new.device()
    text = (f"post-touch: GPU {o.device.index} was short by {fmt_bytes(short)}; expert cache "
            f"{o.cache.n_slots} -> {n.cache.n_slots} slots")
    if _describe(old) != _describe(new):
        text += f"; prompt path {_describe(old)} -> {_describe(new)}"
        if old.prefill and new.prefill and (old.prefill.mode, new.prefill.mode) == \
                ("borrowed", "owned"):
            text += " (the loan was lost: repriced as owned)"
    return text


def open_arena(plan: Plan, backend: DeviceBackend, *, max_shrinks: int = MAX_SHRINKS,
               environ: Mapping[str, str] | None = None) -> "Arena":
    """Allocate, touch and validate the arena of `plan` on `backend`'s device."""
    if not plan.accepted:
        raise ArenaRefusedError(plan.refusal, ()) if plan.refusal else ArenaError("plan refused")
    simulated = simulated_shortfall_bytes(environ)
    current, attempts, notes = plan, [], []
    for shrink in range(max_shrinks + 1):
        dp = current.device(backend.index)
        free_before, _ = backend.memory_info()
        free_after, buf = None, None
        if free_before - dp.arena_bytes >= dp.reserve_bytes:
            buf = backend.allocate(dp.arena_bytes)
            backend.touch(buf)
            free_after = backend.memory_info()[0] - simulated
        attempt = Attempt(dp.arena_bytes, dp.cache.n_slots, _describe(current), free_before,
                          free_after, dp.reserve_bytes)
        attempts.append(attempt)
        if attempt.short_bytes <= 0:
            return Arena(current, backend, buf, tuple(attempts), tuple(notes))
        if buf is not None:
            backend.release(buf)
            buf = None
        if shrink == max_shrinks:
            break
        # the next arena must be smaller by the shortfall (and a slack): a budget of the planned
        # bytes less that yields an arena at most that much smaller, whatever the 2 MiB rounding
        slack = min(SHRINK_SLACK_BYTES, dp.device.free_bytes // SHRINK_SLACK_SHARE)
        target = dp.planned_bytes - attempt.short_bytes - slack
        shrunk = replan(current, free_bytes=target, device=backend.index)
        if not shrunk.accepted:
            raise ArenaRefusedError(shrunk.refusal, tuple(attempts))
        notes.append(_changes(current, shrunk, attempt.short_bytes))
        current = shrunk
    raise ArenaRefusedError(_retry_refusal(current, attempts[-1], max_shrinks), tuple(attempts))


def _retry_refusal(current: Plan, last: Attempt, max_shrinks: int) -> Refusal:
    """The full budget of the last validated arena: what the card had for it, what it needed."""
    dp = current.devices[0]
    free = (last.free_before if last.free_after is None else last.free_after + last.arena_bytes)
    knobs = knobs_for_shortfall(current.shape, dp.device, current.options, current.profile,
                                last.short_bytes)
    return Refusal(f"after {max_shrinks} expert-cache shrinks the arena still does not leave "
                   f"its reserve free (another program or the desktop keeps taking VRAM)",
                   dp.device.index, free_bytes=free,
                   needed_bytes=last.arena_bytes + last.reserve_bytes, knobs=knobs)


class Arena:
    """The one allocation of one GPU and typed views of the plan's regions."""

    def __init__(self, plan: Plan, backend: DeviceBackend, buffer: Any,
                 attempts: tuple[Attempt, ...], notes: tuple[str, ...]):
        self.plan = plan  # the accepted plan, after any post-touch shrink
        self.backend = backend
        self.buffer = buffer
        self.attempts = attempts
        self.notes = notes

    @property
    def device_plan(self) -> DevicePlan:
        return self.plan.device(self.backend.index)

    def _region(self, family: str):
        arena = self.device_plan.arena
        if family not in arena:
            raise KeyError(f"the arena has no {family!r} region (has: {', '.join(arena.names)})")
        return arena.region(family)

    def view(self, family: str, name: str) -> Any:
        """A typed view of region `name` of `family` (weights, kv, activations, draft...)."""
        top = self._region(family)
        r = top.sub.region(name)
        return self.backend.view(self.buffer, top.offset + r.offset, r.dtype, r.shape)

    def views(self, family: str) -> dict[str, Any]:
        top = self._region(family)
        return {r.name: self.backend.view(self.buffer, top.offset + r.offset, r.dtype, r.shape)
                for r in top.sub.regions}

    def cache_bytes(self) -> Any:
        """The expert cache as raw bytes; slot (layer, j) starts at cache.offset(layer, j)."""
        top = self._region("expert_cache")
        return self.backend.view(self.buffer, top.offset, "uint8", (top.n_bytes,))

    def prompt_views(self, use: PromptUse) -> tuple[dict[str, Any], dict[str, Any]]:
        """(prompt buffers, ring) for one prompt step, after the runtime contract allows `use`:
        owned in their own regions, borrowed in the cache's lent tail."""
        check_runtime_use(self.plan, use)
        dp = self.device_plan
        prompt = prompt_layout(self.plan.shape, use.chunk, kv_type=self.plan.options.kv_type,
                               kv_stage_tokens=self.plan.kv.stage_tokens)
        ring = ring_layout(self.plan.shape,
                           ring_bytes=use.ring_slots * ring_slot_bytes(self.plan.shape))
        if use.mode == "owned":
            base_p = self._region("prompt").offset
            base_r = self._region("ring").offset if ring.total_bytes else 0
        else:
            cache = self._region("expert_cache")
            lent = dp.cache.suffix_bytes(use.lend_slots)
            if lent < prompt.total_bytes + ring.total_bytes:
                raise ArenaError(f"a loan of {use.lend_slots} slots ({lent} B) cannot hold the "
                                 f"prompt path ({prompt.total_bytes + ring.total_bytes} B)")
            base_p = cache.offset + dp.cache.total_bytes - lent
            base_r = base_p + prompt.total_bytes
        return self._carve(prompt, base_p), self._carve(ring, base_r)

    def _carve(self, layout: Layout, base: int) -> dict[str, Any]:
        return {r.name: self.backend.view(self.buffer, base + r.offset, r.dtype, r.shape)
                for r in layout.regions}

    def close(self) -> None:
        """Give the allocation back (views taken from it must not be used afterwards)."""
        if self.buffer is not None:
            self.backend.release(self.buffer)
            self.buffer = None
