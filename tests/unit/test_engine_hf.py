"""The CPU engine against Hugging Face's own `Qwen3MoeForCausalLM`, loading the same synthetic
GGUF file (`gguf_file=`, dequantized by transformers' GGUF loader) and running in float64:
greedy tokens through HF's generate (its own KV cache) and the first-step logits."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.engine_models import CONFIG, MIXES, PROMPT, model_path

from strata.engine.cpu import CpuEngine
from strata.gguf import open_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N_STEPS = 6


def _hf_model(path):
    # The GGUF loader maps no key to moe_intermediate_size (llama.cpp writes
    # expert_feed_forward_length), so it is passed; norm_topk_prob it sets itself.
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, moe_intermediate_size=CONFIG.n_ff_expert,
        dtype=torch.float64, experts_implementation="eager")  # grouped_mm has no float64
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.config.norm_topk_prob
    return model.eval()


@pytest.mark.parametrize("mix", MIXES)
def test_greedy_tokens_and_logits_match_hugging_face(tmp_models, mix):
    path = model_path(tmp_models, mix)
    hf = _hf_model(path)
    with torch.no_grad():
        want_first = hf(torch.tensor([PROMPT])).logits[0, -1].numpy()
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=N_STEPS, do_sample=False,
                          attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                          eos_token_id=None, pad_token_id=0)
    want_tokens = out[0, len(PROMPT):].tolist()
    eng = CpuEngine(open_model(path), max_context=32)
    logits = eng.prefill(PROMPT)
    first = logits
    tokens = []
    for _ in range(N_STEPS):
        tokens.append(int(np.argmax(logits)))
        logits = eng.decode_step(tokens[-1])
    assert tokens == want_tokens
    err = np.linalg.norm(first - want_first) / np.linalg.norm(want_first)
    # the bound: f32 activations (8-bit into K-quant products) against HF's f32 forward
    assert err < 2e-2
