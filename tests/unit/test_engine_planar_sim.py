"""The CUDA engine keeps a Q4_K_M file's dense Q6_K tensors (attn_v of this layer, the head) in
the planar layout (`strata.quant.planar`) and still computes the file's model: under numba's CUDA
simulator, on a one-layer model, the prompt's and a decode step's logits against the float64
reference forward and the CPU engine (which reads GGUF's layout from the file).

Slow (the simulator runs each CUDA thread as a Python thread); tests/gpu/test_engine_gpu.py runs
the Q4_K_M mix at real speed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.reference import RefModel, forward
from strata.synth import PRESETS, write_model

pytestmark = pytest.mark.slow
# 256 wide (whole K-quant super-blocks); one layer, so the Q4_K_M recipe gives its attn_v Q6_K
PLANAR = dataclasses.replace(
    PRESETS["tiny"], name="micro-planar", n_layer=1, n_embd=256, n_head=2, n_head_kv=1,
    head_dim=64, n_expert=4, n_expert_used=2, n_ff_expert=256, n_vocab=512, n_ctx_train=512)
PROMPT = [5, 77, 300]


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_planar_dense_q6_k_gives_the_files_model(tmp_models):
    from gguf import GGMLQuantizationType as T

    from strata.engine.cpu import CpuEngine
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions
    from strata.quant.planar import Q6_K_P8

    path = tmp_models / "micro-planar-Q4_K_M.gguf"
    if not path.is_file():
        write_model(path, PLANAR, mix="Q4_K_M", seed=5, progress=False)
    mf = open_model(path)
    planar = [n for n in ("blk.0.attn_v.weight", "output.weight")
              if mf.tensors[n].ggml_type == int(T.Q6_K)]
    assert planar == ["blk.0.attn_v.weight", "output.weight"]  # the recipe's Q6_K tensors

    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))  # the simulator has no size
    opts = CudaOptions(plan=PlanOptions(max_context=256), graph=False, progress=False)
    model = CudaModel(mf, opts, backend=card)
    assert model.matrices["blk.0.attn_v"].ggml_type == Q6_K_P8.ggml_type
    assert model.matrices["output"].ggml_type == Q6_K_P8.ggml_type
    assert model.matrices["blk.0.attn_q"].ggml_type == mf.tensors["blk.0.attn_q.weight"].ggml_type
    # the arena holds the packed bytes: unpacked, the file's
    for name in planar:
        got = model.arena.view("weights", name).copy_to_host()
        assert np.array_equal(Q6_K_P8.unpack(got, mf.tensors[name].n_bytes), mf.raw(name))

    eng = CudaEngine(model, use_graph=False)
    first = eng.prefill(PROMPT)
    tok = int(np.argmax(first))
    step = eng.decode_step(tok)
    want = forward(RefModel.load(path), PROMPT + [tok])
    assert _rel(first, want[-2]) < 0.02 and _rel(step, want[-1]) < 0.02
    cpu = CpuEngine(open_model(path), max_context=64)
    cpu_first = cpu.prefill(PROMPT)
    assert int(np.argmax(cpu_first)) == tok
    assert _rel(first, cpu_first) < 0.02 and _rel(step, cpu.decode_step(tok)) < 0.02
