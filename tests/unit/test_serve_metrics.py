"""Metrics: the Prometheus text exposition, the live rate window, and the device cards built
from a real VRAM plan of the tiny model."""

from __future__ import annotations

import re

import pytest

from strata.serve.devices import cpu_report, plan_reports
from strata.serve.metrics import DeviceReport, Metrics, Region

LINE = re.compile(r'^(strata_[a-z_]+)(\{([a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*)\})? (\S+)$')


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def parse(text: str) -> dict[str, float]:
    """Every sample line as {"name{labels}": value}; every line must be valid exposition."""
    samples, typed = {}, set()
    for line in text.strip().split("\n"):
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge")
            typed.add(name)
            continue
        m = LINE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        assert m.group(1) in typed, f"{m.group(1)} has no TYPE line"
        samples[line.rsplit(" ", 1)[0]] = float(m.group(5))
    return samples


def test_exposition_counts_everything():
    clock = Clock()
    m = Metrics(clock)
    m.record_request("/v1/messages", 200)
    m.record_request("/v1/messages", 200)
    m.record_request("/v1/messages", 400)
    m.record_prefill(30, 0.5)
    m.record_decode(4, 0.01)
    m.record_decode(3, 0.01, n_device_picked=2)  # two picked on the GPU, one on the host
    m.record_finish("length", 7)
    m.record_finish("cancelled", 2, cancelled_in="running")
    m.set_load(queue_depth=3, active=2, n_slots=4)
    s = parse(m.render())
    assert s['strata_requests_total{route="/v1/messages",status="200"}'] == 2
    assert s['strata_requests_total{route="/v1/messages",status="400"}'] == 1
    assert s["strata_prompt_tokens_total"] == 30
    assert s["strata_completion_tokens_total"] == 9
    assert s['strata_requests_cancelled_total{where="running"}'] == 1
    assert s['strata_requests_cancelled_total{where="queued"}'] == 0
    assert s['strata_requests_finished_total{reason="length"}'] == 1
    assert s['strata_decode_tokens_total{picked="device"}'] == 2
    assert s['strata_decode_tokens_total{picked="host"}'] == 5
    assert (s["strata_queue_depth"], s["strata_active_sequences"], s["strata_slots"]) == (3, 2, 4)


def test_values_are_written_in_full():
    m = Metrics(Clock())
    m.record_prefill(1_063_281, 0.1 + 0.2)  # past a million: six digits would round it
    m.record_decode(7, 1 / 3)
    big = DeviceReport(device="cpu", label="CPU", regions=(Region("kv", 134_217_729),),
                       expert_hit_rate=float("nan"))
    text = Metrics.render(m, [big])
    assert "\nstrata_prompt_tokens_total 1063281\n" in text
    assert '\nstrata_region_bytes{device="cpu",region="kv"} 134217729\n' in text
    assert f"\nstrata_prefill_seconds_total {0.1 + 0.2!r}\n" in text  # 0.30000000000000004
    assert f"\nstrata_decode_seconds_total {1 / 3!r}\n" in text
    assert '\nstrata_expert_cache_hit_ratio{device="cpu"} NaN\n' in text
    s = parse(text)
    assert s["strata_prompt_tokens_total"] == 1_063_281
    assert s["strata_prefill_seconds_total"] == 0.1 + 0.2


def test_rates_cover_the_last_window_only():
    clock = Clock()
    m = Metrics(clock)
    clock.t += 10  # the server has been up longer than the window
    for _ in range(5):
        m.record_decode(4, 0.01)
    assert m.rate("decode") == pytest.approx(20 / 5.0)
    m.record_prefill(100, 0.2)
    assert m.rate("prefill") == pytest.approx(100 / 5.0)
    clock.t += 6
    assert m.rate("decode") == 0.0 and m.rate("prefill") == 0.0
    assert m.snapshot()["decode_tok_s"] == 0.0


def test_label_values_are_escaped():
    m = Metrics(Clock())
    m.record_request('/a"b\\c', 404)
    assert 'route="/a\\"b\\\\c"' in m.render()


def test_device_families():
    dev = DeviceReport(device="cuda:0", label="GPU", regions=(Region("kv", 1024),),
                       layers=(0, 4), total_bytes=8, used_bytes=3, free_bytes=5, expert_slots=9,
                       expert_hit_rate=0.25)
    s = parse(Metrics(Clock()).render([dev]))
    assert s['strata_region_bytes{device="cuda:0",region="kv"}'] == 1024
    assert s['strata_vram_free_bytes{device="cuda:0"}'] == 5
    assert s['strata_expert_cache_slots{device="cuda:0"}'] == 9
    assert s['strata_expert_cache_hit_ratio{device="cuda:0"}'] == 0.25
    cpu = parse(Metrics(Clock()).render([DeviceReport(device="cpu", label="CPU")]))
    assert not any("vram" in k or "expert" in k for k in cpu)  # nothing measured, nothing shown


def test_gpu_cards_come_from_the_plan(tmp_models):
    from strata.gguf import open_model
    from strata.plan import DeviceInfo, PlanOptions, plan
    from strata.synth import preset, write_model

    path = tmp_models / "metrics-tiny.gguf"
    write_model(path, preset("tiny"), progress=False)
    p = plan(open_model(path).shape,
             [DeviceInfo(index=0, name="NVIDIA H200", free_bytes=8 << 30, total_bytes=16 << 30)],
             PlanOptions())
    (card,) = plan_reports(p, nvml=lambda i: (16 << 30, 3 << 30, 13 << 30), hit_rates={0: 0.5})
    d = p.devices[0]
    assert card.device == "cuda:0" and card.label == "NVIDIA H200"
    assert card.layers == tuple(d.layers)
    assert {r.name: r.n_bytes for r in card.regions} == {k: v for k, v in d.regions.items() if v}
    assert (card.used_bytes, card.free_bytes) == (3 << 30, 13 << 30)
    assert card.expert_slots == d.cache.n_slots and card.expert_hit_rate == 0.5
    (blind,) = plan_reports(p, nvml=lambda i: None)
    assert blind.total_bytes is None and blind.expert_hit_rate is None


def test_cpu_card_sums_the_slots_kv():
    class Kv:
        n_bytes = 1000

    class Eng:
        kv = Kv()

    card = cpu_report(5000, [Eng(), Eng()])
    assert card.device == "cpu"
    assert [(r.name, r.n_bytes) for r in card.regions] == [("weights (mapped)", 5000),
                                                           ("kv (2 slots)", 2000)]
