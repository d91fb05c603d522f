"""The prompt-path profiler's accounting over stand-in launchers, a fake event clock and a fake
stream, and `strata bench --backend cuda --profile-prefill` reaching the bench and its table."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

SHAPE = SimpleNamespace(n_head=4, head_dim=8, n_head_kv=2, n_embd=24, n_expert=6, n_vocab=50,
                        n_layer=0)  # q 32, k/v 16, attn_output 24, router 6, head 50
MS = {"rms_norm_f16": 1.0, "dense_matmul": 2.0, "route_tokens": 0.5, "moe_gate_up": 8.0,
      "matvec": 3.0}
SYNC_IDLE_MS, SYNC_HOST_S, LAUNCH_HOST_S = 4.0, 0.002, 0.001


class Gpu:
    """One stream's clock (ms): a launch runs for its launcher's MS, a sync leaves it idle."""

    def __init__(self):
        self.t, self.n_new = 0.0, 0
        self.host = 0.0  # seconds

    def new(self):
        self.n_new += 1
        return SimpleNamespace(t=None)

    def record(self, ev, stream):
        assert stream is STREAM
        ev.t = self.t

    def elapsed_ms(self, a, b):
        return b.t - a.t


class Stream:
    def __init__(self, gpu):
        self.gpu, self.n_sync = gpu, 0

    def synchronize(self):
        self.n_sync += 1


STREAM = None


def _module(gpu):
    def launcher(name):
        def call(*args, **kwargs):
            gpu.t += MS[name]
            gpu.host += LAUNCH_HOST_S
            return name
        return call

    return SimpleNamespace(**{n: launcher(n) for n in MS}, not_a_launcher=object())


def _prompt(mod, stream, gpu, n_layer=2):
    y = {n: np.zeros((3, n), np.float32) for n in (32, 16, 24, 6, 50)}

    def run():
        for _ in range(n_layer):
            mod.rms_norm_f16("x")
            for n in (32, 16, 16, 24, 6):
                mod.dense_matmul("x16", "w", y[n], stream=stream)
            assert mod.route_tokens("ids") == "route_tokens"  # results pass through
            gpu.host += SYNC_HOST_S  # the counts' copy and the sync, as _moe does
            stream.synchronize()
            gpu.t += SYNC_IDLE_MS  # the stream waits for the host's next launch
            mod.moe_gate_up("x16")
        mod.matvec("w", 14, "x", y[50][0], stream=stream)
    return run


@pytest.fixture
def fakes():
    global STREAM
    gpu = Gpu()
    STREAM = Stream(gpu)
    return gpu, STREAM, _module(gpu)


def test_launchers_are_summed_by_unit_and_role_with_idle_gaps_and_host_syncs(fakes):
    from strata.engine.cuda.prefill_profile import EVENTS_PER_LAYER, profile_prefill

    gpu, stream, mod = fakes
    real = dict(vars(mod))
    prof = profile_prefill(_prompt(mod, stream, gpu), stream=stream, shape=SHAPE, module=mod,
                           events=gpu, clock=lambda: gpu.host)
    u = prof["units"]
    assert {k: v["calls"] for k, v in u.items()} == {
        "rms_norm_f16": 2, "dense_matmul q": 2, "dense_matmul k/v": 4,
        "dense_matmul attn_output": 2, "dense_matmul router": 2, "route_tokens": 2,
        "moe_gate_up": 2, "matvec head": 1}
    assert u["dense_matmul k/v"]["ms"] == pytest.approx(8.0)
    assert u["moe_gate_up"]["ms"] == pytest.approx(16.0)
    assert u["matvec head"]["host_ms"] == pytest.approx(1e3 * LAUNCH_HOST_S)
    assert prof["gpu_ms"] == pytest.approx(2 * (1 + 5 * 2 + 0.5 + 8) + 3)
    assert prof["n_launches"] == 2 * 8 + 1
    # the only idle time is after each layer's sync, between route_tokens and moe_gate_up
    assert prof["gaps"]["route_tokens -> moe_gate_up"] == {"ms": 2 * SYNC_IDLE_MS, "calls": 2}
    assert prof["idle_ms"] == pytest.approx(2 * SYNC_IDLE_MS)
    assert prof["span_ms"] == pytest.approx(prof["gpu_ms"] + prof["idle_ms"])
    assert prof["host_sync"]["calls"] == 2
    assert prof["host_sync"]["ms"] == pytest.approx(2e3 * SYNC_HOST_S)
    assert prof["wall_ms"] == pytest.approx(1e3 * (17 * LAUNCH_HOST_S + 2 * SYNC_HOST_S))
    assert prof["launch_host_ms"] == pytest.approx(17e3 * LAUNCH_HOST_S)
    # the pool made up front (64 events for a 0-layer shape) held all 34: none made mid-prompt
    assert gpu.n_new == EVENTS_PER_LAYER
    assert dict(vars(mod)) == real and "synchronize" not in vars(stream)
    assert stream.n_sync == 3  # both layers' syncs reached the real one, and the final one


def test_the_event_pool_grows_past_its_first_size(fakes):
    from strata.engine.cuda.prefill_profile import EVENTS_PER_LAYER, profile_prefill

    gpu, stream, mod = fakes
    n_layer = EVENTS_PER_LAYER // 8 + 1  # 8 launches (16 events) a layer: past the pool
    prof = profile_prefill(_prompt(mod, stream, gpu, n_layer), stream=stream, shape=SHAPE,
                           module=mod, events=gpu, clock=lambda: gpu.host)
    assert prof["n_launches"] == 8 * n_layer + 1
    assert gpu.n_new == 2 * prof["n_launches"] > EVENTS_PER_LAYER
    assert prof["units"]["moe_gate_up"]["ms"] == pytest.approx(8.0 * n_layer)


def test_launchers_and_the_stream_are_restored_when_the_prompt_fails(fakes):
    from strata.engine.cuda.prefill_profile import profile_prefill

    gpu, stream, mod = fakes
    real = dict(vars(mod))

    def boom():
        mod.rms_norm_f16("x")
        raise RuntimeError("prompt failed")

    with pytest.raises(RuntimeError, match="prompt failed"):
        profile_prefill(boom, stream=stream, shape=SHAPE, module=mod, events=gpu,
                        clock=lambda: gpu.host)
    assert dict(vars(mod)) == real and "synchronize" not in vars(stream)


def test_the_prompt_path_imports_every_listed_launcher():
    import strata.engine.cuda.prefill as prefill_mod
    from strata.engine.cuda.prefill_profile import LAUNCHERS

    assert [n for n in LAUNCHERS if not callable(getattr(prefill_mod, n, None))] == []


def _profile(fakes) -> dict:
    from strata.engine.cuda.prefill_profile import profile_prefill

    gpu, stream, mod = fakes
    return profile_prefill(_prompt(mod, stream, gpu), stream=stream, shape=SHAPE, module=mod,
                           events=gpu, clock=lambda: gpu.host)


def test_table_lists_units_largest_first_then_gaps_and_host(fakes):
    from strata.engine.cuda.prefill_profile import profile_table

    lines = profile_table(_profile(fakes), n_tokens=6).splitlines()
    assert "6 tokens, 17 launches" in lines[0] and "stream idle 8.0 ms" in lines[0]
    assert lines[1].split()[:2] == ["moe_gate_up", "16.00"] and "ms/call" in lines[1]
    assert "route_tokens -> moe_gate_up" in "\n".join(lines)
    assert "in 2 stream syncs" in lines[-1]


def test_bench_cli_passes_profile_prefill_and_prints_its_table(fakes, monkeypatch, capsys):
    from strata.cli.main import main

    from strata.bench import engine_cuda

    prof = _profile(fakes)
    seen = {}

    def measure(args, options):
        seen["flag"] = args.profile_prefill
        return {
            "model": "m.gguf", "device": "H200", "gpu_mem_cap": None,
            "bandwidth": {"d2d_gb_per_s": 3000.0, "h2d_gb_per_s": 50.0},
            "device_allocations": {"count": 1, "bytes": [1], "arena_bytes": 1 << 30},
            "prefill": {"tokens": 6, "tokens_per_s": 5000.0, "chunk": 6, "mode": "borrowed",
                        "ring_slots": 0, "bytes_streamed": 0,
                        "pcie_streaming_bound_tokens_per_s": None,
                        "fraction_of_streaming_bound": None,
                        **({"profile": prof} if args.profile_prefill else {})},
            "decode": {"tokens_per_s": 80.0, "bound_tokens_per_s": 100.0,
                       "fraction_of_bound": 0.8, "vram_bytes_per_token": 1e9,
                       "host_bytes_per_token": 0.0, "hit_rate_measured": 1.0,
                       "hit_rate_predicted": 1.0},
            "plan": {"predicted": {"model": "the file's expert ranking"}}}

    monkeypatch.setattr(engine_cuda, "measure", measure)
    argv = ["bench", "--backend", "cuda", "-m", "m.gguf", "--prompt-tokens", "6"]
    assert main(argv + ["--profile-prefill"]) == 0
    out = capsys.readouterr().out
    assert seen["flag"] is True and "prefill profile (6 tokens" in out
    assert main(argv + ["--profile-prefill", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["command"].endswith("--profile-prefill")
    assert res["prefill"]["profile"]["units"]["moe_gate_up"]["calls"] == 2
    assert main(argv) == 0
    assert seen["flag"] is False and "prefill profile" not in capsys.readouterr().out


def test_split_bench_refuses_profile_prefill():
    from argparse import Namespace

    from strata.engine.multi.bench import run_split_cli
    from strata.errors import StrataError

    args = Namespace(model=["m.gguf"], prompt_tokens=4, gen=4, miss_path="mapped",
                     adaptive_cache=False, profile_decode=False, profile_prefill=True)
    with pytest.raises(StrataError, match="--profile-prefill measures the one-GPU engine"):
        run_split_cli(args, SimpleNamespace(devices=(0, 1)))
    args.profile_prefill, args.temperature = False, 0.7
    with pytest.raises(StrataError, match="--temperature measures the one-GPU engine"):
        run_split_cli(args, SimpleNamespace(devices=(0, 1)))


def test_bench_temperature_samples_the_decode_and_is_recorded(monkeypatch, capsys):
    """--temperature T: the bench decodes by sampling at T, unfiltered and seeded by --seed (a
    random model's greedy tokens repeat: a tiny sample of the routing the hit rate measures);
    the command records it; a negative temperature is refused."""
    from argparse import Namespace

    from strata.bench import engine_cuda
    from strata.cli.main import main

    assert engine_cuda.decode_sampling(Namespace(temperature=0.0, seed=3)) is None
    sp = engine_cuda.decode_sampling(Namespace(temperature=1.0, seed=7))
    assert (sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.seed) == (1.0, 0, 1.0, 0.0, 7)
    seen = {}

    def measure(args, options):
        seen["t"] = args.temperature
        return {"model": "m.gguf", "device": "H200", "gpu_mem_cap": None,
                "bandwidth": {"d2d_gb_per_s": 3000.0, "h2d_gb_per_s": 50.0},
                "device_allocations": {"count": 1, "bytes": [1], "arena_bytes": 1 << 30},
                "prefill": {"tokens": 6, "tokens_per_s": 5000.0, "chunk": 6, "mode": "owned",
                            "ring_slots": 0, "bytes_streamed": 0,
                            "pcie_streaming_bound_tokens_per_s": None,
                            "fraction_of_streaming_bound": None},
                "decode": {"tokens": 8, "tokens_per_s": 80.0, "bound_tokens_per_s": 100.0,
                           "fraction_of_bound": 0.8, "vram_bytes_per_token": 1e9,
                           "host_bytes_per_token": 0.0, "hit_rate_measured": 0.5,
                           "hit_rate_predicted": 0.49, "temperature": args.temperature,
                           "n_distinct_tokens": 7},
                "plan": {"predicted": {"model": "the file's expert ranking"}}}

    monkeypatch.setattr(engine_cuda, "measure", measure)
    argv = ["bench", "--backend", "cuda", "-m", "m.gguf", "--prompt-tokens", "6", "--gen", "8"]
    assert main(argv + ["--temperature", "1", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert seen["t"] == 1.0 and "decoded at temperature 1, 7 distinct of 8 tokens" in out
    assert main(argv + ["--temperature", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["command"].endswith("--temperature 1 --seed 0")
    for bad in ("-1", "inf", "nan"):
        assert main(argv + ["--temperature", bad]) != 0
        assert "--temperature must be a finite number >= 0" in capsys.readouterr().err
