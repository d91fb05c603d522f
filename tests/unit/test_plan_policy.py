"""The chunk/loan policy, checked against brute force over the 256-token grid: the largest chunk
that leaves the ring full, the smaller-ring fallback, loan limits, fixed chunks served exactly or
reduced, and the one borrowing capability."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.moe_shapes import qwen3moe
from strata.plan import PlanOptions, PrefillRequest, RoutingProfile, fill_cache, plan
from strata.plan import parse_gpu_mem, prompt_may_borrow
from strata.plan.policy import (
    OWNED_AUTO_CHUNK, RING_MIN_SLOTS, PromptPricing, choose_prompt_path, loan_limit,
)

S30 = qwen3moe()
GIB = 1 << 30
AUTO = PrefillRequest()


def _pricing(ring_bytes=GIB):
    return PromptPricing(S30, "f16", 0, ring_bytes)


def _loan(budget, pct=90, floor=128):
    cache = fill_cache(S30, RoutingProfile.uniform(48, 128), budget_bytes=budget)
    return loan_limit(cache, lend_pct=pct, floor_slots=floor)


def _brute(pr, c_max, room, ring_slots):
    best = 0
    for c in range(256, c_max + 1, 256):
        if pr.prompt_bytes(c) + pr.ring_bytes(ring_slots) <= room:
            best = c
    return best


@pytest.mark.parametrize("cache_gib", [2.5, 4, 6.5, 9])
def test_auto_takes_largest_chunk_with_full_ring(cache_gib):
    pr = _pricing()
    loan = _loan(int(cache_gib * GIB))
    path = choose_prompt_path(AUTO, pr, max_chunk=32768, loan=loan, owned_room=0)
    full = pr.ring_full_slots
    assert full == GIB // 3059712 == 350
    want = _brute(pr, 16384, loan.max_bytes, full)
    assert want, "each case leaves room for some chunk with a full ring"
    assert (path.mode, path.chunk, path.ring_slots) == ("borrowed", want, full)
    # the loan is the fewest tail slots that hold chunk + ring, within the limit
    need = path.prompt_bytes + path.ring_bytes
    assert loan.cache.suffix_bytes(path.lend_slots) == path.lend_bytes >= need
    assert loan.cache.suffix_bytes(path.lend_slots - 1) < need
    assert path.lend_slots <= loan.max_slots


def test_smaller_ring_only_when_no_chunk_leaves_it_full():
    pr = _pricing()
    loan = _loan(int(1.1 * GIB), floor=0)  # loan ~0.99 GiB: no chunk beside a full 1 GiB ring
    assert _brute(pr, 16384, loan.max_bytes, pr.ring_full_slots) == 0
    path = choose_prompt_path(AUTO, pr, max_chunk=32768, loan=loan, owned_room=0)
    assert path.mode == "borrowed"
    assert path.chunk == _brute(pr, 16384, loan.max_bytes, RING_MIN_SLOTS)
    assert RING_MIN_SLOTS <= path.ring_slots < pr.ring_full_slots
    # the ring takes all the loan leaves: one more slot would not fit
    left = loan.max_bytes - path.prompt_bytes
    assert pr.ring_bytes(path.ring_slots) <= left < pr.ring_bytes(path.ring_slots + 1)


def test_ceiling_and_context_cap_the_chunk():
    pr, loan = _pricing(), _loan(9 * GIB)
    assert choose_prompt_path(PrefillRequest(True, 4096), pr, max_chunk=32768, loan=loan,
                              owned_room=0).chunk == 4096
    assert choose_prompt_path(AUTO, pr, max_chunk=3000, loan=loan, owned_room=0).chunk == 2816


def test_loan_limit_pct_and_floor():
    cache = fill_cache(S30, RoutingProfile.uniform(48, 128), n_slots=1000)
    assert loan_limit(cache, lend_pct=90, floor_slots=128).max_slots == 872  # floor binds
    assert loan_limit(cache, lend_pct=50, floor_slots=128).max_slots == 500  # pct binds
    assert loan_limit(cache, lend_pct=90, floor_slots=1000) is None


def test_auto_owned_when_it_cannot_borrow():
    pr, notes = _pricing(), []
    path = choose_prompt_path(AUTO, pr, max_chunk=32768, loan=None, owned_room=2 * GIB,
                              notes=notes)
    assert (path.mode, path.chunk, path.ring_slots) == ("owned", OWNED_AUTO_CHUNK, 350)
    assert "borrowing is off" in notes[0]
    tight = pr.prompt_bytes(512) + pr.ring_bytes(350) + 10
    small = choose_prompt_path(AUTO, pr, max_chunk=32768, loan=None, owned_room=tight)
    assert (small.chunk, small.ring_slots) == (512, 350)  # reduced on the grid, ring kept full
    assert choose_prompt_path(AUTO, pr, max_chunk=32768, loan=None, owned_room=1000) is None


def test_no_ring_when_every_expert_is_resident():
    pr = _pricing()
    room = pr.prompt_bytes(8192) + 5
    path = choose_prompt_path(AUTO, pr, max_chunk=32768, loan=None, owned_room=room, ring=False)
    assert (path.mode, path.chunk, path.ring_slots, path.ring_bytes) == ("owned", 8192, 0, 0)


def test_fixed_chunk_exact_then_reduced():
    pr, loan = _pricing(), _loan(3 * GIB)  # lends ~2.7 GiB
    n = 8192
    exact = choose_prompt_path(PrefillRequest(False, n), pr, max_chunk=32768, loan=loan,
                               owned_room=0)
    assert (exact.mode, exact.chunk) == ("borrowed", n)
    # too big to lend, but the owned room holds it exactly: served exactly, owned
    big = 24576
    room = pr.prompt_bytes(big) + pr.ring_bytes(RING_MIN_SLOTS)
    owned = choose_prompt_path(PrefillRequest(False, big), pr, max_chunk=32768, loan=loan,
                               owned_room=room)
    assert (owned.mode, owned.chunk, owned.ring_slots) == ("owned", big, RING_MIN_SLOTS)
    # neither holds it: reduced on the grid to the larger of the two, with a note
    notes = []
    red = choose_prompt_path(PrefillRequest(False, big), pr, max_chunk=32768, loan=loan,
                             owned_room=room - 1, notes=notes)
    b = _brute(pr, big, loan.max_bytes, RING_MIN_SLOTS)
    o = _brute(pr, big, room - 1, RING_MIN_SLOTS)
    assert red.chunk == max(b, o) < big and red.chunk % 256 == 0
    assert red.mode == ("borrowed" if b >= o else "owned")
    assert "reduced to" in notes[0]
    assert choose_prompt_path(PrefillRequest(False, big), pr, max_chunk=32768, loan=None,
                              owned_room=100) is None


def test_capability_is_read_by_the_planner():
    assert prompt_may_borrow(PlanOptions()) and not prompt_may_borrow(
        PlanOptions(prefill_borrow=False))
    on = plan(S30, parse_gpu_mem("16GiB"), PlanOptions())
    off = plan(S30, parse_gpu_mem("16GiB"), PlanOptions(prefill_borrow=False))
    assert on.prefill.mode == "borrowed" and off.prefill.mode == "owned"
    assert off.device().regions["prompt"] == off.prefill.prompt_bytes > 0
    assert on.device().regions["prompt"] == 0


def test_pricing_is_monotone_in_the_chunk():
    pr = _pricing()
    prices = np.array([pr.prompt_bytes(c) for c in range(256, 32769, 256)])
    assert np.all(np.diff(prices) > 0)
