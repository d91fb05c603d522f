"""The CUDA backend in the registry (where no GPU runs: the simulator), its option checks, and
the bench's table and argument errors."""

from __future__ import annotations

import pytest

from strata.engine.backends import BackendError, select_backend


def test_cuda_backend_refuses_the_simulator_and_auto_falls_back_to_cpu():
    from strata.engine.cuda import unavailable_reason

    assert "simulator" in unavailable_reason()
    with pytest.raises(BackendError, match="simulator.*available here: cpu"):
        select_backend("cuda")
    assert select_backend("auto")[0] == "cpu"


def test_cuda_options_refuse_batches_and_bad_budgets():
    from strata.engine.cuda.options import CudaEngineError, CudaOptions
    from strata.plan.options import PlanOptions

    with pytest.raises(CudaEngineError, match="batch 1"):
        CudaOptions(plan=PlanOptions(batch=2))
    with pytest.raises(CudaEngineError, match="--gpu-mem"):
        CudaOptions(gpu_mem=0)


def test_factory_refuses_intermediates(tmp_models):
    from helpers.engine_models import model_path
    from strata.engine.cuda import CudaEngineError, engine_factory
    from strata.gguf import open_model

    with pytest.raises(CudaEngineError, match="intermediates"):
        engine_factory(open_model(model_path(tmp_models, "Q8_0")), cb=lambda *a: None)


def _result(streamed: int):
    return {
        "model": "m.gguf", "device": "H200", "gpu_mem_cap": 8 << 30,
        "bandwidth": {"d2d_gb_per_s": 3000.0, "h2d_gb_per_s": 50.0},
        "device_allocations": {"count": 1, "bytes": [123], "arena_bytes": 7 << 30},
        "prefill": {"tokens": 4096, "tokens_per_s": 5000.0, "chunk": 4096, "mode": "borrowed",
                    "ring_slots": 8, "bytes_streamed": streamed,
                    "pcie_streaming_bound_tokens_per_s": 6000.0 if streamed else None,
                    "fraction_of_streaming_bound": 5 / 6 if streamed else None},
        "decode": {"tokens_per_s": 80.0, "bound_tokens_per_s": 100.0, "fraction_of_bound": 0.8,
                   "vram_bytes_per_token": 1e9, "host_bytes_per_token": 2e8,
                   "hit_rate_measured": 0.61, "hit_rate_predicted": 0.6},
        "plan": {"predicted": {"model": "the file's expert ranking"}},
    }


def test_bench_table_shows_each_number_against_its_bound():
    from strata.bench.engine_cuda import table

    text = table(_result(10**9))
    assert "budget 8.0 GiB" in text and "device allocations: 1" in text
    assert "5000.0" in text and "6000.0" in text and "83.3%" in text
    assert "80.0" in text and "100.0" in text and "80.0%" in text
    assert "measured 61.0%, predicted 60.0%" in text
    resident = table(_result(0))
    assert "PCIe streaming of 0.00 GB" in resident
    # a prompt short enough to run as decode steps (`prompt_steps`) says so instead of a chunk
    steps = _result(0)
    steps["prefill"].update(tokens=8, chunk=None, mode="steps", ring_slots=0, prompt_steps=22)
    assert "(8 tokens, run as decode steps: --prompt-steps 22)" in table(steps)


def test_bench_decode_bound_counts_the_kv_each_step_reads():
    from strata.bench.engine_cuda import kv_read_bytes, table
    from strata.cuda_kernels.kvcache import KvLayout

    f16 = KvLayout("f16", 4096, 4, 128)  # one token: 4 heads x 256 bytes a side a layer
    # steps at positions 10, 11: 11 and 12 rows, all in VRAM, K and V of 2 layers
    assert kv_read_bytes(f16, 2, range(10, 12), 4096) == (2 * 2 * 1024 * 11.5, 0.0)
    # 8 resident tokens: 3 and 4 rows in host memory
    assert kv_read_bytes(f16, 2, range(10, 12), 8) == (2 * 2 * 1024 * 8, 2 * 2 * 1024 * 3.5)
    int8 = KvLayout("int8", 4096, 4, 128)  # rows of 128 bytes, a 2-byte scale a head in VRAM
    vram, host = kv_read_bytes(int8, 1, range(99, 100), 64)
    assert (vram, host) == (2 * (512 * 64 + 8 * 100), 2 * 512 * 36)
    assert kv_read_bytes(f16, 2, range(5, 5), 8) == (0.0, 0.0)  # no timed step
    r = _result(0)
    r["decode"].update(kv_vram_bytes_per_token=2e8, kv_host_bytes_per_token=5e8)
    assert "KV 0.200 GB in VRAM + 0.500 GB in host memory at 50.0 GB/s" in table(r)
    r["decode"].update(kv_host_bytes_per_token=0.0)
    assert "KV 0.200 GB in VRAM" in table(r) and "in host memory" not in table(r)


def test_bench_prompt_flops_count_the_models_math():
    """Against a count made token by token and key by key (another way than the formula's)."""
    from types import SimpleNamespace

    from strata.bench.engine_cuda import prompt_flops, table

    s = SimpleNamespace(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8,
                        n_expert_used=2, n_ff_expert=48, n_vocab=100)
    n = 5
    want = 0
    for _ in range(s.n_layer):
        for i in range(n):  # token i
            want += 2 * 64 * 64 + 2 * 64 * 32 * 2 + 2 * 64 * 64  # q, k and v, o
            want += 2 * 64 * 8 + 2 * (2 * 2 * 64 * 48 + 2 * 48 * 64)  # router, two experts
            for _key in range(i + 1):  # QK^T and PV of each head over the keys it sees
                want += 4 * 2 * 16 * 2
    want += 2 * 64 * 100  # the last token's logits
    assert prompt_flops(s, n) == want
    r = _result(0)
    r["prefill"].update(model_tflop=29.0, model_tflops_per_s=163.4)
    assert "163.4 TFLOP/s of the model's math (29.00 TFLOP" in table(r)
    assert "TFLOP/s" not in table(_result(0))  # JSON from before the field: no line


def test_bench_cuda_needs_one_model(capsys):
    from strata.cli.main import main

    assert main(["bench", "--backend", "cuda"]) == 2  # a usage error
    assert "give -m FILE once" in capsys.readouterr().err


@pytest.mark.parametrize("head_dim,kv,ok", [(64, "f16", True), (128, "f16", True),
                                            (96, "f16", False), (80, "f16", False),
                                            (64, "int8", False), (128, "q4_0", True)])
def test_head_sizes_the_attention_kernels_take(head_dim, kv, ok):
    from helpers.moe_shapes import tiny
    from strata.engine.cuda.model import check_kernel_shape
    from strata.engine.cuda.options import CudaEngineError

    shape = tiny(head_dim=head_dim)
    if ok:
        check_kernel_shape(shape, kv)
    else:
        with pytest.raises(CudaEngineError, match=f"head_dim {head_dim} with --kv {kv}"):
            check_kernel_shape(shape, kv)
