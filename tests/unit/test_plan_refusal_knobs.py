"""A refusal's knobs say what following them does: each knob's 'frees' is the short device's
needed bytes less what it needs with that one change (a layer split's pinned stage caches
included), the reserve knob's value fits alone where one does, pinned stage caches get their own
knob and are named by the flag the user gave; and the knob parsing refuses what it cannot run
(split flags with one GPU, `--prefill auto:0`, a zero `--gpu-mem`) with messages that read."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers.moe_shapes import qwen3moe

from strata.cli.main import main
from strata.plan import (
    DeviceInfo, PlanOptions, PrefillRequest, RoutingProfile, parse_gpu_mem, plan,
)
from strata.plan.budget import minimum_bytes
from strata.plan.devices import GiB, MiB, parse_size
from strata.plan.options import OptionError
from strata.plan.refusal import KNOB_GRID, NOT_ENOUGH
from strata.plan.split import SplitOptions, plan_split

S30 = qwen3moe()  # Qwen3-30B-A3B, Q4_K_M
PINNED = SplitOptions(stage_cache=(100000, 100000))


def _follow(options: PlanOptions, split: SplitOptions, flag: str):
    """(options, split) with the knob `flag` applied."""
    name, _, value = flag.partition(" ")
    value = value.split(" (")[0]
    if name == "--kv":
        return replace(options, kv_type=value), split
    if name == "--max-context":
        return replace(options, max_context=int(value)), split
    if name == "--vram-reserve-mib":
        return replace(options, vram_reserve_mib=int(value)), split
    if name == "--spec":
        return replace(options, spec=0), split
    if name == "--expert-cache":
        return replace(options, expert_cache=int(value)), split
    if name == "--stage-cache":
        return options, replace(split, stage_cache=tuple(int(x) for x in value.split(",")))
    if name == "--layer-split":
        return options, replace(split, cuts=tuple(int(x) for x in value.split(",")))
    raise AssertionError(f"unexpected knob {flag}")


def _check_knobs_say_what_they_free(gpus: str, options: PlanOptions, split: SplitOptions):
    """Every knob of a refused split, followed at the refused placement: the short device needs
    exactly `needed - frees` (still refused there) or the plan is accepted, as its note says."""
    devs = parse_gpu_mem(gpus)
    bad = plan_split(S30, devs, options, split)
    assert not bad.accepted
    r, cuts = bad.refusal, bad.placement.cuts
    assert r.knobs and [k.frees_bytes for k in r.knobs] == sorted(
        (k.frees_bytes for k in r.knobs), reverse=True)
    for k in r.knobs:
        opts, sp = _follow(options, replace(split, cuts=cuts), k.flag)
        after = plan_split(S30, devs, opts, sp)
        if NOT_ENOUGH in k.note:
            assert not after.accepted, k
        else:
            assert after.accepted, k
        if not after.accepted and after.refusal.device_index == r.device_index:
            assert after.refusal.needed_bytes == r.needed_bytes - k.frees_bytes, k
    return bad


def test_pinned_stage_caches_price_every_knob_with_the_pin():
    """QA: `--gpu-mem 8GiB,8GiB --stage-cache 100000,100000` was short by 2.94 GiB, yet offered
    `--kv q4_0 (frees 8.74 GiB)` and a 256 MiB reserve 'freeing' 7.91 GiB: the knobs were priced
    without the pinned caches the refusal's 'needed' had. Following `--kv q4_0` stayed refused."""
    bad = _check_knobs_say_what_they_free("8GiB,8GiB", PlanOptions(), PINNED)
    r, stage = bad.refusal, bad.stages[0]
    assert r.device_index == 0 and 2.9 * GiB < r.short_by_bytes < 3 * GiB
    by = {k.flag.split(" (")[0]: k for k in r.knobs}
    # a lighter KV frees at most the stage's whole KV, a reserve at most the reserve above 256 MiB
    assert by["--kv q4_0"].frees_bytes < stage.device_plan.regions["kv"]
    assert by["--kv q4_0"].note == NOT_ENOUGH
    assert by["--vram-reserve-mib 256"].frees_bytes == 256 * MiB
    # the reason names the flag the user gave, not --expert-cache
    assert "--stage-cache 100000" in r.reason and "--expert-cache" not in r.reason


def test_pinned_stage_caches_get_the_largest_caches_that_fit():
    bad = plan_split(S30, parse_gpu_mem("8GiB,8GiB"), PlanOptions(), PINNED)
    knob = next(k for k in bad.refusal.knobs if k.flag.startswith("--stage-cache "))
    assert knob.note == "" and knob.frees_bytes >= bad.refusal.short_by_bytes
    slots = tuple(int(x) for x in knob.flag.split()[1].split(","))
    assert len(slots) == 2 and all(0 < n < 24 * 128 for n in slots)
    devs, cuts = parse_gpu_mem("8GiB,8GiB"), bad.placement.cuts
    ok = plan_split(S30, devs, PlanOptions(), SplitOptions(stage_cache=slots))
    assert ok.accepted
    assert [s.device_plan.cache.n_slots for s in ok.stages] == list(slots)
    for g in range(2):  # the largest: one more slot on either stage does not fit
        more = tuple(n + (i == g) for i, n in enumerate(slots))
        over = plan_split(S30, devs, PlanOptions(), SplitOptions(cuts=cuts, stage_cache=more))
        assert not over.accepted and over.refusal.device_index == g


def test_caches_pinned_by_expert_cache_keep_their_flag():
    """`--expert-cache N` pins every stage alike: its reason and its knob say --expert-cache."""
    bad = _check_knobs_say_what_they_free("8GiB,8GiB", PlanOptions(expert_cache=3000),
                                          SplitOptions())
    r = bad.refusal
    assert "--expert-cache 3000 needs" in r.reason and "--stage-cache" not in r.reason
    knob = next(k for k in r.knobs if k.flag.startswith("--expert-cache "))
    assert knob.note == "" and not any(k.flag.startswith("--stage-cache") for k in r.knobs)


def test_split_knobs_without_pins_still_say_what_they_free():
    _check_knobs_say_what_they_free("8GiB,2GiB", PlanOptions(max_context=4096),
                                    SplitOptions(cuts=(10,)))


@pytest.mark.parametrize("ctx, cuts", [(131072, (24,)), (262144, None)])
def test_the_split_context_knob_is_the_largest_that_fits(ctx, cuts):
    """QA: a refused split halved --max-context: 131072 over 8GiB,8GiB at 24 (one card 24 MiB
    short) got `--max-context 65536`, and 262144 (no placement fits; the even split shown) got
    131072, which fits the short card but not the other. The knob is now the largest context on
    the 1,024-token grid at which every stage of the refused placement is planned."""
    devs, opts = parse_gpu_mem("8GiB,8GiB"), PlanOptions(max_context=ctx)
    bad = plan_split(S30, devs, opts, SplitOptions(cuts=cuts))
    assert not bad.accepted
    knob = next(k for k in bad.refusal.knobs if k.flag.startswith("--max-context "))
    n = int(knob.flag.split()[1])
    assert knob.note == "" and n % KNOB_GRID == 0 and knob.frees_bytes > 0
    at = SplitOptions(cuts=bad.placement.cuts)
    assert plan_split(S30, devs, replace(opts, max_context=n), at).accepted
    assert not plan_split(S30, devs, replace(opts, max_context=n + KNOB_GRID), at).accepted
    # followed as given (the placement searched again where it was), the plan is accepted
    assert plan_split(S30, devs, replace(opts, max_context=n), SplitOptions(cuts=cuts)).accepted


def test_a_split_context_that_no_stage_plan_fits_says_so():
    """Where no context on the grid lets every stage fit, the knob offers a quarter of it and
    says it is not enough alone (as the one-GPU knob does)."""
    bad = plan_split(S30, parse_gpu_mem("8GiB,2GiB"), PlanOptions(max_context=8192),
                     SplitOptions(cuts=(10,)))
    knob = next(k for k in bad.refusal.knobs if k.flag.startswith("--max-context "))
    assert knob.flag == "--max-context 2048" and knob.note == NOT_ENOUGH


def _short_by(short: int, options: PlanOptions = PlanOptions(max_context=4096)):
    big = DeviceInfo(0, "x", 64 * GiB, 64 * GiB)  # the need does not depend on the free bytes
    free = minimum_bytes(S30, big, options, RoutingProfile.uniform(48, 128)) - short
    return DeviceInfo(0, "x", free, free), options


@pytest.mark.parametrize("short", [26 * MiB + 838 * 1024, 1, MiB, MiB + 1, 255 * MiB + 7])
def test_the_reserve_knob_is_the_gentlest_that_fits_alone(short):
    """QA: short by 26.8 MiB, the knob said `--vram-reserve-mib 486` (26 MiB: still 838 KiB
    short) where 485 fits. The value is the largest whole MiB that fits, checked in bytes."""
    dev, opts = _short_by(short)
    r = plan(S30, [dev], opts).refusal
    assert r.short_by_bytes == short
    knob = next(k for k in r.knobs if k.flag.startswith("--vram-reserve-mib "))
    mib = int(knob.flag.split()[1])
    assert knob.note == "" and knob.frees_bytes >= short
    assert mib == 512 - -(-short // MiB)
    assert plan(S30, [dev], replace(opts, vram_reserve_mib=mib)).accepted
    assert not plan(S30, [dev], replace(opts, vram_reserve_mib=mib + 1)).accepted


def test_the_reserve_knob_that_cannot_fit_alone_says_so():
    dev, opts = _short_by(300 * MiB)
    knob = next(k for k in plan(S30, [dev], opts).refusal.knobs
                if k.flag.startswith("--vram-reserve-mib "))
    assert knob.flag == "--vram-reserve-mib 256" and knob.note == NOT_ENOUGH
    assert knob.frees_bytes == 256 * MiB
    wddm = replace(dev, driver_model="wddm", total_bytes=dev.free_bytes)
    knob = next(k for k in plan(S30, [wddm], opts).refusal.knobs
                if k.flag.startswith("--vram-reserve-mib "))
    assert knob.note.startswith(NOT_ENOUGH) and "Prefer No Sysmem Fallback" in knob.note


# -- the knob parsing ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from strata.synth import preset, write_model

    path = tmp_path_factory.mktemp("knobs") / "tiny.gguf"
    write_model(path, preset("tiny"), progress=False)
    return str(path)


def test_tiny_reserve_hint_is_followed_to_an_accepted_plan(capsys, tiny):
    assert main(["plan", "-m", tiny, "--dry-run", "--gpu-mem", "1GiB", "--json"]) == 3
    knobs = json.loads(capsys.readouterr().out)["refusal"]["knob_bytes"]
    flag = next(k["knob"] for k in knobs if k["knob"].startswith("--vram-reserve-mib "))
    mib = flag.split()[1]
    assert main(["plan", "-m", tiny, "--gpu-mem", "1GiB", "--vram-reserve-mib", mib]) == 0
    assert main(["plan", "-m", tiny, "--gpu-mem", "1GiB",
                 "--vram-reserve-mib", str(int(mib) + 1)]) == 3
    capsys.readouterr()


@pytest.mark.parametrize("argv,flags", [
    (["--stage-cache", "10"], "--stage-cache"),
    (["--gpu-bandwidth", "100"], "--gpu-bandwidth"),
    (["--no-helper-tiers"], "--no-helper-tiers"),
    (["--no-carve"], "--no-carve"),
    (["--handoff", "host"], "--handoff"),
    (["--cover-b", "2"], "--cover-b"),
    (["--layer-split", "2"], "--layer-split"),
    (["--cover-b", "2", "--no-carve"], "--cover-b, --no-carve"),
])
def test_split_flags_with_one_gpu_are_refused(capsys, tiny, argv, flags):
    """README: 'Split flags with one GPU are refused' — all of them, as --layer-split was."""
    assert main(["plan", "-m", tiny, "--gpu-mem", "8GiB", *argv]) == 2
    err = capsys.readouterr().err
    assert f"{flags}: a layer split's flag" in err and "one GPU runs every layer" in err
    # the same flags are fine over two GPUs (--stage-cache then needs a value per GPU)
    two = [a if a != "10" else "10,10" for a in argv]
    two = [a if a != "100" else "100,100" for a in two]
    assert main(["plan", "-m", tiny, "--gpu-mem", "8GiB,8GiB", *two]) == 0
    capsys.readouterr()


def test_split_flags_at_their_defaults_are_fine_with_one_gpu(capsys, tiny):
    assert main(["plan", "-m", tiny, "--gpu-mem", "8GiB", "--layer-split", "auto",
                 "--handoff", "auto", "--gpus", "0"]) == 0
    capsys.readouterr()


def test_the_engines_refuse_the_same_split_flags():
    """`generate`, `bench` and `serve` refuse one GPU's split flags through
    strata.engine.multi.request: its list must be the planner's."""
    from strata.engine.multi import request
    from strata.plan.split import knobs

    assert request.SPLIT_ONLY == knobs.SPLIT_ONLY


@pytest.mark.parametrize("argv,match", [
    (["--prefill", "auto:0"], "auto's ceiling must be a positive multiple of 256"),
    (["--prefill", "auto:-256"], "auto's ceiling must be positive"),
    (["--prefill", "0"], "chunk must be positive"),
    (["--prefill", "100"], "chunk 100 is not a multiple of 256 (try 256)\n"),
    (["--prefill", "300"], "(try 256 or 512)"),
    (["--gpu-mem", "0"], "size '0' must be positive"),
    (["--gpu-mem", "0GiB"], "size '0GiB' must be positive"),
    (["--gpu-mem", "8GiB", "--gpus", "1"],
     "--gpus 1: no GPU 1 (--gpu-mem plans GPU 0 only; --gpus picks its sizes by position"),
    (["--gpu-mem", "8GiB,8GiB", "--gpus", "0,2"], "no GPU 2 (--gpu-mem plans GPUs 0, 1;"),
])
def test_bad_knobs_are_named_plainly(capsys, tiny, argv, match):
    assert main(["plan", "-m", tiny, *(["--gpu-mem", "8GiB"] if "--gpu-mem" not in argv
                                       else []), *argv]) == 2
    assert match in capsys.readouterr().err


def test_prefill_parse():
    with pytest.raises(OptionError, match="auto's ceiling must be a positive multiple"):
        PrefillRequest.parse("auto:0")
    assert PrefillRequest.parse("auto") == PrefillRequest(True, 0)
    assert PrefillRequest.parse("auto:512").ceiling == 512
    with pytest.raises(OptionError) as e:
        PrefillRequest.parse("100")
    assert "256 or 256" not in str(e.value) and str(e.value).endswith("(try 256)")
    with pytest.raises(ValueError, match="must be positive"):
        parse_size("0")
    assert parse_size("16GiB") == 16 * GiB


def test_a_layer_split_knob_that_leaves_another_card_short_says_so():
    """QA: 131072 tokens over 8GiB,8GiB at --layer-split 24 offered `--layer-split 25` as enough
    alone; followed, the other card was refused. A --layer-split knob is enough alone only where
    every stage of the placement it makes is planned."""
    devs, opts = parse_gpu_mem("8GiB,8GiB"), PlanOptions(max_context=131072)
    bad = plan_split(S30, devs, opts, SplitOptions(cuts=(24,)))
    assert not bad.accepted
    splits = [k for k in bad.refusal.knobs if k.flag.startswith("--layer-split ")]
    assert splits
    for k in splits:
        cuts = tuple(int(c) for c in k.flag.split()[1].split(","))
        ok = plan_split(S30, devs, opts, SplitOptions(cuts=cuts)).accepted
        assert (k.note == "") == ok, k
    assert any(k.note == NOT_ENOUGH for k in splits)


@pytest.mark.parametrize("gpus, ctx", [("8GiB,8GiB", 262144), ("5GiB,5GiB", 131072),
                                       ("4GiB,4GiB,4GiB", 262144)])
def test_every_split_knob_said_enough_alone_is_accepted_when_followed(gpus, ctx):
    """QA: a split's knobs other than the context and the layer split were priced on the short
    card alone: at 262144 tokens over 8GiB,8GiB `--kv int8` (frees 5.91 GiB) was offered as
    enough, and followed, the other card was refused. Each knob said to be enough alone must
    now plan the whole placement, and each said not to must not."""
    devs, opts = parse_gpu_mem(gpus), PlanOptions(max_context=ctx)
    bad = plan_split(S30, devs, opts, SplitOptions())
    assert not bad.accepted
    at = SplitOptions(cuts=bad.placement.cuts)
    follow = {"--kv": "kv_type", "--vram-reserve-mib": "vram_reserve_mib",
              "--max-context": "max_context"}
    checked = 0
    for k in bad.refusal.knobs:
        flag, _, value = k.flag.partition(" ")
        if flag not in follow:
            continue
        v = value.split()[0]
        changed = replace(opts, **{follow[flag]: v if flag == "--kv" else int(v)})
        assert k.note.startswith(NOT_ENOUGH) != plan_split(S30, devs, changed, at).accepted, k
        checked += 1
    assert checked >= 2
