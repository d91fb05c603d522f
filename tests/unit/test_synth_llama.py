"""llama.cpp (through llama-cpp-python, an optional dependency) loads a synthetic model, tokenizes
with its vocabulary as Hugging Face `tokenizers` does, and computes logits that agree with the
float64 reference forward (llama.cpp quantizes activations to 8 bits: a few percent)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.reference import RefModel, forward
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from strata.synth import PRESETS, write_model
from strata.synth.vocab import build_vocab

llama_cpp = pytest.importorskip("llama_cpp")

TEXT = "The children walk to the market, and the river runs clear."


def _hf_ids(text: str) -> list[int]:
    v = build_vocab(PRESETS["tiny"].n_vocab)
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(v.tokens)},
                               [tuple(m.split(" ")) for m in v.merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok.encode(text).ids


@pytest.fixture(scope="module")
def tiny_q4km(tmp_models):
    path = tmp_models / "tiny-llama-Q4_K_M.gguf"
    write_model(path, PRESETS["tiny"], mix="Q4_K_M", seed=4, skew=3, progress=False)
    return path


def test_llama_cpp_tokenizes_and_agrees_with_reference(tiny_q4km):
    llm = llama_cpp.Llama(str(tiny_q4km), n_ctx=128, n_threads=1, logits_all=True, verbose=False)
    ids = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    assert ids == _hf_ids(TEXT) and llm.detokenize(ids).decode() == TEXT
    assert llm.tokenize(b"<|im_start|>", add_bos=False, special=True) == [
        build_vocab(PRESETS["tiny"].n_vocab).tokens.index("<|im_start|>")]
    llm.eval(ids)
    got = np.asarray(llm.scores[:len(ids)], np.float64)  # [n_tok, n_vocab]
    want = forward(RefModel.load(tiny_q4km), ids)
    rel = np.sqrt(((got - want) ** 2).mean()) / want.std()
    assert rel < 0.05, rel
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.9
