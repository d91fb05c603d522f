"""Decoding: UTF-8 edge cases, invalid byte sequences, and streaming one token at a time."""

from __future__ import annotations

import random

import pytest

from helpers.vocabmake import BYTE_CHAR, byte_level_meta
from strata.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    # no merges: every byte is its own token, so every multi-byte character is split
    return Tokenizer.from_metadata(byte_level_meta([("a", "b")]))


def _stream(tok, ids, **kw):
    d = tok.stream_decoder(**kw)
    pushed = [d.push(i) for i in ids]
    return pushed, d.flush()


def _byte_ids(data: bytes) -> list[int]:
    return list(data)  # byte_level_meta puts byte b at id b


def test_byte_ids_are_bytes(tok):
    assert [tok.token_text(b) for b in (0x20, 0x0A, 0x41)] == [BYTE_CHAR[0x20], "Ċ", "A"]
    assert all(tok.token_bytes(b) == bytes([b]) for b in range(256))


def test_four_byte_character_is_held_until_complete(tok):
    ids = tok.encode("🙂")
    assert ids == _byte_ids("🙂".encode())
    pushed, tail = _stream(tok, ids)
    assert pushed == ["", "", "", "🙂"] and tail == ""


@pytest.mark.parametrize("text", [
    "plain ascii", "naïve café", "日本語のテキスト", "한국어 텍스트", "e\u0301a\u0308 combining",
    "👩‍👩‍👧 family, 🇫🇷 flag, 👍🏽 skin tone", "mixed a🙂b日c\u0301d", "\U0010ffff\ue000",
])
def test_stream_emits_exactly_the_text(tok, text):
    ids = tok.encode(text)
    pushed, tail = _stream(tok, ids)
    assert "".join(pushed) + tail == text == tok.decode(ids)
    assert all("\ufffd" not in p for p in pushed)  # nothing half-decoded ever leaks out
    # every push returns whole characters: the prefix decoded so far is a prefix of the text
    out = ""
    for p in pushed:
        out += p
        assert text.startswith(out)


def test_invalid_sequences_become_replacement_characters(tok):
    assert tok.decode(_byte_ids(b"\xff")) == "\ufffd"
    assert tok.decode(_byte_ids(b"a\xf0b")) == "a\ufffdb"
    assert tok.decode(_byte_ids(b"\xc3")) == "\ufffd"  # truncated two-byte character
    assert tok.decode(_byte_ids(b"\xed\xa0\x80")) == "\ufffd" * 3  # a UTF-16 surrogate


def test_stream_releases_invalid_bytes_at_once(tok):
    pushed, tail = _stream(tok, _byte_ids(b"\xf0\x9f" + b"x"))
    assert pushed == ["", "", "\ufffdx"] and tail == ""
    pushed, tail = _stream(tok, _byte_ids(b"\xe6\x97"))
    assert pushed == ["", ""] and tail == "\ufffd"


def test_random_bytes_stream_equals_decode_equals_python(tok):
    rng = random.Random(5)
    for _ in range(300):
        data = bytes(rng.choice([rng.randrange(256), 0xE6, 0x97, 0xA5, 0xF0, 0x9F, 0x80, 0x41])
                     for _ in range(rng.randint(0, 12)))
        ids = _byte_ids(data)
        pushed, tail = _stream(tok, ids)
        expected = data.decode("utf-8", errors="replace")
        assert "".join(pushed) + tail == expected == tok.decode(ids), data


def test_stream_skips_specials_when_asked(tok):
    ids = tok.encode("<|im_start|>hi🙂<|im_end|>")
    pushed, tail = _stream(tok, ids, skip_special=True)
    assert "".join(pushed) + tail == "hi🙂"
    pushed, tail = _stream(tok, ids)
    assert "".join(pushed) + tail == "<|im_start|>hi🙂<|im_end|>"


def test_flush_resets_for_reuse(tok):
    d = tok.stream_decoder()
    assert d.push(0xE6) == "" and d.flush() == "\ufffd"
    assert [d.push(i) for i in _byte_ids("日".encode())] == ["", "", "日"]


def test_stream_rejects_bad_ids(tok):
    d = tok.stream_decoder()
    n = tok.n_vocab
    with pytest.raises(ValueError, match=f"token id {n} is out of range .* {n} tokens"):
        d.push(tok.n_vocab)
