"""Host memory of a GPU run: the expert store's size priced from the shape alone (equal to the
store the engine fills), the plan's JSON carrying it, the OS's numbers read, and a store past
what the machine has refused before anything is allocated."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.engine_models import MIXES, model_path
from strata.experts import build_store
from strata.gguf import open_model
from strata.plan.devices import GiB, fmt_bytes
from strata.plan.host import HostMemory, probe_host_memory, store_bytes, store_shortfall


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("embd", [True, False])
def test_the_priced_store_is_the_filled_one(tmp_models, mix, embd):
    mf = open_model(model_path(tmp_models, mix))
    assert store_bytes(mf.shape, embd) == build_store(mf, with_embd=embd).n_bytes


def test_the_plan_says_its_store(tmp_models):
    from strata.plan import plan
    from strata.plan.devices import DeviceInfo
    from strata.plan.options import PlanOptions
    mf = open_model(model_path(tmp_models, "Q4_K_M"))
    s = mf.shape
    dev = DeviceInfo(0, "test card", 8 * GiB, 8 * GiB)
    for embd_on_host in (True, False):
        # a cache of every expert and an owned prompt path: no expert in host memory
        p = plan(s, [dev], PlanOptions(max_context=512, embd_on_host=embd_on_host))
        assert p.accepted and p.token_embd == ("host" if embd_on_host else "device")
        assert p.devices[0].cache.n_slots == s.n_layer * s.n_expert
        assert p.prefill.mode == "owned" and not p.keeps_experts
        assert p.to_dict()["host_store_bytes"] == p.host_store_bytes == store_bytes(
            s, embd_on_host, experts=False) < store_bytes(s, embd_on_host)
        # fewer slots than pairs: misses read the store, which holds every expert
        p = plan(s, [dev], PlanOptions(max_context=512, embd_on_host=embd_on_host,
                                       expert_cache=s.n_expert))
        assert p.accepted and p.keeps_experts
        assert p.to_dict()["host_store_bytes"] == store_bytes(s, embd_on_host)
    assert store_bytes(s, False, experts=False) == 0


@pytest.mark.parametrize("slots,mode,lend,adaptive,keeps", [
    (20, "owned", 0, False, False), (19, "owned", 0, False, True), (20, "borrowed", 5, False, True),
    (20, "owned", 0, True, True), (20, None, 0, False, False)])
def test_the_store_keeps_experts_where_any_can_be_read(slots, mode, lend, adaptive, keeps):
    from strata.plan.host import keeps_experts
    assert keeps_experts(slots, 20, mode, lend, adaptive) is keeps


def test_shortfall_names_both_sizes():
    gib = 1 << 30
    assert store_shortfall(10 * gib, HostMemory(64 * gib, 20 * gib)) is None
    why = store_shortfall(30 * gib, HostMemory(64 * gib, 20 * gib))
    assert "30.00 GiB" in why and "20.00 GiB available of 64.00 GiB" in why
    # where the OS gives no available figure, the total is what it is held to
    assert store_shortfall(30 * gib, HostMemory(64 * gib, None)) is None
    assert "in all" in store_shortfall(70 * gib, HostMemory(64 * gib, None))
    assert store_shortfall(1 << 60, None) is None  # nothing to check against


def test_this_machine_reports_its_memory():
    mem = probe_host_memory()
    assert mem is not None and mem.total_bytes > 0
    assert mem.available_bytes is None or 0 <= mem.available_bytes <= mem.total_bytes


def _micro(tmp_models):
    """A one-layer model the CUDA kernels take (head_dim 64), written on first use."""
    from strata.synth import PRESETS, write_model
    micro = dataclasses.replace(
        PRESETS["tiny"], name="micro-host", n_layer=1, n_embd=128, n_head=2, n_head_kv=1,
        head_dim=64, n_expert=4, n_expert_used=2, n_ff_expert=64, n_vocab=512, n_ctx_train=512)
    path = tmp_models / "micro-host-Q8_0.gguf"
    if not path.is_file():
        write_model(path, micro, mix="Q8_0", seed=1, progress=False)
    return open_model(path)


def test_the_cuda_engine_refuses_a_store_past_host_memory(tmp_models, monkeypatch):
    from strata.engine.cuda import model as cuda_model
    from strata.engine.cuda.options import CudaEngineError, CudaOptions
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions
    mf = _micro(tmp_models)
    need = store_bytes(mf.shape, True)
    monkeypatch.setattr(cuda_model, "probe_host_memory",
                        lambda: HostMemory(need * 4, need - 1))
    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))
    allocations = []
    card.allocate = lambda n: allocations.append(n)
    # no cache slot: every expert is read from the store
    opts = CudaOptions(plan=PlanOptions(max_context=256, expert_cache=0), graph=False,
                       progress=False)
    with pytest.raises(CudaEngineError, match="the expert store needs"):
        cuda_model.CudaModel(mf, opts, backend=card)
    assert allocations == []  # refused before the arena


def test_plan_notes_a_store_this_machine_cannot_hold(tmp_models, monkeypatch, capsys):
    import json

    from strata.cli.main import main
    from strata.plan import host
    path = str(model_path(tmp_models, "Q4_K_M"))
    args = ["plan", "-m", path, "--dry-run", "--gpu-mem", "8GiB", "--max-context", "512",
            "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["host_store_bytes"] > 0 and not any("expert store needs" in n for n in d["notes"])
    monkeypatch.setattr(host, "probe_host_memory",
                        lambda: HostMemory(d["host_store_bytes"], d["host_store_bytes"] // 2))
    assert main(args) == 0  # still accepted: the plan may be for another machine
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith("on this machine, the expert store needs") for n in notes)


def _cgroup_fs(tmp_path, proc_lines, files):
    for rel, text in files.items():
        f = tmp_path / "cg" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    proc = tmp_path / "proc_cgroup"
    proc.write_text("\n".join(proc_lines) + "\n")
    return str(tmp_path / "cg"), str(proc)


def test_a_v2_cgroup_limit_counts_its_page_cache_as_room(tmp_path):
    from strata.plan.host import cgroup_room
    gib = 1 << 30
    root, proc = _cgroup_fs(tmp_path, ["0::/app.slice"], {
        "app.slice/memory.max": str(16 * gib), "app.slice/memory.current": str(10 * gib),
        "app.slice/memory.stat": f"anon {7 * gib}\ninactive_file {3 * gib}\n"})
    assert cgroup_room(root, proc) == 9 * gib
    (tmp_path / "cg" / "app.slice" / "memory.max").write_text("max\n")
    assert cgroup_room(root, proc) is None  # no limit: the machine's figure stands


def test_a_v1_container_limit_is_read_at_its_own_root(tmp_path):
    from strata.plan.host import cgroup_room
    gib = 1 << 30
    # a container sees the host's path in /proc/self/cgroup, its own cgroup at the root
    root, proc = _cgroup_fs(tmp_path, ["4:memory:/docker/abc", "0::/"], {
        "memory/memory.limit_in_bytes": str(8 * gib),
        "memory/memory.usage_in_bytes": str(6 * gib),
        "memory/memory.stat": f"inactive_file {gib}\ntotal_inactive_file {2 * gib}\n"})
    assert cgroup_room(root, proc) == 4 * gib
    assert cgroup_room(root, str(tmp_path / "missing")) is None


def test_the_machine_figure_is_capped_by_the_cgroup(tmp_path):
    from strata.plan.host import _linux
    gib = 1 << 30
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {64 * gib // 1024} kB\nMemFree: {gib // 1024} kB\n"
                       f"MemAvailable: {40 * gib // 1024} kB\n")
    root, proc = _cgroup_fs(tmp_path, ["0::/app.slice"], {
        "app.slice/memory.max": str(16 * gib), "app.slice/memory.current": str(4 * gib),
        "app.slice/memory.stat": "inactive_file 0\n"})
    assert _linux(str(meminfo), (root, proc)) == HostMemory(64 * gib, 12 * gib)
    # no limit: the machine's MemAvailable
    (tmp_path / "cg" / "app.slice" / "memory.max").write_text("max")
    assert _linux(str(meminfo), (root, proc)) == HostMemory(64 * gib, 40 * gib)



def test_an_adaptive_cache_prices_the_store_it_keeps(tmp_models, monkeypatch):
    """The plan (every expert cached, owned prompt path) keeps no experts in host memory, but
    --adaptive-cache swaps read them: the engine checks the whole store before it fills one."""
    from strata.engine.cuda import model as cuda_model
    from strata.engine.cuda.options import CudaEngineError, CudaOptions
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions
    mf = _micro(tmp_models)
    small, whole = store_bytes(mf.shape, True, experts=False), store_bytes(mf.shape, True)
    monkeypatch.setattr(cuda_model, "probe_host_memory", lambda: HostMemory(whole * 4, whole - 1))
    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))
    opts = CudaOptions(plan=PlanOptions(max_context=256), graph=False, progress=False,
                       adaptive_cache=True)
    assert small < whole - 1  # the plan's own store fits
    with pytest.raises(CudaEngineError, match=f"needs {fmt_bytes(whole)} of host memory"):
        cuda_model.CudaModel(mf, opts, backend=card)
