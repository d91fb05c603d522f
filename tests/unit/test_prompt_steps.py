"""Which prompts run as decode steps (`strata.engine.cuda.prompt_steps`): the plan's estimate
(pure: from the plan alone) and the knob that overrides it, on the 30B-A3B shape."""

from __future__ import annotations

import pytest

from helpers.moe_shapes import qwen3moe
from strata.engine.cuda import prompt_steps as ps
from strata.plan import PlanOptions, parse_gpu_mem, plan

MAX_STEPS = ps.MAX_STEPS  # read at import: the suite's fixture sets it to 0 for every test
S30 = qwen3moe()


def _plan(mem: str, shape=S30):
    return plan(shape, parse_gpu_mem(mem), PlanOptions(max_context=4096))


@pytest.fixture
def auto(monkeypatch):
    monkeypatch.setattr(ps, "MAX_STEPS", MAX_STEPS)


def test_the_suite_keeps_prompts_on_the_prompt_path():
    # tests/conftest.py: a test written for the prompt path runs it, however short its prompt
    assert ps.auto_limit(_plan("8GiB")) == 0 and ps.limit(5, _plan("8GiB")) == 5


def test_under_a_budget_short_prompts_run_as_steps(auto):
    p8 = _plan("8GiB")
    assert ps.streams(p8) and p8.prefill.mode == "borrowed"
    # the H200 at 8 GiB (Q4_K_M, skew 3: 77% hits): 7.9-9.3 ms a step; steps won below ~40
    assert 6e-3 < ps.step_seconds(p8) < 12e-3
    assert 28 <= ps.auto_limit(p8) <= 44


def test_the_limit_follows_the_steps_cost(auto):
    # fewer hits, slower steps, a shorter limit; more VRAM, the other way, up to MAX_STEPS
    q4 = [ps.auto_limit(_plan(m)) for m in ("6GiB", "8GiB", "12GiB")]
    assert q4[0] < q4[1] < q4[2] == MAX_STEPS
    q8 = qwen3moe("q8_0")  # twice the bytes a missed expert: slower steps at the same budget
    assert ps.step_seconds(_plan("8GiB", q8)) > 2 * ps.step_seconds(_plan("8GiB"))
    assert 0 < ps.auto_limit(_plan("8GiB", q8)) < q4[1]


def test_every_expert_in_vram_still_runs_a_few_tokens_as_steps(auto):
    full = _plan("80GiB")
    assert not ps.streams(full) and full.predicted_hit_rate == 1.0
    # the H200 with no cap: the chunk path 53-57 ms for 1-16 tokens, steps 2.5-2.9 ms a token
    assert 2e-3 < ps.step_seconds(full) < 3e-3
    assert 15 <= ps.auto_limit(full) <= 25 < ps.auto_limit(_plan("8GiB"))
    # a step is never estimated under its layers' launch floor (a tiny model's weights)
    tiny = qwen3moe("q8_0", n_embd=64, n_ff=32, n_head=2, n_head_kv=1, head_dim=32,
                    n_vocab=512, n_layer=4)
    assert ps.step_seconds(_plan("80GiB", tiny)) == 4 * ps.STEP_LAYER_S


def test_a_refused_plan_and_a_given_limit(auto):
    refused = _plan("1GiB")
    assert not refused.accepted and ps.auto_limit(refused) == 0
    assert ps.limit(0, _plan("8GiB")) == 0 and ps.limit(17, _plan("80GiB")) == 17


def test_a_negative_limit_is_refused():
    from strata.engine.cuda.options import CudaEngineError, CudaOptions
    from strata.serve.config import ServeConfig, ServeConfigError

    with pytest.raises(CudaEngineError, match="--prompt-steps -1"):
        CudaOptions(prompt_steps=-1)
    with pytest.raises(ServeConfigError, match="prompt_steps: must be 0 or more"):
        ServeConfig(model="m", prompt_steps=-1)
    assert CudaOptions(prompt_steps=0).prompt_steps == 0


def test_a_split_weighs_its_stages(auto):
    """A layer split's limit: its stages' prompt costs over their step times, summed (a step
    and a prompt run every stage in turn)."""
    from strata.engine.multi.model import stage_plan
    from strata.plan.split import plan_split

    sp = plan_split(S30, parse_gpu_mem("4GiB,4GiB"), PlanOptions(max_context=4096))
    stages = [stage_plan(sp, st, i) for i, st in enumerate(sp.stages)]
    alone = [ps.auto_limit(p) for p in stages]
    both = ps.auto_limit(*stages)
    assert all(ps.streams(p) for p in stages) and min(alone) <= both <= max(alone)
    assert ps.limit(None, *stages) == both > 0 and ps.limit(3, *stages) == 3
    resident = plan_split(S30, parse_gpu_mem("12GiB,12GiB"), PlanOptions(max_context=4096))
    stages = [stage_plan(resident, st, i) for i, st in enumerate(resident.stages)]
    assert not any(ps.streams(p) for p in stages)
    assert abs(ps.auto_limit(*stages) - ps.auto_limit(_plan("80GiB"))) <= 3
