"""The arena on a simulated device (HostBackend): one allocation, the carve matches the plan's
layouts, and the post-touch loop (shrink, borrowed->owned repricing, retry limit) end to end."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from helpers.moe_shapes import qwen3moe
from strata.memory import (
    MAX_SHRINKS, SHORTFALL_ENV, ArenaError, ArenaRefusedError, HostBackend, live_device_info,
    open_arena, simulated_shortfall_bytes,
)
from strata.plan import (
    DeviceInfo, PlanOptions, PrefillRequest, RuntimeContractError, plan, runtime_use,
)
from strata.plan.devices import MiB

SMALL = qwen3moe("f32", n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_expert=64,
                 n_expert_used=2, n_ff=64, n_vocab=256, n_ctx=4096)  # 256 slots of 96 KiB
OPTS = PlanOptions(max_context=1024, vram_reserve_mib=1, ring_mib=1, lend_floor_slots=4)


def small_plan(mib: float, **change):
    dev = DeviceInfo(0, "simulated", int(mib * MiB), int(mib * MiB), context_bytes=0)
    return plan(SMALL, [dev], replace(OPTS, **change))


def base_of(arr: np.ndarray, buffer: np.ndarray) -> int:
    return arr.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]


def test_one_allocation_carved_into_the_plans_regions():
    p = small_plan(8)
    assert p.accepted and p.prefill.mode == "borrowed"
    dev = HostBackend(8 * MiB)
    arena = open_arena(p, dev, environ={})
    dp = arena.device_plan
    assert dev.n_allocations == 1 and dev.allocated_bytes == dp.arena_bytes == len(arena.buffer)
    assert dev.n_touched_pages == -(-dp.arena_bytes // 4096)
    # every region of every family: a typed view at its planned offset, and writing one pattern
    # per region leaves every other region intact (the carve never overlaps)
    views = []
    for top in dp.arena.regions:
        if top.sub is None:
            continue
        for name, v in arena.views(top.name).items():
            r = top.sub.region(name)
            assert (str(v.dtype), v.shape) == (r.dtype, r.shape)
            assert base_of(v, arena.buffer) == top.offset + r.offset
            views.append(v)
    for i, v in enumerate(views):
        v.view(np.uint8).reshape(-1)[:] = i % 251
    for i, v in enumerate(views):
        assert np.all(v.view(np.uint8) == i % 251)
    assert arena.view("kv", "k").shape == (4, 1024, 2, 64)  # f16 rows of 32 values
    assert arena.cache_bytes().shape == (dp.cache.total_bytes,)
    arena.close()
    assert dev.allocated_bytes == 0


def test_prompt_views_borrow_the_cache_tail_after_the_contract():
    p = small_plan(8)
    dev = HostBackend(8 * MiB)
    arena = open_arena(p, dev, environ={})
    dp, pre = arena.device_plan, p.prefill
    prompt, ring = arena.prompt_views(runtime_use(p, 10_000))
    cache = dp.arena.region("expert_cache")
    lo, hi = cache.offset + dp.cache.total_bytes - pre.lend_bytes, cache.offset + cache.n_bytes
    for v in list(prompt.values()) + list(ring.values()):
        start = base_of(v, arena.buffer)
        assert lo <= start and start + v.nbytes <= hi
    assert prompt["hidden"].shape == (pre.chunk, 128) and ring["slots"].shape[0] == pre.ring_slots
    short, _ = arena.prompt_views(runtime_use(p, 100))  # a shorter prompt: a smaller carve
    assert short["hidden"].shape == (256, 128)
    with pytest.raises(RuntimeContractError, match="owned"):
        arena.prompt_views(replace(runtime_use(p, 100), mode="owned"))
    assert dev.n_allocations == 1


def test_owned_prompt_views_use_their_own_regions():
    p = small_plan(8, prefill_borrow=False)
    arena = open_arena(p, HostBackend(8 * MiB), environ={})
    prompt, ring = arena.prompt_views(runtime_use(p, 300))
    region = arena.device_plan.arena.region("prompt")
    assert base_of(prompt["hidden"], arena.buffer) == region.offset
    assert base_of(ring["slots"], arena.buffer) == arena.device_plan.arena.region("ring").offset


def test_posttouch_shortfall_shrinks_the_cache_once():
    p = small_plan(10)
    dev = HostBackend(10 * MiB)
    arena = open_arena(p, dev, environ={SHORTFALL_ENV: "1.5"})
    a0, a1 = arena.attempts
    assert a0.short_bytes > 0 and a1.short_bytes <= 0
    assert a1.free_after is not None and a1.free_after >= a1.reserve_bytes
    before, after = p.device().cache.n_slots, arena.device_plan.cache.n_slots
    assert after < before and f"expert cache {before} -> {after} slots" in arena.notes[0]
    assert dev.n_allocations == 2 and dev.allocated_bytes == arena.device_plan.arena_bytes
    # the accepted plan after the shrink is what the runtime contract now checks against
    assert arena.plan.accepted and arena.plan is not p


def test_borrowed_plan_that_loses_its_loan_is_repriced_owned():
    p = small_plan(10, lend_pct=30)
    assert p.prefill.mode == "borrowed"
    arena = open_arena(p, HostBackend(10 * MiB), environ={SHORTFALL_ENV: "2"})
    assert arena.plan.prefill.mode == "owned"
    assert "the loan was lost: repriced as owned" in arena.notes[0]
    dp = arena.device_plan
    assert dp.regions["prompt"] == arena.plan.prefill.prompt_bytes > 0
    assert sum(dp.regions.values()) <= dp.device.free_bytes


def test_precheck_shrinks_before_allocating():
    p = small_plan(10)
    dev = HostBackend(10 * MiB, others_bytes=2 * MiB)  # taken after the plan was made
    arena = open_arena(p, dev, environ={})
    assert arena.attempts[0].free_after is None  # no allocation for the arena that cannot fit
    assert dev.n_allocations == 1 and len(arena.attempts) == 2


def _growing_desktop(step: int, times: int):
    calls = {"n": 0}

    def grow(dev: HostBackend) -> None:
        if calls["n"] < times:
            dev.others_bytes += step
        calls["n"] += 1
    return grow


def test_retry_limit_fails_with_the_full_budget():
    p = small_plan(20)  # a large elastic cache: shrinks keep succeeding as plans
    dev = HostBackend(20 * MiB, on_touch=_growing_desktop(2 * MiB, 100))
    with pytest.raises(ArenaRefusedError) as e:
        open_arena(p, dev, environ={})
    err = e.value
    assert len(err.attempts) == MAX_SHRINKS + 1
    assert err.refusal.short_by_bytes == err.attempts[-1].short_bytes > 0
    assert err.refusal.needed_bytes == err.attempts[-1].arena_bytes + MiB
    assert "after 6 expert-cache shrinks" in str(err) and "try 6" in str(err)
    assert dev.allocated_bytes == 0  # every refused arena was given back


def test_retry_limit_accepts_the_last_validated_arena():
    p = small_plan(20)
    dev = HostBackend(20 * MiB, on_touch=_growing_desktop(2 * MiB, MAX_SHRINKS))
    arena = open_arena(p, dev, environ={})
    assert len(arena.attempts) == MAX_SHRINKS + 1 and arena.attempts[-1].short_bytes <= 0
    assert len(arena.notes) == MAX_SHRINKS
    with pytest.raises(ArenaRefusedError):  # one shrink fewer allowed: refused, not accepted
        open_arena(p, HostBackend(20 * MiB, on_touch=_growing_desktop(2 * MiB, MAX_SHRINKS)),
                   max_shrinks=MAX_SHRINKS - 1, environ={})


def test_shrink_below_the_floor_is_refused_with_knobs():
    p = small_plan(8)
    with pytest.raises(ArenaRefusedError) as e:
        open_arena(p, HostBackend(8 * MiB), environ={SHORTFALL_ENV: "4"})
    assert e.value.refusal.knobs and e.value.refusal.short_by_bytes > 0


def test_explicit_cache_is_not_elastic():
    p = small_plan(10, expert_cache=30)
    assert p.accepted
    with pytest.raises(ArenaRefusedError, match="--expert-cache 30"):
        open_arena(p, HostBackend(10 * MiB), environ={SHORTFALL_ENV: "4"})


def test_refused_plan_and_bad_env():
    refused = small_plan(5)
    assert not refused.accepted
    dev = HostBackend(5 * MiB)
    with pytest.raises(ArenaRefusedError, match="short by"):
        open_arena(refused, dev, environ={})
    assert dev.n_allocations == 0
    with pytest.raises(ArenaError, match=SHORTFALL_ENV):
        open_arena(small_plan(8), HostBackend(8 * MiB), environ={SHORTFALL_ENV: "lots"})
    assert simulated_shortfall_bytes({SHORTFALL_ENV: "2.5"}) == int(2.5 * MiB)
    assert simulated_shortfall_bytes({}) == 0


def test_live_device_info_counts_the_context_as_paid():
    dev = HostBackend(64 * MiB, others_bytes=4 * MiB)
    info = live_device_info(dev, name="sim")
    assert (info.free_bytes, info.total_bytes, info.context_bytes) == (60 * MiB, 64 * MiB, 0)
    p = plan(SMALL, [info], replace(OPTS, prefill=PrefillRequest(False, 512)))
    assert p.accepted and open_arena(p, dev, environ={}).device_plan.device.name == "sim"
