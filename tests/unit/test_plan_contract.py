"""The runtime contract: the runtime may run less than the accepted plan (a shorter prompt),
never more and never another mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from helpers.moe_shapes import qwen3moe
from strata.plan import (
    PlanOptions, PrefillRequest, PromptUse, RuntimeContractError, check_runtime_use,
    parse_gpu_mem, plan, runtime_use,
)

S30 = qwen3moe()
BORROWED = plan(S30, parse_gpu_mem("16GiB"), PlanOptions())
OWNED = plan(S30, parse_gpu_mem("16GiB"), PlanOptions(prefill_borrow=False,
                                                      prefill=PrefillRequest(False, 768)))


def test_plans_under_test():
    assert BORROWED.prefill.mode == "borrowed" and BORROWED.prefill.chunk == 16384
    assert OWNED.prefill.mode == "owned" and OWNED.prefill.chunk == 768


@pytest.mark.parametrize("n_tokens,chunk", [(1, 256), (300, 512), (16384, 16384),
                                            (100000, 16384)])
def test_shorter_prompts_run_less(n_tokens, chunk):
    use = runtime_use(BORROWED, n_tokens)
    assert use.chunk == chunk and use.mode == "borrowed"
    assert check_runtime_use(BORROWED, use) is use


def test_owned_768_never_grows_back_to_1024():
    use = runtime_use(OWNED, 5000)
    assert use.chunk == 768
    check_runtime_use(OWNED, use)
    with pytest.raises(RuntimeContractError, match="chunk 1024 exceeds .* 768"):
        check_runtime_use(OWNED, replace(use, chunk=1024))


@pytest.mark.parametrize("change,match", [
    (dict(mode="owned", lend_slots=0, lend_bytes=0), "borrowed in the accepted plan"),
    (dict(chunk=16640), "chunk 16640 exceeds"),
    (dict(ring_slots=351), "ring slots 351 exceeds"),
    (dict(lend_slots=10_000), "lent slots 10000 exceeds"),
    (dict(lend_bytes=1 << 40), "lent bytes"),
    (dict(device=1), "GPU 1 is not in the accepted plan"),
    (dict(chunk=0), "invalid prompt use"),
])
def test_departures_are_refused(change, match):
    use = replace(runtime_use(BORROWED, 16384), **change)
    with pytest.raises(RuntimeContractError, match=match):
        check_runtime_use(BORROWED, use)


def test_owned_plan_refuses_a_loan_and_the_other_mode():
    use = runtime_use(OWNED, 100)
    with pytest.raises(RuntimeContractError, match="owned in the accepted plan"):
        check_runtime_use(OWNED, replace(use, mode="borrowed"))
    with pytest.raises(RuntimeContractError, match="lent slots 1 exceeds .* 0"):
        check_runtime_use(OWNED, replace(use, lend_slots=1))


def test_refused_plan_runs_nothing():
    refused = plan(S30, parse_gpu_mem("8GiB"), PlanOptions(max_context=65536))
    with pytest.raises(RuntimeContractError, match="refused"):
        runtime_use(refused, 10)
    with pytest.raises(RuntimeContractError, match="refused"):
        check_runtime_use(refused, PromptUse(256, "owned", 2))
    with pytest.raises(RuntimeContractError, match="at least one token"):
        runtime_use(BORROWED, 0)
