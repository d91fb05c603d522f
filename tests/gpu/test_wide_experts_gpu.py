"""Qwen3-235B-A22B's expert widths on a real GPU (`helpers.gpu_engine.WIDE`: n_embd 4096, expert
width 1536, top-8, whose 48 KiB of h per token the decode down kernels take in groups of
experts): greedy tokens of the one-token engine (graph and no graph) equal the CPU engine's and
the float64 reference's, first logits within 2%; two sequences decoded together (their rows run
one by one through the grouped kernels) give each its tokens alone.

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_wide_experts_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.gpu_engine import PROMPT, WIDE, load, model_path
from helpers.reference import RefModel, greedy

pytestmark = pytest.mark.gpu
N_GEN = 6


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q8_0"])
def test_wide_experts_tokens_equal_the_cpu_engine_and_the_reference(tmp_models, mix):
    from strata.engine.cpu import CpuEngine
    from strata.gguf import open_model

    path = model_path(tmp_models, mix, config=WIDE)
    ref_toks, ref_first = greedy(RefModel.load(path), PROMPT, N_GEN)
    cpu = CpuEngine(open_model(path), max_context=64)
    cpu_first = cpu.prefill(PROMPT)
    got = {}
    for graph in (True, False):
        m, eng = load(path, graph=graph, expert_cache=4)  # hits and mapped-host misses
        first = eng.prefill(PROMPT)
        got[graph] = (eng.decode_tokens(N_GEN), first)
        m.close()
    toks, first = got[True]
    assert np.isfinite(first).all()
    assert _rel(first, ref_first) < 0.02 and _rel(first, cpu_first) < 0.02
    assert toks == ref_toks == got[False][0]


def test_wide_experts_batched_rows_equal_alone(tmp_models):
    from strata.cuda_kernels.batch_moe import batch_moe_fits
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.gguf import open_model
    from strata.plan.options import PlanOptions

    path = model_path(tmp_models, "Q4_K_M", config=WIDE)
    mf = open_model(path)
    eng = load_batch(mf, batch_options(mf, 2, PlanOptions(max_context=256, ring_mib=1),
                                       progress=False))
    assert not batch_moe_fits(eng.m.layouts[0], WIDE.n_expert_used, 2)
    prompts = (PROMPT, [260, 9, 600, 33])
    alone = []
    for p in prompts:
        logits = eng.prefill(0, p)
        toks = [int(np.argmax(logits))]
        for _ in range(N_GEN - 1):
            toks.append(int(np.argmax(eng.decode([0], [toks[-1]])[0])))
        eng.release(0)
        alone.append(toks)
    last = [eng.prefill(s, p) for s, p in enumerate(prompts)]
    together = [[int(np.argmax(x))] for x in last]
    for _ in range(N_GEN - 1):
        out = eng.decode([0, 1], [t[-1] for t in together])
        for t, x in zip(together, out):
            t.append(int(np.argmax(x)))
    assert together == alone
