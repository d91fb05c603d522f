"""Streamed KV on a real GPU (`--kv-resident` below the context): the first tokens' K/V rows in
VRAM, the rest in host memory mapped into the same address range (`strata.memory.kv_map`).

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_kv_stream_gpu.py

A prompt whose chunks lie below the resident tokens, across them and past them, then greedy
decode steps that read host rows: the same first logits (bit for bit: the same kernels over the
same bytes) and tokens as the whole KV in VRAM; the mapping is given back on close.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.gpu_engine import CONFIG, load, model_path

pytestmark = pytest.mark.gpu
N_GEN = 16

# int8 KV takes head_dim 128 on the GPU: the test model with its heads twice as wide
HEAD128 = dataclasses.replace(CONFIG, name="gpu-engine-head128", head_dim=128)

# kv type -> (model config, max context, --kv-resident, prompt tokens, chunk): a K side is 2
# heads a token, 256 bytes in both (64 f16 values, 128 int8 ones), so the 2 MiB mapping
# granule is 8,192 tokens (q4_0's 72- or 36-byte rows make it 65,536+, too long to test)
CASES = {"f16": (CONFIG, 16384, 8192, 9900, 1536), "int8": (HEAD128, 16384, 8192, 9900, 1536)}


def _greedy(eng, prompt):
    eng.reset()
    logits = np.array(eng.prefill(prompt), copy=True)
    return logits, eng.decode_tokens(N_GEN)


@pytest.mark.parametrize("kv", sorted(CASES))
def test_streamed_kv_gives_the_tokens_of_kv_in_vram(tmp_models, kv):
    from strata.plan.options import PrefillRequest

    config, ctx, resident, n_prompt, chunk = CASES[kv]
    path = model_path(tmp_models, "Q8_0", config=config)
    prompt = [int(t) for t in np.random.default_rng(3).integers(1, 640, n_prompt)]
    knobs = dict(max_context=ctx, kv_type=kv, prefill=PrefillRequest(False, chunk))
    m, eng = load(path, **knobs)
    want_logits, want = _greedy(eng, prompt)
    assert m.kv_map is None
    m.close()
    m, eng = load(path, kv_resident=resident, **knobs)
    assert m.plan.kv.resident_tokens == resident and m.plan.kv.host_bytes > 0
    assert m.kv_map is not None and m.kv_map.host_bytes >= m.plan.kv.host_bytes
    logits, toks = _greedy(eng, prompt)
    staged = eng.prefill_traffic().kv_staged_bytes if hasattr(eng, "prefill_traffic") else None
    print(f"\nstreamed {kv}: {resident} of {ctx} tokens in VRAM, prompt {n_prompt} in chunks "
          f"of {chunk}, tokens {toks[:8]}... ({'same' if toks == want else 'DIFFER'}), "
          f"staged bytes {staged}")
    assert np.array_equal(logits, want_logits)
    assert toks == want
    m.close()
    assert m.kv_map.views == [] and m.kv_sides == []
