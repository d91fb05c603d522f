"""The CPU engine's whole forward against the float64 numpy reference (gguf-py dequantization,
Hugging Face Qwen3MoE formulas), on synthetic models in four quant mixes; the KV cache against
full recomputation; the intermediate hook; bad input."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import reference as ref
from helpers import ties
from helpers.engine_models import MIXES, PROMPT, model_path

from strata.engine import ContextFullError, EngineInputError
from strata.engine.cpu import CpuEngine, CpuModel
from strata.gguf import open_model

N_STEPS = 8


@pytest.fixture(scope="module")
def models(tmp_models):
    """mix -> (CpuModel, path): each file written and mapped once."""
    out = {}
    for mix in MIXES:
        path = model_path(tmp_models, mix)
        out[mix] = (CpuModel(open_model(path)), path)
    return out


def _greedy(engine: CpuEngine, prompt, n):
    logits = engine.prefill(prompt)
    first = logits
    tokens = []
    for i in range(n):
        tokens.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = engine.decode_step(tokens[-1])
    return tokens, first


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("mix", MIXES)
def test_greedy_tokens_and_logits_match_the_float64_reference(models, mix):
    model, path = models[mix]
    tokens, first = _greedy(CpuEngine(model, max_context=64), PROMPT, N_STEPS)
    want_tokens, want_first = ref.greedy(ref.RefModel.load(path), PROMPT, N_STEPS)
    assert tokens == want_tokens
    # f32 activations, 8-bit into K-quant products: inside the required 2%
    assert _rel(first, want_first) < 2e-2
    # and within f32 rounding of a reference that rounds those activations the same way, its
    # near-ties resolved either way (helpers.ties: one of them alone moves these logits 7e-4)
    dist, _ = ties.x8_distance(first, ref.RefModel.load(path, x8=True), PROMPT)
    assert dist < 1e-5, f"{mix}: {dist:.2e} from the 8-bit-rounding reference"


@pytest.mark.parametrize("mix", ["Q4_K_M", "LEGACY_MIX"])
def test_decode_with_the_kv_cache_equals_a_full_recompute(models, mix):
    model, _ = models[mix]
    seq = PROMPT + [3, 99, 250, 1, 638]
    eng = CpuEngine(model, max_context=32)
    eng.prefill(seq[:4])
    for t in seq[4:]:
        stepped = eng.decode_step(t)
    assert eng.n_past == len(seq)
    eng.reset()
    full = eng.prefill(seq)
    assert _rel(stepped, full) < 1e-5
    chunked = CpuEngine(model, max_context=32, prefill_chunk=3)
    assert _rel(chunked.prefill(seq), full) < 1e-5


def test_engines_sharing_one_model_keep_separate_sequences(models):
    model, _ = models["Q8_0"]
    a, b = CpuEngine(model, max_context=16), CpuEngine(model, max_context=16)
    a.prefill(PROMPT[:3])
    b.prefill([5, 6])
    la = a.decode_step(7)
    solo = CpuEngine(model, max_context=16)
    solo.prefill(PROMPT[:3])
    np.testing.assert_array_equal(la, solo.decode_step(7))


def test_the_hook_sees_every_intermediate(models):
    model, path = models["IQ_MIX"]
    seen: dict[tuple[str, int], np.ndarray] = {}
    eng = CpuEngine(model, max_context=16, cb=lambda name, il, x: seen.__setitem__((name, il),
                                                                                    np.copy(x)))
    logits = eng.prefill(PROMPT)
    s = model.shape
    for il in range(s.n_layer):
        for name in ("attn_norm", "Qcur", "Kcur", "Vcur", "Qcur_rope", "Kcur_rope", "kqv_out",
                     "attn_out", "ffn_inp", "ffn_norm", "ffn_moe_logits", "ffn_moe_weights",
                     "ffn_moe_topk", "ffn_moe_out", "l_out"):
            assert (name, il) in seen, name
    assert seen[("Qcur_rope", 0)].shape == (len(PROMPT), s.n_head, s.head_dim)
    assert seen[("ffn_moe_topk", 1)].shape == (len(PROMPT), s.n_expert_used)
    np.testing.assert_array_equal(seen[("result_output", -1)][0], logits)
    # the router's choice for the first token of layer 0, against the reference's math
    m = ref.RefModel.load(path)
    h = m.t["token_embd"][PROMPT]
    np.testing.assert_allclose(seen[("inp_embd", -1)], h, rtol=1e-6)
    x = ref.rms_norm(h, m.t["blk.0.attn_norm"], m.eps)
    np.testing.assert_allclose(seen[("attn_norm", 0)], x, rtol=1e-4, atol=1e-5)


def test_bad_tokens_are_clear_errors(models):
    model, _ = models["Q8_0"]
    eng = CpuEngine(model, max_context=8)
    with pytest.raises(EngineInputError, match="empty"):
        eng.prefill([])
    with pytest.raises(EngineInputError, match="token id 640 is outside the vocabulary"):
        eng.prefill([1, 640])
    with pytest.raises(EngineInputError, match="token id -1"):
        eng.decode_step(-1)
    with pytest.raises(ContextFullError, match="the prompt has 9 tokens but the context holds 8"):
        eng.prefill(list(range(9)))
    eng.prefill(list(range(8)))
    with pytest.raises(ContextFullError, match="context holds 8"):
        eng.decode_step(1)
    assert eng.n_past == 8


def test_max_context_defaults_to_the_model_capped_and_is_checked(models):
    model, _ = models["Q8_0"]
    assert CpuEngine(model).max_context == min(model.shape.n_ctx_train, 4096)
    with pytest.raises(ValueError, match="max_context must be at least 1"):
        CpuEngine(model, max_context=0)


def test_a_prompt_stops_between_chunks_when_its_check_says_so(models):
    """`strata.engine.interrupt`: inside `interruptible(check)`, the prompt stops at the
    chunk boundary after check() turns true (a server's cancelled request); the engine is
    then reset and runs the next prompt as if nothing had happened. Outside, or with a check
    that stays false, nothing changes."""
    from strata.engine.interrupt import PrefillInterrupted, interruptible
    model, _ = models["Q8_0"]
    seq = PROMPT * 3
    full = CpuEngine(model, max_context=32).prefill(seq)
    eng = CpuEngine(model, max_context=32, prefill_chunk=3)
    calls = []

    def check():
        calls.append(eng.n_past)
        return eng.n_past >= 6
    with interruptible(check), pytest.raises(PrefillInterrupted):
        eng.prefill(seq)
    assert calls == [3, 6] and eng.n_past == 6  # two chunks run, stopped before the third
    eng.reset()
    with interruptible(lambda: False):
        after = eng.prefill(seq)
    np.testing.assert_array_equal(after, CpuEngine(model, max_context=32,
                                                   prefill_chunk=3).prefill(seq))
    assert _rel(after, full) < 1e-5
