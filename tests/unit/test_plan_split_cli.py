"""`strata plan` over several GPUs: one table per device, the JSON's devices with their layer
ranges, --gpus, --layer-split, the carve's kill switch and bad input (exit 1)."""

from __future__ import annotations

import json

import pytest
from helpers import ggufmake
from strata.cli.main import main


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return ggufmake.write(tmp_path_factory.mktemp("split") / "m.gguf", n_ctx=4096, n_layer=6)


def run_json(capsys, *argv):
    rc = main(["plan", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_one_table_per_device(capsys, model):
    rc = main(["plan", "-m", model, "--dry-run", "--gpu-mem", "2GiB,1600MiB,1800MiB"])
    out = capsys.readouterr().out
    assert rc == 0 and "accepted" in out
    for i in range(3):
        assert f"GPU {i}: planned" in out
    assert out.count("helper_tier") == 3 and out.count("stage cache:") == 3
    assert "layer split" in out and "placements" in out and "predicted decode hit rate" in out


def test_json_lists_each_device_with_its_layers(capsys, model):
    rc, d = run_json(capsys, "-m", model, "--gpu-mem", "2GiB,2GiB", "--layer-split", "2")
    assert rc == 0 and d["accepted"] and d["split"]["how"] == "explicit"
    assert [dev["layers"] for dev in d["devices"]] == [[0, 2], [2, 6]]
    assert [dev["stage"]["layers"] for dev in d["devices"]] == [[0, 2], [2, 6]]
    for dev in d["devices"]:
        assert sum(dev["regions"].values()) == dev["planned_bytes"] <= dev["budget_bytes"]
        assert "helper_tier" in dev and "helper_tier" in dev["regions"]
    assert d["prefill"]["chunk"] == d["devices"][0]["stage"]["prefill"]["chunk"]


def test_gpus_pick_and_order_the_cards(capsys, model):
    rc, d = run_json(capsys, "-m", model, "--gpu-mem", "1GiB,2GiB,3GiB", "--gpus", "2,1")
    assert rc == 0 and [dev["index"] for dev in d["devices"]] == [2, 1]
    rc, d = run_json(capsys, "-m", model, "--gpu-mem", "1GiB,2GiB,3GiB", "--gpus", "1")
    assert rc == 0 and len(d["devices"]) == 1 and "split" not in d  # the single-GPU contract


def test_carve_kill_switch(capsys, model, monkeypatch):
    argv = ("-m", model, "--gpu-mem", "2GiB,2GiB", "--layer-split", "3", "--no-helper-tiers")
    _, on = run_json(capsys, *argv)
    _, off = run_json(capsys, *argv, "--no-carve")
    monkeypatch.setenv("STRATA_WEIGHT_CARVE", "0")
    _, env = run_json(capsys, *argv)
    for a, b, c in zip(on["devices"], off["devices"], env["devices"]):
        assert b["regions"]["weights"] == c["regions"]["weights"] > a["regions"]["weights"]
        assert b["stage"]["carve_frees_bytes"] == 0 < a["stage"]["carve_frees_bytes"]
    assert off["split"]["carve"] is False


def test_each_table_names_its_layers_and_the_handoff(capsys, model):
    argv = ("-m", model, "--gpu-mem", "2GiB,2GiB", "--layer-split", "2")
    assert main(["plan", *argv, "--handoff", "host"]) == 0
    out = capsys.readouterr().out
    assert "layers 0-1 (2)" in out and "layers 2-5 (4)" in out
    assert "through pinned host memory (--handoff host)" in out
    _, auto = run_json(capsys, *argv)
    _, host = run_json(capsys, *argv, "--handoff", "host")
    assert (auto["split"]["handoff"], host["split"]["handoff"]) == ("auto", "host")


@pytest.mark.parametrize("argv,match", [
    (["--gpu-mem", "2GiB,2GiB", "--layer-split", "2,4"], "need 1 stage starts"),
    (["--gpu-mem", "2GiB,2GiB", "--layer-split", "x"], "whole numbers"),
    (["--gpu-mem", "2GiB,2GiB", "--layer-split", "6"], "past the model's last layer"),
    (["--gpu-mem", "2GiB,2GiB", "--gpus", "0,0"], "distinct"),
    (["--gpu-mem", "2GiB,2GiB", "--gpus", "3"], "no GPU 3"),
    (["--gpu-mem", "2GiB", "--layer-split", "3"], "one GPU runs every layer"),
    (["--gpu-mem", "2GiB,2GiB", "--cover-b", "-1"], "--cover-b"),
    (["--gpu-mem", "2GiB,2GiB", "--gpu-bandwidth", "1,a"], "--gpu-bandwidth"),
])
def test_bad_split_input_exits_2(capsys, model, argv, match):
    assert main(["plan", "-m", model, *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("knobs,match", [
    ({"miss_path": "cpu"}, "--miss-path cpu"), ({"miss_path": "hybrid"}, "--miss-path hybrid"),
    ({"adaptive_cache": True}, "--adaptive-cache"), ({"profile_decode": True}, "--profile-decode"),
])
def test_split_bench_refuses_the_one_gpu_engines_knobs(model, knobs, match):
    from argparse import Namespace
    from types import SimpleNamespace

    from strata.engine.multi.bench import run_split_cli
    from strata.errors import StrataError

    args = Namespace(model=[model], prompt_tokens=4, gen=4, **{
        "miss_path": "mapped", "adaptive_cache": False, "profile_decode": False, **knobs})
    with pytest.raises(StrataError, match=match):
        run_split_cli(args, SimpleNamespace(devices=(0, 1)))


@pytest.mark.parametrize("argv,match", [
    (["--ab", "even,sideways"], "unknown arm(s) sideways"),
    (["--gpu-mem", "1GiB,1GiB,1GiB,1GiB,1GiB,1GiB,1GiB,1GiB,1GiB"], "names 9 GPUs"),
])
def test_split_bench_checks_its_arms_and_gpu_count(model, capsys, argv, match):
    from strata.engine.multi.bench import main as bench_main

    with pytest.raises(SystemExit):
        bench_main([model, "--out", "/dev/null", *argv])
    assert match in capsys.readouterr().err
