"""Reading OpenAI-dialect request bodies into `ChatInput` / `CompletionRequest`.

Every field the API defines is either honoured, checked and ignored because it cannot change
the output (`user`, `metadata`, `store`, `parallel_tool_calls`, `service_tier`), or refused with
a 400 naming it (`n` > 1, `logprobs`, `logit_bias`, structured `response_format`,
image/audio/file content parts): nothing is silently dropped. `presence_penalty` and
`frequency_penalty` (-2..2) apply to the last 64 tokens of the sequence, prompt included
(llama.cpp's window; `strata.engine.sampler`). As llama.cpp's server does, the OpenAI routes
also take `top_k`, `min_p`, `repeat_penalty` and `repeat_last_n` (the penalties' window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.serve.chat import ChatInput, tool_arguments
from strata.serve.errors import bad_request
from strata.serve.fields import Fields, join
from strata.serve.job import PENALTY_LAST_N, Sampling

MAX_STOPS = 16
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ChatRequest:
    chat: ChatInput
    stream: bool
    include_usage: bool


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    prompt: tuple[int, ...]
    max_tokens: int | None
    sampling_args: dict
    stream: bool
    include_usage: bool
    echo: bool

    def sampling(self, max_tokens: int) -> Sampling:
        return Sampling(max_tokens=max_tokens, **self.sampling_args)


def parse_stop(f: Fields, key: str) -> tuple[str, ...]:
    value = f.raw(key)
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request(f"{f.where(key)}: expected a string or an array of strings", f.where(key))
    if len(stops) > MAX_STOPS:
        raise bad_request(f"{f.where(key)}: at most {MAX_STOPS} stop strings, got {len(stops)}",
                          f.where(key))
    if any(not s for s in stops):
        raise bad_request(f"{f.where(key)}: stop strings must not be empty", f.where(key))
    return tuple(stops)


def _refuse_unsupported(f: Fields) -> None:
    n = f.int("n", default=1, minimum=1, maximum=128)
    if n != 1:
        raise bad_request(f"n: only one choice per request is supported, got {n}", "n")
    bias = f.obj_at("logit_bias")
    if bias is not None and bias.obj:
        raise bad_request("logit_bias: not supported; send an empty object or leave it out",
                          "logit_bias")


def sampling_args(f: Fields) -> dict[str, Any]:
    """temperature / top_p / top_k / min_p / seed / stop / the penalties as `Sampling` keywords
    (top_p 0 is greedy)."""
    temperature = f.number("temperature", default=1.0, minimum=0.0, maximum=2.0)
    top_p = f.number("top_p", default=1.0, minimum=0.0, maximum=1.0)
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    return {"temperature": temperature, "top_p": top_p,
            "top_k": f.int("top_k", default=0, minimum=0, maximum=1 << 20),
            "seed": f.int("seed", minimum=-(1 << 63), maximum=(1 << 64) - 1),
            "stop": parse_stop(f, "stop"),
            "presence_penalty": f.number("presence_penalty", default=0.0, minimum=-2.0,
                                         maximum=2.0),
            "frequency_penalty": f.number("frequency_penalty", default=0.0, minimum=-2.0,
                                          maximum=2.0),
            "min_p": f.number("min_p", default=0.0, minimum=0.0, maximum=1.0),
            "repeat_penalty": _repeat_penalty(f),
            "repeat_last_n": f.int("repeat_last_n", default=PENALTY_LAST_N, minimum=0,
                                   maximum=1 << 20)}


def _repeat_penalty(f: Fields) -> float:
    """llama.cpp's repeat penalty: a positive logit divided by it, a negative one multiplied
    (1 = off; 0 would make every recent logit infinite, so it is refused)."""
    v = f.number("repeat_penalty", default=1.0, minimum=0.0, maximum=10.0)
    if v == 0.0:
        raise bad_request("repeat_penalty: must be above 0 (1 = off), got 0", "repeat_penalty")
    return v


def _stream_flags(f: Fields) -> tuple[bool, bool]:
    stream = f.bool("stream")
    opts = f.obj_at("stream_options")
    if opts is not None and not stream:
        raise bad_request("stream_options: only allowed when stream is true", "stream_options")
    return stream, bool(opts is not None and opts.bool("include_usage"))


def _content(f: Fields, key: str, *, required: bool) -> str | None:
    value = f.raw(key, required=required)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{f.where(key)}: expected a string or an array of content parts",
                          f.where(key))
    texts = []
    for j, part in enumerate(value):
        path = join(f.where(key), j)
        pf = Fields(part, path)
        kind = pf.str("type", required=True)
        if kind == "text":
            texts.append(pf.str("text", required=True))
        elif kind == "refusal":
            texts.append(pf.str("refusal", required=True))
        elif kind in ("image_url", "input_audio", "file", "input_image"):
            raise bad_request(f"{path} is an {kind!r} part, but this model takes text only: "
                              f"remove it or serve a model that accepts it", path)
        else:
            raise bad_request(f"{join(path, 'type')}: unknown content part type {kind!r} "
                              f"(expected 'text')", join(path, "type"))
    return "".join(texts)


def _tool_calls(f: Fields) -> list[dict]:
    calls = []
    for j, raw in enumerate(f.list("tool_calls") or []):
        c = Fields(raw, join(f.where("tool_calls"), j))
        c.str("type", default="function", choices=("function",))
        fn = c.obj_at("function", required=True)
        calls.append({"type": "function", "id": c.str("id", default=""),
                      "function": {"name": fn.str("name", required=True, non_empty=True),
                                   "arguments": tool_arguments(fn.str("arguments", default="{}"))}})
    return calls


def _message(raw: Any, path: str) -> dict:
    m = Fields(raw, path)
    role = m.str("role", required=True, choices=ROLES)
    if role == "assistant":
        calls = _tool_calls(m)
        out: dict[str, Any] = {"role": "assistant",
                               "content": _content(m, "content", required=not calls) or ""}
        if calls:
            out["tool_calls"] = calls
        return out
    content = _content(m, "content", required=True)
    if role == "tool":
        return {"role": "tool", "content": content,
                "tool_call_id": m.str("tool_call_id", required=True)}
    return {"role": "system" if role == "developer" else role, "content": content}


def _tools(f: Fields) -> tuple[list[dict], str]:
    tools = []
    for j, raw in enumerate(f.list("tools") or []):
        t = Fields(raw, join("tools", j))
        t.str("type", required=True, choices=("function",))
        fn = t.obj_at("function", required=True)
        params = fn.obj_at("parameters")
        tools.append({"type": "function", "function": {
            "name": fn.str("name", required=True, non_empty=True),
            "description": fn.str("description", default=""),
            "parameters": params.obj if params is not None else {"type": "object",
                                                                  "properties": {}}}})
    choice = f.raw("tool_choice")
    if choice is None:
        return tools, "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad_request(f"tool_choice: {choice!r} is not one of 'auto', 'none', 'required'",
                              "tool_choice")
        if choice == "required" and not tools:
            raise bad_request("tool_choice: 'required' needs at least one tool", "tool_choice")
        return tools, choice
    c = Fields(choice, "tool_choice")
    c.str("type", required=True, choices=("function",))
    name = c.obj_at("function", required=True).str("name", required=True)
    if name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"tool_choice.function.name: {name!r} is not among the tools",
                          "tool_choice.function.name")
    return tools, name


def parse_chat(f: Fields, state) -> ChatRequest:
    state.check_model(f.str("model", required=True))
    raw_messages = f.list("messages", required=True, non_empty=True)
    messages = tuple(_message(m, join("messages", i)) for i, m in enumerate(raw_messages))
    _refuse_unsupported(f)
    if f.bool("logprobs") or f.has("top_logprobs"):
        raise bad_request("logprobs: not supported", "logprobs")
    fmt = f.obj_at("response_format")
    if fmt is not None and fmt.str("type", required=True) != "text":
        raise bad_request("response_format: only {'type': 'text'} is supported (no constrained "
                          "decoding)", "response_format.type")
    max_tokens = f.int("max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = f.int("max_tokens", minimum=1)
    tools, choice = _tools(f)
    stream, include_usage = _stream_flags(f)
    chat = ChatInput(messages=messages, tools=tuple(tools), tool_choice=choice,
                     max_tokens=max_tokens, **sampling_args(f))
    return ChatRequest(chat=chat, stream=stream, include_usage=include_usage)


def _prompt_tokens(f: Fields, model) -> tuple[int, ...]:
    value = f.raw("prompt", required=True)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        tokens = model.encode_prompt(value)
    elif isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                         for t in value):
        bad = [t for t in value if not 0 <= t < model.n_vocab]
        if bad:
            raise bad_request(f"prompt: token id {bad[0]} is outside the vocabulary "
                              f"(0..{model.n_vocab - 1})", "prompt")
        tokens = list(value)
    elif isinstance(value, list):
        raise bad_request("prompt: send one prompt per request (a string or one array of token "
                          "ids); batches of several prompts are not supported", "prompt")
    else:
        raise bad_request("prompt: expected a string or an array of token ids", "prompt")
    if not tokens:
        raise bad_request("prompt: must not be empty", "prompt")
    return tuple(tokens)


def parse_completion(f: Fields, state) -> CompletionRequest:
    state.check_model(f.str("model", required=True))
    prompt = _prompt_tokens(f, state.model)
    _refuse_unsupported(f)
    if f.int("best_of", default=1, minimum=1, maximum=128) != 1:
        raise bad_request("best_of: only 1 is supported", "best_of")
    if f.has("logprobs"):
        raise bad_request("logprobs: not supported", "logprobs")
    if f.str("suffix"):
        raise bad_request("suffix: insertion (fill-in-the-middle) is not supported", "suffix")
    stream, include_usage = _stream_flags(f)
    return CompletionRequest(prompt=prompt, max_tokens=f.int("max_tokens", default=16, minimum=1),
                             sampling_args=sampling_args(f), stream=stream,
                             include_usage=include_usage, echo=f.bool("echo"))
