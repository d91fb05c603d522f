"""A thinking model's `<think>` block returned apart from its answer (`strata.serve.reasoning`):
the splitter at every way an answer can arrive in pieces, then each dialect's field for it
(OpenAI `reasoning_content`, Anthropic `thinking` blocks, Responses `reasoning` items, Ollama
`thinking`), whole and streamed, and `--reasoning none` leaving the block in the text."""

from __future__ import annotations

import itertools
import json

import pytest

from test_serve_app import Harness, sse_events

from strata.serve.reasoning import Thinking, ThinkSplitter, opens_thinking, signature, thinks

ANSWER = "<think>\nLet me see.\n</think>\n\nHi there!"


def _split(text: str, cuts: tuple[int, ...], inside: bool = False) -> tuple[str, str]:
    s = ThinkSplitter(inside=inside)
    pieces = []
    bounds = (0, *cuts, len(text))
    for a, b in zip(bounds, bounds[1:]):
        pieces += s.feed(text[a:b])
    pieces += s.finish()
    thinking = "".join(p.text for p in pieces if isinstance(p, Thinking))
    content = "".join(p for p in pieces if isinstance(p, str))
    assert all(p.text if isinstance(p, Thinking) else p for p in pieces)  # nothing empty
    return thinking, content


@pytest.mark.parametrize("text, inside, want", [
    (ANSWER, False, ("Let me see.", "Hi there!")),
    ("  \n<think>a  b</think>c <think>d</think>", False, ("a  b", "c <think>d</think>")),
    ("plain answer", False, ("", "plain answer")),
    ("a <think> later", False, ("", "a <think> later")),
    ("<thi", False, ("", "<thi")),
    ("\nplan</think>\n\nok", True, ("plan", "ok")),
    ("<think>never closed  ", False, ("never closed", "")),
    ("<think></think>\n\n", False, ("", "")),
    ("<think>x</thinker>y", False, ("x</thinker>y", "")),
])
def test_the_splitter_at_every_cut(text, inside, want):
    """Every way of cutting the answer into one, two or three pieces gives the same split."""
    n = len(text)
    for k in (0, 1, 2):
        for cuts in itertools.combinations(range(1, n), k):
            assert _split(text, cuts, inside) == want, cuts


def test_which_templates_and_prompts_think():
    assert thinks("{% if m.reasoning_content %}<think>{{ r }}</think>{% endif %}")
    assert not thinks("{{ messages }}")
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.fixture
def h():
    with Harness() as harness:
        harness.model.splits_thinking = True
        harness.engine.script = lambda prompt: ANSWER
        yield harness


HELLO = [{"role": "user", "content": "hello"}]


def test_openai_chat_reasoning_content(h):
    r = h.client.post("/v1/chat/completions", json={"model": "fake", "messages": HELLO})
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "Hi there!" and message["reasoning_content"] == "Let me see."
    assert message["reasoning"] == "Let me see."  # vLLM's newer name, beside it
    r = h.client.post("/v1/chat/completions", json={"model": "fake", "messages": HELLO,
                                                    "stream": True})
    deltas = [json.loads(d)["choices"][0]["delta"] for _, d in sse_events(r.text)[:-1]
              if json.loads(d)["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Let me see."
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    assert "".join(d.get("content", "") for d in deltas) == "Hi there!"


def test_anthropic_thinking_blocks(h):
    body = {"model": "fake", "max_tokens": 100, "messages": HELLO}
    content = h.client.post("/v1/messages", json=body).json()["content"]
    sig = signature("Let me see.")
    assert content == [{"type": "thinking", "thinking": "Let me see.", "signature": sig},
                       {"type": "text", "text": "Hi there!"}]
    assert sig.startswith("strata-sha256:") and sig != signature("Let me see")
    r = h.client.post("/v1/messages", json={**body, "stream": True})
    events = [json.loads(d) for _, d in sse_events(r.text)]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "Let me see."
    assert "".join(d.get("text", "") for d in deltas) == "Hi there!"
    # the thinking block's signature last, before its stop, as Anthropic streams it
    kinds = [(e["type"], e.get("delta", {}).get("type")) for e in events]
    at = kinds.index(("content_block_delta", "signature_delta"))
    assert kinds[at - 1] == ("content_block_delta", "thinking_delta")
    assert kinds[at + 1] == ("content_block_stop", None)
    assert events[at]["delta"]["signature"] == sig and events[at]["index"] == 0
    # the thinking block sent back with the next turn is taken (the template drops it)
    follow = HELLO + [{"role": "assistant", "content": content},
                      {"role": "user", "content": "more"}]
    assert h.client.post("/v1/messages", json={**body, "messages": follow}).status_code == 200


def test_responses_reasoning_items(h):
    r = h.client.post("/v1/responses", json={"model": "fake", "input": "hello"}).json()
    reasoning, message = r["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me see."}]
    assert message["content"][0]["text"] == "Hi there!"
    s = h.client.post("/v1/responses", json={"model": "fake", "input": "hello", "stream": True})
    events = [json.loads(d) for _, d in sse_events(s.text)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    # the reasoning item's part opens and closes around its text, then the message's opens
    parts = [(e["type"], e["part"]["type"]) for e in events if "part" in e]
    assert parts == [("response.content_part.added", "reasoning_text"),
                     ("response.content_part.done", "reasoning_text"),
                     ("response.content_part.added", "output_text"),
                     ("response.content_part.done", "output_text")]
    at = kinds.index("response.reasoning_text.done")
    assert kinds[at + 1:at + 3] == ["response.content_part.done", "response.output_item.done"]
    assert events[at + 1]["part"] == {"type": "reasoning_text", "text": "Let me see."}
    assert "".join(e["delta"] for e in events
                   if e["type"] == "response.reasoning_text.delta") == "Let me see."
    last = events[-1]["response"]
    assert [i["type"] for i in last["output"]] == ["reasoning", "message"]
    assert last["output"][0]["content"] == reasoning["content"]
    # the items sent back as input (as agent clients do), and continued from the store
    follow = [{"role": "user", "content": "hello"}, *r["output"],
              {"role": "user", "content": "more"}]
    assert h.client.post("/v1/responses", json={"model": "fake", "input": follow}).status_code == 200
    more = h.client.post("/v1/responses", json={"model": "fake", "input": "more",
                                                "previous_response_id": r["id"]})
    assert more.status_code == 200, more.text


def test_responses_sealed_reasoning_for_a_stateless_client(h):
    """A client keeping no state here (Codex: `store: false`, `include:
    ["reasoning.encrypted_content"]`, a cache key and verbosity it sends along) gets each
    reasoning item's text sealed, whole and streamed; the item sent back with only its seal
    (no `content`) reaches the template as the text; another provider's seal is dropped."""
    codex = {"model": "fake", "store": False, "include": ["reasoning.encrypted_content"],
             "reasoning": {"effort": "medium", "summary": "auto"}, "prompt_cache_key": "k1",
             "text": {"verbosity": "low"}, "parallel_tool_calls": False,
             "instructions": "be brief"}
    r = h.client.post("/v1/responses", json={**codex, "input": "hello"})
    assert r.status_code == 200, r.text
    reasoning, message = r.json()["output"]
    sealed = reasoning["encrypted_content"]
    assert isinstance(sealed, str) and "Let me see." not in sealed
    assert reasoning["content"][0]["text"] == "Let me see."
    assert h.client.get(f"/v1/responses/{r.json()['id']}").status_code == 404  # not stored
    s = h.client.post("/v1/responses", json={**codex, "input": "hello", "stream": True})
    events = [json.loads(d) for _, d in sse_events(s.text)]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["type"] == "reasoning" and done[0]["encrypted_content"] == sealed
    assert events[-1]["response"]["output"][0]["encrypted_content"] == sealed
    # without the include entry, no seal; a stored response read with it, sealed then
    plain = h.client.post("/v1/responses", json={"model": "fake", "input": "hello"}).json()
    assert "encrypted_content" not in plain["output"][0]
    url = f"/v1/responses/{plain['id']}"
    assert h.client.get(url).json() == plain
    read = h.client.get(url, params={"include": "reasoning.encrypted_content"}).json()
    assert read["output"][0]["encrypted_content"] == sealed
    assert read == {**plain, "output": [{**plain["output"][0], "encrypted_content": sealed},
                                        *plain["output"][1:]]}
    assert h.client.get(url, params={"include": "x"}).json()["error"]["param"] == "include[0]"
    back = {"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content": sealed}
    for seal, want in ((sealed, "<assistant>[Let me see.]Hi there!"),
                       ("gAAAAABforeign==", "<assistant>Hi there!")):
        follow = [{"role": "user", "content": "hello"}, {**back, "encrypted_content": seal},
                  message, {"role": "user", "content": "more"}]
        r = h.client.post("/v1/responses", json={**codex, "input": follow})
        assert r.status_code == 200, r.text
        assert want in h.model.rendered[-1] and "<user>more" in h.model.rendered[-1]
    bad = h.client.post("/v1/responses", json={**codex, "input": "x",
                                               "include": ["file_search_call.results"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "include[0]"
    assert "reasoning.encrypted_content" in bad.json()["error"]["message"]


def test_ollama_thinking(h):
    r = h.client.post("/api/chat", json={"model": "fake", "messages": HELLO, "stream": False})
    assert r.json()["message"] == {"role": "assistant", "content": "Hi there!",
                                   "thinking": "Let me see."}
    lines = [json.loads(x) for x in h.client.post("/api/generate", json={
        "model": "fake", "prompt": "hello"}).text.splitlines()]
    assert "".join(x.get("thinking", "") for x in lines) == "Let me see."
    assert "".join(x["response"] for x in lines) == "Hi there!"


def test_reasoning_none_leaves_the_block_in_the_text(h):
    h.model.splits_thinking = False
    r = h.client.post("/v1/chat/completions", json={"model": "fake", "messages": HELLO})
    message = r.json()["choices"][0]["message"]
    assert message["content"] == ANSWER and "reasoning_content" not in message


def test_the_knob_is_checked():
    from strata.serve.config import ServeConfig, ServeConfigError

    assert ServeConfig(model="m").reasoning == "auto"
    with pytest.raises(ServeConfigError, match="reasoning"):
        ServeConfig(model="m", reasoning="deepseek")


@pytest.mark.parametrize("path, body, want", [
    ("/v1/chat/completions", {"chat_template_kwargs": {"enable_thinking": False}}, "false"),
    ("/v1/messages", {"max_tokens": 9, "thinking": {"type": "enabled", "budget_tokens": 99}},
     "true"),
    ("/v1/messages", {"max_tokens": 9, "thinking": {"type": "disabled"}}, "false"),
    ("/api/chat", {"think": False, "stream": False}, "false"),
    ("/api/chat", {"think": "high", "stream": False}, "true"),
    ("/tokenize", {"chat_template_kwargs": {"enable_thinking": True}}, "true"),
])
def test_thinking_on_or_off_reaches_the_template(h, path, body, want):
    """Each dialect's switch becomes the template's `enable_thinking` (Qwen3's); left out,
    the template decides (no variable set)."""
    r = h.client.post(path, json={"model": "fake", "messages": HELLO, **body})
    assert r.status_code == 200, r.text
    rendered = "".join(chr(t) for t in r.json()["tokens"]) if path == "/tokenize" else (
        h.model.rendered[-1])
    assert rendered.endswith(f"<enable_thinking={want}>")
    h.client.post("/v1/chat/completions", json={"model": "fake", "messages": HELLO})
    assert "enable_thinking" not in h.model.rendered[-1]


@pytest.mark.parametrize("value, param", [
    ([1], "chat_template_kwargs"),
    ({"messages": []}, "chat_template_kwargs.messages"),
    ({"not a name": 1}, "chat_template_kwargs.not a name"),
])
def test_template_variables_are_checked(h, value, param):
    r = h.client.post("/v1/chat/completions", json={"model": "fake", "messages": HELLO,
                                                    "chat_template_kwargs": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_earlier_reasoning_sent_back_reaches_the_template(h):
    """An earlier answer's reasoning, sent back in each dialect's shape, is the assistant
    message's `reasoning_content` (the fake template shows it in brackets); a Responses
    reasoning item that no answer followed is dropped."""
    think = {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "plan"}]}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    cases = [
        ("/v1/responses", {"input": [
            {"role": "user", "content": "q"}, think,
            {"type": "message", "role": "assistant", "content": "a"},
            {"role": "user", "content": "q2"}, think, call,
            {"type": "function_call_output", "call_id": "c1", "output": "r"},
            think, {"role": "user", "content": "q3"}]},
         "<user>q<assistant>[plan]a<user>q2<assistant>[plan]<tool_call>f</tool_call><tool>r"
         "<user>q3<assistant>"),
        ("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "plan"},
            {"role": "user", "content": "q2"}]}, "<user>q<assistant>[plan]a<user>q2"),
        ("/v1/chat/completions", {"messages": [  # vLLM's / OpenRouter's name for it
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning": "plan"},
            {"role": "user", "content": "q2"}]}, "<user>q<assistant>[plan]a<user>q2"),
        ("/api/chat", {"stream": False, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "thinking": "plan"},
            {"role": "user", "content": "q2"}]}, "<user>q<assistant>[plan]a<user>q2"),
        ("/v1/messages", {"max_tokens": 5, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": ""},
                {"type": "text", "text": "a"}]},
            {"role": "user", "content": "q2"}]}, "<user>q<assistant>[plan]a<user>q2"),
    ]
    for path, body, want in cases:
        r = h.client.post(path, json={"model": "fake", **body})
        assert r.status_code == 200, r.text
        assert want in h.model.rendered[-1], (path, h.model.rendered[-1])
    both = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning": "x", "reasoning_content": "y"},
            {"role": "user", "content": "q2"}]
    r = h.client.post("/v1/chat/completions", json={"model": "fake", "messages": both})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].reasoning"


def test_a_strict_tool_is_not_called_inside_the_reasoning(h):
    """Strict tools (the Responses API's default) hold calls to their schemas, but a
    `<tool_call>` the reasoning mentions opens none: the block stays free text, and the call
    after it is held and parsed."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    h.engine.script = lambda prompt: ("<think>I could write <tool_call> here.</think>\n\n"
                                      + call)
    tools = [{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}]
    r = h.client.post("/v1/responses", json={"model": "fake", "input": "weather?",
                                             "tools": tools}).json()
    assert r["tools"][0]["strict"] is True
    reasoning, fc = r["output"]
    assert reasoning["content"][0]["text"] == "I could write <tool_call> here."
    assert fc["type"] == "function_call" and json.loads(fc["arguments"]) == {"city": "Paris"}


def test_seal_round_trips_and_refuses_what_it_did_not_make():
    import base64

    from strata.serve.responses_request import seal, unseal
    for text in ("", "Let me see.", "ünïcode 思考 \n\t<think>"):
        assert unseal(seal(text)) == text
        assert not text or text not in seal(text)  # opaque: the text itself is not in it
    tag = seal("x")[:-len(base64.b64encode(b"x").decode())]
    assert unseal(tag + "!!not base64!!") is None
    assert unseal(tag + base64.b64encode(b"\xff\xfe").decode()) is None  # not UTF-8
    assert unseal("gAAAAABforeign==") is None and unseal("") is None


def test_reasoning_tokens_are_counted_through_the_closing_tag():
    """`count_reasoning`: the tokens through the close tag where the block was open (by the
    prompt or the first token), all of them where it never closed, none where none opened."""
    from strata.serve.job import Sampling, count_reasoning

    def n(tokens, ids=(1, 2), opened=False):
        return count_reasoning(tokens, Sampling(max_tokens=8, reasoning_ids=ids,
                                                reasoning_open=opened))

    assert n([1, 5, 5, 2, 7, 8]) == 4          # <think> . . </think> answer
    assert n([5, 5, 2, 7], opened=True) == 3   # the prompt opened it
    assert n([1, 5, 5]) == 3 and n([5, 5], opened=True) == 2  # never closed: all
    assert n([7, 2, 8]) == 0                    # no block open: a stray close is not reasoning
    assert n([]) == 0 and n([1, 2], ids=None) == 0


def test_usage_counts_the_reasoning_tokens(h):
    """Where the tags are one token each (`ServedModel.think_ids`; here the character
    vocabulary's '<' and '>' stand in for them), usage says how many of the completion's tokens
    the reasoning took: OpenAI's chat `completion_tokens_details`, the Responses API's
    `output_tokens_details`; 0 where the model has none."""
    h.model.think_ids = (ord("<"), ord(">"))  # "<think>": '<' opens, its '>' closes
    r = h.client.post("/v1/chat/completions", json={"model": "fake", "messages": HELLO}).json()
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": len("<think>")}
    r = h.client.post("/v1/responses", json={"model": "fake", "input": "hello"}).json()
    assert r["usage"]["output_tokens_details"] == {"reasoning_tokens": len("<think>")}
    h.model.think_ids = None
    r = h.client.post("/v1/chat/completions", json={"model": "fake", "messages": HELLO}).json()
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


@pytest.mark.parametrize("tags_are_tokens", [True, False])
def test_a_models_think_tags_are_counted_where_each_is_one_token(tags_are_tokens):
    """`ServedModel.think_ids`: the tags' ids where the vocabulary holds each as one token
    (Qwen3's do), so the worker can count the reasoning; None where a tag takes several (its
    tokens in generated text need not match its encoding alone) or the model does not think."""
    from helpers.vocabmake import byte_level_meta
    from strata.serve.model import ServedModel
    from strata.tokenizer import ChatTemplate, Tokenizer

    template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                "{% if add_generation_prompt %}<think>\n{% endif %}{# </think> #}")
    tags = ("<think>", "</think>") if tags_are_tokens else ()
    meta = byte_level_meta([("a", "b")], chat_template=template, user_defined=tags)
    tok = Tokenizer.from_metadata(meta)

    def served(split=True):
        return ServedModel(name="m", aliases=(), tokenizer=tok, max_context=64,
                           template=ChatTemplate.from_metadata(meta, tok), split_thinking=split)

    want = (meta["tokenizer.ggml.tokens"].index("<think>"),
            meta["tokenizer.ggml.tokens"].index("</think>")) if tags_are_tokens else None
    assert served().think_ids == want
    assert served(split=False).think_ids is None  # --reasoning none: nothing split or counted


def test_anthropic_budget_tokens_bounds_the_reasoning(h):
    """thinking.budget_tokens reaches the worker as `Sampling.reasoning_budget`: the block
    ('<' opens and '>' closes here, the character vocabulary's stand-ins for Qwen3's one-token
    tags) ends at the budget's last token, the closing tag, however long the model would go
    on; without a budget it runs as the model says. A budget that is not a positive integer
    is a 400 naming it."""
    h.model.think_ids = (ord("<"), ord(">"))
    body = {"model": "fake", "max_tokens": 60, "messages": HELLO}

    def text(thinking):
        r = h.client.post("/v1/messages", json={**body, "thinking": thinking})
        assert r.status_code == 200, r.text
        return "".join(b.get("text", "") + b.get("thinking", "") for b in r.json()["content"])
    assert text({"type": "enabled", "budget_tokens": 3}).startswith("<t>")  # '<', 't', '>'
    assert text({"type": "enabled", "budget_tokens": 1000}) == "Let me see.Hi there!"
    assert text({"type": "enabled"}) == "Let me see.Hi there!"
    for bad in (0, -5, "many", 2.5):
        r = h.client.post("/v1/messages", json={**body, "thinking": {
            "type": "enabled", "budget_tokens": bad}})
        assert r.status_code == 400 and "thinking.budget_tokens" in r.text, r.text


def test_openai_thinking_token_budget_bounds_the_reasoning(h):
    """vLLM's `thinking_token_budget` on the chat route holds the block as Anthropic's
    budget does ('<' and '>' stand in for the one-token tags, as above); 0 turns the template's
    switch off (even beside a high effort) and closes at once a block the model opens anyway;
    without it the model runs on. Not a count of 0 or more: a 400 naming it."""
    h.model.think_ids = (ord("<"), ord(">"))
    body = {"model": "fake", "messages": HELLO}

    def answer(**extra):
        r = h.client.post("/v1/chat/completions", json={**body, **extra})
        assert r.status_code == 200, r.text
        m = r.json()["choices"][0]["message"]
        return (m.get("reasoning_content") or "") + m["content"], h.model.rendered[-1]
    assert answer(thinking_token_budget=3)[0].startswith("<t>")  # '<', 't', '>'
    text, rendered = answer(thinking_token_budget=0, reasoning_effort="high")
    assert text.startswith("<>") and rendered.endswith("<enable_thinking=false>")
    assert answer(thinking_token_budget=1000)[0] == "Let me see.Hi there!"
    assert answer()[0] == "Let me see.Hi there!"
    for bad in (-1, "many", 2.5, True):
        r = h.client.post("/v1/chat/completions", json={**body, "thinking_token_budget": bad})
        assert r.status_code == 400 and "thinking_token_budget" in r.text, (bad, r.text)
