"""Input that used to reach a 500: lone surrogates in text, bodies nested without end, null
message content, an `n` the queue can never hold; and the wording of a few 400s. Each is the
client's 4xx (or a 200 where the input is usable), with the field at fault named."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from starlette.testclient import TestClient

from helpers.vocabmake import byte_level_meta
from strata.serve.fields import MAX_JSON_DEPTH
from strata.serve.job import Job, Sampling
from strata.serve.model import ServedModel
from strata.tokenizer import ChatTemplate, Tokenizer
from test_serve_app import KEY, Harness, chat

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
          "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
LONE = "x\ud800y"  # json.dumps writes it as the escape "x\\ud800y", as a client would send it


class _ArgmaxModel(ServedModel):
    """The served model over a real byte-level tokenizer and template; the scripted engine's
    one-hot logits are read by arg-max (its ids 0..255 are this vocabulary's byte tokens and
    256 is <|endoftext|>, an end of turn)."""

    def sampler(self, sampling):
        return lambda logits: int(np.argmax(logits))


def real_model(template: str = CHATML) -> ServedModel:
    meta = byte_level_meta([("a", "b")], chat_template=template)
    tok = Tokenizer.from_metadata(meta)
    return _ArgmaxModel(name="fake", aliases=("fake-alias",), tokenizer=tok,
                        template=ChatTemplate.from_metadata(meta, tok), max_context=4096)


@pytest.fixture
def real():
    with Harness(model=real_model()) as harness:
        # a failure is a 500 response, not the server's exception raised here (whose message
        # may hold the surrogate, which the test runner's workers cannot pass on)
        harness.client = TestClient(harness.app, raise_server_exceptions=False,
                                    headers={"authorization": f"Bearer {KEY}"})
        yield harness


@pytest.fixture
def h():
    with Harness(max_body_bytes=1 << 20) as harness:  # room for 100,000 levels of nesting
        yield harness


def post_raw(client, path: str, body) -> object:
    text = body if isinstance(body, str) else json.dumps(body)  # ASCII: surrogates escaped
    return client.post(path, content=text, headers={"content-type": "application/json"})


# -- lone surrogates --------------------------------------------------------------------------

@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", chat(messages=[{"role": "system", "content": LONE},
                                            {"role": "user", "content": LONE}], stop=[LONE])),
    ("/v1/completions", {"model": "fake", "prompt": LONE, "echo": True, "stop": LONE}),
    ("/v1/messages", {"model": "fake", "max_tokens": 8, "system": LONE, "stop_sequences": [LONE],
                      "messages": [{"role": "user", "content": LONE}]}),
    ("/v1/messages/count_tokens", {"model": "fake",
                                   "messages": [{"role": "user", "content": LONE}]}),
    ("/v1/responses", {"model": "fake", "input": LONE, "instructions": LONE,
                       "metadata": {LONE: LONE}}),
    ("/api/chat", {"model": "fake", "stream": False,
                   "messages": [{"role": "user", "content": LONE}]}),
    ("/tokenize", {"prompt": LONE}),
    ("/tokenize", {"messages": [{"role": "user", "content": LONE}]}),
    ("/v1/conversations", {"metadata": {"k": LONE}}),
])
def test_a_lone_surrogate_is_read_as_the_replacement_character(real, path, body):
    r = post_raw(real.client, path, body)
    assert r.status_code == 200, r.text
    assert "\ud800" not in r.text and "\\ud800" not in r.text.lower()
    r.json()  # the answer is valid JSON throughout, echoed fields included


def test_surrogate_text_is_tokenized_as_its_replacement(real):
    got = post_raw(real.client, "/tokenize", {"prompt": LONE}).json()["tokens"]
    assert got == real.model.tokenizer.encode("x\ufffdy")
    pair = post_raw(real.client, "/tokenize", {"prompt": "\U0001F600"}).json()["tokens"]
    assert pair == real.model.tokenizer.encode("\U0001F600")  # an escaped pair is its character


def test_a_surrogate_in_a_key_named_by_an_error_is_a_400(real):
    r = post_raw(real.client, "/v1/chat/completions", chat(logit_bias={LONE: 1}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "logit_bias.x\ufffdy"


# -- nesting ----------------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [100_000, 1_000, MAX_JSON_DEPTH])
def test_a_body_nested_too_deeply_is_a_400(h, depth):
    nested = "[" * depth + "]" * depth  # inside the body object: one level more than `depth`
    for path, body in [("/v1/chat/completions", '{"model": "fake", "metadata": %s}'),
                       ("/v1/messages", '{"model": "fake", "metadata": %s}'),
                       ("/api/chat", '{"model": "fake", "metadata": %s}')]:
        r = post_raw(h.client, path, body % nested)
        assert r.status_code == 400, (path, r.text)
        message = r.text
        assert "nested too deeply" in message and str(MAX_JSON_DEPTH) in message


def test_a_body_within_the_depth_is_read(h):
    depth = MAX_JSON_DEPTH - 1
    body = '{"prompt": "hi", "extra": %s}' % ("[" * depth + "]" * depth)
    assert post_raw(h.client, "/tokenize", body).status_code == 200


def test_deep_tool_arguments_stay_a_string(h):
    deep = "[" * 5000 + "]" * 5000  # a string field: it nests nothing in the body itself
    call = {"type": "function", "id": "c1", "function": {"name": "f", "arguments": deep}}
    r = h.client.post("/v1/chat/completions", json=chat(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "done", "tool_call_id": "c1"}]))
    assert r.status_code == 200, r.text


# -- null content -----------------------------------------------------------------------------

@pytest.mark.parametrize("messages, param", [
    ([{"role": "system", "content": None}, {"role": "user", "content": "hi"}],
     "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "developer", "content": None}, {"role": "user", "content": "hi"}],
     "messages[0].content"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
      {"role": "user", "content": "again"}], "messages[1].content"),
    ([{"role": "user", "content": "hi"},
      {"role": "assistant", "content": None, "tool_calls": [
          {"type": "function", "id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "content": None, "tool_call_id": "c1"}], "messages[2].content"),
])
def test_null_content_is_a_400_naming_it(real, messages, param):
    for path in ("/v1/chat/completions", "/tokenize"):
        body = chat(messages=messages) if path != "/tokenize" else {"messages": messages}
        r = real.client.post(path, json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(f"{param}: ")
        assert "null" in err["message"]


def test_null_content_beside_tool_calls_is_taken(real):
    r = real.client.post("/v1/chat/completions", json=chat(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1"}]))
    assert r.status_code == 200, r.text


# -- n and the queue --------------------------------------------------------------------------

def test_an_n_the_queue_can_never_hold_is_a_400_and_counts_nothing():
    with Harness(n_slots=1, max_queue=1) as h:  # --batch 1 --max-queue 1, idle
        for path, body in [("/v1/chat/completions", chat(n=2)),
                           ("/v1/completions", {"model": "fake", "prompt": "x", "n": 3})]:
            r = h.client.post(path, json=body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "n" and "holds 1 request" in err["message"]
        assert not h.metrics.cancelled and not h.metrics.finished
        assert h.engine.prefills == []
        r = h.client.post("/v1/chat/completions", json=chat(n=1))
        assert r.status_code == 200 and h.metrics.finished == {"stop": 1}


def test_a_full_queue_is_a_503_with_retry_after():
    h = Harness(n_slots=1, max_queue=1)  # its worker not started: what is queued stays
    h.worker.submit(Job((1,), Sampling(max_tokens=2), lambda event: None))
    client = TestClient(h.app, headers={"authorization": f"Bearer {KEY}"})
    r = client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "queue is full" in r.json()["error"]["message"]
    # Anthropic's clients: its API's status for an overloaded server, 529 overloaded_error
    r = client.post("/v1/messages", json={"model": "fake", "max_tokens": 4,
                                          "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 529 and r.headers["retry-after"] == "1"
    assert r.json() == {"type": "error", "error": {"type": "overloaded_error",
                                                   "message": r.json()["error"]["message"]}}
    assert "queue is full" in r.json()["error"]["message"]
    assert not h.metrics.cancelled and not h.metrics.finished


# -- wording ----------------------------------------------------------------------------------

def test_the_room_a_prompt_lacks_is_counted_in_the_singular():
    with Harness(max_context=64) as h:
        r = h.client.post("/v1/completions", json={"model": "fake", "prompt": "x" * 64})
        message = r.json()["error"]["message"]
        assert r.status_code == 400 and message.endswith("shorten it by at least 1 token")
        r = h.client.post("/v1/completions", json={"model": "fake", "prompt": "x" * 65})
        assert r.json()["error"]["message"].endswith("shorten it by at least 2 tokens")
        # OpenAI's code for it, which agents act on (compact the history and retry)
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert "maximum context length is 64 tokens" in r.json()["error"]["message"]
        r = h.client.post("/v1/responses", json={"model": "fake", "input": "x" * 65})
        assert (r.status_code, r.json()["error"]["param"], r.json()["error"]["code"]) == (
            400, "input", "context_length_exceeded")
        # Anthropic's words for it, which its clients (Claude Code, LiteLLM) look for
        r = h.client.post("/v1/messages", json={"model": "fake", "max_tokens": 4, "messages": [
            {"role": "user", "content": "x" * 80}]})
        message = r.json()["error"]["message"]
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert re.match(r"prompt is too long: \d+ tokens > 64 maximum \(", message), message


def test_block_and_part_types_take_their_article(h):
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                          "data": "x"}}
    r = h.client.post("/v1/messages", json={"model": "fake", "max_tokens": 4, "messages": [
        {"role": "user", "content": [doc]}]})
    assert "is a 'document' block" in r.json()["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AA=="}}
    r = h.client.post("/v1/messages", json={"model": "fake", "max_tokens": 4, "messages": [
        {"role": "user", "content": [image]}]})
    assert "is an 'image' block" in r.json()["error"]["message"]
    r = h.client.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": [
        {"type": "file", "file": {"file_id": "f1"}}]}]))
    assert "is a 'file' part" in r.json()["error"]["message"]


def test_a_boolean_is_not_a_token_id(h):
    r = h.client.post("/detokenize", json={"tokens": [72, True]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "tokens[1]"
    assert err["message"] == "tokens[1]: expected an integer token id (0..256), got boolean"
    r = h.client.post("/detokenize", json={"tokens": [999]})
    assert r.json()["error"]["message"] == "tokens[0]: token id 999 is outside the vocabulary " \
                                           "(0..256)"
    r = h.client.post("/v1/completions", json={"model": "fake", "prompt": [72, True]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt[1]"
    assert "expected an integer token id" in err["message"] and "True" not in err["message"]


# -- empty Anthropic content, and metadata ------------------------------------------------------

ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
HI = {"role": "user", "content": "hi"}


def anthropic(messages: list, **extra) -> dict:
    return {"model": "fake", "max_tokens": 4, "messages": messages, **extra}


def anthropic_400(r, param: str) -> str:
    """The error's message, after checking it is Anthropic's 400 shape naming `param` first."""
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{param}: "), body
    return body["error"]["message"]


@pytest.mark.parametrize("messages, param", [
    ([{"role": "user", "content": ""}], "messages[0].content"),
    ([{"role": "user", "content": []}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "text", "text": ""}]}],
     "messages[0].content[0].text"),
    ([{"role": "user", "content": [{"type": "text", "text": ""}] * 2}],
     "messages[0].content[0].text"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": ""}]}],
     "messages[0].content[1].text"),
    ([HI, {"role": "assistant", "content": ""}, HI], "messages[1].content"),
    ([HI, {"role": "assistant", "content": []}, HI], "messages[1].content"),
    ([HI, {"role": "assistant", "content": "ok"}, {"role": "user", "content": []}],
     "messages[2].content"),
    ([HI, {"role": "assistant", "content": [{"type": "text", "text": ""}]}],
     "messages[1].content[0].text"),
])
def test_empty_anthropic_content_is_a_400_naming_it(h, messages, param):
    """Anthropic's API refuses a message without content (but a final assistant turn) and an
    empty text block; both routes read the body alike, and nothing reaches the engine."""
    for path in ANTHROPIC_ROUTES:
        message = anthropic_400(h.client.post(path, json=anthropic(messages)), param)
        assert "must not be empty" in message
    assert h.engine.prefills == []


@pytest.mark.parametrize("messages, param", [
    ([{"role": "user", "content": " \n\t"}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "  "}]}],
     "messages[0].content[1].text"),
    ([HI, {"role": "assistant", "content": [{"type": "text", "text": "\n"}]}, HI],
     "messages[1].content[0].text"),
])
def test_whitespace_only_anthropic_text_is_a_400_naming_it(h, messages, param):
    """Anthropic's API refuses text of whitespace alone ("text content blocks must contain
    non-whitespace text") in every message but a final assistant turn (a prefill, whose
    trailing whitespace is dropped)."""
    for path in ANTHROPIC_ROUTES:
        message = anthropic_400(h.client.post(path, json=anthropic(messages)), param)
        assert "non-whitespace" in message
    assert h.engine.prefills == []
    for path in ANTHROPIC_ROUTES:  # content of no type at all: named, not a 500 (the fuzzer's)
        bad = anthropic([{"role": "user", "content": None}])
        anthropic_400(h.client.post(path, json=bad), "messages[0].content")
    for path in ANTHROPIC_ROUTES:  # a final assistant turn of whitespace: a prefill, taken
        r = h.client.post(path, json=anthropic([HI, {"role": "assistant", "content": "  "}]))
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("last", ["", []])
def test_an_empty_final_assistant_turn_is_taken(h, last):
    """The one message Anthropic lets be empty: a final assistant turn (an empty prefill)."""
    for path in ANTHROPIC_ROUTES:
        r = h.client.post(path, json=anthropic([HI, {"role": "assistant", "content": last}]))
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("metadata, param", [
    ("user-1", "metadata"), (["user-1"], "metadata"), (7, "metadata"), (True, "metadata"),
    ({"user_id": 7}, "metadata.user_id"), ({"user_id": ["u"]}, "metadata.user_id"),
    ({"user_id": {"id": "u"}}, "metadata.user_id"), ({"user_id": False}, "metadata.user_id"),
    ({"user_id": "u" * 257}, "metadata.user_id"),
])
def test_anthropic_metadata_of_the_wrong_type_is_a_400(h, metadata, param):
    for path in ANTHROPIC_ROUTES:
        message = anthropic_400(h.client.post(path, json=anthropic([HI], metadata=metadata)),
                                param)
        assert "expected" in message or "at most 256 characters" in message
    assert h.engine.prefills == []


@pytest.mark.parametrize("metadata", [None, {}, {"user_id": None}, {"user_id": ""},
                                      {"user_id": "8f14e45f-ceea-4e7a-9f1b-5c1d2f3a4b6c"},
                                      {"user_id": "u" * 256}])
def test_anthropic_metadata_as_the_api_takes_it(h, metadata):
    for path in ANTHROPIC_ROUTES:
        r = h.client.post(path, json=anthropic([HI], metadata=metadata))
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("extra, param", [
    ({"metadata": "run-1"}, "metadata"), ({"metadata": ["run-1"]}, "metadata"),
    ({"metadata": {"run": 1}}, "metadata.run"), ({"metadata": {"run": None}}, "metadata.run"),
    ({"metadata": {"run": {"id": "1"}}}, "metadata.run"),
    ({"metadata": {"k": "v" * 513}}, "metadata.k"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"user": 5}, "user"), ({"store": "yes"}, "store"),
    ({"parallel_tool_calls": 1}, "parallel_tool_calls"), ({"service_tier": 1}, "service_tier"),
])
def test_openai_chat_checks_the_fields_it_ignores(h, extra, param):
    """OpenAI's `metadata` is an object of at most 16 strings; it and the other fields that
    cannot change the output are checked, as the official API checks them, then ignored."""
    r = h.client.post("/v1/chat/completions", json=chat(**extra))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["message"].startswith(f"{param}: ")
    if "metadata" in extra:  # the Responses route holds its (echoed) metadata to the same rules
        r = h.client.post("/v1/responses", json={"model": "fake", "input": "hi", **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert h.engine.prefills == []


def test_openai_chat_takes_the_fields_it_ignores(h):
    extra = {"metadata": {"run": "1", "k" * 64: "v" * 512}, "user": "u", "store": False,
             "parallel_tool_calls": True, "service_tier": "auto"}
    assert h.client.post("/v1/chat/completions", json=chat(**extra)).status_code == 200
    assert h.client.post("/v1/chat/completions", json=chat(metadata=None)).status_code == 200
    r = h.client.post("/v1/responses", json={"model": "fake", "input": "hi",
                                             "metadata": extra["metadata"]})
    assert r.status_code == 200 and r.json()["metadata"] == extra["metadata"], r.text
