"""Reading OpenAI Responses API request bodies (`POST /v1/responses`) into a `ChatInput`.

`input` is a string (one user message) or a list of items: messages (`role` user / system /
developer / assistant; `content` a string or `input_text` / `output_text` parts), the model's
earlier `function_call` items (an assistant message's tool calls) and the client's
`function_call_output` items (tool messages); `instructions` is a system message before them.
Tools are function tools in the Responses shape (`name`, `parameters`, `strict` at the top of
the tool; strict by default, as the API has it, unless the schema lies outside the subset
`strata.engine.json_schema` holds calls to: then the tool is not, and the response's `tools`
say so; `strict: true` given explicitly makes such a schema a 400); `text.format` is `text`,
`json_object` or `json_schema` (`name`, `schema`, `strict`).

Log-probabilities: `include: ["message.output_text.logprobs"]` (or a `top_logprobs` count,
0..20) gives each output_text part the chat route's per-token entries.

A stored response (`store`, true by default; `strata.serve.response_store`) is continued by
`previous_response_id`: its conversation's turns come before this request's `input`, the
earlier `instructions` not carried over. Or by `conversation` (an id, or `{"id": ...}`: the
Conversations API, `strata.serve.conversation_store`): its items come before `input`, and the
response's input and output items are added to it; the two cannot be given together.
A `reasoning` item (a thinking model's, sent back) becomes the next assistant message's
`reasoning_content`, which a thinking template shows where it wants it. Built-in tools (web
search, file search, ...), image and file inputs, stored prompt templates (`prompt`), and
`include` entries other than `message.output_text.logprobs` and `reasoning.encrypted_content`
are a 400 naming the field.
With `reasoning.encrypted_content`, each reasoning item also carries its text sealed (`seal`),
so a client that keeps no state here (`store: false`, as Codex sends) can send the item back
without its `content` and the template still sees the reasoning; another provider's encrypted
reasoning cannot be read here and is dropped. `reasoning.effort` switches a thinking
template's `enable_thinking` as the chat route's `reasoning_effort` does (off for "none" and
"minimal"; without it the model thinks as its template lets it); `metadata`, `user`, `truncation` and
`service_tier` cannot change the output and are checked and ignored (the response repeats
`reasoning`, `truncation` and `user` as sent, as OpenAI's does). `parallel_tool_calls: false`
ends the answer at its first complete function call.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from strata.engine.json_schema import Node, SchemaError
from strata.engine.json_schema_request import compile_request_schema
from strata.serve.chat import ChatInput, schema_node, tool_arguments
from strata.serve.errors import bad_request
from strata.serve.fields import Fields, check_metadata, join, text_parts
from strata.serve.job import MAX_TOP_LOGPROBS
from strata.serve.openai_request import EFFORTS, parse_tool_choice, thinking_vars

ROLES = ("user", "system", "developer", "assistant")
LOGPROBS = "message.output_text.logprobs"
# reasoning items carry their text sealed, for a client that keeps no server state (store:
# false, as Codex sends) to send back; the two `include` entries this server has
SEALED = "reasoning.encrypted_content"
INCLUDES = (LOGPROBS, SEALED)
_SEAL = "strata-reasoning-v1:"
_TEXT = ("input_text", "output_text", "text")
_NOT_TEXT = ("input_image", "input_file", "input_audio")


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    chat: ChatInput
    stream: bool
    echo: dict  # the request's settings as the response object repeats them
    input_items: list  # `input` as items, kept with the response where it is stored
    seal_reasoning: bool = False  # `include` has SEALED: reasoning items get encrypted_content


def seal(text: str) -> str:
    """A reasoning item's `encrypted_content`: its text, base64 behind a tag. Not a secret
    (the item's `content` holds the same text); opaque to clients, read back by `unseal`."""
    return _SEAL + base64.b64encode(text.encode()).decode("ascii")


def check_includes(entries: list) -> list:
    """`include`'s entries, each one of INCLUDES, else a 400 naming `include[j]`."""
    for j, entry in enumerate(entries):
        if entry not in INCLUDES:
            raise bad_request(f"include[{j}]: {entry!r} is not available here (only "
                              f"{' and '.join(map(repr, INCLUDES))})", f"include[{j}]")
    return entries


def with_includes(items: list, query) -> list:
    """Listed items (a response's input items, a conversation's) as the query's `include`
    asks (`include` or `include[]`, repeated): each entry one of INCLUDES, else a 400 naming
    `include[j]`. With `reasoning.encrypted_content`, a reasoning item stored without it gets
    its text sealed, as a response made with that include carries it; logprobs are as the
    response that made an item asked for them (kept with it, never computed again)."""
    entries = check_includes(list(query.getlist("include")) + list(query.getlist("include[]")))
    if SEALED not in entries:
        return items
    out = []
    for item in items:
        first = (item.get("content") or [None])[0] if item.get("type") == "reasoning" else None
        if (isinstance(first, dict) and isinstance(first.get("text"), str)
                and "encrypted_content" not in item):  # sealed as `_sealed` seals an output's
            item = {**item, "encrypted_content": seal(first["text"])}
        out.append(item)
    return out


def unseal(value: str) -> str | None:
    """The text `seal` made, or None for content this server did not seal (another
    provider's encrypted reasoning, which it cannot read)."""
    if not value.startswith(_SEAL):
        return None
    try:
        return base64.b64decode(value[len(_SEAL):], validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _content(m: Fields) -> str:
    return text_parts(m.raw("content", required=True), m.where("content"), texts=_TEXT,
                      not_text=_NOT_TEXT)


def _input_items(f: Fields) -> list:
    """`input` as a list of items (a string is one user message)."""
    value = f.raw("input", required=True)
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("input: expected a string or a non-empty array of items", "input")
    return value


def _conversation(f: Fields) -> str | None:
    """`conversation`: the id of the conversation this response continues, or None."""
    if not f.has("conversation"):
        return None
    raw = f.raw("conversation")
    conv = Fields(raw, "conversation").str("id", required=True, non_empty=True) \
        if isinstance(raw, dict) else f.str("conversation", non_empty=True)
    if f.has("previous_response_id"):
        raise bad_request("conversation: cannot be given with previous_response_id (each names "
                          "the turns before this one)", "conversation")
    return conv


def check_items(items: list, where: str) -> None:
    """Items as `input` holds them, each checked (a 400 names the first wrong field)."""
    out: list[dict] = []
    for i, raw in enumerate(items):
        _item(out, Fields(raw, join(where, i)))


def _messages(f: Fields, history: list, items: list, history_from: str) -> list[dict]:
    """The chat messages: `instructions`, the turns before this one (`history`, items as
    `input` holds them, from `history_from`), then this request's `items`."""
    out: list[dict] = []
    instructions = f.str("instructions")
    if instructions:
        out.append({"role": "system", "content": instructions})
    for where, turn in ((history_from, history), ("input", items)):
        for i, raw in enumerate(turn):
            _item(out, Fields(raw, join(where, i)))
    out = [m for m in out if not _bare_reasoning(m)]  # reasoning that no answer followed
    if not any(msg["role"] != "system" for msg in out):
        raise bad_request("input: needs at least one message besides instructions", "input")
    return out


def _item(out: list[dict], m: Fields) -> None:
    """One input item onto the messages: a message, or a function call (onto the assistant
    message before it, where it follows one) or its output (a tool message)."""
    kind = m.str("type", default="message")
    last = out[-1] if out else None
    if kind == "message":
        role = m.str("role", required=True, choices=ROLES)
        if role == "assistant" and last is not None and _bare_reasoning(last):
            last["content"] = _content(m)  # the answer its reasoning came before
            return
        out.append({"role": "system" if role == "developer" else role, "content": _content(m)})
    elif kind == "function_call":
        call = {"type": "function", "id": m.str("call_id", required=True, non_empty=True),
                "function": {"name": m.str("name", required=True, non_empty=True),
                             "arguments": tool_arguments(m.str("arguments", required=True))}}
        if last is not None and last["role"] == "assistant":  # its text, then its calls
            last.setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "reasoning":  # held for the assistant message that follows it
        text = "".join(Fields(p, join(m.where("content"), j)).str("text", default="")
                       for j, p in enumerate(m.list("content") or []))
        sealed = m.str("encrypted_content")
        if not text and sealed is not None:  # sent back without its text: ours, or unread
            text = unseal(sealed) or ""
        out.append({"role": "assistant", "content": "", "reasoning_content": text})
    elif kind == "function_call_output":
        text = text_parts(m.raw("output", required=True), m.where("output"),
                          texts=_TEXT, not_text=_NOT_TEXT)
        out.append({"role": "tool", "content": text,
                    "tool_call_id": m.str("call_id", required=True, non_empty=True)})
    else:
        raise bad_request(f"{m.where('type')}: item type {kind!r} is not supported here "
                          f"(expected 'message', 'reasoning', 'function_call' or "
                          f"'function_call_output')",
                          m.where("type"))


def _bare_reasoning(msg: dict) -> bool:
    """An assistant message made of a `reasoning` item alone, so far."""
    return ("reasoning_content" in msg and not msg["content"]
            and not msg.get("tool_calls"))


def _tools(f: Fields) -> tuple[list[dict], str, tuple, list[dict]]:
    """The tools (as the chat template reads them), the tool choice, (name, compiled schema
    where strict) per tool, and the tools as the response repeats them."""
    tools, schemas, echo = [], [], []
    for j, raw in enumerate(f.list("tools") or []):
        t = Fields(raw, join("tools", j))
        kind = t.str("type", required=True)
        if kind != "function":  # (Codex sends web_search unless its config says not to)
            hint = (' (Codex: set web_search = "disabled" in its config.toml)'
                    if kind.startswith("web_search") else "")
            raise bad_request(f"tools[{j}].type: built-in tool {kind!r} is not available here; "
                              f"only function tools are{hint}", f"tools[{j}].type")
        name = t.str("name", required=True, non_empty=True)
        params = t.obj_at("parameters")
        schema = params.obj if params is not None else {"type": "object", "properties": {}}
        node = None
        if t.has("strict"):  # asked for: a schema it cannot hold to is a 400
            if t.bool("strict"):
                node = schema_node(schema, t.where("parameters"))
        else:  # the API's default is strict; where the schema is outside the subset, the
            try:  # tool is not, and the response's tools say so
                node = compile_request_schema(schema)
            except SchemaError:
                node = None
        strict = node is not None
        schemas.append((name, node))
        description = t.str("description", default="")
        tools.append({"type": "function", "function": {
            "name": name, "description": description, "parameters": schema}})
        echo.append({"type": "function", "name": name, "description": description,
                     "parameters": schema, "strict": strict})
    return tools, parse_tool_choice(f, tools, nested=False), tuple(schemas), echo


def _format(f: Fields) -> tuple[bool, Node | None, dict]:
    """`text.format`: (constrained, the compiled schema or None, the format as echoed)."""
    text = f.obj_at("text")
    fmt = text.obj_at("format") if text is not None else None
    if fmt is None:
        return False, None, {"type": "text"}
    kind = fmt.str("type", required=True, choices=("text", "json_object", "json_schema"))
    if kind != "json_schema":
        return kind == "json_object", None, {"type": kind}
    name = fmt.str("name", required=True, non_empty=True)
    schema = fmt.obj_at("schema", required=True)
    strict = fmt.bool("strict")  # without it, as on the chat route (`_json_format`)
    return True, schema_node(schema.obj, schema.path, loose=not strict), {
        "type": "json_schema", "name": name, "schema": schema.obj, "strict": strict}


def _refuse_unsupported(f: Fields) -> dict:
    """The fields checked and not acted on, refused where acting on them was asked for; the
    settings the response repeats (`reasoning`, `truncation`, `user`: as sent, as OpenAI's
    response has them)."""
    check_includes(f.list("include") or [])
    if f.bool("background"):
        raise bad_request("background: responses run in the request here", "background")
    if f.has("prompt"):  # a template kept on OpenAI's side: its text is not here to use
        raise bad_request("prompt: stored prompt templates are not available here; send "
                          "their text as instructions and input", "prompt")
    reasoning = f.obj_at("reasoning")
    effort = summary = None
    if reasoning is not None:  # the effort switches the template's thinking (`thinking_vars`)
        effort = reasoning.str("effort", choices=EFFORTS)
        summary = reasoning.str("summary")
    truncation = f.str("truncation", choices=("auto", "disabled"))  # none changes the output
    f.str("service_tier")
    return {"reasoning": {"effort": effort, "summary": summary},
            "truncation": truncation or "disabled", "user": f.str("user")}


def parse_responses(f: Fields, state) -> ResponsesRequest:
    state.check_model(f.str("model", required=True))
    settings = _refuse_unsupported(f)
    previous = f.str("previous_response_id", non_empty=True)
    conv = _conversation(f)
    store = f.bool("store", default=True)
    history = (state.responses.history(previous) if previous is not None else
               state.conversations.history(conv) if conv is not None else [])
    items = _input_items(f)
    messages = _messages(f, history, items,
                         "conversation" if conv is not None else "previous_response_id")
    tools, choice, schemas, tools_echo = _tools(f)
    json_object, json_schema, fmt = _format(f)
    max_tokens = f.int("max_output_tokens", minimum=1)
    temperature = f.number("temperature", default=1.0, minimum=0.0, maximum=2.0)
    top_p = f.number("top_p", default=1.0, minimum=1e-9, maximum=1.0)
    # log-probabilities: asked for by the include entry, or by a top_logprobs count
    top = f.int("top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    include = f.list("include") or []  # each entry one of INCLUDES (`_refuse_unsupported`)
    logprobs = (top or 0) if LOGPROBS in include or top else None
    parallel = f.bool("parallel_tool_calls", default=True)
    effort = settings["reasoning"]["effort"]
    chat = ChatInput(messages=tuple(messages), tools=tuple(tools), tool_choice=choice,
                     tool_schemas=schemas, template_vars=thinking_vars(effort),
                     max_tokens=max_tokens, temperature=temperature,
                     top_p=top_p, json_object=json_object, json_schema=json_schema,
                     logprobs=logprobs, parallel_tool_calls=parallel)
    tool_choice: Any = (choice if choice in ("auto", "none", "required")
                        else {"type": "function", "name": choice})
    metadata = check_metadata(f.raw("metadata"))  # echoed, so held to the API's rules
    echo = {"instructions": f.str("instructions"), "max_output_tokens": max_tokens,
            "temperature": temperature, "top_p": top_p, "tool_choice": tool_choice,
            "tools": tools_echo, "text": {"format": fmt},
            "metadata": metadata,
            "parallel_tool_calls": parallel,
            "top_logprobs": top or 0, "previous_response_id": previous, "store": store,
            "conversation": None if conv is None else {"id": conv}, **settings}
    return ResponsesRequest(chat=chat, stream=f.bool("stream"), echo=echo,
                            input_items=items, seal_reasoning=SEALED in include)
