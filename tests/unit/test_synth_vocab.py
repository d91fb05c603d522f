"""The synthetic tokenizer: a byte-level BPE vocabulary that Hugging Face `tokenizers` (an
independent implementation) accepts and round-trips, with ChatML specials and unused fillers."""

from __future__ import annotations

import jinja2
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from strata.tokenizer.bytelevel import BYTE_TO_CHAR
from strata.synth.vocab import (
    CHAT_TEMPLATE, CONTROL, NORMAL, SPECIALS, UNUSED, build_vocab, learn_merges,
)


@pytest.fixture(scope="module")
def vocab():
    return build_vocab(1152)


def _hf(v) -> Tokenizer:
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(v.tokens)},
                               [tuple(m.split(" ")) for m in v.merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def test_byte_chars_are_gpt2_mapping():
    chars = BYTE_TO_CHAR
    assert len(set(chars)) == 256
    assert chars[ord("A")] == "A" and chars[ord(" ")] == "\u0120" and chars[ord("\n")] == "\u010a"


def test_layout_and_special_ids(vocab):
    n_merge = len(vocab.merges)
    assert 150 <= n_merge == len(learn_merges()) and vocab.tokens[:256] == BYTE_TO_CHAR
    assert vocab.tokens[256 + n_merge:256 + n_merge + 3] == SPECIALS
    assert vocab.bos_id == vocab.pad_id == vocab.tokens.index("<|endoftext|>")
    assert vocab.eos_id == vocab.eot_id == vocab.tokens.index("<|im_end|>")
    assert set(vocab.token_types[:256 + n_merge]) == {NORMAL}
    assert set(vocab.token_types[256 + n_merge:vocab.n_real]) == {CONTROL}
    assert set(vocab.token_types[vocab.n_real:]) == {UNUSED}
    assert len(vocab.tokens) == 1152 == len(set(vocab.tokens))


def test_every_merge_builds_on_earlier_tokens(vocab):
    known = set(vocab.tokens[:256])
    for m in vocab.merges:
        a, b = m.split(" ")
        assert a in known and b in known
        known.add(a + b)


@pytest.mark.parametrize("text", [
    "The children walk to the market.", "  leading spaces\nand lines\n\n",
    "Ünïcode ✓ 数字 123 and emoji 🙂", "",
])
def test_round_trip_with_hf_tokenizers(vocab, text):
    tok = _hf(vocab)
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert all(i < vocab.n_real - len(SPECIALS) for i in ids)  # no special, no filler


def test_merges_compress_english(vocab):
    ids = _hf(vocab).encode("the people of the village walk to the market").ids
    assert len(ids) <= 14  # 44 bytes


def test_chat_template_renders_chatml():
    out = jinja2.Template(CHAT_TEMPLATE).render(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n")


def test_vocab_too_small():
    with pytest.raises(ValueError, match="no room"):
        build_vocab(200)
