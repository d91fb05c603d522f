"""Anthropic's prefill: a final assistant turn on /v1/messages is continued, not answered. The
prompt is the conversation before it with the generation prompt, then its text (trailing blank
space dropped), with no end of turn after it; the response holds only the new text, and
count_tokens counts that same prompt."""

from __future__ import annotations

import json

import pytest

from strata.serve.chat import chat_text, prepare_chat
from strata.serve.fields import Fields
from strata.serve.anthropic_request import parse_messages
from test_serve_app import Harness, sse_events
from test_serve_bad_input import real_model

ANSWER = "Hi there!"  # the scripted engine's answer to a plain prompt
# Qwen3's switch: with enable_thinking false the generation prompt holds an empty block
QWEN3_LIKE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
              "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and "
              "not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}")
# DeepSeek-R1's way: the generation prompt opens the block (history's is cut at </think>)
R1_LIKE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + "
           "m['content'].split('</think>')[-1] + '<|im_end|>\\n' }}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}")


class _State:
    """What `parse_messages` asks of the server state."""

    def check_model(self, name):
        pass


def body(messages, **kw):
    return {"model": "fake", "max_tokens": 16, "messages": messages, **kw}


ASK = [{"role": "user", "content": "Give me JSON"}]
PREFILLED = ASK + [{"role": "assistant", "content": "{  \n"}]


def chat_of(messages, **kw):
    return parse_messages(Fields(body(messages, **kw)), _State()).chat


def test_the_prompt_ends_with_the_prefill_and_no_end_of_turn():
    model = real_model()
    text, prefix = chat_text(model, chat_of(PREFILLED))
    assert text == "<|im_start|>user\nGive me JSON<|im_end|>\n<|im_start|>assistant\n{"
    assert prefix == ""
    plain, _ = chat_text(model, chat_of(ASK))  # a normal conversation renders as before
    assert plain == model.render_chat(ASK, None, {})
    assert text == plain + "{"


def test_count_tokens_counts_the_prefilled_prompt():
    model = real_model()
    with Harness(model=model) as h:
        got = h.client.post("/v1/messages/count_tokens", json=body(PREFILLED)).json()
        want = model.encode(model.render_chat(ASK, None, {}) + "{")
        assert got == {"input_tokens": len(want)}
        assert model.tokenizer.decode(want).endswith("assistant\n{")
        plain = h.client.post("/v1/messages/count_tokens", json=body(ASK)).json()
        assert plain == {"input_tokens": len(model.encode(model.render_chat(ASK, None, {})))}


def test_the_answer_is_only_what_follows_the_prefill():
    with Harness() as h:
        r = h.client.post("/v1/messages", json=body(PREFILLED))
        assert r.status_code == 200, r.text
        assert r.json()["content"] == [{"type": "text", "text": ANSWER}]
        # (the fake template writes the variables: no `thinking` is thinking off)
        assert h.engine.prefills[-1] == "<user>Give me JSON<assistant><enable_thinking=false>{"
        r = h.client.post("/v1/messages", json=body(PREFILLED, stream=True))
        deltas = [json.loads(d)["delta"] for e, d in sse_events(r.text)
                  if e == "content_block_delta"]
        assert "".join(d["text"] for d in deltas) == ANSWER
        # a whitespace-only final turn continues nothing: the usual generation prompt
        h.client.post("/v1/messages", json=body(ASK + [{"role": "assistant", "content": " "}]))
        assert h.engine.prefills[-1] == "<user>Give me JSON<assistant><enable_thinking=false>"


def test_thinking_templates_keep_their_generation_prompt():
    # Qwen3 with thinking off: the prefill follows the empty block; the answer is content
    model = real_model(QWEN3_LIKE)
    assert model.splits_thinking
    chat = chat_of(PREFILLED, thinking={"type": "disabled"})
    text, _ = chat_text(model, chat)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n{")
    prepared = prepare_chat(model, chat, limit=None)
    assert not prepared.split_thinking and not prepared.thinking_open
    # a template that opens the block: the prefill is written inside it, and what follows
    # is reasoning until the model closes it
    model = real_model(R1_LIKE)
    text, _ = chat_text(model, chat_of(PREFILLED))
    assert text.endswith("<|im_start|>assistant\n<think>\n{")
    prepared = prepare_chat(model, chat_of(PREFILLED), limit=None)
    assert prepared.split_thinking and prepared.thinking_open
    closed = chat_of(ASK + [{"role": "assistant", "content": "<think>\nplan\n</think>\n\nOK"}])
    prepared = prepare_chat(model, closed, limit=None)
    assert not prepared.split_thinking  # the block is closed: what follows is the answer


@pytest.mark.parametrize("messages, extra, param", [
    (ASK + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}],
     {"tools": [{"name": "f", "input_schema": {"type": "object"}}]}, "messages[1]"),
    (ASK + [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": "{"}]}], {}, "messages[1]"),
    ([{"role": "assistant", "content": "{"}], {}, "messages[0]"),
])
def test_a_final_turn_that_cannot_be_continued_is_a_400(messages, extra, param):
    with Harness() as h:
        r = h.client.post("/v1/messages", json=body(messages, **extra))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith(f"{param}: the final assistant turn")


def test_a_prefill_with_a_json_format_or_a_forced_call_is_a_400():
    with Harness() as h:
        fmt = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
        r = h.client.post("/v1/messages", json=body(PREFILLED, output_config=fmt))
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith("output_config.format: ")
        tools = [{"name": "f", "input_schema": {"type": "object"}}]
        r = h.client.post("/v1/messages", json=body(PREFILLED, tools=tools,
                                                    tool_choice={"type": "any"}))
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("tool_choice: ")
        r = h.client.post("/v1/messages", json=body(PREFILLED, tools=tools))  # auto: fine
        assert r.status_code == 200, r.text
