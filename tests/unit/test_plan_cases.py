"""The planner's table of cases (no GPU): every accepted plan keeps sum(regions) <= budget on
every device, and each case lands where its knobs say it must."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from helpers.moe_shapes import QWEN3_235B, qwen3moe
from strata.plan import (
    DeviceInfo, PlanInputError, PlanOptions, PrefillRequest, parse_gpu_mem, plan,
)
from strata.plan.budget import ALLOC_GRANULE, cache_floor_slots
from strata.plan.devices import GiB, MiB
from strata.plan.layout import ALIGN
from strata.plan.options import OptionError
from strata.plan.policy import loan_limit

S30 = qwen3moe()
S30_Q8 = qwen3moe("q8_0")


def check_invariants(p):
    """What every accepted plan must satisfy, per device."""
    assert p.accepted and p.refusal is None
    for d in p.devices:
        regions = d.regions
        assert sum(regions.values()) == d.planned_bytes <= d.device.free_bytes
        end = 0
        for r in d.arena.regions:  # one allocation, regions back to back
            assert r.offset == end and r.offset % ALIGN == 0
            end += r.aligned_bytes
        assert d.arena_bytes == end and end % ALLOC_GRANULE == 0
        assert d.cache.n_slots >= cache_floor_slots(p.shape, p.options)
        pre = p.prefill
        assert pre.chunk % 256 == 0 and pre.chunk <= max(256, p.kv.max_context)
        if pre.mode == "borrowed":
            loan = loan_limit(d.cache, lend_pct=p.options.lend_pct,
                              floor_slots=p.options.lend_floor_slots)
            assert 0 < pre.lend_slots <= loan.max_slots
            assert pre.lend_bytes == d.cache.suffix_bytes(pre.lend_slots)
            assert pre.lend_bytes >= pre.prompt_bytes + pre.ring_bytes
            assert regions["prompt"] == regions["ring"] == 0
        else:
            assert regions["prompt"] == pre.prompt_bytes and regions["ring"] == pre.ring_bytes
        every = d.cache.n_slots == p.shape.n_layer * p.shape.n_expert
        if p.options.expert_cache is None and not every:
            # elastic: the cache took what was left (less than a slot, plus the unused granule)
            assert d.headroom_bytes < int(d.cache.slot_bytes.max()) + ALLOC_GRANULE


def gpu(size, **kw):
    return parse_gpu_mem(size, **kw)


def test_16gb_30b_q4km_32k_borrows():
    p = plan(S30, gpu("16GiB"), PlanOptions(max_context=32768))
    check_invariants(p)
    pre = p.prefill
    assert (pre.mode, pre.chunk, pre.ring_slots) == ("borrowed", 16384, 350)
    d = p.device()
    assert len(set(d.cache.slot_bytes.tolist())) == 2  # mixed Q4_K / Q6_K slot sizes
    assert p.notes == () and p.warnings == ()
    assert 0.5 < p.predicted_hit_rate < 1.0
    assert p.token_embd == "host" and d.regions["kv"] == 3 * GiB  # 32768 x 96 KiB


def test_512k_int8_streamed_kv_fixed_chunk():
    opts = PlanOptions(max_context=524288, kv_type="int8", kv_resident=212992,
                       prefill=PrefillRequest(False, 24576))
    p = plan(S30, gpu("16GiB"), opts)
    check_invariants(p)
    # the prompt path's copy of a layer's 512K-token context (512 MiB) takes room: the chunk is
    # reduced on the grid, still borrowed
    assert p.prefill.mode == "borrowed" and p.prefill.chunk < 24576
    assert any("reduced to" in n for n in p.notes)
    assert p.kv.resident_tokens == 212992  # a multiple of 4096: int8's mapping unit
    assert p.kv.host_bytes == (524288 - 212992) * 2 * 48 * 4 * 128  # rows; scales stay
    assert p.kv.stage_tokens == 524288
    # without borrowing the same request is owned and reduced on the grid
    owned = plan(S30, gpu("16GiB"), replace(opts, prefill_borrow=False))
    check_invariants(owned)
    assert owned.prefill.mode == "owned" and owned.prefill.chunk < p.prefill.chunk
    assert any("reduced to" in n for n in owned.notes)
    assert owned.device().cache.n_slots < p.device().cache.n_slots  # the cache gave way


def test_8gb_64k_refused_with_knobs_that_work():
    opts = PlanOptions(max_context=65536)
    p = plan(S30, gpu("8GiB"), opts)
    assert not p.accepted and p.prefill is None
    r = p.refusal
    assert r.free_bytes == 8 * GiB and r.short_by_bytes == r.needed_bytes - r.free_bytes > 0
    flags = [k.flag for k in r.knobs]
    assert flags[-1] == "a second GPU" and "--gpu-mem A,B" in r.knobs[-1].note
    assert any(f.startswith("--max-context ") for f in flags)
    assert "--kv q4_0" in flags and any(f.startswith("--kv-resident ") for f in flags)
    frees = [k.frees_bytes for k in r.knobs[:-1]]
    assert frees == sorted(frees, reverse=True) and min(frees) > 0
    for k in r.knobs[:-1]:
        fixed = _apply(opts, k.flag)
        q = plan(S30, gpu("8GiB"), fixed)
        assert q.accepted == ("not enough" not in k.note), k
        if q.accepted:
            check_invariants(q)
    d = r.to_dict()
    assert d["knobs"][0].startswith(r.knobs[0].flag) and "frees" in d["knobs"][0]


def test_what_a_knob_costs_besides_vram_is_said_where_the_plan_offers_it():
    """A draft region is priced but no engine runs it: the plan warns. Streamed KV runs (one
    GPU, one sequence): its plan says where the KV lives in a note, and a refusal's
    --kv-resident knob says what it costs (time over PCIe); --batch with it is bad input."""
    from strata.plan.capability import DRAFT_UNRUN, KV_STREAM_NOTE
    streamed = plan(S30, gpu("16GiB"), PlanOptions(max_context=65536, kv_resident=16384))
    check_invariants(streamed)
    assert not streamed.warnings
    assert any("--kv-resident 16384: the KV of the first 16384 tokens in VRAM" in n
               for n in streamed.notes)
    drafted = plan(S30, gpu("16GiB"), PlanOptions(max_context=4096, spec=2))
    assert any(DRAFT_UNRUN in w and "--spec 2" in w for w in drafted.warnings)
    whole = plan(S30, gpu("16GiB"), PlanOptions(max_context=4096, kv_resident=4096))
    assert not any(DRAFT_UNRUN in w for w in whole.warnings) and whole.kv.host_bytes == 0
    refused = plan(S30, gpu("8GiB"), PlanOptions(max_context=65536))
    kv = [k for k in refused.refusal.knobs if k.flag.startswith("--kv-resident ")]
    assert len(kv) == 1 and kv[0].note.endswith(KV_STREAM_NOTE), kv
    assert all(KV_STREAM_NOTE not in k.note for k in refused.refusal.knobs if k is not kv[0])
    batched = plan(S30, gpu("8GiB"), PlanOptions(max_context=65536, batch=2))
    assert not any(k.flag.startswith("--kv-resident") for k in batched.refusal.knobs)
    with pytest.raises(OptionError, match="--batch 2 keeps every sequence's whole context"):
        plan(S30, gpu("16GiB"), PlanOptions(max_context=65536, kv_resident=16384, batch=2))


def _apply(opts, flag):
    name, _, value = flag.partition(" ")
    if name == "--max-context":
        return replace(opts, max_context=int(value))
    if name == "--kv":
        return replace(opts, kv_type=value)
    if name == "--kv-resident":
        return replace(opts, kv_resident=int(value))
    if name == "--vram-reserve-mib":
        return replace(opts, vram_reserve_mib=int(value))
    if name == "--expert-cache":
        return replace(opts, expert_cache=int(value))
    raise AssertionError(f"unexpected knob {flag}")


def test_explicit_prefill_reduced():
    opts = PlanOptions(max_context=131072, prefill=PrefillRequest(False, 16384))
    p = plan(S30, gpu("16GiB"), opts)
    check_invariants(p)
    assert p.prefill.chunk < 16384
    assert any("--prefill 16384 cannot be served" in n and f"reduced to {p.prefill.chunk}" in n
               for n in p.notes)
    bigger = replace(opts, prefill=PrefillRequest(False, p.prefill.chunk + 256))
    assert plan(S30, gpu("16GiB"), bigger).prefill.chunk == p.prefill.chunk  # the largest


def test_explicit_prefill_capped_at_context():
    p = plan(S30, gpu("16GiB"), PlanOptions(max_context=4096,
                                            prefill=PrefillRequest(False, 8192)))
    check_invariants(p)
    assert p.prefill.chunk == 4096 and "capped at the context" in p.notes[0]


def test_explicit_expert_cache_too_large_is_refused_with_the_largest_that_fits():
    p = plan(S30, gpu("16GiB"), PlanOptions(max_context=32768, expert_cache=5000))
    assert not p.accepted and "--expert-cache 5000" in p.refusal.reason
    knob = next(k for k in p.refusal.knobs if k.flag.startswith("--expert-cache "))
    k = int(knob.flag.split()[1])
    ok = plan(S30, gpu("16GiB"), PlanOptions(max_context=32768, expert_cache=k))
    check_invariants(ok)
    assert ok.device().cache.n_slots == k
    assert not plan(S30, gpu("16GiB"), PlanOptions(max_context=32768, expert_cache=k + 1)).accepted
    clamp = plan(S30, gpu("64GiB"), PlanOptions(max_context=32768, expert_cache=9000))
    check_invariants(clamp)
    assert clamp.device().cache.n_slots == 6144 and "clamped to 6144" in clamp.notes[0]


def test_explicit_expert_cache_is_exact_and_zero_is_allowed():
    p = plan(S30, gpu("16GiB"), PlanOptions(max_context=32768, expert_cache=1000))
    check_invariants(p)
    assert p.device().cache.n_slots == 1000 and p.device().headroom_bytes > GiB
    none = plan(S30, gpu("16GiB"), PlanOptions(max_context=32768, expert_cache=0))
    check_invariants(none)
    assert none.prefill.mode == "owned" and none.prefill.ring_slots == 350
    assert none.predicted_hit_rate == 0.0


def test_every_expert_resident_needs_no_ring():
    p = plan(S30, gpu("24GiB"), PlanOptions(max_context=32768))
    check_invariants(p)
    assert p.device().cache.n_slots == 6144 and p.predicted_hit_rate == 1.0
    assert (p.prefill.mode, p.prefill.ring_slots, p.prefill.chunk) == ("owned", 0, 16384)


def test_wddm_margins():
    lin = plan(S30, gpu("16GiB"), PlanOptions())
    win = plan(S30, gpu("16GiB", driver_model="wddm"), PlanOptions())
    check_invariants(win)
    assert lin.device().reserve_bytes == 512 * MiB and win.device().reserve_bytes == GiB
    assert win.warnings == ()  # the default margin is the safe one
    big = plan(S30, gpu("48GiB", driver_model="wddm"), PlanOptions())
    assert big.device().reserve_bytes == int(48 * GiB * 0.05) // MiB * MiB
    thin = plan(S30, gpu("16GiB", driver_model="wddm"), PlanOptions(vram_reserve_mib=256))
    check_invariants(thin)
    assert "Prefer No Sysmem Fallback" in thin.warnings[0]
    same_linux = plan(S30, gpu("16GiB"), PlanOptions(vram_reserve_mib=256))
    assert same_linux.warnings == ()


def test_q8_0_and_235b_shapes():
    q8 = plan(S30_Q8, gpu("16GiB"), PlanOptions(max_context=32768))
    check_invariants(q8)
    assert len(set(q8.device().cache.slot_bytes.tolist())) == 1
    s235 = qwen3moe(**QWEN3_235B)
    big = plan(s235, gpu("80GiB"), PlanOptions(max_context=32768))
    check_invariants(big)
    assert not plan(s235, gpu("16GiB"), PlanOptions()).accepted


def test_spec_and_batch_take_their_room():
    base = plan(S30, gpu("16GiB"), PlanOptions(max_context=4096))
    more = plan(S30, gpu("16GiB"), PlanOptions(max_context=4096, spec=4, batch=8))
    check_invariants(more)
    assert more.device().regions["draft"] > 0
    assert more.device().regions["activations"] > base.device().regions["activations"]
    assert more.device().cache.n_slots < base.device().cache.n_slots


def test_one_gpu_planner_points_several_gpus_to_the_split():
    with pytest.raises(PlanInputError, match="plan_split"):
        plan(S30, gpu("16GiB,16GiB"), PlanOptions())
    with pytest.raises(PlanInputError, match="no GPU"):
        plan(S30, [], PlanOptions())


def test_context_default_and_training_warning():
    p = plan(S30, gpu("16GiB"), PlanOptions())
    assert p.kv.max_context == 32768
    long = plan(S30, gpu("80GiB"), PlanOptions(max_context=524288))
    assert "training context" in long.warnings[0]


@pytest.mark.parametrize("seed", range(6))
def test_random_configurations_keep_the_invariant(seed):
    rng = np.random.default_rng(seed)
    for _ in range(8):
        ctx = int(rng.choice([4096, 32768, 131072, 524288]))
        resident = int(rng.choice([ctx, 8192, 65536])) if rng.random() < .4 else None
        streams = resident is not None and resident < ctx  # one sequence only
        opts = PlanOptions(
            max_context=ctx, kv_type=str(rng.choice(["f16", "int8", "q4_0"])),
            kv_resident=resident,
            prefill=PrefillRequest.parse(str(rng.choice(["auto", "auto:4096", "2048", "20480"]))),
            expert_cache=int(rng.integers(0, 7000)) if rng.random() < .3 else None,
            spec=int(rng.integers(0, 5)), batch=1 if streams else int(rng.integers(1, 5)),
            prefill_borrow=bool(rng.random() < .8), lend_pct=int(rng.integers(10, 101)))
        size = f"{int(rng.integers(6, 48))}GiB"
        model = str(rng.choice(["linux", "wddm"]))
        p = plan(S30 if rng.random() < .7 else S30_Q8, gpu(size, driver_model=model), opts)
        if p.accepted:
            check_invariants(p)
        else:
            assert p.refusal.short_by_bytes > 0 and p.refusal.knobs


def test_device_info_validation():
    with pytest.raises(ValueError, match="driver model"):
        DeviceInfo(0, "x", 1, 2, "macos")
    with pytest.raises(ValueError, match="not within"):
        DeviceInfo(0, "x", 3, 2)


def test_batch_holds_one_kv_context_per_sequence():
    one = plan(S30, gpu("80GiB"), PlanOptions(max_context=8192))
    four = plan(S30, gpu("80GiB"), PlanOptions(max_context=8192, batch=4))
    check_invariants(four)
    assert (four.kv.max_context, four.kv.resident_tokens, four.kv.n_seq) == (8192, 8192, 4)
    assert four.device().regions["kv"] == 4 * one.device().regions["kv"]
    assert four.kv.vram_bytes == 4 * one.kv.vram_bytes
    assert four.kv.to_dict()["sequences"] == 4 and one.kv.to_dict()["sequences"] == 1
    with pytest.raises(OptionError, match="streams one sequence's KV"):
        plan(S30, gpu("80GiB"), PlanOptions(max_context=8192, kv_resident=4096, batch=2))


def test_streamed_kv_on_a_layer_split_is_bad_input():
    """Streamed KV runs on one GPU: a split asked to stream is refused by name (exit 1 in the
    CLI), not planned with VRAM rows nothing would map."""
    from strata.plan.split import plan_split
    with pytest.raises(OptionError, match="--kv-resident 8192: KV streamed from host memory runs "
                                          "on one GPU"):
        plan_split(S30, gpu("16GiB") + gpu("16GiB"),
                   PlanOptions(max_context=32768, kv_resident=8192))
