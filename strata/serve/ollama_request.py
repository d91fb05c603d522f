"""Reading Ollama API request bodies (`POST /api/chat`, `/api/generate`) into a `ChatInput` or a
raw prompt.

`messages` are Ollama's (`role` system / user / assistant / tool in any case, as Ollama
lowercases it; `content` a string, an assistant's `tool_calls` as `{"id", "function": {"name",
"arguments": {...}}}`, a tool message's `tool_call_id` or `tool_name`); `tools` are in the
OpenAI function shape, as Ollama takes them (`type` may be left out, as there). `options` holds
the sampling knobs, with Ollama's defaults where a request leaves them out (temperature 0.8,
top_k 40, top_p 0.9, repeat_penalty 1.1 over the last 64 tokens), so an Ollama client gets
what it would get there; `num_predict` is max_tokens (0 or below, e.g. -1 or -2: as much as
the context holds, as Ollama's runner reads it); `seed` -1 is Ollama's default, no seed (its
sampler draws one), not a fixed seed.
Options that set up the runner (`num_ctx`, `num_gpu`, `num_thread`, `num_batch`, ...) are
checked and ignored: the plan made at start-up decides those. `mirostat` and `typical_p` at
anything but off are a 400, as are images and a generate's `template`. A generate's `suffix`
asks for the text between the prompt and it (fill-in-the-middle, as Ollama's code-model
templates put `.Suffix`: `ServedModel.encode_fim`), not with `raw`, `system`, `context` or a
JSON `format`; a model without the tokens is a 400.
`format` is "json" (one JSON object) or a JSON schema. `think` reaches the chat template as
`enable_thinking` (Qwen3's switch; false: no reasoning); `keep_alive` is checked (a number of
seconds or a Go duration string, as Ollama parses it) and otherwise ignored: the model stays
loaded while the server runs, but a load request with `keep_alive` 0 is answered as Ollama's
unload. `logprobs` (with `top_logprobs`, 0 to 20) asks for Ollama's per-token log-probabilities.
A generate's `context` (the token ids an earlier generate returned) comes before its prompt, as
Ollama detokenizes it in front of the templated prompt; raw mode takes no `context` or `system`.
"""

from __future__ import annotations

import json
import re
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
MAX_TOP_LOGPROBS = 20  # Ollama's bound on top_logprobs
# Go's time.ParseDuration, which Ollama's keep_alive string goes through ("5m", "1h30m", "-1m")
_GO_DURATION = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")


@dataclass(frozen=True, slots=True)
class OllamaRequest:
    model: str  # the name as the client sent it (echoed in every line)
    chat: ChatInput | None  # a chat (and a generate that is not raw); None: `raw_prompt`
    raw_prompt: str | None  # a raw generate's prompt, fed as given
    stream: bool
    sampling: dict  # the `Sampling` keywords besides max_tokens (a raw prompt's)
    max_tokens: int | None
    unload: bool = False  # a load request with keep_alive 0: Ollama's unload
    logprobs: bool = False  # each line carries its tokens' `logprobs`
    # a templated generate's earlier `context` (put before its prompt); None: the final object
    # has no `context` (a chat, or a raw generate, as in Ollama)
    context: tuple[int, ...] | None = None
    suffix: str | None = None  # with raw_prompt: the text after the insertion (fill-in-the-middle)


def check_model(f: Fields, state) -> str:
    """The model the body names (`model`, or the older `name`); Ollama's `:latest` tag of the
    served name is the served name (`ServerState.check_model`, on every route)."""
    key = "model" if f.has("model") or not f.has("name") else "name"
    name = f.str(key, required=True, non_empty=True)
    state.check_model(name)
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
    seed = o.int("seed", minimum=-(1 << 63), maximum=(1 << 64) - 1)
    # Ollama's runner cuts a sequence only where num_predict > 0: 0, -1 (its documented "no
    # limit") and -2 ("fill the context") all run until the model stops or the context is full
    predict = o.int("num_predict", minimum=-(1 << 31), maximum=1 << 30)
    if predict is not None and predict <= 0:
        predict = None
    sampling = {
        "temperature": temperature, "top_p": top_p,
        "top_k": o.int("top_k", default=DEFAULTS["top_k"], minimum=0, maximum=1 << 20),
        "min_p": o.number("min_p", default=DEFAULTS["min_p"], minimum=0.0, maximum=1.0),
        "seed": None if seed == -1 else seed,  # -1: Ollama's "no seed", a fresh draw
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


def _keep_alive(f: Fields) -> float | None:
    """`keep_alive` as Ollama reads it: a number of seconds (negative: forever) or a Go
    duration string ("5m", "1h30m"; a bare number string is taken as seconds too); whether it
    is zero is all that matters here. None: left out."""
    keep = f.raw("keep_alive")
    if keep is None or keep == "":  # "" too: left empty by a client's settings form
        return None
    if isinstance(keep, (int, float)) and not isinstance(keep, bool):
        return float(keep)
    if isinstance(keep, str):
        text = keep.strip()
        if _NUMBER.fullmatch(text):
            return float(text)
        if _GO_DURATION.fullmatch(text):  # zero only where every number in it is
            numbers = re.findall(r"\d+\.?\d*|\.\d+", text)
            return 1.0 if any(float(n) for n in numbers) else 0.0
    raise bad_request(f"keep_alive: expected a number of seconds or a duration such as \"5m\" "
                      f"or \"1h30m\", got {json.dumps(keep)}", "keep_alive")


def _logprobs(f: Fields, sampling: dict) -> bool:
    """`logprobs` (and `top_logprobs`, the alternatives per token, 0 to 20) into `sampling`."""
    top = f.int("top_logprobs", default=0, minimum=0, maximum=MAX_TOP_LOGPROBS)
    if not f.bool("logprobs"):
        return False  # top_logprobs alone asks for nothing, as in Ollama
    sampling["logprobs"] = top
    return True


def _common(f: Fields) -> tuple:
    """Checks both routes share; the template variables `think` sets (`enable_thinking`:
    true, or an effort level, thinks; false does not; left out, the template decides)."""
    if f.list("images"):
        raise bad_request("images: this model takes text only", "images")
    think = f.raw("think")
    if think is not None and not isinstance(think, (bool, str)):
        raise bad_request("think: expected a boolean or an effort string", "think")
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
    role = m.str("role", required=True).lower()  # Ollama lowercases the role before reading it
    if role not in ROLES:
        raise bad_request(f"{m.where('role')}: {m.obj['role']!r} is not one of "
                          f"{', '.join(repr(r) for r in ROLES)}", m.where("role"))
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
    if role == "tool":  # answering a call by its id (Ollama's tool_call_id) or its name
        name = m.str("tool_name", default="")
        return {"role": "tool", "content": content, "name": name,
                "tool_call_id": m.str("tool_call_id") or name}
    return {"role": role, "content": content}


def _tools(f: Fields) -> tuple[list[dict], tuple]:
    """The tools and their schemas; a tool that leaves out `type` is a function, as Ollama
    reads it (its Tool.Type is never checked)."""
    raw = f.list("tools")
    if raw and any(isinstance(t, dict) and "type" not in t for t in raw):
        f = Fields({**f.obj, "tools": [{"type": "function", **t}
                                       if isinstance(t, dict) and "type" not in t else t
                                       for t in raw]}, f.path)
    tools, _, schemas = parse_tools(f)
    return tools, schemas


def _context(f: Fields, n_vocab: int) -> tuple[int, ...]:
    """A generate's `context`: token ids an earlier generate returned (none: empty)."""
    ids = f.list("context") or []
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            where = join("context", i)
            raise bad_request(f"{where}: expected a token id from 0 to {n_vocab - 1} (the "
                              f"context a generate returned), got {json.dumps(t)}", where)
    return tuple(ids)


def parse_chat(f: Fields, state) -> OllamaRequest:
    """`/api/chat`; no messages at all is a load request (chat None, nothing to run)."""
    name = check_model(f, state)
    switch = _common(f)
    keep = _keep_alive(f)
    raw = f.list("messages") or []
    messages = tuple(_message(m, join("messages", i)) for i, m in enumerate(raw))
    sampling, max_tokens = _options(f)
    logprobs = _logprobs(f, sampling)
    json_object, json_schema = _format(f)
    tools, schemas = _tools(f)
    chat = (ChatInput(messages=messages, tools=tuple(tools), tool_schemas=schemas,
                      max_tokens=max_tokens, json_object=json_object, json_schema=json_schema,
                      template_vars=switch, **sampling) if messages else None)
    return OllamaRequest(model=name, chat=chat, raw_prompt=None,
                         stream=f.bool("stream", default=True), sampling=sampling,
                         max_tokens=max_tokens, unload=not messages and keep == 0,
                         logprobs=logprobs)


def parse_generate(f: Fields, state) -> OllamaRequest:
    """`/api/generate`: the prompt as one user turn (after `system`) through the chat template,
    or, `raw`, fed as given; an empty prompt is a load request."""
    name = check_model(f, state)
    switch = _common(f)
    keep = _keep_alive(f)
    if f.str("template"):
        raise bad_request("template: not supported here (the model file's chat template is "
                          "used)", "template")
    suffix = f.str("suffix") or None
    context = _context(f, state.model.n_vocab)
    prompt = f.str("prompt", default="")
    system = f.str("system")
    raw = f.bool("raw")
    sampling, max_tokens = _options(f)
    logprobs = _logprobs(f, sampling)
    json_object, json_schema = _format(f)
    stream = f.bool("stream", default=True)
    if not prompt and suffix is None:  # (an insertion at the start of a file is no load)
        return OllamaRequest(name, None, None, stream, sampling, max_tokens,
                             unload=keep == 0)
    if suffix is not None:  # fill-in-the-middle: the prompt and suffix around the insertion
        for key, given in (("raw", raw), ("system", system), ("context", context),
                           ("format", json_object)):
            if given:
                raise bad_request(f"{key}: not with suffix (an insertion's prompt is the code "
                                  f"around it, in the model's fill-in-the-middle tokens)", key)
        return OllamaRequest(name, None, prompt, stream, sampling, max_tokens,
                             logprobs=logprobs, suffix=suffix)
    if raw:
        for key, given in (("context", context), ("system", system)):
            if given:  # Ollama: "raw mode does not support template, system, or context"
                raise bad_request(f"{key}: not with raw (a raw prompt is fed as given)", key)
        if json_object:
            raise bad_request("format: not with raw (the JSON format is held through the chat "
                              "template's answer)", "format")
        return OllamaRequest(name, None, prompt, stream, sampling, max_tokens,
                             logprobs=logprobs)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}]
    chat = ChatInput(messages=tuple(messages), max_tokens=max_tokens, json_object=json_object,
                     json_schema=json_schema, template_vars=switch, **sampling)
    return OllamaRequest(name, chat, None, stream, sampling, max_tokens, logprobs=logprobs,
                         context=context)
