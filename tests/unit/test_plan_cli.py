"""`strata plan`: the JSON contract, exit codes (0 accepted, 2 refused, 1 bad input), --gpu-mem
parsing, NVML (faked) and its absence, profiles, a sparse 235B header, and no numba import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from helpers import ggufmake
from helpers.moe_shapes import QWEN3_235B, more_bits
from strata.cli.main import main
from strata.plan import parse_gpu_mem, parse_size
from strata.plan.devices import GiB, MiB, SizeError


def write_header_only(path, cfg: dict, *, mix: str = "q4_k_m", extra=None) -> str:
    """A qwen3moe file whose tensor data is a sparse hole: the header of any size of model."""
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    k = "qwen3moe."
    for key, val in (("block_count", cfg["n_layer"]), ("context_length", cfg["n_ctx"]),
                     ("embedding_length", cfg["n_embd"]), ("attention.head_count", cfg["n_head"]),
                     ("attention.head_count_kv", cfg["n_head_kv"]),
                     ("attention.key_length", cfg["head_dim"]),
                     ("attention.value_length", cfg["head_dim"]),
                     ("expert_count", cfg["n_expert"]), ("expert_used_count", cfg["n_expert_used"]),
                     ("expert_feed_forward_length", cfg["n_ff"])):
        w.add_uint32(k + key, val)
    w.add_string("general.name", "header-only test model")
    for key, (values, vtype) in (extra or {}).items():
        w.add_array(key, values) if vtype is None else w.add_key_value(
            key, values, gguf.GGUFValueType.ARRAY, sub_type=vtype)
    total = 0
    for name, np_shape in ggufmake.tensor_shapes(cfg).items():
        layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
        base = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        t = _type(mix, base, layer, cfg["n_layer"])
        block, size = gguf.GGML_QUANT_SIZES[t]
        byte_shape = (*np_shape[:-1], np_shape[-1] // block * size)
        n = int(np.prod(byte_shape))
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), n, raw_dtype=t)
        total += -(-n // 32) * 32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = os.path.getsize(path)
    os.truncate(path, -(-header // 32) * 32 + total)  # a hole: nothing is written
    return str(path)


def _type(mix, base, layer, n_layer):
    Q = gguf.GGMLQuantizationType
    if base.endswith("norm") or base == "ffn_gate_inp" or mix == "f32":
        return Q.F32
    if base == "output":
        return Q.Q6_K
    if base in ("attn_v", "ffn_down_exps") and more_bits(layer, n_layer):
        return Q.Q6_K
    return Q.Q4_K


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


def test_refused_exit_2_with_knobs(capsys, small):
    rc, d = run_json(capsys, "-m", small, "--gpu-mem", "700MiB")
    assert rc == 2 and d["accepted"] is False
    r = d["refusal"]
    assert r["short_by_bytes"] == r["needed_bytes"] - r["free_bytes"] > 0
    assert r["free_bytes"] == 700 * MiB
    assert any(k.startswith("--vram-reserve-mib") for k in r["knobs"])
    rc = main(["plan", "-m", small, "--gpu-mem", "700MiB"])
    out = capsys.readouterr().out
    assert rc == 2 and "refused:" in out and "short by" in out and "--vram-reserve-mib" in out


@pytest.mark.parametrize("argv,match", [
    (["--gpu-mem", "16Q"], "'16Q'"),
    (["--gpu-mem", "16GiB,,8GiB"], "separated by commas"),
    (["--gpu-mem", "16"], "needs a unit"),
    (["--prefill", "1000"], "not a multiple of 256"),
    (["--expert-cache", "lots"], "--expert-cache 'lots'"),
    (["--gpu-mem", "16GiB,16GiB"], "not available yet"),
    (["--gpu-mem", "8GiB", "--kv-resident", "10"], "--kv-resident"),
])
def test_bad_input_exit_1(capsys, small, argv, match):
    rc = main(["plan", "-m", small, *argv])
    assert rc == 1
    assert match in capsys.readouterr().err


def test_bad_flags_and_files_exit_1(capsys, small, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["plan", "-m", small, "--max-context", "abc"])
    assert e.value.code == 1 and "invalid int value: 'abc'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["plan", "--gpu-mem", "8GiB"])  # no -m
    assert e.value.code == 1
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
    assert main(["plan", "-m", small, "--device", "5"]) == 1
    assert "NVML sees GPUs 0, 1" in capsys.readouterr().err


def test_no_gpu_suggests_gpu_mem(capsys, small, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail=True))
    assert main(["plan", "-m", small]) == 1
    err = capsys.readouterr().err
    assert "no NVIDIA GPU found" in err and "--gpu-mem 16GiB" in err


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
    assert main(["plan", "-m", small, "--gpu-mem", "2GiB", "--profile", str(path)]) == 1
    assert "[2, 4]" in capsys.readouterr().err
    cfg = dict(ggufmake.SMALL, n_ctx=4096)
    rank = np.array([[3, 2, 1, 0], [0, 1, 2, 3]]).ravel().tolist()
    ranked = write_header_only(tmp_path / "ranked.gguf", cfg, mix="f32", extra={
        "strata.synth.expert_rank": (rank, gguf.GGUFValueType.UINT32)})
    rc, d = run_json(capsys, "-m", ranked, "--gpu-mem", "2GiB")
    assert rc == 0 and "expert ranking" in d["predicted"]["model"]


def test_235b_sparse_header(capsys, tmp_path):
    path = write_header_only(tmp_path / "q235.gguf", QWEN3_235B)
    assert os.stat(path).st_blocks * 512 < 64 * MiB  # a hole, not 130 GB of data
    rc, d = run_json(capsys, "-m", path, "--gpu-mem", "80GiB")
    assert rc == 0 and d["devices"][0]["layers"] == [0, 94]
    assert d["prefill"]["mode"] == "borrowed"
    rc, d = run_json(capsys, "-m", path, "--gpu-mem", "16GiB")
    assert rc == 2 and d["refusal"]["knobs"]


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
