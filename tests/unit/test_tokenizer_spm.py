"""SentencePiece-style ("llama") vocabularies: score-ordered merges against a naive reference,
byte fallback, the dummy space prefix, special tokens."""

from __future__ import annotations

import random

import pytest

from helpers.vocabmake import (
    SPACE, read_meta, reference_spm, spm_meta, spm_pieces, write_gguf,
)
from strata.tokenizer import Tokenizer, TokenizerError


@pytest.fixture(scope="module")
def meta():
    return spm_meta(spm_pieces())


@pytest.fixture(scope="module")
def tok(meta):
    return Tokenizer.from_metadata(meta)


TEXTS = [
    "Hello world", "The quick brown fox jumps over the lazy dog.", "  two leading spaces",
    "trailing   ", "the test set", "sets  set   set", "naïve café 日本語のテキスト",
    "emoji 🙂🚀 and \U0010ffff", "e\u0301 combining", "tab\tand\nnewline", "", " ",
]


@pytest.mark.parametrize("text", TEXTS)
def test_matches_naive_reference(meta, tok, text):
    assert tok.encode(text, add_bos=False) == reference_spm(text, meta, prefix_space=bool(text))


def test_random_text_matches_reference(meta, tok):
    rng = random.Random(11)
    alphabet = list("thequickbrownfoxTQ .,;!\n\tés日🙂") + [" the ", "  ", "set "]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        ids = tok.encode(text, add_bos=False)
        assert ids == reference_spm(text, meta, prefix_space=True), repr(text)
        assert tok.decode(ids) == text


def test_without_space_prefix(meta):
    t = Tokenizer.from_metadata({**meta, "tokenizer.ggml.add_space_prefix": False})
    for text in TEXTS:
        ids = t.encode(text, add_bos=False)
        assert ids == reference_spm(text, meta, prefix_space=False), repr(text)
        assert t.decode(ids) == text


def test_pieces_span_word_boundaries_where_the_vocabulary_says():
    pieces = {"a": -1.0, "b": -1.0, SPACE: -1.0, "a" + SPACE: -0.1, "a" + SPACE + "b": -0.05,
              SPACE + "b": -0.5}
    meta = spm_meta(pieces, add_space_prefix=False)
    t = Tokenizer.from_metadata(meta)
    assert [t.token_text(i) for i in t.encode("b a b", add_bos=False)] == ["b", SPACE, "a▁b"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_with_bos(tok, text):
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert tok.decode(ids, skip_special=True) == text
    assert tok.decode(ids) == "<s>" + text


def test_byte_fallback(tok):
    ids = tok.encode("🙂", add_bos=False)
    assert [tok.token_text(i) for i in ids][-4:] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    assert tok.token_bytes(ids[-1]) == b"\x82"
    assert tok.decode(ids) == "🙂"


def test_space_prefix_after_control_tokens(tok, meta):
    tokens = meta["tokenizer.ggml.tokens"]
    start, end = tokens.index("<start_of_turn>"), tokens.index("<end_of_turn>")
    ids = tok.encode("<start_of_turn>user said<end_of_turn>", add_bos=False)
    assert ids[0] == start and ids[-1] == end
    # a fresh text fragment after a control token gets the dummy space, as at the start
    assert ids[1:-1] == tok.encode("user said", add_bos=False)
    assert tok.decode(ids) == "<start_of_turn>user said<end_of_turn>"
    plain = tok.encode("<start_of_turn>x", add_bos=False, parse_special=False)
    assert start not in plain and tok.decode(plain) == "<start_of_turn>x"


def test_stream_keeps_a_generated_space_after_ordinary_text(tok):
    ids = tok.encode("the fox", add_bos=False)
    last, generated = ids[0], ids[1:]
    assert tok.decode(generated) == "fox"  # a stream from nothing drops the dummy space
    d = tok.stream_decoder(after=last)
    assert "".join(d.push(i) for i in generated) + d.flush() == " fox"
    d = tok.stream_decoder(after=tok.bos_id)
    assert "".join(d.push(i) for i in generated) + d.flush() == "fox"


def test_user_defined_whitespace_tokens(meta):
    m = spm_meta(spm_pieces(), user_defined=("\n", "\n\n", "  "), add_space_prefix=False)
    t = Tokenizer.from_metadata(m)
    tokens = m["tokenizer.ggml.tokens"]
    ids = t.encode("a\n\n\nb  c", add_bos=False, parse_special=False)
    assert [tokens[i] for i in ids if tokens[i].strip() == ""] == ["\n\n", "\n", "  "]
    assert t.decode(ids) == "a\n\n\nb  c"


def test_reads_a_gguf_file(tmp_path, meta):
    path = write_gguf(tmp_path / "spm.gguf", meta, arch="llama")
    t = Tokenizer.from_metadata(read_meta(path))
    text = "The quick brown fox 🙂"
    assert t.encode(text) == Tokenizer.from_metadata(meta).encode(text)


def test_eot_and_special(tok, meta):
    tokens = meta["tokenizer.ggml.tokens"]
    assert tok.eot_ids == {2, tokens.index("<end_of_turn>")}
    assert tok.is_special(0) and tok.is_special(1) and tok.is_special(2)
    assert not tok.is_special(tokens.index("<0x41>"))


def test_no_byte_tokens_and_no_unknown_is_an_error():
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b", SPACE],
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0]}
    t = Tokenizer.from_metadata(meta)
    assert t.encode("ab ba") == [2, 0, 1, 2, 1, 0] and t.bos_id is None
    with pytest.raises(TokenizerError, match="no byte token <0xE6>"):
        t.encode("a日")
    with_unk = Tokenizer.from_metadata({**meta, "tokenizer.ggml.tokens": ["a", "b", "<unk>"],
                                        "tokenizer.ggml.unknown_token_id": 2,
                                        "tokenizer.ggml.add_space_prefix": False})
    assert with_unk.encode("a日") == [0, 2, 2, 2]


def test_scores_length_must_match(meta):
    with pytest.raises(TokenizerError, match="scores has 3 entries"):
        Tokenizer.from_metadata({**meta, "tokenizer.ggml.scores": [0.0, 1.0, 2.0]})
