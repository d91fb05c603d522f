"""Reading OpenAI-dialect request bodies into `ChatInput` / `CompletionRequest`.

Every field the API defines is either honoured, checked and ignored because it cannot change
the output (`user`, `metadata`, `store`, `service_tier`, `prediction`), or refused with
a 400 naming it (`n` above 16, a `best_of` other than `n`, a JSON schema keyword the output
could not be held to, image/audio/file content parts, a completion's `echo` with `logprobs`,
audio output, `web_search_options`, the deprecated `functions` / `function_call`): nothing is
silently dropped. A completion's `suffix` asks for the text between the prompt and it, where
the model has fill-in-the-middle tokens (a code model: `strata.tokenizer.fim`); one without them
refuses a non-empty suffix. A completion's `prompt` may be a batch (`n` choices of each).
`reasoning_effort` switches a thinking template's `enable_thinking` (off for "none" and
"minimal", on for the others) unless `chat_template_kwargs` sets it; `thinking_token_budget`
(vLLM's) bounds the reasoning's tokens (`thinking_budget`).
`parallel_tool_calls: false` ends the answer at its first complete tool call (at most one, as
OpenAI's). `n` choices are `n` sequences (`strata.serve.choices`).
`logit_bias` (token id -> -100..100) is added to the logits before the penalties (on the
device too: the sampler's bias table holds MAX_LOGIT_BIAS entries); `logprobs` (chat:
`logprobs` and `top_logprobs` 0..20; completions: `logprobs` 0..20) are the model's own
log-probabilities, before bias, penalties and temperature; `response_format` json_object /
json_schema constrains the answer (`strata.engine.json_constraint`; beside tools, the answer
is calls or the document: `strata.engine.json_either`). These two make the host
sample that sequence (they read its logits). `presence_penalty` and `frequency_penalty`
(-2..2) apply to the last 64 tokens of the sequence, prompt included (llama.cpp's window;
`strata.engine.sampler`). As llama.cpp's server does, the OpenAI routes also take `top_k`,
`min_p`, `repeat_penalty` (also by vLLM's name, `repetition_penalty`) and `repeat_last_n` (the
penalties' window); `top_k` -1 is off, as 0 is (vLLM's way to say it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.engine.json_schema import Node
from strata.plan.pick import PICK_MAX_BIAS
from strata.serve.chat import ChatInput, schema_node, template_vars, tool_arguments
from strata.serve.choices import MAX_CHOICES
from strata.serve.errors import bad_request
from strata.serve.fields import Fields, check_metadata, join, text_parts, type_name
from strata.serve.job import MAX_TOP_LOGPROBS, PENALTY_LAST_N, Sampling

MAX_STOPS = 16
# entries; a bias on more tokens than this is a mistake or an attack (and the device sampler's
# table holds exactly this many)
MAX_LOGIT_BIAS = PICK_MAX_BIAS
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ChatRequest:
    chat: ChatInput
    stream: bool
    include_usage: bool
    n: int = 1  # choices


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    prompts: tuple[tuple[int, ...], ...]  # one, or a batch (`n` choices of each)
    max_tokens: int | None
    sampling_args: dict
    stream: bool
    include_usage: bool
    echo: bool
    n: int = 1  # choices

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


def _n_choices(f: Fields) -> int:
    """`n`: how many choices (each a sequence of its own, decoded side by side)."""
    return f.int("n", default=1, minimum=1, maximum=MAX_CHOICES)


def parse_logit_bias(f: Fields, n_vocab: int) -> tuple[tuple[int, float], ...]:
    """`logit_bias`: {"token id": bias -100..100}, as (id, bias) pairs in id order."""
    bias = f.obj_at("logit_bias")
    if bias is None:
        return ()
    if len(bias.obj) > MAX_LOGIT_BIAS:
        raise bad_request(f"logit_bias: at most {MAX_LOGIT_BIAS} tokens, got {len(bias.obj)}",
                          "logit_bias")
    out = {}
    for key in bias.obj:
        token = int(key) if key.isascii() and key.isdigit() else -1
        if not 0 <= token < n_vocab:
            raise bad_request(f"{bias.where(key)}: the key must be a token id 0..{n_vocab - 1}",
                              bias.where(key))
        if token in out:
            raise bad_request(f"{bias.where(key)}: token {token} is biased twice", bias.where(key))
        out[token] = bias.number(key, minimum=-100.0, maximum=100.0)
        if out[token] is None:
            raise bad_request(f"{bias.where(key)}: expected a number, got null", bias.where(key))
    return tuple(sorted(out.items()))


def sampling_args(f: Fields, n_vocab: int) -> dict[str, Any]:
    """temperature / top_p / top_k / min_p / seed / stop / the penalties / logit_bias as
    `Sampling` keywords (top_p 0 is greedy)."""
    temperature = f.number("temperature", default=1.0, minimum=0.0, maximum=2.0)
    top_p = f.number("top_p", default=1.0, minimum=0.0, maximum=1.0)
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    return {"temperature": temperature, "top_p": top_p,
            # -1: vLLM's "off", as 0 is here
            "top_k": max(0, f.int("top_k", default=0, minimum=-1, maximum=1 << 20)),
            "seed": f.int("seed", minimum=-(1 << 63), maximum=(1 << 64) - 1),
            "stop": parse_stop(f, "stop"),
            "presence_penalty": f.number("presence_penalty", default=0.0, minimum=-2.0,
                                         maximum=2.0),
            "frequency_penalty": f.number("frequency_penalty", default=0.0, minimum=-2.0,
                                          maximum=2.0),
            "min_p": f.number("min_p", default=0.0, minimum=0.0, maximum=1.0),
            "repeat_penalty": _repeat_penalty(f),
            "repeat_last_n": f.int("repeat_last_n", default=PENALTY_LAST_N, minimum=0,
                                   maximum=1 << 20),
            "logit_bias": parse_logit_bias(f, n_vocab)}


def _repeat_penalty(f: Fields) -> float:
    """llama.cpp's repeat penalty: a positive logit divided by it, a negative one multiplied
    (1 = off; 0 would make every recent logit infinite, so it is refused). vLLM's name for it,
    `repetition_penalty`, is taken too (not both)."""
    key = "repetition_penalty" if f.raw("repetition_penalty") is not None else "repeat_penalty"
    if key == "repetition_penalty" and f.raw("repeat_penalty") is not None:
        raise bad_request("repetition_penalty: give the repeat penalty once (repeat_penalty is "
                          "llama.cpp's name for it, repetition_penalty vLLM's)",
                          "repetition_penalty")
    v = f.number(key, default=1.0, minimum=0.0, maximum=10.0)
    if v == 0.0:
        raise bad_request(f"{key}: must be above 0 (1 = off), got 0", key)
    return v


def _stream_flags(f: Fields) -> tuple[bool, bool]:
    stream = f.bool("stream")
    opts = f.obj_at("stream_options")
    if opts is not None and not stream:
        raise bad_request("stream_options: only allowed when stream is true", "stream_options")
    return stream, bool(opts is not None and opts.bool("include_usage"))


def _content(f: Fields, key: str, *, required: bool) -> str | None:
    value = f.raw(key, required=required)
    if value is None and required:  # null is absent (`Fields.has`), not text to render
        raise bad_request(f"{f.where(key)}: expected a string or an array of content parts, "
                          f"got null", f.where(key))
    if value is None:
        return None
    return text_parts(value, f.where(key), texts=("text",),
                      not_text=("image_url", "input_audio", "file", "input_image"))


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


def chat_message(raw: Any, path: str) -> dict:
    m = Fields(raw, path)
    role = m.str("role", required=True, choices=ROLES)
    if role == "assistant":
        calls = _tool_calls(m)
        out: dict[str, Any] = {"role": "assistant",
                               "content": _content(m, "content", required=not calls) or ""}
        if calls:
            out["tool_calls"] = calls
        # a thinking model's, for its template; `reasoning` is vLLM's newer name for it (and
        # OpenRouter's), which clients written against those send back
        reasoning = m.str("reasoning_content")
        if m.raw("reasoning") is not None:
            if reasoning is not None:
                raise bad_request(f"{path}.reasoning: give the reasoning once (reasoning_content "
                                  f"or reasoning)", f"{path}.reasoning")
            reasoning = m.str("reasoning")
        if reasoning:
            out["reasoning_content"] = reasoning
        return out
    content = _content(m, "content", required=True)
    if role == "tool":
        return {"role": "tool", "content": content,
                "tool_call_id": m.str("tool_call_id", required=True)}
    return {"role": "system" if role == "developer" else role, "content": content}


def parse_tools(f: Fields) -> tuple[list[dict], str, tuple]:
    """The tools (as the chat template reads them), the tool choice, and (name, the parameters'
    compiled schema where the function is `strict`, else None) per tool: a strict tool's calls
    are held to its schema, and a schema keyword they could not be held to is a 400."""
    tools, schemas = [], []
    for j, raw in enumerate(f.list("tools") or []):
        t = Fields(raw, join("tools", j))
        t.str("type", required=True, choices=("function",))
        fn = t.obj_at("function", required=True)
        params = fn.obj_at("parameters")
        node = None
        if fn.bool("strict"):
            node = schema_node(params.obj if params is not None else
                               {"type": "object", "properties": {}}, fn.where("parameters"))
        schemas.append((fn.str("name", required=True, non_empty=True), node))
        tools.append({"type": "function", "function": {
            "name": fn.str("name", required=True, non_empty=True),
            "description": fn.str("description", default=""),
            "parameters": params.obj if params is not None else {"type": "object",
                                                                  "properties": {}}}})
    return tools, parse_tool_choice(f, tools, nested=True), tuple(schemas)


def parse_tool_choice(f: Fields, tools: list[dict], *, nested: bool) -> str:
    """`tool_choice`: "auto" (also when absent), "none", "required" (with a tool to call), or
    the name of the tool an object names: {"type": "function", "function": {"name"}} on the
    chat route (`nested`), {"type": "function", "name"} on the Responses route."""
    choice = f.raw("tool_choice")
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad_request(f"tool_choice: {choice!r} is not one of 'auto', 'none', 'required'",
                              "tool_choice")
        if choice == "required" and not tools:
            raise bad_request("tool_choice: 'required' needs at least one tool", "tool_choice")
        return choice
    c = Fields(choice, "tool_choice")
    c.str("type", required=True, choices=("function",))
    holder = c.obj_at("function", required=True) if nested else c
    name = holder.str("name", required=True)
    if name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"{holder.where('name')}: {name!r} is not among the tools",
                          holder.where("name"))
    return name


def _json_format(f: Fields) -> tuple[bool, Node | None]:
    """`response_format`: {"type": "text"} (the default), {"type": "json_object"} (the answer is
    one JSON object) or {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    (one object the schema allows; with `strict`, a schema keyword the output could not be held
    to is a 400 naming it, never ignored). Returns (constrained, the compiled schema or None)."""
    fmt = f.obj_at("response_format")
    if fmt is None:
        return False, None
    kind = fmt.str("type", required=True, choices=("text", "json_object", "json_schema"))
    if kind != "json_schema":
        return kind == "json_object", None
    spec = fmt.obj_at("json_schema", required=True)
    spec.str("name", required=True, non_empty=True)
    # without strict (OpenAI's default), OpenAI's API holds the answer to nothing: here its
    # structure still is, but not the keywords narrowing a value within its type (`format`,
    # `minimum`, ...), which are refused only where `strict` asks for every one to be kept
    strict = spec.bool("strict")
    schema = spec.obj_at("schema")
    if schema is None:  # OpenAI: no schema is any object
        return True, None
    return True, schema_node(schema.obj, schema.path, loose=not strict)


def _check_ignored(f: Fields) -> None:
    """The fields that cannot change the output, checked as the official API checks them (a
    wrong type is a 400 naming it, not silently taken) and then ignored; and those asking for
    what this server has not, refused by name."""
    check_metadata(f.raw("metadata"))
    f.str("user")
    f.bool("store")
    f.str("service_tier")
    p = f.obj_at("prediction")  # predicted output: only ever a speed-up, never other text
    if p is not None:
        p.str("type", required=True, choices=("content",))
    for key in ("functions", "function_call"):  # the API's deprecated form of tools
        if f.raw(key) is not None:
            raise bad_request(f"{key}: the deprecated function-calling fields are not taken "
                              f"here; send `tools` (each {{\"type\": \"function\", \"function\": "
                              f"{{...}}}}) and `tool_choice`", key)
    if f.raw("web_search_options") is not None:
        raise bad_request("web_search_options: this server has no web search; leave it out",
                          "web_search_options")
    modalities = f.list("modalities") or []
    if f.raw("audio") is not None or any(m != "text" for m in modalities):
        key = "audio" if f.raw("audio") is not None else "modalities"
        raise bad_request(f"{key}: the served model writes text only", key)


# `reasoning_effort` where the template has Qwen3's thinking switch: these run without thinking,
# the others with it (there is no budget between)
EFFORT_OFF = ("none", "minimal")
EFFORTS = EFFORT_OFF + ("low", "medium", "high", "xhigh")


def _template_vars(f: Fields, budget: int | None) -> tuple[tuple[str, Any], ...]:
    """`chat_template_kwargs`, with `reasoning_effort` as `enable_thinking` where the kwargs do
    not set it themselves; a thinking budget of 0 turns it off whatever the effort says."""
    values = dict(template_vars(f.raw("chat_template_kwargs"), "chat_template_kwargs"))
    effort = f.str("reasoning_effort", choices=EFFORTS)
    if budget == 0:
        effort = "none"
    return tuple(sorted({**dict(thinking_vars(effort)), **values}.items()))


def thinking_vars(effort: str | None) -> tuple[tuple[str, Any], ...]:
    """An effort (`EFFORTS`, None: not given) as the template's `enable_thinking`."""
    return () if effort is None else (("enable_thinking", effort not in EFFORT_OFF),)


def thinking_budget(f: Fields) -> int | None:
    """vLLM's `thinking_token_budget`: at most this many reasoning tokens, its tags counted
    (as Anthropic's `budget_tokens` here: `Sampling.reasoning_budget`); 0 asks for none (the
    template's thinking switch off; a block the model opens anyway closes at once)."""
    return f.int("thinking_token_budget", minimum=0, maximum=1 << 30)


def parse_chat(f: Fields, state) -> ChatRequest:
    state.check_model(f.str("model", required=True))
    _check_ignored(f)
    raw_messages = f.list("messages", required=True, non_empty=True)
    messages = tuple(chat_message(m, join("messages", i)) for i, m in enumerate(raw_messages))
    n = _n_choices(f)
    top = f.int("top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    if top is not None and not f.bool("logprobs"):
        raise bad_request("top_logprobs: needs logprobs set to true", "top_logprobs")
    logprobs = (top or 0) if f.bool("logprobs") else None
    json_object, json_schema = _json_format(f)
    max_tokens = f.int("max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = f.int("max_tokens", minimum=1)
    tools, choice, tool_schemas = parse_tools(f)
    stream, include_usage = _stream_flags(f)
    budget = thinking_budget(f)
    chat = ChatInput(messages=messages, tools=tuple(tools), tool_choice=choice,
                     tool_schemas=tool_schemas, template_vars=_template_vars(f, budget),
                     reasoning_budget=None if budget is None else max(budget, 1),
                     max_tokens=max_tokens, logprobs=logprobs, json_object=json_object,
                     json_schema=json_schema,
                     parallel_tool_calls=f.bool("parallel_tool_calls", default=True),
                     **sampling_args(f, state.model.n_vocab))
    return ChatRequest(chat=chat, stream=stream, include_usage=include_usage, n=n)


MAX_PROMPTS = 64  # a completion's batch (each prompt's choices also wait in the queue together)


def _prompts(f: Fields, model, suffix: str | None) -> tuple[tuple[int, ...], ...]:
    """`prompt`: a string, an array of token ids, or a batch of either (an array of strings or
    of id arrays), each a prompt of its own; with a `suffix` (`ServedModel.encode_fim`), text."""
    value = f.raw("prompt", required=True)
    batch = (isinstance(value, list) and len(value) > 0
             and all(isinstance(v, (str, list)) for v in value))
    items = value if batch else [value]
    if len(items) > MAX_PROMPTS:
        raise bad_request(f"prompt: at most {MAX_PROMPTS} prompts a request, got {len(items)}",
                          "prompt")
    out = []
    for i, item in enumerate(items):
        where = f"prompt[{i}]" if batch else "prompt"
        if suffix is not None:
            if not isinstance(item, str):
                raise bad_request(f"{where}: with suffix, the text before the insertion (a "
                                  f"string)", where)
            out.append(tuple(model.encode_fim(item, suffix, "suffix")))
        else:
            out.append(_prompt_tokens(item, model, where))
    return tuple(out)


def _prompt_tokens(value: Any, model, where: str) -> tuple[int, ...]:
    if isinstance(value, str):
        tokens = model.encode_prompt(value)
    elif isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                         for t in value):
        bad = [t for t in value if not 0 <= t < model.n_vocab]
        if bad:
            raise bad_request(f"{where}: token id {bad[0]} is outside the vocabulary "
                              f"(0..{model.n_vocab - 1})", where)
        tokens = list(value)
    elif isinstance(value, list):
        j, t = next((j, t) for j, t in enumerate(value)  # an array of ids with one that is not
                    if isinstance(t, bool) or not isinstance(t, int))
        raise bad_request(f"{where}[{j}]: expected an integer token id (0..{model.n_vocab - 1}), "
                          f"got {type_name(t)}", f"{where}[{j}]")
    else:
        raise bad_request(f"{where}: expected a string or an array of token ids", where)
    if not tokens:
        raise bad_request(f"{where}: must not be empty", where)
    return tuple(tokens)


def parse_completion(f: Fields, state) -> CompletionRequest:
    state.check_model(f.str("model", required=True))
    suffix = f.str("suffix")
    prompts = _prompts(f, state.model,
                       suffix if suffix is not None and (suffix or state.model.fim) else None)
    n = _n_choices(f)
    best_of = f.int("best_of", minimum=1, maximum=128)
    if best_of is not None and best_of != n:
        raise bad_request(f"best_of: {best_of} candidates would need ranking, which is not "
                          f"done here; leave it out or set it to n ({n})", "best_of")
    logprobs = f.int("logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    echo = f.bool("echo")
    if logprobs is not None and echo:
        raise bad_request("logprobs: not with echo (the prompt's tokens get no log-probabilities "
                          "here); leave one of them out", "logprobs")
    if suffix is not None and echo:
        raise bad_request("echo: not with suffix (the prompt of an insertion is the text "
                          "around it, not text the answer follows)", "echo")
    stream, include_usage = _stream_flags(f)
    return CompletionRequest(prompts=prompts,
                             max_tokens=f.int("max_tokens", default=16, minimum=1),
                             sampling_args={**sampling_args(f, state.model.n_vocab),
                                            "logprobs": logprobs},
                             stream=stream, include_usage=include_usage, echo=echo, n=n)
