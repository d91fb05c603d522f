"""The official `openai` and `anthropic` Python SDKs against a real `strata serve` process on the
tiny synthetic model (CPU backend): chat, streaming, usage, a tool round trip through the chat
template, the Responses API, and errors surfacing as the SDKs' own exception types."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.serve_process import API_KEY, MODEL_NAME

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=60)


def test_start_up_printed_the_plan_before_ready(server):
    ready = next(i for i, line in enumerate(server.lines) if line.startswith("READY "))
    before = "\n".join(server.lines[:ready])
    assert "backend  cpu: 4 slot(s)" in before and "1,024 tokens of context" in before
    assert "memory   cpu" in before and "kv (4 slots)" in before
    assert "<tool_call> blocks parsed" in before
    assert "thinking <think>" not in before  # the tests' template is not a thinking one
    assert server.url.startswith("http://127.0.0.1:") and not server.url.endswith(":1")


def test_openai_models_and_chat(oai):
    assert [m.id for m in oai.models.list().data] == [MODEL_NAME, "tiny-alias"]
    assert oai.models.retrieve("tiny-alias").id == "tiny-alias"
    r = oai.chat.completions.create(model=MODEL_NAME, max_tokens=5, temperature=0,
                                    messages=[{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hello"}])
    assert r.object == "chat.completion"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert isinstance(r.choices[0].message.content, str)
    assert 0 < r.usage.completion_tokens <= 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = oai.chat.completions.create(model="tiny-alias", max_tokens=5, temperature=0,
                                        messages=[{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hello"}])
    assert again.choices[0].message.content == r.choices[0].message.content  # greedy: same


def test_openai_stream_matches_non_stream_and_reports_usage(oai):
    kw = dict(model=MODEL_NAME, max_tokens=6, temperature=0,
              messages=[{"role": "user", "content": "Tell me about rivers"}])
    whole = oai.chat.completions.create(**kw)
    chunks = list(oai.chat.completions.create(**kw, stream=True,
                                              stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_openai_seeded_sampling_repeats(oai):
    kw = dict(model=MODEL_NAME, max_tokens=6, temperature=0.9, top_p=0.9, seed=1234,
              messages=[{"role": "user", "content": "Once upon a time"}])
    assert (oai.chat.completions.create(**kw).choices[0].message.content
            == oai.chat.completions.create(**kw).choices[0].message.content)


def test_openai_legacy_completion(oai):
    r = oai.completions.create(model=MODEL_NAME, prompt="The river", max_tokens=4, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens <= 4
    streamed = "".join(c.choices[0].text for c in oai.completions.create(
        model=MODEL_NAME, prompt="The river", max_tokens=4, temperature=0, stream=True))
    assert streamed == r.choices[0].text


def test_openai_tool_round_trip(oai):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    plain = oai.chat.completions.create(model=MODEL_NAME, max_tokens=1, messages=ask)
    with_tools = oai.chat.completions.create(model=MODEL_NAME, max_tokens=3, messages=ask,
                                             tools=TOOLS)
    # the tools went through the chat template into the prompt
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20
    follow = ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "Sunny, 21 C"},
    ]
    r = oai.chat.completions.create(model=MODEL_NAME, max_tokens=3, messages=follow, tools=TOOLS)
    assert r.usage.prompt_tokens > with_tools.usage.prompt_tokens  # call and result rendered
    forced = oai.chat.completions.create(
        model=MODEL_NAME, max_tokens=2, messages=ask, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    # the forced call's opening is part of the prompt
    assert forced.usage.prompt_tokens > with_tools.usage.prompt_tokens


def test_openai_penalties_through_the_sdk(oai):
    """The SDK's own presence_penalty / frequency_penalty, and llama.cpp's repeat_penalty,
    repeat_last_n and min_p in extra_body, reach a real server: greedy with them repeats
    itself, and a penalty out of OpenAI's range is the SDK's BadRequestError naming it."""
    kw = dict(model=MODEL_NAME, max_tokens=6, temperature=0, presence_penalty=0.5,
              frequency_penalty=-2.0, extra_body={"repeat_penalty": 1.3, "repeat_last_n": 32,
                                                  "min_p": 0.1},
              messages=[{"role": "user", "content": "river river river"}])
    first = oai.chat.completions.create(**kw)
    assert first.choices[0].finish_reason in ("stop", "length")
    assert first.choices[0].message.content == oai.chat.completions.create(
        **kw).choices[0].message.content
    legacy = oai.completions.create(model=MODEL_NAME, prompt="The river", max_tokens=3,
                                    temperature=0, frequency_penalty=1.0)
    assert 0 < legacy.usage.completion_tokens <= 3
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL_NAME, max_tokens=2, frequency_penalty=2.5,
                                    messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "frequency_penalty"


def test_openai_logprobs_are_the_float64_models(oai, tmp_models):
    """The SDK parses both logprobs shapes, and their numbers are the model's: each greedy
    token's log-probability and its five best alternatives' equal the log-softmax of a float64
    forward of the file (gguf-py's dequantize), their texts the tokenizer's pieces."""
    from helpers.reference import RefModel, forward
    from helpers.serve_process import tiny_model
    from strata.gguf import open_model
    from strata.tokenizer import Tokenizer

    path = tiny_model(tmp_models)
    ref, tok = RefModel.load(path), Tokenizer.from_metadata(open_model(path).metadata)
    prompt = [17, 301, 42, 999, 5]

    def piece(t):
        return tok.token_bytes(int(t)).decode("utf-8", errors="replace")

    r = oai.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0,
                               logprobs=5)
    lp = r.choices[0].logprobs
    chat = oai.chat.completions.create(
        model=MODEL_NAME, max_tokens=3, temperature=0, logprobs=True, top_logprobs=5,
        messages=[{"role": "user", "content": "Tell me about rivers"}])
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens or chat.choices[0].finish_reason == "stop"
    assert all(len(e.top_logprobs) == 5 and e.logprob == e.top_logprobs[0].logprob
               for e in content)
    seq = list(prompt)
    for i, token_text in enumerate(lp.tokens):
        z = forward(ref, seq)[-1]  # [n_vocab] f64
        ref_lp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
        best = np.argsort(-ref_lp, kind="stable")[:5]
        seq.append(int(best[0]))  # greedy: the server's token (tested against it elsewhere)
        assert token_text == piece(best[0])
        assert lp.token_logprobs[i] == pytest.approx(ref_lp[best[0]], abs=2e-3)
        want: dict[str, float] = {}  # the legacy shape keys by text: the likelier one stays
        for t in best:
            want.setdefault(piece(t), float(ref_lp[t]))
        assert lp.top_logprobs[i] == pytest.approx(want, abs=2e-3)
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == r.choices[0].text


def test_openai_logit_bias_through_the_sdk(oai, tmp_models):
    """-100 on the float64 forward's greedy token makes its runner-up the first token; +100 on
    one token makes greedy pick it every step; a key outside the vocabulary is the SDK's
    BadRequestError naming it."""
    from helpers.reference import RefModel, forward
    from helpers.serve_process import tiny_model
    from strata.gguf import open_model
    from strata.tokenizer import Tokenizer

    path = tiny_model(tmp_models)
    tok = Tokenizer.from_metadata(open_model(path).metadata)
    prompt = [17, 301, 42]
    order = np.argsort(-forward(RefModel.load(path), prompt)[-1], kind="stable")

    def piece(t):
        return tok.token_bytes(int(t)).decode("utf-8", errors="replace")

    kw = dict(model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0, logprobs=0)
    first = oai.completions.create(**kw).choices[0].logprobs.tokens[0]
    banned = oai.completions.create(**kw, logit_bias={str(order[0]): -100})
    assert (first, banned.choices[0].logprobs.tokens[0]) == (piece(order[0]), piece(order[1]))
    forced = oai.completions.create(**kw, logit_bias={"700": 100}).choices[0]
    assert forced.logprobs.tokens == [piece(700)] * 3
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(**kw, logit_bias={"99999": 1})
    assert e.value.body["param"] == "logit_bias.99999"


def test_openai_choices_through_the_sdk(oai):
    """n choices: the SDK reads each by index; greedy choices agree, seeded sampled ones repeat
    as a whole; the prompt is counted once."""
    kw = dict(model=MODEL_NAME, max_tokens=4, messages=[{"role": "user", "content": "Hello"}])
    greedy = oai.chat.completions.create(**kw, n=2, temperature=0)
    assert [c.index for c in greedy.choices] == [0, 1]
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    one = oai.chat.completions.create(**kw, temperature=0)
    assert greedy.usage.prompt_tokens == one.usage.prompt_tokens
    assert greedy.usage.completion_tokens == 2 * one.usage.completion_tokens
    sampled = [oai.chat.completions.create(**kw, n=3, temperature=1.0, seed=7)
               for _ in range(2)]
    assert ([c.message.content for c in sampled[0].choices]
            == [c.message.content for c in sampled[1].choices])
    streamed = {}
    for chunk in oai.completions.create(model=MODEL_NAME, prompt="The river", max_tokens=3,
                                        temperature=0, n=2, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    whole = oai.completions.create(model=MODEL_NAME, prompt="The river", max_tokens=3,
                                   temperature=0)
    assert streamed == {0: whole.choices[0].text, 1: whole.choices[0].text}


def test_openai_json_object_through_the_sdk(oai, tmp_models):
    """response_format json_object / json_schema on the real model and tokenizer: the answer
    opens an object at once and stays a prefix of one; with a bias towards "}" it closes at
    once, ends with the end-of-turn token (finish "stop") and parses; under a schema the whole
    answer validates; a keyword it cannot hold is the SDK's BadRequestError naming it."""
    from helpers.serve_process import tiny_model
    from strata.engine.json_constraint import feed, start
    from strata.engine.json_schema import object_node
    from strata.gguf import open_model
    from strata.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(open_model(tiny_model(tmp_models)).metadata)
    close = next(t for t in range(tok.n_vocab) if tok.token_bytes(t) == b"}")
    kw = dict(model=MODEL_NAME, temperature=0, response_format={"type": "json_object"},
              messages=[{"role": "user", "content": "Give me a JSON object"}])
    free = oai.chat.completions.create(**kw, max_tokens=24).choices[0]
    assert free.message.content.startswith("{")
    assert feed(start(object_node()), free.message.content.encode("utf-8")) is not None
    closed = oai.chat.completions.create(**kw, max_tokens=24, logit_bias={str(close): 60})
    assert closed.choices[0].finish_reason == "stop"
    assert json.loads(closed.choices[0].message.content) == {}
    # a schema: the random model is held to it key by key, and the whole answer validates
    # (jsonschema_rs, independent of the constraint)
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    held = oai.chat.completions.create(**{**kw, "response_format": {
        "type": "json_schema", "json_schema": {"name": "flags", "strict": True,
                                               "schema": schema}}}, max_tokens=400)
    assert held.choices[0].finish_reason == "stop"
    assert jsonschema_rs.is_valid(schema, json.loads(held.choices[0].message.content))
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(**{**kw, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
                "type": "object", "properties": {"d": {"type": "string", "pattern": "^a"}}}}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "pattern" in e.value.message


def test_openai_strict_tool_calls_through_the_sdk(oai):
    """A forced call to a strict tool on the real model and tokenizer: the arguments the model
    writes validate against the tool's parameters (jsonschema_rs)."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    params = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                               "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "strict": True,
                                               "parameters": params}}]
    r = oai.chat.completions.create(
        model=MODEL_NAME, max_tokens=400, temperature=0, tools=tools,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert jsonschema_rs.is_valid(params, json.loads(call.function.arguments))


def test_openai_responses_through_the_sdk(oai):
    """The Responses API through the SDK's typed objects: the text equals the chat route's
    greedy answer to the same conversation, the stream helper (which replays every event into
    the response and checks their order) ends with the same response, and a forced strict
    function call's arguments validate against its parameters (jsonschema_rs)."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    chat = oai.chat.completions.create(model=MODEL_NAME, max_tokens=6, temperature=0,
                                       messages=ask)
    r = oai.responses.create(model=MODEL_NAME, instructions="Be brief.", input="Hello",
                             max_output_tokens=6, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    with oai.responses.stream(model=MODEL_NAME, instructions="Be brief.", input="Hello",
                              max_output_tokens=6, temperature=0) as stream:
        events = list(stream)  # the helper folds each into its snapshot, checking the order
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    last = events[-1]  # completed, or incomplete where the 6 tokens ran out
    assert last.type == f"response.{r.status}" and last.response.status == r.status
    assert "".join(deltas) == last.response.output_text == r.output_text
    lp = oai.responses.create(model=MODEL_NAME, instructions="Be brief.", input="Hello",
                              max_output_tokens=6, temperature=0, top_logprobs=2,
                              include=["message.output_text.logprobs"])
    entries = lp.output[0].content[0].logprobs
    assert lp.output_text == r.output_text and len(entries) > 0
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    params = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
              "required": ["city"], "additionalProperties": False}
    tools = [{"type": "function", "name": "get_weather", "parameters": params, "strict": True}]
    r = oai.responses.create(model=MODEL_NAME, input="What is the weather in Paris?",
                             max_output_tokens=200, temperature=0, tools=tools,
                             tool_choice={"type": "function", "name": "get_weather"})
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and jsonschema_rs.is_valid(params, json.loads(call.arguments))
    output = [o.model_dump(exclude_none=True) for o in r.output]
    done = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
    follow = oai.responses.create(
        model=MODEL_NAME, max_output_tokens=3, temperature=0, tools=tools,
        input=[{"role": "user", "content": "What is the weather in Paris?"}, *output, done])
    assert follow.usage.input_tokens > r.usage.input_tokens  # the call and its output rendered
    # the same conversation continued from the store: the same prompt, the same answer
    cont = oai.responses.create(model=MODEL_NAME, max_output_tokens=3, temperature=0,
                                tools=tools, previous_response_id=r.id, input=[done])
    assert cont.previous_response_id == r.id
    assert cont.usage.input_tokens == follow.usage.input_tokens
    assert cont.output_text == follow.output_text
    assert oai.responses.retrieve(r.id).output_text == r.output_text
    # the continued response's own input through the SDK's pager (one item a page)
    listed = list(oai.responses.input_items.list(cont.id, limit=1, order="asc"))
    assert [(i.type, i.call_id, i.output) for i in listed] == [
        ("function_call_output", call.call_id, "Sunny")]
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        oai.responses.create(model=MODEL_NAME, input="x", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"


def test_openai_conversations_through_the_sdk(oai):
    """The Conversations API through the SDK: a conversation made with an item, a response in
    it seeing that item (the same prompt as the items sent as input), its items listed by the
    SDK's pager (the turn's input and answer added), an item added, read and deleted, the
    metadata updated, and the conversation deleted (then a 404 the SDK raises)."""
    conv = oai.conversations.create(metadata={"topic": "sdk"}, items=[
        {"type": "message", "role": "user", "content": "My name is Ada."}])
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "sdk"}
    r = oai.responses.create(model=MODEL_NAME, conversation=conv.id, input="Hello",
                             max_output_tokens=4, temperature=0)
    sent = oai.responses.create(model=MODEL_NAME, max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": "My name is Ada."}, {"role": "user", "content": "Hello"}])
    assert r.conversation.id == conv.id and r.output_text == sent.output_text
    assert r.usage.input_tokens == sent.usage.input_tokens
    items = list(oai.conversations.items.list(conv.id, order="asc", limit=1))
    assert [i.type for i in items] == ["message"] * 3
    assert items[1].content[0].text == "Hello" and items[2].id == r.output[0].id
    added = oai.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "user", "content": "Bye."}])
    (item,) = added.data
    assert oai.conversations.items.retrieve(item.id, conversation_id=conv.id).id == item.id
    oai.conversations.items.delete(item.id, conversation_id=conv.id)
    assert len(list(oai.conversations.items.list(conv.id))) == 3
    assert oai.conversations.update(conv.id, metadata={"topic": "done"}).metadata == {
        "topic": "done"}
    assert oai.conversations.delete(conv.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        oai.conversations.retrieve(conv.id)


def test_openai_errors_are_sdk_exceptions(server, oai):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
    assert "gpt-nope" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL_NAME, max_tokens=2, temperature=7,
                                    messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL_NAME, max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url",
                                          "image_url": {"url": "data:image/png;base64,AA"}}]}])
    assert "messages[0].content[0]" in e.value.message
    bad_key = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()


def test_anthropic_message_and_usage(claude):
    r = claude.messages.create(model=MODEL_NAME, max_tokens=5, extra_body={"temperature": 0},
                               system="Be brief.",
                               messages=[{"role": "user", "content": "Hello"}])
    assert r.type == "message" and r.role == "assistant"
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert 0 < r.usage.output_tokens <= 5 and r.usage.input_tokens > 0
    assert all(b.type == "text" for b in r.content)


def test_anthropic_stream_events(claude):
    kw = dict(model=MODEL_NAME, max_tokens=6, extra_body={"temperature": 0},
              messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me"}]}])
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds or whole.content == []
    assert [b.text for b in final.content] == [b.text for b in whole.content]
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.stop_reason == whole.stop_reason


def test_anthropic_tool_round_trip(claude):
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": TOOLS[0]["function"]["parameters"]}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = claude.messages.create(model=MODEL_NAME, max_tokens=3, messages=ask, tools=tools)
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    follow = ask + [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "Sunny, 21 C"}]},
            {"type": "text", "text": "Thanks"}]},
    ]
    r2 = claude.messages.create(model=MODEL_NAME, max_tokens=3, messages=follow, tools=tools)
    # the tool result makes the second prompt longer; its first turn's tokens come from the KV
    assert (r2.usage.input_tokens + r2.usage.cache_read_input_tokens > r.usage.input_tokens
            and r2.usage.cache_read_input_tokens > 0)
    counted = claude.messages.count_tokens(model=MODEL_NAME, messages=follow, tools=tools)
    assert counted.input_tokens == r2.usage.input_tokens + r2.usage.cache_read_input_tokens


def test_anthropic_models_through_the_sdk(claude):
    assert [m.id for m in claude.models.list().data] == [MODEL_NAME, "tiny-alias"]
    assert claude.models.retrieve("tiny-alias").id == "tiny-alias"
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("claude-nope")


def test_anthropic_errors_are_sdk_exceptions(server, claude):
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-nope", max_tokens=2,
                               messages=[{"role": "user", "content": "x"}])
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL_NAME, max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": [image]}]}])
    assert "messages[0].content[0].content[0]" in e.value.message
    assert e.value.body["error"]["type"] == "invalid_request_error"
    bad_key = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad_key.messages.create(model=MODEL_NAME, max_tokens=2,
                                messages=[{"role": "user", "content": "x"}])


def test_tokenize_gives_the_tokens_the_generation_routes_feed(server, oai):
    """`/tokenize` with the real tokenizer: a prompt's count is `/v1/completions`' prompt
    tokens, a chat's is the chat route's, and `/detokenize` gives the prompt's text back."""
    import httpx

    head = {"authorization": f"Bearer {API_KEY}"}

    def post(path, **body):
        r = httpx.post(server.url + path, json=body, headers=head, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    text = "The quick brown fox, 42 times."
    tok = post("/tokenize", prompt=text)
    done = oai.completions.create(model=MODEL_NAME, prompt=text, max_tokens=1, temperature=0)
    assert tok["count"] == len(tok["tokens"]) == done.usage.prompt_tokens
    assert tok["max_model_len"] == 1024
    assert post("/detokenize", tokens=tok["tokens"])["content"].endswith(text)
    pieces = post("/tokenize", content=text, with_pieces=True, add_special=False)["tokens"]
    assert "".join(p["piece"] for p in pieces) == text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    chat = oai.chat.completions.create(model=MODEL_NAME, max_tokens=1, messages=messages)
    assert post("/tokenize", messages=messages)["count"] == chat.usage.prompt_tokens


def test_the_ollama_client(server, oai):
    """The official `ollama` client against the /api routes: a greedy chat (Ollama's repeat
    penalty set off) answers as the OpenAI chat route does, whole and streamed; a raw generate
    as /v1/completions; the model listing and details."""
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=server.url, headers={"authorization": f"Bearer {API_KEY}"})
    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    opts = {"temperature": 0, "num_predict": 6, "repeat_penalty": 1.0}
    chat = oai.chat.completions.create(model=MODEL_NAME, max_tokens=6, temperature=0,
                                       messages=ask)
    r = client.chat(model=MODEL_NAME, messages=ask, options=opts)
    assert r.message.content == chat.choices[0].message.content and r.done
    assert r.prompt_eval_count == chat.usage.prompt_tokens
    assert r.eval_count == chat.usage.completion_tokens
    parts = list(client.chat(model=MODEL_NAME, messages=ask, options=opts, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content and parts[-1].done
    done = oai.completions.create(model=MODEL_NAME, prompt="Once upon", max_tokens=5,
                                  temperature=0)
    g = client.generate(model=MODEL_NAME, prompt="Once upon", raw=True,
                        options={"temperature": 0, "num_predict": 5, "repeat_penalty": 1.0})
    assert g.response == done.choices[0].text
    assert [m.model for m in client.list().models] == [MODEL_NAME, "tiny-alias"]
    assert client.show(MODEL_NAME).modelinfo
    assert client.ps().models[0].model == MODEL_NAME
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope", messages=ask)
    assert e.value.status_code == 404 and "nope" in e.value.error
    # the served model pulls as present; another pull, and the model store's verbs, say why not
    assert client.pull(MODEL_NAME).status == "success"
    assert [p.status for p in client.pull(MODEL_NAME, stream=True)] == ["success"]
    for call in (lambda: client.pull("llama3"), lambda: client.delete(MODEL_NAME),
                 lambda: client.copy(MODEL_NAME, "other")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 400 and "one model file" in e.value.error
