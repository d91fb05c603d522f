"""Token ids against llama.cpp (through llama-cpp-python, an optional dependency) on synthetic
byte-level BPE and SentencePiece vocabularies written as GGUF files."""

from __future__ import annotations

import pytest

from helpers.vocabmake import (
    CORPUS, PY_PATTERNS, byte_level_meta, llama_cpp_keys, random_texts, spm_meta, spm_pieces,
    train_merges, write_gguf,
)
from strata.tokenizer import Tokenizer

llama_cpp = pytest.importorskip("llama_cpp")

FIXED = CORPUS.splitlines(keepends=True) + [
    CORPUS, "", " ", "  x  ", "\n\n\n", "a\r\nb", "<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|><|im_end|><|endoftext|>", "x<|im_end", "1234567890 12 123", "'S 'rE 'LL",
]


def _llama(path):
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def _compare(llm, tok, texts):
    bad = []
    for text in texts:
        for special in (True, False):
            ours = tok.encode(text, add_bos=False, parse_special=special)
            theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            if ours != theirs:
                bad.append((text, special, ours, theirs))
    return bad


@pytest.fixture(scope="module")
def merges():
    # digit runs in the training text give digit merges, where qwen2 (one digit per word) and
    # llama-bpe (up to three) differ; the random texts give merges across many scripts
    text = CORPUS * 2 + "".join(random_texts(1, 60)) + " 123 456 789 2024 1234 99 " * 4
    return train_merges(text, 400, pattern=PY_PATTERNS["llama-bpe"])


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt-2"])
def test_byte_level_bpe_matches_llama_cpp(tmp_path, merges, pre):
    meta = byte_level_meta(merges, pre=pre, n_filler=1000)
    llm = _llama(write_gguf(tmp_path / f"{pre}.gguf", meta, extra=llama_cpp_keys("qwen2")))
    tok = Tokenizer.from_metadata(meta)
    bad = _compare(llm, tok, FIXED + random_texts(2, 300))
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"


def test_sentencepiece_matches_llama_cpp(tmp_path):
    meta = spm_meta(spm_pieces(), user_defined=("\n\n", "<tab>"))
    llm = _llama(write_gguf(tmp_path / "spm.gguf", meta, arch="llama",
                            extra=llama_cpp_keys("llama")))
    tok = Tokenizer.from_metadata(meta)
    texts = FIXED + ["<s>x</s>", "<start_of_turn>user x<end_of_turn>", "a<tab>b\n\n\nc"]
    bad = _compare(llm, tok, texts + random_texts(3, 300))
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"
    for text in ("Hello", "<start_of_turn>a b"):
        assert tok.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True)
