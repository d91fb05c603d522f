"""Chat templates: the HF rendering environment, the ChatML fallback, and template errors."""

from __future__ import annotations

import datetime

import pytest

from helpers.vocabmake import byte_level_meta
from strata.tokenizer import (
    FALLBACK_TEMPLATE, ChatTemplate, ChatTemplateError, Tokenizer, TokenizerWarning,
)

# Qwen2.5-style ChatML with a tools section (the shape of real templates: whitespace control,
# tojson, namespace-free loops)
QWEN_LIKE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] != 'system' %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (tools and message.role == 'system') %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CHAT = [{"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."}]


@pytest.fixture(scope="module")
def meta():
    return byte_level_meta([("a", "b")], bos="<|endoftext|>", chat_template=QWEN_LIKE)


@pytest.fixture(scope="module")
def tok(meta):
    return Tokenizer.from_metadata(meta)


def _tmpl(tok, source):
    return ChatTemplate.from_metadata({}, tok, template=source)


def test_renders_the_file_template(meta, tok):
    t = ChatTemplate.from_metadata(meta, tok)
    assert not t.is_fallback and t.source == QWEN_LIKE
    assert t.render(CHAT) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
        "<|im_start|>user\nTell me a joke.<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert t.render(CHAT[:1], add_generation_prompt=False).endswith("Hi there<|im_end|>\n")


def test_tools_render_with_hf_tojson(meta, tok):
    tools = [{"type": "function", "function": {"name": "météo", "description": "a < b & c",
                                               "parameters": {"z": 1, "a": 2}}}]
    out = ChatTemplate.from_metadata(meta, tok).render(CHAT[:1], tools=tools)
    # non-ASCII kept, no HTML escaping, keys in their own order, ", " / ": " separators
    assert ('{"type": "function", "function": {"name": "météo", "description": "a < b & c", '
            '"parameters": {"z": 1, "a": 2}}}') in out
    assert out.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n<tools>\n")


def test_tojson_indent_and_ensure_ascii(tok):
    t = _tmpl(tok, "{{ messages[0] | tojson(indent=2) }}|{{ 'é' | tojson(ensure_ascii=True) }}")
    assert t.render([{"role": "user", "content": "é"}]) == \
        '{\n  "role": "user",\n  "content": "é"\n}|"\\u00e9"'


def test_rendered_prompt_tokenizes_to_control_tokens(meta, tok):
    text = ChatTemplate.from_metadata(meta, tok).render(CHAT[:1])
    ids = tok.encode(text)
    tokens = meta["tokenizer.ggml.tokens"]
    start, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    assert ids.count(start) == 3 and ids.count(end) == 2
    assert tok.decode(ids) == text


def test_fallback_is_chatml_with_a_warning(tok):
    with pytest.warns(TokenizerWarning, match="no tokenizer.chat_template"):
        t = ChatTemplate.from_metadata({}, tok)
    assert t.is_fallback and t.source == FALLBACK_TEMPLATE
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                         {"type": "image"}, {"type": "text", "text": "you"}]}]
    assert t.render(msgs) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                              "<|im_start|>user\nHi you<|im_end|>\n<|im_start|>assistant\n")
    assert t.render(msgs[:1], add_generation_prompt=False) == \
        "<|im_start|>system\nBe brief.<|im_end|>\n"


def test_special_token_variables(tok):
    t = _tmpl(tok, "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}")
    assert t.render([]) == "<|endoftext|>|<|im_end|>||"


def test_extra_variables_and_generation_block(tok):
    src = ("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}"
           "{% endfor %}{% if enable_thinking is false %}/no_think{% endif %}")
    t = _tmpl(tok, src)
    assert t.render(CHAT[:2], enable_thinking=False) == "Hi thereHello! How can I help?/no_think"
    assert t.render(CHAT[:2]) == "Hi thereHello! How can I help?"


def test_loop_controls(tok):
    src = ("{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}"
           "{% if loop.index0 == 2 %}{% break %}{% endif %}[{{ m.role }}]{% endfor %}")
    assert _tmpl(tok, src).render(CHAT + CHAT) == "[user]"


def test_trim_and_lstrip_blocks_as_hf(tok):
    src = "A\n{% if true %}\nB\n    {% endif %}\nC"
    assert _tmpl(tok, src).render([]) == "A\nB\nC"


def test_strftime_now(tok):
    year = datetime.datetime.now().strftime("%Y")
    assert _tmpl(tok, "{{ strftime_now('%Y') }}").render([]) in {year, str(int(year) + 1)}


def test_raise_exception_becomes_a_chat_template_error(tok):
    src = ("{% if messages[0]['role'] != 'user' %}"
           "{{ raise_exception('Conversation must start with user') }}{% endif %}ok")
    t = _tmpl(tok, src)
    assert t.render(CHAT) == "ok"
    with pytest.raises(ChatTemplateError, match="rejected the conversation: Conversation must "
                                                "start with user"):
        t.render(CHAT[1:])


def test_syntax_error_names_the_line(tok):
    with pytest.raises(ChatTemplateError, match=r"does not compile: .*line 2"):
        _tmpl(tok, "ok\n{% for m in messages %}no end")


def test_runtime_errors_are_chat_template_errors(tok):
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        _tmpl(tok, "{{ messages[0]['content'] + 1 }}").render(CHAT)
    with pytest.raises(ChatTemplateError, match="chat template failed: SecurityError"):
        _tmpl(tok, "{{ messages.append(1) }}").render(CHAT)  # the sandbox is immutable
    with pytest.raises(ChatTemplateError, match="chat template failed: UndefinedError"):
        _tmpl(tok, "{{ nothing.here }}").render(CHAT)


@pytest.mark.parametrize("bad, message", [
    ("hello", "messages must be a list"),
    ([{"content": "no role"}], r"messages\[0\] must be a dict with a string 'role'"),
    (["text"], r"messages\[0\] must be a dict"),
])
def test_bad_messages(tok, bad, message):
    with pytest.raises(ChatTemplateError, match=message):
        _tmpl(tok, FALLBACK_TEMPLATE).render(bad)


def test_template_key_must_be_a_string(tok):
    with pytest.raises(ChatTemplateError, match="should be a string"):
        ChatTemplate.from_metadata({"tokenizer.chat_template": 3}, tok)
