"""The Ollama API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/version`) in process over the scripted engine: whole and NDJSON-streamed answers with
Ollama's counts and durations, tool calls and their results, raw and templated generate, a
budget cut, JSON formats, load requests, Ollama's sampling defaults, and `{"error": ...}`
refusals. The official `ollama` client against a real server: tests/e2e/test_serve_sdk.py."""

from __future__ import annotations

import json

import pytest

from test_serve_app import Harness

from strata.serve.fields import Fields
from strata.serve.ollama_request import DEFAULTS, parse_chat

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def _post(h, path, **body):
    r = h.client.post(path, json={"model": "fake", **body})
    assert r.status_code == 200, r.text
    return r


def _lines(r) -> list[dict]:
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines() if line]


def test_a_whole_chat_answer_with_ollamas_counts(h):
    r = _post(h, "/api/chat", messages=HELLO, stream=False, model="fake:latest").json()
    assert r["model"] == "fake:latest" and r["created_at"].endswith("Z")
    assert r["message"] == {"role": "assistant", "content": "Hi there!"}
    assert r["done"] is True and r["done_reason"] == "stop"
    assert r["prompt_eval_count"] == len(h.model.rendered[-1]) and r["eval_count"] == 10
    assert r["total_duration"] >= r["eval_duration"] >= 0 and r["load_duration"] == 0
    assert r["total_duration"] >= r["prompt_eval_duration"] >= 0


def test_a_chat_streams_ndjson_by_default(h):
    lines = _lines(_post(h, "/api/chat", messages=HELLO))
    assert all(not x["done"] for x in lines[:-1]) and lines[-1]["done"] is True
    assert "".join(x["message"]["content"] for x in lines) == "Hi there!"
    assert lines[-1]["message"]["content"] == "" and lines[-1]["eval_count"] == 10


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_and_their_results(h, stream):
    ask = [{"role": "user", "content": "weather?"}]
    r = _post(h, "/api/chat", messages=ask, tools=TOOLS, stream=stream)
    if stream:
        lines = _lines(r)
        calls = [c for x in lines for c in x["message"].get("tool_calls", [])]
        text = "".join(x["message"]["content"] for x in lines)
    else:
        message = r.json()["message"]
        calls, text = message["tool_calls"], message["content"]
    assert text == "Checking."
    assert [c["function"] for c in calls] == [
        {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}]
    follow = ask + [{"role": "assistant", "content": "Checking.", "tool_calls": calls},
                    {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    r = _post(h, "/api/chat", messages=follow, tools=TOOLS, stream=False).json()
    assert r["message"]["content"] == "Hi there!"
    assert "<assistant>Checking.<tool_call>get_weather</tool_call><tool>sunny" in h.model.rendered[-1]


def test_generate_through_the_template_or_raw(h):
    r = _post(h, "/api/generate", prompt="hello", system="be brief", stream=False).json()
    assert r["response"] == "Hi there!" and r["done_reason"] == "stop"
    assert h.model.rendered[-1] == "<system>be brief<user>hello<assistant>"
    lines = _lines(_post(h, "/api/generate", prompt="raw text", raw=True))
    assert "".join(x["response"] for x in lines) == "Hi there!"
    assert h.engine.prefills[-1] == "raw text"  # fed as given: no template


def test_num_predict_cuts_with_done_reason_length(h):
    r = _post(h, "/api/chat", messages=HELLO, stream=False, options={"num_predict": 3}).json()
    assert r["message"]["content"] == "Hi " and r["done_reason"] == "length"
    assert r["eval_count"] == 3


def test_json_formats_hold_the_answer(h):
    h.engine.script = lambda prompt: '{"a": [1], "z": 2} and prose'
    r = _post(h, "/api/chat", messages=HELLO, stream=False, format="json").json()
    assert json.loads(r["message"]["content"]) == {"a": [1], "z": 2}
    schema = {"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"],
              "additionalProperties": False}
    r = _post(h, "/api/generate", prompt="x", stream=False, format=schema).json()
    assert json.loads(r["response"]) == {"a": [1]}


def test_load_requests_answer_at_once(h):
    r = _post(h, "/api/chat", messages=[]).json()
    assert r["done"] is True and r["done_reason"] == "load" and r["message"]["content"] == ""
    r = _post(h, "/api/generate").json()
    assert r["done_reason"] == "load" and r["response"] == ""
    assert h.engine.prefills == []


def test_the_model_routes(h):
    tags = h.client.get("/api/tags").json()["models"]
    assert [m["name"] for m in tags] == ["fake", "fake-alias"]
    assert tags[0]["details"]["format"] == "gguf"
    shown = _post(h, "/api/show").json()
    assert shown["capabilities"] == ["completion", "tools", "insert"]  # insert: its FIM
    h.model.fim = False
    assert _post(h, "/api/show").json()["capabilities"] == ["completion", "tools"]
    h.model.fim = True
    assert any(k.endswith(".context_length") and v == 4096 for k, v in shown["model_info"].items())
    assert _post(h, "/api/show", model=None, name="fake-alias").status_code == 200
    assert h.client.get("/api/ps").json()["models"][0]["name"] == "fake"
    from starlette.testclient import TestClient
    version = TestClient(h.app).get("/api/version").json()  # no key needed, as Ollama
    # an Ollama release's number, which clients gate on (GitHub Copilot wants 0.6.4 or later)
    assert tuple(int(p) for p in version["version"].split(".")) >= (0, 12, 11)
    from strata import __version__
    assert version["strata"] == __version__


class _State:
    class model:
        n_vocab = 257
        name, aliases = "fake", ()

    @staticmethod
    def check_model(name):
        assert name == "fake"


def test_ollamas_sampling_defaults_and_options():
    req = parse_chat(Fields({"model": "fake", "messages": HELLO}), _State)
    c = req.chat
    assert (c.temperature, c.top_k, c.top_p, c.repeat_penalty, c.repeat_last_n) == (
        DEFAULTS["temperature"], DEFAULTS["top_k"], DEFAULTS["top_p"],
        DEFAULTS["repeat_penalty"], DEFAULTS["repeat_last_n"])
    assert c.max_tokens is None and req.stream is True
    opts = {"temperature": 0, "top_k": 5, "seed": 7, "stop": ["x"], "num_predict": 9,
            "repeat_last_n": -1, "num_ctx": 8192, "num_gpu": 99, "use_mmap": True}
    c = parse_chat(Fields({"model": "fake", "messages": HELLO, "options": opts}), _State).chat
    assert (c.temperature, c.top_k, c.seed, c.stop, c.max_tokens) == (0, 5, 7, ("x",), 9)
    assert c.repeat_last_n >= 1 << 20  # -1: all of it
    for unlimited in (-1, -2, 0):  # Ollama's runner cuts only where num_predict > 0
        c = parse_chat(Fields({"model": "fake", "messages": HELLO,
                               "options": {"num_predict": unlimited}}), _State).chat
        assert c.max_tokens is None


@pytest.mark.parametrize("path, body, needle", [
    ("/api/chat", {"model": "other", "messages": HELLO}, "other"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     "messages[0].images"),
    ("/api/chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/api/chat", {"messages": HELLO, "options": {"mirostat": 2}}, "options.mirostat"),
    ("/api/chat", {"messages": HELLO, "options": {"num_predict": 1.5}}, "options.num_predict"),
    ("/api/chat", {"messages": HELLO, "options": {"temperature": "hot"}}, "options.temperature"),
    ("/api/chat", {"messages": HELLO, "format": "yaml"}, "format"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ("/api/generate", {"prompt": "x", "suffix": "y", "raw": True}, "raw"),
    ("/api/generate", {"prompt": "x", "raw": True, "context": [1, 2]}, "context"),
    ("/api/generate", {"prompt": "x", "raw": True, "format": "json"}, "format"),
    ("/api/show", {"model": "other"}, "other"),
])
def test_refusals_are_ollamas_error_objects(h, path, body, needle):
    r = h.client.post(path, json={"model": "fake", **body})
    assert r.status_code in (400, 404), r.text
    assert list(r.json()) == ["error"] and needle in r.json()["error"]


def test_pull_of_the_served_model_succeeds_and_nothing_else_is_managed(h):
    # the served model (any of its names, ':latest' too) is here: Ollama's success, streamed or not
    assert _lines(_post(h, "/api/pull")) == [{"status": "success"}]
    assert _post(h, "/api/pull", model="fake-alias:latest", stream=False).json() == {
        "status": "success"}
    r = h.client.post("/api/pull", json={"model": "llama3"})
    assert r.status_code == 400 and "does not download models" in r.json()["error"]
    assert "'fake'" in r.json()["error"] and "strata serve -m FILE" in r.json()["error"]
    r = h.client.post("/api/pull", json={"model": "fake", "stream": "yes"})
    assert r.status_code == 400 and "stream" in r.json()["error"]
    for method, path, needle in (("POST", "/api/push", "upload"),
                                 ("POST", "/api/create", "create"),
                                 ("POST", "/api/copy", "--alias"),
                                 ("DELETE", "/api/delete", "delete model files"),
                                 ("POST", "/api/blobs/sha256:00", "store blobs")):
        r = h.client.request(method, path, json={"model": "fake", "source": "fake"})
        assert r.status_code == 400 and list(r.json()) == ["error"], (path, r.text)
        assert needle in r.json()["error"] and "one model file" in r.json()["error"]
    assert h.client.head("/api/blobs/sha256:00").status_code == 400
    assert h.engine.prefills == []  # nothing ran


# --- divergences from Ollama's own server (ollama/ollama server/routes.go, api/types.go) ---

def test_a_tool_call_carries_ollamas_id_and_index_and_its_result_may_name_the_id(h):
    """Ollama's ToolCall is {"id": "call_...", "function": {"index", "name", "arguments"}};
    a tool message may answer it by `tool_call_id` (api.Message.ToolCallID)."""
    ask = [{"role": "user", "content": "weather?"}]
    for stream in (False, True):
        r = _post(h, "/api/chat", messages=ask, tools=TOOLS, stream=stream)
        calls = ([c for x in _lines(r) for c in x["message"].get("tool_calls", [])] if stream
                 else r.json()["message"]["tool_calls"])
        assert len(calls) == 1 and calls[0]["id"].startswith("call_")
        assert calls[0]["function"] == {"index": 0, "name": "get_weather",
                                        "arguments": {"city": "Paris"}}
    follow = ask + [{"role": "assistant", "content": "", "tool_calls": calls},
                    {"role": "tool", "content": "sunny", "tool_call_id": calls[0]["id"]}]
    assert _post(h, "/api/chat", messages=follow, tools=TOOLS, stream=False).json()["done"]


def test_roles_are_read_case_blind_as_ollama_lowercases_them(h):
    r = _post(h, "/api/chat", messages=[{"role": "User", "content": "hello"}], stream=False)
    assert r.json()["message"]["content"] == "Hi there!"
    assert h.model.rendered[-1].startswith("<user>hello")


def test_seed_minus_one_is_ollamas_random_seed():
    """Ollama's default seed is -1, which its sampler takes as 'no seed' (sample/samplers.go)."""
    c = parse_chat(Fields({"model": "fake", "messages": HELLO,
                           "options": {"seed": -1}}), _State).chat
    assert c.seed is None
    c = parse_chat(Fields({"model": "fake", "messages": HELLO,
                           "options": {"seed": 42}}), _State).chat
    assert c.seed == 42


@pytest.mark.parametrize("path, body", [("/api/chat", {"messages": []}),
                                        ("/api/generate", {"prompt": ""})])
@pytest.mark.parametrize("keep", [0, "0", "0s", "0m"])
def test_keep_alive_zero_without_a_prompt_is_ollamas_unload_request(h, path, body, keep):
    r = _post(h, path, keep_alive=keep, **body).json()
    assert r["done"] is True and r["done_reason"] == "unload"
    r = _post(h, path, keep_alive="5m", **body).json()
    assert r["done_reason"] == "load"
    assert h.engine.prefills == []


@pytest.mark.parametrize("keep", ["5m", "1h30m", "300ms", "-1", "-1m", 300, -1, 2.5, "1.5h"])
def test_keep_alive_durations_ollama_takes(h, keep):
    assert _post(h, "/api/chat", messages=HELLO, stream=False, keep_alive=keep).json()["done"]


def test_the_not_found_error_says_what_ollama_says(h):
    r = h.client.post("/api/chat", json={"model": "llama3", "messages": HELLO})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error.startswith("model 'llama3' not found") and "'fake'" in error


def test_generate_returns_and_takes_ollamas_context(h):
    """A templated generate's last object has `context` (the prompt's tokens and the
    answer's); sent back, it comes before the next prompt (ollama server/routes.go)."""
    r = _post(h, "/api/generate", prompt="hello", stream=False).json()
    first = "<user>hello<assistant>Hi there!"
    assert r["context"] == [ord(c) for c in first]
    lines = _lines(_post(h, "/api/generate", prompt="again", context=r["context"]))
    assert "context" not in lines[0] and lines[-1]["context"][:len(first)] == r["context"]
    assert h.engine.prefills[-1] == first + "<user>again<assistant>"
    raw = _post(h, "/api/generate", prompt="raw text", raw=True, stream=False).json()
    assert "context" not in raw  # raw: none, as Ollama
    assert _post(h, "/api/generate", prompt="x", context=[], stream=False).json()["done"]


def test_logprobs_in_ollamas_shape(h):
    r = _post(h, "/api/chat", messages=HELLO, stream=False, logprobs=True, top_logprobs=2).json()
    lp = r["logprobs"]
    assert "".join(e["token"] for e in lp) == "Hi there!"
    assert set(lp[0]) == {"token", "logprob", "bytes", "top_logprobs"}
    assert len(lp[0]["top_logprobs"]) == 2 and lp[0]["top_logprobs"][0]["token"] == "H"
    lines = _lines(_post(h, "/api/generate", prompt="x", logprobs=True))
    assert "".join(e["token"] for x in lines for e in x.get("logprobs", [])) == "Hi there!"
    r = _post(h, "/api/chat", messages=HELLO, stream=False).json()
    assert "logprobs" not in r


def test_ps_and_show_carry_the_fields_ollama_clients_read(h):
    entry = h.client.get("/api/ps").json()["models"][0]
    assert entry["context_length"] == 4096
    h.model.splits_thinking = True
    assert "thinking" in _post(h, "/api/show").json()["capabilities"]


def test_a_tool_without_its_type_is_a_function_as_in_ollama(h):
    tools = [{"function": TOOLS[0]["function"]}]
    r = _post(h, "/api/chat", messages=[{"role": "user", "content": "weather?"}], tools=tools,
              stream=False).json()
    assert r["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("path, body, needle", [
    ("/api/chat", {"messages": HELLO, "keep_alive": "5 minutes"}, "keep_alive"),
    ("/api/chat", {"messages": HELLO, "keep_alive": True}, "keep_alive"),
    ("/api/chat", {"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/api/chat", {"messages": HELLO, "logprobs": "yes"}, "logprobs"),
    ("/api/generate", {"prompt": "x", "context": [1, "a"]}, "context[1]"),
    ("/api/generate", {"prompt": "x", "context": [1, 999999]}, "context[1]"),
    ("/api/generate", {"prompt": "x", "context": "1,2"}, "context"),
    ("/api/generate", {"prompt": "x", "raw": True, "system": "be brief"}, "system"),
])
def test_more_refusals_name_the_field(h, path, body, needle):
    r = h.client.post(path, json={"model": "fake", **body})
    assert r.status_code == 400, r.text
    assert list(r.json()) == ["error"] and needle in r.json()["error"]


@pytest.mark.parametrize("mix, quant", [("Q4_K_M", "Q4_K_M"), ("IQ_MIX", None)])
def test_tags_say_the_models_size_and_quantization(h, tmp_path, mix, quant):
    """/api/tags' details as Ollama fills them (clients list models by them): the parameter
    count from the file's tensors, the quantization from its `general.file_type` (llama.cpp's
    name) or, where it has none, the format most of its bytes are in."""
    import dataclasses

    import numpy as np

    from strata.gguf import open_model
    from strata.serve.ollama_dialect import parameter_size
    from strata.serve.server import model_facts
    from strata.synth import PRESETS, write_model

    path = tmp_path / f"m-{mix}.gguf"
    write_model(path, dataclasses.replace(PRESETS["tiny"], n_layer=1), mix=mix, seed=1,
                progress=False)
    mf = open_model(path)
    facts = model_facts(mf)
    assert facts["n_params"] == sum(int(np.prod(t.ne)) for t in mf.tensors.values()) > 0
    if quant is None:  # no file type: the format holding the most bytes
        assert mf.metadata.get("general.file_type") is None
        sizes = {}
        for t in mf.tensors.values():
            sizes[t.qtype.name] = sizes.get(t.qtype.name, 0) + t.n_bytes
        quant = max(sizes, key=sizes.get)
    assert facts["quantization"] == quant
    # /api/show's model_info: the file's one-value keys, its parameter count, and the context
    # this server runs (not the file's), as JSON
    meta = mf.metadata
    info = facts["model_info"]
    assert info["general.parameter_count"] == facts["n_params"]
    assert info["general.architecture"] == meta.get("general.architecture")
    assert f"{mf.arch}.block_count" in info and "tokenizer.ggml.tokens" not in info
    assert "tokenizer.chat_template" not in info
    assert all(isinstance(v, (int, float, str, bool)) for v in info.values())
    h.state.plan_summary.update(facts, arch=mf.arch)  # as `server.load` fills it
    shown = _post(h, "/api/show", verbose=True).json()
    assert shown["model_info"]["general.parameter_count"] == facts["n_params"]
    assert shown["model_info"][f"{mf.arch}.block_count"] == meta.get(f"{mf.arch}.block_count")
    assert shown["model_info"][f"{mf.arch}.context_length"] == h.state.model.max_context
    assert shown["model_info"]["general.architecture"] == mf.arch
    json.dumps(shown)
    details = h.client.get("/api/tags").json()["models"][0]["details"]
    assert details["quantization_level"] == quant
    assert details["parameter_size"] == parameter_size(facts["n_params"]) != ""
    assert (parameter_size(30_532_122_624), parameter_size(567_000_000),
            parameter_size(0)) == ("30.5B", "567.0M", "")


def test_a_generate_with_a_suffix_fills_in_the_middle(h):
    """An editor's completion (Continue, Twinny send `suffix` to Ollama): the prompt and suffix
    around the model's fill-in-the-middle tokens (the fake vocabulary's FIM_MARKS), no template,
    an empty prompt an insertion at the start of a file (not a load); a suffix with raw, system,
    context or a JSON format, or on a model without the tokens, is a 400 naming the field."""
    from helpers.serve_fakes import FIM_MARKS
    pre, suf, mid = FIM_MARKS
    h.engine.script = lambda p: "x + 1"
    r = _post(h, "/api/generate", prompt="def f(x):\n    return ", suffix="\n\nprint(f(2))",
              stream=False).json()
    assert r["response"] == "x + 1" and r["done"] is True
    assert h.engine.prefills[-1] == f"{pre}def f(x):\n    return {suf}\n\nprint(f(2)){mid}"
    assert h.model.rendered == []  # no chat template
    _post(h, "/api/generate", prompt="", suffix="tail", stream=False)
    assert h.engine.prefills[-1] == f"{pre}{suf}tail{mid}"
    for extra, param in (({"raw": True}, "raw"), ({"system": "s"}, "system"),
                         ({"context": [1, 2]}, "context"), ({"format": "json"}, "format")):
        r = h.client.post("/api/generate", json={"model": "fake", "prompt": "a", "suffix": "b",
                                                 **extra})
        assert r.status_code == 400 and param in r.json()["error"], (extra, r.text)
    h.model.fim = False
    r = h.client.post("/api/generate", json={"model": "fake", "prompt": "a", "suffix": "b"})
    assert r.status_code == 400 and "suffix" in r.json()["error"]
