"""`strata plan`: the JSON contract, exit codes (0 accepted, 3 refused, 2 a bad flag, 1 a failed
run), --gpu-mem parsing, NVML (faked) and its absence, --device and --driver-model with the other
way of finding GPUs, profiles, a sparse 235B header, and no numba import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import ggufmake
from strata.cli.main import main
from strata.plan import parse_gpu_mem, parse_size
from strata.plan.devices import GiB, MiB, SizeError


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return ggufmake.write(tmp_path_factory.mktemp("plan") / "small.gguf", n_ctx=4096)


def run_json(capsys, *argv):
    rc = main(["plan", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_json_contract_accepted(capsys, small):
    rc, d = run_json(capsys, "-m", small, "--dry-run", "--gpu-mem", "2GiB")
    assert rc == 0 and d["accepted"] is True and d["refusal"] is None
    dev = d["devices"][0]
    for key in ("index", "name", "budget_bytes", "planned_bytes", "layers", "regions",
                "expert_cache_slots", "expert_slot_bytes"):
        assert key in dev
    for key in ("weights", "kv", "activations", "prompt", "ring", "expert_cache", "reserve"):
        assert isinstance(dev["regions"][key], int)
    assert dev["layers"] == [0, 2] and dev["budget_bytes"] == 2 * GiB
    assert sum(dev["regions"].values()) == dev["planned_bytes"] <= dev["budget_bytes"]
    assert set(d["prefill"]) >= {"chunk", "mode", "lend_slots", "ring_slots"}
    assert d["prefill"]["mode"] in ("owned", "borrowed")
    assert set(d["kv"]) >= {"type", "max_context", "bytes_per_token", "resident_tokens"}
    assert d["kv"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # K+V, 2 layers, 2 heads, 16, f16
    assert 0 <= d["predicted"]["expert_hit_rate"] <= 1


def test_refused_exit_3_with_knobs(capsys, small):
    rc, d = run_json(capsys, "-m", small, "--gpu-mem", "700MiB")
    assert rc == 3 and d["accepted"] is False
    r = d["refusal"]
    assert r["short_by_bytes"] == r["needed_bytes"] - r["free_bytes"] > 0
    assert r["free_bytes"] == 700 * MiB
    assert any(k.startswith("--vram-reserve-mib") for k in r["knobs"])
    rc = main(["plan", "-m", small, "--gpu-mem", "700MiB"])
    out = capsys.readouterr().out
    assert rc == 3 and "refused:" in out and "short by" in out and "--vram-reserve-mib" in out


@pytest.mark.parametrize("argv,match", [
    (["--gpu-mem", "16Q"], "'16Q'"),
    (["--gpu-mem", "16GiB,,8GiB"], "separated by commas"),
    (["--gpu-mem", "16"], "needs a unit"),
    (["--prefill", "1000"], "not a multiple of 256"),
    (["--expert-cache", "lots"], "--expert-cache 'lots'"),
    (["--gpu-mem", "16GiB,16GiB,16GiB"], "3 GPUs for 2 layers"),
    (["--gpu-mem", "8GiB", "--kv-resident", "10"], "--kv-resident"),
])
def test_bad_flags_exit_2(capsys, small, argv, match):
    rc = main(["plan", "-m", small, *argv])
    assert rc == 2
    assert match in capsys.readouterr().err


def test_argparse_errors_exit_2_and_files_exit_1(capsys, small, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["plan", "-m", small, "--max-context", "abc"])
    assert e.value.code == 2 and "invalid int value: 'abc'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["plan", "--gpu-mem", "8GiB"])  # no -m
    assert e.value.code == 2
    assert main(["plan", "-m", str(tmp_path / "none.gguf"), "--gpu-mem", "8GiB"]) == 1
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    assert main(["plan", "-m", str(junk), "--gpu-mem", "8GiB"]) == 1
    assert "not a GGUF" in capsys.readouterr().err


def test_parse_sizes():
    assert parse_size("16GiB") == parse_size("16G") == parse_size("16g") == 16 * GiB
    assert parse_size("12000MiB") == 12000 * MiB and parse_size("1.5TiB") == 3 * (1 << 39)
    assert parse_size("16GB") == 16 * 10**9
    assert [d.free_bytes for d in parse_gpu_mem("16GiB, 12GiB")] == [16 * GiB, 12 * GiB]
    with pytest.raises(SizeError, match="'0GiB' must be positive"):
        parse_size("0GiB")


class FakeNvml:
    """pynvml's calls, answered for two cards."""

    NVMLError = type("NVMLError", (Exception,), {})

    def __init__(self, fail=False, model=0):
        self.fail, self.model = fail, model

    def nvmlInit(self):
        if self.fail:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Mem", (), {"free": (10 + h) * GiB, "total": 16 * GiB})()

    def nvmlDeviceGetName(self, h):
        return f"Fake GPU {h}"

    def nvmlDeviceGetCurrentDriverModel(self, h):
        return self.model


def test_nvml_devices(capsys, small, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    rc, d = run_json(capsys, "-m", small, "--device", "1")
    dev = d["devices"][0]
    assert rc == 0 and dev["name"] == "Fake GPU 1" and dev["budget_bytes"] == 11 * GiB
    assert dev["driver_model"] == "linux" or sys.platform.startswith("win")
    assert any("planning GPU 1 alone" in n for n in d["notes"])
    monkeypatch.setattr("strata.memory.probe.sys.platform", "win32")
    rc, d = run_json(capsys, "-m", small)
    assert d["devices"][0]["driver_model"] == "wddm"
    assert d["devices"][0]["regions"]["reserve"] == GiB
    assert main(["plan", "-m", small, "--device", "5"]) == 2
    assert "NVML sees GPUs 0, 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    # the budget comes from --gpu-mem: --device would pick nothing (was silently ignored)
    (["--gpu-mem", "8GiB", "--device", "1"],
     "--device 1: picks a GPU read through NVML, and --gpu-mem plans cards of its sizes instead "
     "(pick among them with --gpus, from 0; or drop --gpu-mem to plan GPU 1 as it is)"),
    # --device planned GPU 1 alone and dropped --gpus without a word
    (["--device", "1", "--gpus", "0,1"],
     "--device 1 and --gpus 0,1 both pick the GPUs to plan: give one (--gpus 1 plans GPU 1 "
     "alone)"),
    # NVML reads a present GPU's driver model: --driver-model changed nothing
    (["--driver-model", "wddm"],
     "--driver-model wddm: sets the driver of the --gpu-mem cards; a GPU read through NVML has "
     "its own (add --gpu-mem SIZE)"),
])
@pytest.mark.parametrize("nvml", ["two GPUs", "none"])
def test_device_flags_with_the_other_way_to_find_gpus_are_refused(capsys, small, monkeypatch,
                                                                   argv, says, nvml):
    """Refused by name before any GPU is read, whether NVML answers or not: never ignored."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail=nvml == "none"))
    rc = main(["plan", "-m", small, *argv, "--json"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err == f"error: {says}\n", err
    # each one alone is good: --gpu-mem's plan, --device's GPU 1, --gpus 1
    if nvml != "none":
        for one in (["--gpu-mem", "8GiB"], ["--device", "1"], ["--gpus", "1"],
                    ["--gpu-mem", "8GiB", "--driver-model", "wddm"]):
            rc, d = run_json(capsys, "-m", small, *one)
            assert rc == 0 and d["accepted"], one


def test_no_gpu_suggests_gpu_mem(capsys, small, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail=True))
    assert main(["plan", "-m", small]) == 1
    err = capsys.readouterr().err
    assert "no NVIDIA GPU found" in err and "--gpu-mem 16GiB" in err
    # a missing file is what is wrong, even where there is no GPU
    assert main(["plan", "-m", "/nonexistent/model.gguf"]) == 1
    err = capsys.readouterr().err
    assert "/nonexistent/model.gguf" in err and "no NVIDIA GPU" not in err


def test_table_output_and_wddm_warning(capsys, small):
    rc = main(["plan", "-m", small, "--gpu-mem", "1000MiB", "--driver-model", "wddm",
               "--vram-reserve-mib", "300"])
    out = capsys.readouterr().out
    assert rc == 0
    for word in ("weights", "kv", "activations", "expert_cache", "reserve", "headroom",
                 "accepted", "prefill auto: chunk"):
        assert word in out
    assert "Prefer No Sysmem Fallback" in out


def test_profiles(capsys, small, tmp_path):
    counts = np.zeros((2, 4))
    counts[:, 0] = 100
    path = tmp_path / "profile.npy"
    np.save(path, counts)
    rc, d = run_json(capsys, "-m", small, "--gpu-mem", "2GiB", "--profile", str(path))
    assert rc == 0 and "measured counts" in d["predicted"]["model"]
    np.save(path, np.ones((3, 4)))
    # a profile of another shape is the file's fault, not a flag's: a failed run
    assert main(["plan", "-m", small, "--gpu-mem", "2GiB", "--profile", str(path)]) == 1
    assert "[2, 4]" in capsys.readouterr().err


def test_synthesized_file_ranks_the_cache(capsys, tmp_path):
    import gguf
    from strata.synth import preset, write_model

    path = tmp_path / "tiny.gguf"
    write_model(path, preset("tiny"), mix="Q8_0", skew=8.0, header_only=True, progress=False)
    rc, d = run_json(capsys, "-m", str(path), "--gpu-mem", "2GiB", "--expert-cache", "16")
    assert rc == 0 and d["predicted"]["model"] == "the file's expert ranking and routing shares"
    assert d["devices"][0]["expert_cache_slots_per_layer"] == [4, 4, 4, 4]
    # the file's own shares (read with gguf-py): the 4 hottest of 8 experts in every layer
    field = gguf.GGUFReader(str(path)).fields["strata.synth.expert_share"]
    share = np.array([field.parts[i][0] for i in field.data], dtype=np.float64)
    assert d["predicted"]["expert_hit_rate"] == pytest.approx(share[:4].sum() / share.sum())
    assert d["predicted"]["expert_hit_rate"] > 1 - 0.5 ** 3  # skewed past the default curve


def test_235b_synthesized_sparse_header(capsys, tmp_path):
    from strata.synth import preset, write_model

    path = tmp_path / "q235.gguf"
    write_model(path, preset("qwen3-235b-a22b"), mix="Q4_K_M", header_only=True, progress=False)
    assert os.stat(path).st_blocks * 512 < 64 * MiB  # a hole, not 130 GB of data
    rc, d = run_json(capsys, "-m", str(path), "--gpu-mem", "80GiB")
    dev = d["devices"][0]
    assert rc == 0 and dev["layers"] == [0, 94] and d["prefill"]["mode"] == "borrowed"
    assert dev["expert_slot_bytes"] > dev["expert_slot_bytes_min"]  # Q4_K_M: mixed slot sizes
    rc, d = run_json(capsys, "-m", str(path), "--gpu-mem", "16GiB")
    assert rc == 3 and d["refusal"]["knobs"]


def test_cli_does_not_import_numba(small):
    code = ("import sys, json\n"
            "from strata.cli.main import main\n"
            f"rc = main(['plan', '-m', {small!r}, '--gpu-mem', '16GiB', '--json'])\n"
            "sys.stderr.write(json.dumps({'rc': rc, 'numba': 'numba' in sys.modules}))\n")
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    flags = json.loads(out.stderr.strip().splitlines()[-1])
    assert flags == {"rc": 0, "numba": False}
    assert json.loads(out.stdout)["accepted"] is True


def test_ring_budget_knob_and_env():
    import argparse

    from strata.plan.knobs import add_engine_knobs, options_from_args
    from strata.plan.options import OptionError

    p = argparse.ArgumentParser()
    add_engine_knobs(p)
    assert options_from_args(p.parse_args([]), environ={}).ring_bytes == 1 << 30
    assert options_from_args(p.parse_args([]), environ={"STRATA_RING_MIB": "64"}).ring_mib == 64
    flag = p.parse_args(["--ring-mib", "32"])
    assert options_from_args(flag, environ={"STRATA_RING_MIB": "64"}).ring_mib == 32
    with pytest.raises(OptionError, match="STRATA_RING_MIB"):
        options_from_args(p.parse_args([]), environ={"STRATA_RING_MIB": "big"})
    opts = options_from_args(p.parse_args(["--prefill", "auto:4096", "--expert-cache", "12",
                                           "--no-prefill-borrow", "--embd-on-gpu"]), environ={})
    assert (opts.prefill.ceiling, opts.expert_cache, opts.prefill_borrow, opts.embd_on_host) == \
        (4096, 12, False, False)


def test_knob_flags_render_what_differs_from_the_defaults():
    """A benchmark's recorded command names its knobs: every flag given, none that was not,
    and the rendering parses back to the same options."""
    import argparse

    from strata.plan.knobs import add_engine_knobs, knob_flags, options_from_args
    p = argparse.ArgumentParser()
    add_engine_knobs(p)
    assert knob_flags(p.parse_args([])) == []
    given = ["--kv", "int8", "--max-context", "4096", "--no-prefill-borrow", "--batch", "4"]
    args = p.parse_args(given)
    flags = knob_flags(args)
    assert sorted(flags) == sorted(given)
    assert options_from_args(p.parse_args(flags), environ={}) == options_from_args(args,
                                                                                   environ={})
