"""A thinking template on a real server (the tiny model, its real tokenizer): the template opens
`<think>` in the generation prompt, so the whole greedy answer is reasoning. Each route returns
it apart, equal to the raw text `/v1/completions` gives for the same prompt tokens."""

from __future__ import annotations

import httpx
import pytest

from helpers.serve_process import API_KEY, MODEL_NAME, TOOL_TEMPLATE, start_server

from strata.serve.reasoning import signature

THINKING = TOOL_TEMPLATE.replace("'<|im_start|>assistant\\n' }}{%- endif %}",
                                 "'<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
                                 "{#- </think> closes it #}")


@pytest.fixture(scope="module")
def thinking_server(tmp_models):
    assert THINKING != TOOL_TEMPLATE
    template = tmp_models / "thinking-template.jinja"
    template.write_text(THINKING)
    s = start_server(tmp_models, chat_template=str(template), batch=1)
    yield s
    s.stop()


def test_every_route_returns_the_reasoning_apart(thinking_server):
    ready = next(i for i, line in enumerate(thinking_server.lines) if line.startswith("READY "))
    assert any(line.startswith("thinking <think> blocks returned apart")
               for line in thinking_server.lines[:ready])
    head = {"authorization": f"Bearer {API_KEY}"}

    def post(path, **body):
        r = httpx.post(thinking_server.url + path, json=body, headers=head, timeout=120)
        assert r.status_code == 200, r.text
        return r

    messages = [{"role": "user", "content": "Hello"}]
    prompt = post("/tokenize", messages=messages).json()["tokens"]
    raw = post("/v1/completions", model=MODEL_NAME, prompt=prompt, max_tokens=8,
               temperature=0).json()["choices"][0]["text"]
    want = raw.strip()
    assert want and "</think>" not in raw  # the tiny model never closes the block
    chat = post("/v1/chat/completions", model=MODEL_NAME, messages=messages, max_tokens=8,
                temperature=0).json()["choices"][0]["message"]
    assert chat["reasoning_content"] == want and chat["content"] == ""
    claude = post("/v1/messages", model=MODEL_NAME, messages=messages, max_tokens=8,
                  temperature=0).json()["content"]
    assert claude == [{"type": "thinking", "thinking": want, "signature": signature(want)}]
    resp = post("/v1/responses", model=MODEL_NAME, input="Hello", max_output_tokens=8,
                temperature=0).json()["output"]
    assert resp[0]["type"] == "reasoning" and resp[0]["content"][0]["text"] == want
    ollama = post("/api/chat", model=MODEL_NAME, messages=messages, stream=False,
                  options={"temperature": 0, "num_predict": 8, "repeat_penalty": 1.0}).json()
    assert ollama["message"]["thinking"] == want and ollama["message"]["content"] == ""


def test_the_anthropic_sdk_keeps_the_thinking_blocks_signature(thinking_server):
    """The official client's stream helper folds the signature_delta into the thinking block:
    the block equals the one the whole response returns, its signature the text's digest."""
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=thinking_server.url, api_key=API_KEY, max_retries=0,
                                 timeout=60)
    ask = dict(model=MODEL_NAME, max_tokens=8, extra_body={"temperature": 0},  # greedy
               messages=[{"role": "user", "content": "Hello"}])
    whole = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    (block,) = whole.content
    assert block.type == "thinking" and block.signature == signature(block.thinking)
    assert streamed.content[0].model_dump() == block.model_dump()
