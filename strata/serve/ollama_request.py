"""Reading Ollama API request bodies (`POST /api/chat`, `/api/generate`) into a `ChatInput` or a
raw prompt.

`messages` are Ollama's (`role` system / user / assistant / tool, `content` a string, an
assistant's `tool_calls` as `{"function": {"name", "arguments": {...}}}`, a tool message's
`tool_name`); `tools` are in the OpenAI function shape, as Ollama takes them. `options` holds
the sampling knobs, with Ollama's defaults where a request leaves them out (temperature 0.8,
top_k 40, top_p 0.9, repeat_penalty 1.1 over the last 64 tokens), so an Ollama client gets
what it would get there; `num_predict` is max_tokens (-1 or -2: as much as the context holds).
Options that set up the runner (`num_ctx`, `num_gpu`, `num_thread`, `num_batch`, ...) are
checked and ignored: the plan made at start-up decides those. `mirostat` and `typical_p` at
anything but off are a 400, as are images and a generate `suffix` or `template`.
`format` is "json" (one JSON object) or a JSON schema. `think` reaches the chat template as
`enable_thinking` (Qwen3's switch; false: no reasoning); `keep_alive` is checked and ignored:
the model stays loaded while the server runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.engine.json_schema import Node
from strata.serve.chat import ChatInput, schema_node
from strata.serve.errors import bad_request
from strata.serve.fields import Fields, join
from strata.serve.openai_request import parse_stop, parse_tools

ROLES = ("system", "user", "assistant", "tool")
# Ollama's defaults for a request that leaves them out
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1,
            "repeat_last_n": 64}
_RUNNER = ("num_ctx", "num_keep", "num_batch", "num_gpu", "main_gpu", "num_thread")
_RUNNER_FLAGS = ("use_mmap", "use_mlock", "numa", "low_vram", "vocab_only", "f16_kv",
                 "penalize_newline")


@dataclass(frozen=True, slots=True)
class OllamaRequest:
    model: str  # the name as the client sent it (echoed in every line)
    chat: ChatInput | None  # a chat (and a generate that is not raw); None: `raw_prompt`
    raw_prompt: str | None  # a raw generate's prompt, fed as given
    stream: bool
    sampling: dict  # the `Sampling` keywords besides max_tokens (a raw prompt's)
    max_tokens: int | None


def check_model(f: Fields, state) -> str:
    """The model the body names (`model`, or the older `name`); Ollama's `:latest` tag of the
    served name is the served name."""
    key = "model" if f.has("model") or not f.has("name") else "name"
    name = f.str(key, required=True, non_empty=True)
    state.check_model(name[:-len(":latest")] if name.endswith(":latest") else name)
    return name


def _options(f: Fields) -> tuple[dict[str, Any], int | None]:
    """(the `Sampling` keywords, max_tokens) from `options`."""
    o = f.obj_at("options")
    o = o if o is not None else Fields({}, "options")
    for key in _RUNNER:
        o.int(key)
    for key in _RUNNER_FLAGS:
        o.bool(key)
    if o.int("mirostat", default=0, minimum=0, maximum=2):
        raise bad_request("options.mirostat: mirostat sampling is not available here (0: off)",
                          "options.mirostat")
    if o.number("typical_p", default=1.0, minimum=0.0, maximum=1.0) != 1.0:
        raise bad_request("options.typical_p: locally typical sampling is not available here "
                          "(1.0: off)", "options.typical_p")
    o.number("tfs_z")  # removed from Ollama's runner; checked and ignored as there
    o.number("mirostat_tau")
    o.number("mirostat_eta")
    temperature = o.number("temperature", default=DEFAULTS["temperature"], minimum=0.0,
                           maximum=2.0)
    top_p = o.number("top_p", default=DEFAULTS["top_p"], minimum=0.0, maximum=1.0)
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    repeat = o.number("repeat_penalty", default=DEFAULTS["repeat_penalty"], minimum=0.0,
                      maximum=10.0)
    if repeat == 0.0:
        raise bad_request("options.repeat_penalty: must be above 0 (1 = off), got 0",
                          "options.repeat_penalty")
    last_n = o.int("repeat_last_n", default=DEFAULTS["repeat_last_n"], minimum=-1,
                   maximum=1 << 20)
    predict = o.int("num_predict", minimum=-2, maximum=1 << 30)
    if predict == 0:
        raise bad_request("options.num_predict: must be positive (-1: until the model stops)",
                          "options.num_predict")
    sampling = {
        "temperature": temperature, "top_p": top_p,
        "top_k": o.int("top_k", default=DEFAULTS["top_k"], minimum=0, maximum=1 << 20),
        "min_p": o.number("min_p", default=DEFAULTS["min_p"], minimum=0.0, maximum=1.0),
        "seed": o.int("seed", minimum=-(1 << 63), maximum=(1 << 64) - 1),
        "stop": parse_stop(o, "stop"),
        "presence_penalty": o.number("presence_penalty", default=0.0, minimum=-2.0, maximum=2.0),
        "frequency_penalty": o.number("frequency_penalty", default=0.0, minimum=-2.0,
                                      maximum=2.0),
        "repeat_penalty": repeat,
        # -1: the whole context, which the penalty window caps at what the sequence holds
        "repeat_last_n": 1 << 20 if last_n == -1 else last_n,
    }
    return sampling, (predict if predict is not None and predict > 0 else None)


def _format(f: Fields) -> tuple[bool, Node | None]:
    value = f.raw("format")
    if value is None or value == "":
        return False, None
    if value == "json":
        return True, None
    if isinstance(value, dict):
        return True, schema_node(value, "format")
    raise bad_request("format: expected \"json\" or a JSON schema object", "format")


def _common(f: Fields) -> tuple:
    """Checks both routes share; the template variables `think` sets (`enable_thinking`:
    true, or an effort level, thinks; false does not; left out, the template decides)."""
    if f.list("images"):
        raise bad_request("images: this model takes text only", "images")
    think = f.raw("think")
    if think is not None and not isinstance(think, (bool, str)):
        raise bad_request("think: expected a boolean or an effort string", "think")
    keep = f.raw("keep_alive")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, (str, int, float))):
        raise bad_request("keep_alive: expected a duration string or a number", "keep_alive")
    return () if think is None else (("enable_thinking", think is not False),)


def _tool_calls(m: Fields) -> list[dict]:
    calls = []
    for j, raw in enumerate(m.list("tool_calls") or []):
        c = Fields(raw, join(m.where("tool_calls"), j))
        fn = c.obj_at("function", required=True)
        args = fn.raw("arguments")
        if args is not None and not isinstance(args, (dict, str)):
            raise bad_request(f"{fn.where('arguments')}: expected an object", fn.where("arguments"))
        calls.append({"type": "function", "id": c.str("id", default=""),
                      "function": {"name": fn.str("name", required=True, non_empty=True),
                                   "arguments": args if args is not None else {}}})
    return calls


def _message(raw: Any, path: str) -> dict:
    m = Fields(raw, path)
    role = m.str("role", required=True, choices=ROLES)
    if m.list("images"):
        raise bad_request(f"{m.where('images')}: this model takes text only", m.where("images"))
    thinking = m.str("thinking")  # an earlier turn's reasoning, for a thinking template
    content = m.str("content", default="")
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            out["reasoning_content"] = thinking
        calls = _tool_calls(m)
        if calls:
            out["tool_calls"] = calls
        return out
    if role == "tool":
        name = m.str("tool_name", default="")
        return {"role": "tool", "content": content, "tool_call_id": name, "name": name}
    return {"role": role, "content": content}


def parse_chat(f: Fields, state) -> OllamaRequest:
    """`/api/chat`; no messages at all is a load request (chat None, nothing to run)."""
    name = check_model(f, state)
    switch = _common(f)
    raw = f.list("messages") or []
    messages = tuple(_message(m, join("messages", i)) for i, m in enumerate(raw))
    sampling, max_tokens = _options(f)
    json_object, json_schema = _format(f)
    tools, _, schemas = parse_tools(f)
    if json_object and tools:
        raise bad_request("format: a JSON format cannot be combined with tools (a tool call is "
                          "not the JSON document); leave one out", "format")
    chat = (ChatInput(messages=messages, tools=tuple(tools), tool_schemas=schemas,
                      max_tokens=max_tokens, json_object=json_object, json_schema=json_schema,
                      template_vars=switch, **sampling) if messages else None)
    return OllamaRequest(model=name, chat=chat, raw_prompt=None,
                         stream=f.bool("stream", default=True), sampling=sampling,
                         max_tokens=max_tokens)


def parse_generate(f: Fields, state) -> OllamaRequest:
    """`/api/generate`: the prompt as one user turn (after `system`) through the chat template,
    or, `raw`, fed as given; an empty prompt is a load request."""
    name = check_model(f, state)
    switch = _common(f)
    for key in ("suffix", "template"):
        if f.str(key):
            raise bad_request(f"{key}: not supported here (the model file's chat template is "
                              f"used; fill-in-the-middle is not)", key)
    if f.has("context"):
        raise bad_request("context: the deprecated context array is not supported; send the "
                          "conversation to /api/chat", "context")
    prompt = f.str("prompt", default="")
    system = f.str("system")
    raw = f.bool("raw")
    sampling, max_tokens = _options(f)
    json_object, json_schema = _format(f)
    stream = f.bool("stream", default=True)
    if not prompt:
        return OllamaRequest(name, None, None, stream, sampling, max_tokens)
    if raw:
        if json_object:
            raise bad_request("format: not with raw (the JSON format is held through the chat "
                              "template's answer)", "format")
        return OllamaRequest(name, None, prompt, stream, sampling, max_tokens)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}]
    chat = ChatInput(messages=tuple(messages), max_tokens=max_tokens, json_object=json_object,
                     json_schema=json_schema, template_vars=switch, **sampling)
    return OllamaRequest(name, chat, None, stream, sampling, max_tokens)
