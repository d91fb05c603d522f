"""Lone UTF-16 surrogates (a JSON escape such as "\\ud800", a non-UTF-8 command-line argument
decoded with surrogateescape) are encoded as U+FFFD by both vocabulary kinds, rather than
failing inside the tokenizer core."""

from __future__ import annotations

import pytest

from helpers.vocabmake import byte_level_meta, spm_meta, spm_pieces
from strata.tokenizer import ChatTemplate, Tokenizer, replace_surrogates

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
          "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module", params=["bpe", "spm"])
def tok(request):
    meta = (byte_level_meta([("a", "b")], chat_template=CHATML) if request.param == "bpe"
            else spm_meta(spm_pieces()))
    return Tokenizer.from_metadata(meta)


@pytest.mark.parametrize("text, clean", [
    ("x\ud800y", "x\ufffdy"),  # a lone high surrogate (JSON "\ud800")
    ("x\udfffy", "x\ufffdy"),  # a lone low one
    ("caf\udcc3", "caf\ufffd"),  # argv byte 0xC3 kept by surrogateescape
    ("\udcff", "\ufffd"),
    ("a\ud83d\ude00b", "a\U0001F600b"),  # a pair standing as two code points: its character
    ("\ud800\ud800\udc00", "\ufffd\U00010000"),
])
def test_lone_surrogates_encode_as_the_replacement_character(tok, text, clean):
    assert replace_surrogates(text) == clean
    assert tok.encode(text) == tok.encode(clean)
    assert tok.encode(text, parse_special=False) == tok.encode(clean, parse_special=False)


def test_valid_text_is_returned_as_is():
    text = "naïve 日本語 🙂 \U0010ffff"
    assert replace_surrogates(text) is text


def test_a_rendered_chat_with_a_surrogate_encodes():
    meta = byte_level_meta([("a", "b")], chat_template=CHATML)
    tok = Tokenizer.from_metadata(meta)
    text = ChatTemplate.from_metadata(meta, tok).render(
        [{"role": "user", "content": "hi \ud800 there"}])
    assert tok.decode(tok.encode(text)) == text.replace("\ud800", "\ufffd")
