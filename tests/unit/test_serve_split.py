"""`strata serve` over a layer split, without a GPU: which GPUs the server runs on (one, unless
several are named; a split refuses --batch > 1 and split knobs need several GPUs), the split
knobs in a config file, the one-slot `SplitSlot` (hit counters copied on the worker's thread),
and the monitor's hit rate per GPU over the layers each runs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from strata.errors import UsageError
from strata.plan.options import OptionError
from strata.serve.batch import SplitSlot
from strata.serve.config import ServeConfig, ServeConfigError, build_config
from strata.serve.engines import gpu_choice


def _cfg(**kw) -> ServeConfig:
    return ServeConfig(model="m.gguf", **kw)


@pytest.mark.parametrize("kw,devices,caps", [
    ({}, (0,), (None,)),                                      # 4 visible: still GPU 0 alone
    ({"gpus": "2", "gpu_mem": "8GiB"}, (2,), (8 << 30,)),
    ({"gpus": "1,3"}, (1, 3), (None, None)),
    ({"gpu_mem": "12GiB,16GiB"}, (0, 1), (12 << 30, 16 << 30)),
    ({"gpus": "3,0", "gpu_mem": "12GiB", "layer_split": "7", "handoff": "host"}, (3, 0),
     (12 << 30, 12 << 30)),
])
def test_the_server_splits_only_over_the_gpus_it_is_given(kw, devices, caps):
    req = gpu_choice(_cfg(**kw), 4)
    assert (req.devices, req.gpu_mem) == (devices, caps)
    assert req.is_split == (len(devices) > 1)
    if "layer_split" in kw:
        assert req.split.cuts == (7,) and req.split.handoff == "host"


@pytest.mark.parametrize("kw,err,match", [
    ({"gpus": "0,1", "batch": 4}, OptionError, "one sequence at a time"),
    ({"layer_split": "10"}, OptionError, "--layer-split: a layer split's knobs"),
    ({"gpus": "1", "no_carve": True}, OptionError, "--no-carve"),
    ({"gpus": "0,5"}, OptionError, "no GPU 5"),
    ({"gpu_mem": "8GiB,8GiB,8GiB"}, OptionError, "3 sizes for 2 GPUs"),
])
def test_bad_gpu_choices_are_refused_with_what_is_wrong(kw, err, match):
    with pytest.raises(err, match=match) as e:
        gpu_choice(_cfg(**kw), 2)
    assert isinstance(e.value, UsageError)  # `strata serve` exits 2, as for any bad flag


def test_split_knobs_from_a_config_file(tmp_path):
    f = tmp_path / "serve.json"
    f.write_text(json.dumps({"model": "m.gguf", "gpus": "0,1", "layer-split": "12",
                             "cover-b": 2, "no-helper-tiers": True}))
    cfg = build_config({"handoff": "host", "no_carve": None}, str(f))
    assert (cfg.gpus, cfg.layer_split, cfg.cover_b, cfg.no_helper_tiers) == ("0,1", "12", 2.0,
                                                                             True)
    assert (cfg.handoff, cfg.no_carve) == ("host", False)
    f.write_text(json.dumps({"model": "m.gguf", "cover_b": "steep"}))
    with pytest.raises(ServeConfigError, match="cover_b: expected a number"):
        build_config({}, str(f))


class _FakeSplit:
    """What `SplitSlot` drives: a single-sequence engine with device-side hit counters."""

    def __init__(self):
        self.shape = SimpleNamespace(n_layer=3)
        self.max_context = 64
        self.calls, self.reads, self.n = [], 0, 0

    def reset(self):
        self.calls.append("reset")

    def prefill(self, tokens):
        self.calls.append(("prefill", list(tokens)))
        return np.arange(5, dtype=np.float32)

    def decode_step(self, token):
        self.calls.append(("step", token))
        self.n += 1
        return np.full(5, token, np.float32)

    def hits(self):
        self.reads += 1
        return SimpleNamespace(counts=np.array([[self.n, 1], [0, 0], [2, 0]], np.int64))


def test_split_slot_copies_its_hit_counters_on_the_worker_thread():
    eng = _FakeSplit()
    slot = SplitSlot(eng)
    assert (slot.n_slots, slot.max_context) == (1, 64)
    assert slot.prefill(0, [4, 5]).tolist() == [0, 1, 2, 3, 4]
    for t in range(SplitSlot.HIT_EVERY - 1):
        assert slot.decode([0], [t]).shape == (1, 5)
    assert eng.reads == 0 and slot.hit_counts().sum() == 0  # not copied yet
    slot.decode([0], [9])
    assert eng.reads == 1 and slot.hit_counts()[0, 0] == SplitSlot.HIT_EVERY
    slot.decode([0], [9])
    slot.release(0)  # a sequence's end copies them too
    assert eng.reads == 2 and slot.hit_counts()[0, 0] == SplitSlot.HIT_EVERY + 1
    assert eng.calls[0] == "reset" and eng.calls[-1] == "reset"
    with pytest.raises(IndexError):
        slot.prefill(1, [1])


def test_the_monitor_gives_each_gpu_the_hit_rate_of_its_own_layers(monkeypatch):
    from strata.serve import devices, server

    plan = SimpleNamespace(devices=[
        SimpleNamespace(device=SimpleNamespace(index=3, name="A"), layers=(0, 2), regions={},
                        cache=SimpleNamespace(n_slots=1)),
        SimpleNamespace(device=SimpleNamespace(index=1, name="B"), layers=(2, 3), regions={},
                        cache=SimpleNamespace(n_slots=1))])
    counts = np.array([[3, 1], [0, 4], [5, 0]], np.int64)
    engine = SimpleNamespace(hit_counts=lambda: counts)
    monkeypatch.setattr(devices, "nvml_memory", lambda index: None)
    monkeypatch.setattr(server, "plan_reports", lambda p, hit_rates: hit_rates, raising=False)
    rates = server._devices_reader(engine, 0, plan)()
    assert rates == {3: 3 / 8, 1: 1.0}
