"""`POST /tokenize` and `/detokenize` over the character vocabulary: a prompt in either local
server's shape, a chat through the template the chat route renders, pieces, round trips and
the 400s naming the field. The real tokenizer: tests/e2e/test_serve_sdk.py."""

from __future__ import annotations

import pytest

from test_serve_app import Harness


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def _post(h, path, **body):
    r = h.client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_prompt_in_either_shape(h):
    for key in ("prompt", "content"):
        r = _post(h, "/tokenize", **{key: "Hi!"})
        assert r == {"tokens": [72, 105, 33], "count": 3, "max_model_len": 4096}
    pieces = _post(h, "/tokenize", content="ab", with_pieces=True, model="fake-alias")
    assert pieces["tokens"] == [{"id": 97, "piece": "a"}, {"id": 98, "piece": "b"}]
    assert _post(h, "/tokenize", prompt="")["count"] == 0


def test_a_chat_is_rendered_as_the_chat_route_renders_it(h):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    r = _post(h, "/tokenize", messages=messages, tools=tools)
    rendered = "<tools>f</tools><system>be brief<user>hi<assistant>"
    assert r["tokens"] == [ord(c) for c in rendered]
    chat = _post(h, "/v1/chat/completions", model="fake", messages=messages, tools=tools,
                 max_tokens=1)
    assert chat["usage"]["prompt_tokens"] == r["count"]


def test_detokenize_keeps_control_tokens(h):
    r = _post(h, "/detokenize", tokens=[72, 105, 256])
    assert r == {"prompt": "Hi<eot>", "content": "Hi<eot>"}
    assert _post(h, "/detokenize", tokens=[])["prompt"] == ""


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": []}, "messages"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "a", "add_special": True, "add_special_tokens": True}, "add_special"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
    ("/detokenize", {"tokens": [1, 257]}, "tokens[1]"),
    ("/detokenize", {"tokens": [1, True]}, "tokens[1]"),
    ("/detokenize", {}, "tokens"),
])
def test_bad_bodies_name_the_field(h, path, body, param):
    r = h.client.post(path, json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


def test_the_routes_need_the_key():
    with Harness() as h:
        from starlette.testclient import TestClient
        bare = TestClient(h.app)
        assert bare.post("/tokenize", json={"prompt": "a"}).status_code == 401
