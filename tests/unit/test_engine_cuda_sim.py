"""The CUDA engine's orchestration under numba's CUDA simulator (CI has no GPU): a one-layer
model with an empty expert cache, so the prompt streams every expert through the ring and the
decode step reads every expert from mapped host memory; logits against the CPU engine and the
float64 reference, the plan's one arena, the device hit/miss counters; the decode step again
with the misses split between the CPU pool and the GPU's mapped reads (hybrid).

Slow (about two minutes: the simulator runs each CUDA thread as a Python thread), so the model is
the smallest the synthesizer writes; the GPU tests (tests/gpu/test_engine_gpu.py) cover the rest.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.device_pick import check_device_generate, check_nan_refused
from helpers.reference import RefModel, forward
from strata.synth import PRESETS, write_model

pytestmark = pytest.mark.slow
MICRO = dataclasses.replace(
    PRESETS["tiny"], name="micro", n_layer=1, n_embd=128, n_head=2, n_head_kv=1, head_dim=64,
    n_expert=4, n_expert_used=2, n_ff_expert=64, n_vocab=512, n_ctx_train=512)
PROMPT = [5, 77, 300]


def test_engine_in_the_simulator(tmp_models):
    from strata.engine.cpu import CpuEngine
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions

    path = tmp_models / "micro-Q8_0.gguf"
    if not path.is_file():
        write_model(path, MICRO, mix="Q8_0", seed=1, progress=False)
    mf = open_model(path)
    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))  # the simulator has no size
    allocations = []
    allocate = card.allocate
    card.allocate = lambda n: allocations.append(n) or allocate(n)
    opts = CudaOptions(plan=PlanOptions(max_context=256, expert_cache=0, ring_mib=1),
                       graph=False, progress=False)
    m = CudaModel(mf, opts, backend=card)
    assert allocations == [m.arena.device_plan.arena_bytes]
    assert m.plan.prefill.mode == "owned" and m.plan.prefill.ring_slots >= 2
    eng = CudaEngine(m, use_graph=False)
    got = eng.prefill(PROMPT)
    assert eng.traffic.n_streamed == eng.traffic.per_layer_streamed[0] > 0
    cpu = CpuEngine(mf, max_context=64)
    want_cpu = cpu.prefill(PROMPT)
    ref = forward(RefModel.load(path), PROMPT + [int(np.argmax(want_cpu))])
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    assert rel(got, ref[-2]) < 0.02 and rel(got, want_cpu) < 0.02
    tok = int(np.argmax(got))
    assert tok == int(np.argmax(want_cpu)) == int(np.argmax(ref[-2]))
    got2 = eng.decode_step(tok)
    assert eng.n_past == len(PROMPT) + 1
    assert rel(got2, ref[-1]) < 0.02 and rel(got2, cpu.decode_step(tok)) < 0.02
    np.testing.assert_array_equal(eng.hits().counts, [[0, MICRO.n_expert_used]])  # all missed
    # the same step again, the misses split: one computed by the CPU pool beside the GPU, the
    # other read by the GPU's second MoE launch (the CPU-only path is the split's share 1)
    with pytest.raises(ValueError, match="cannot keep"):
        eng.rewind(len(PROMPT) + 2)
    eng.rewind(len(PROMPT))  # the decoded token forgotten: the same step can run again
    assert eng.n_past == len(PROMPT)
    eng.set_miss_path("hybrid", miss_share=0.5)
    got3 = eng.decode_step(tok)
    assert rel(got3, got2) < 1e-4 and rel(got3, ref[-1]) < 0.02
    pool = eng.step.pool
    assert pool.n_experts == 1 and pool.seconds > 0
    assert (pool.split.n_cpu, pool.split.n_gpu) == (1, 1)
    assert pool.n_gpu_bytes == pool.n_bytes > 0  # one expert each
    np.testing.assert_array_equal(eng.hits().counts, [[0, 2 * MICRO.n_expert_used]])
    # `generate` with each token picked and fed on the device against the host's choice
    eng.set_miss_path("mapped")
    toks = check_device_generate(eng, PROMPT)
    assert toks[0] == tok
    check_nan_refused(eng, PROMPT, eng.m.norms["output_norm"], toks)


def test_a_cache_of_every_expert_is_filled_from_the_file(tmp_models, monkeypatch):
    """Every expert cached, the prompt path owned: no host store of the experts (the cache is
    filled from the file's map, in runs of slots through two pinned buffers), every slot the
    file's blob, and the logits those of the CPU engine; with --adaptive-cache the store keeps
    them (its swaps read host memory)."""
    from strata.engine.cpu import CpuEngine
    from strata.engine.cuda import file_slots
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions

    path = tmp_models / "micro-Q8_0.gguf"
    if not path.is_file():
        write_model(path, MICRO, mix="Q8_0", seed=1, progress=False)
    mf = open_model(path)
    slot_bytes = mf.shape.expert_slot_bytes(0)
    # a staging buffer of two blobs: the four slots go over in two runs, one per buffer
    monkeypatch.setattr(file_slots, "STAGE_BYTES", 2 * slot_bytes + 1)
    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))
    opts = CudaOptions(plan=PlanOptions(max_context=256, ring_mib=1), graph=False,
                       progress=False)
    m = CudaModel(mf, opts, backend=card)
    assert m.plan.prefill.mode == "owned" and not m.plan.keeps_experts
    assert not m.store.has_experts and m.report["store_experts"] is False
    t = mf.tensors["token_embd.weight"]
    assert m.store.n_bytes == m.plan.host_store_bytes == -(-t.n_bytes // 256) * 256  # its rows
    with pytest.raises(RuntimeError, match="keeps no experts"):
        m.store.blob(0, 0)
    cache = m.cache_bytes.copy_to_host()
    for e in range(MICRO.n_expert):
        slot = m.cache.slot_of(0, e)
        off = int(m.cache.layout.slot_offset[slot])
        want = np.concatenate([mf.expert_raw(f"blk.0.{n}.weight", e).reshape(-1)
                               for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")])
        np.testing.assert_array_equal(cache[off:off + want.size], want)
    assert m.cache.device.n_bytes == MICRO.n_expert * slot_bytes
    eng, cpu = CudaEngine(m, use_graph=False), CpuEngine(mf, max_context=64)
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    got, want = eng.prefill(PROMPT), cpu.prefill(PROMPT)
    assert rel(got, want) < 0.02
    tok = int(np.argmax(want))
    assert rel(eng.decode_step(tok), cpu.decode_step(tok)) < 0.02
    np.testing.assert_array_equal(eng.hits().counts, [[MICRO.n_expert_used, 0]])  # all hits
    m.close()
    adaptive = CudaModel(mf, dataclasses.replace(opts, adaptive_cache=True), backend=card)
    assert adaptive.store.has_experts and adaptive.store.n_bytes > m.store.n_bytes
    adaptive.close()
