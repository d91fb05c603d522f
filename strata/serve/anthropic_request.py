"""Reading Anthropic Messages request bodies into a `ChatInput`.

Content blocks map onto template messages: text joins into the message's content, `tool_use`
becomes an assistant tool call, each `tool_result` a `tool` message, `thinking` the assistant's
`reasoning_content`. A block this model cannot take — an image or document, inside a
`tool_result` or not — is a 400 naming the block's path; nothing is dropped silently.

A final assistant turn is a prefill, as in Anthropic's API: the prompt is the conversation
before it with the generation prompt, then its text (trailing blank space dropped), which the
model continues; the response holds only what it writes after it.

Structured outputs as Anthropic's API has them: `output_config.format` (or the earlier top-level
`output_format`) `{"type": "json_schema", "schema": {...}}` holds the answer's text to one JSON
document the schema allows, and a tool with `"strict": true` has its calls held to its
`input_schema` (`strata.engine.json_schema`; a keyword the output could not be held to is a 400
naming where it is, never ignored). `tool_choice.disable_parallel_tool_use` ends the answer
at its first complete `tool_use` (at most one).

`thinking` `{"type": "enabled"}` or `{"type": "disabled"}` reaches the chat template as
`enable_thinking` (Qwen3's switch); `budget_tokens` bounds the reasoning: where the block is
still open at its last token, that token is the closing tag (`Sampling.reasoning_budget`, where
the tags are one token each, as Qwen3's are), and the answer follows. A request without
`thinking` runs with it off, as Anthropic's API does; `"adaptive"` leaves it to the template. A
`system` message among the messages (Claude Code's reminders) is a system turn where it stands;
a `redacted_thinking` block (reasoning Anthropic's models encrypted for themselves) is dropped.

Checked as Anthropic's API checks them, each a 400 naming the field: every message but a final
assistant turn has content (not `""` or `[]`, nor whitespace alone), no text block is empty, and `metadata` is an
object whose `user_id` is a string of at most 256 characters or null (nothing here reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.engine.json_schema import Node
from strata.serve.chat import ChatInput, schema_node
from strata.serve.errors import bad_request
from strata.serve.fields import PART_JOIN, Fields, a_or_an, join

MAX_STOPS = 16
MAX_USER_ID = 256  # characters: Anthropic's bound on metadata.user_id
_NOT_TEXT = ("image", "document", "search_result", "container_upload")


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    chat: ChatInput
    stream: bool


def _refuse_block(kind: str, path: str) -> None:
    if kind in _NOT_TEXT:
        raise bad_request(f"{path} is {a_or_an(kind)} block, but this model takes text only: "
                          f"remove the block or serve a model that accepts it", path)
    raise bad_request(f"{join(path, 'type')}: content block type {kind!r} is not supported here",
                      join(path, "type"))


def _text_blocks(value: Any, path: str) -> str:
    """A string, or an array of text blocks joined (`fields.PART_JOIN`); any other block is
    refused by path."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{path}: expected a string or an array of content blocks", path)
    texts = []
    for j, raw in enumerate(value):
        b = Fields(raw, join(path, j))
        kind = b.str("type", required=True)
        if kind != "text":
            _refuse_block(kind, join(path, j))
        texts.append(b.str("text", required=True))
    return PART_JOIN.join(texts)


def _tool_result(b: Fields) -> dict:
    content = b.raw("content")
    text = "" if content is None else _text_blocks(content, b.where("content"))
    if b.bool("is_error"):
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "content": text, "tool_call_id": b.str("tool_use_id", required=True)}


def _user(m: Fields, out: list[dict]) -> None:
    content = m.raw("content", required=True)
    if isinstance(content, str):
        out.append({"role": "user", "content": content})
        return
    if not isinstance(content, list):
        raise bad_request(f"{m.where('content')}: expected a string or an array of content "
                          f"blocks", m.where("content"))
    texts: list[str] = []
    for j, raw in enumerate(content):
        b = Fields(raw, join(m.where("content"), j))
        kind = b.str("type", required=True)
        if kind == "text":
            texts.append(b.str("text", required=True, non_empty=True))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": PART_JOIN.join(texts)})
                texts = []
            out.append(_tool_result(b))
        else:
            _refuse_block(kind, b.path)
    if texts:  # (an empty content was refused: `_check_content`)
        out.append({"role": "user", "content": PART_JOIN.join(texts)})


def _assistant(m: Fields, out: list[dict]) -> None:
    content = m.raw("content", required=True)
    if isinstance(content, str):
        out.append({"role": "assistant", "content": content})
        return
    if not isinstance(content, list):
        raise bad_request(f"{m.where('content')}: expected a string or an array of content "
                          f"blocks", m.where("content"))
    texts, calls, thinking = [], [], []
    for j, raw in enumerate(content):
        b = Fields(raw, join(m.where("content"), j))
        kind = b.str("type", required=True)
        if kind == "text":
            texts.append(b.str("text", required=True, non_empty=True))
        elif kind == "tool_use":
            args = b.obj_at("input", required=True)
            calls.append({"type": "function", "id": b.str("id", required=True),
                          "function": {"name": b.str("name", required=True, non_empty=True),
                                       "arguments": args.obj}})
        elif kind == "thinking":
            thinking.append(b.str("thinking", required=True))
        elif kind == "redacted_thinking":
            # reasoning Anthropic's models encrypted for themselves (a conversation carried
            # over from them): no other model can read it, so it is dropped, as another
            # provider's encrypted reasoning is on the Responses route
            b.str("data", required=True)
        else:
            _refuse_block(kind, b.path)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    out.append(msg)


def _check_content(m: Fields, *, final_assistant: bool) -> None:
    """Anthropic's rules: every message has content but a final assistant turn (a prefill, which
    may be empty: the answer then starts fresh), and its text is not whitespace alone ("text
    content blocks must contain non-whitespace text"; a prefill's trailing whitespace is dropped
    here instead). Empty text blocks are refused where read."""
    content = m.raw("content")
    if final_assistant:
        return
    if content == "" or content == []:
        raise bad_request(f"{m.where('content')}: must not be empty (only a final assistant "
                          f"turn may be)", m.where("content"))
    blocks = []  # (where, text); another type of content is named where it is read
    if isinstance(content, str):
        blocks = [(m.where("content"), content)]
    elif isinstance(content, list):
        blocks = [(join(join(m.where("content"), j), "text"), b.get("text"))
                  for j, b in enumerate(content)
                  if isinstance(b, dict) and b.get("type") == "text"]
    for where, text in blocks:
        if isinstance(text, str) and text and not text.strip():
            raise bad_request(f"{where}: must contain non-whitespace text", where)


def _metadata(f: Fields) -> None:
    """`metadata`: checked, not read ({"user_id": a string or null}; Anthropic uses it to
    detect abuse). A wrong one is a 400 there, so it is here, rather than passed over."""
    m = f.obj_at("metadata")
    user = m.str("user_id") if m is not None else None
    if user is not None and len(user) > MAX_USER_ID:
        raise bad_request(f"metadata.user_id: at most {MAX_USER_ID} characters, got "
                          f"{len(user)}", "metadata.user_id")


def _prefill(messages: list[dict], path: str) -> str:
    """The final assistant turn, taken out of `messages` as the answer's start: Anthropic's API
    continues it (a client sends ``{`` to have JSON written) rather than answering after it,
    its trailing blank space dropped as Anthropic drops it. Text only: a tool call needs its
    result in a user turn after it, and thinking cannot be continued as the answer."""
    last = messages.pop()
    if last.get("tool_calls"):
        raise bad_request(f"{path}: the final assistant turn is continued as the answer, so it "
                          f"cannot hold a tool_use block (its tool_result must follow in a user "
                          f"turn)", path)
    if last.get("reasoning_content"):
        raise bad_request(f"{path}: the final assistant turn is continued as the answer's text, "
                          f"so it cannot hold a thinking block", path)
    if not any(m["role"] != "system" for m in messages):
        raise bad_request(f"{path}: the final assistant turn is continued as the answer, so a "
                          f"user turn must come before it", path)
    return last["content"].rstrip()


def _tools(f: Fields) -> tuple[list[dict], str, tuple, bool]:
    """The tools (as the chat template reads them), the tool choice, (name, the input schema
    compiled where the tool is `strict`, else None) per tool, and whether several calls may
    come in one answer (False: `tool_choice.disable_parallel_tool_use`)."""
    tools, schemas = [], []
    for j, raw in enumerate(f.list("tools") or []):
        t = Fields(raw, join("tools", j))
        kind = t.str("type", default="custom")
        if kind != "custom":
            raise bad_request(f"tools[{j}].type: server tool {kind!r} is not available here; "
                              f"only client tools (with input_schema) are", f"tools[{j}].type")
        schema = t.obj_at("input_schema", required=True)
        name = t.str("name", required=True, non_empty=True)
        strict = t.bool("strict")
        schemas.append((name, schema_node(schema.obj, t.where("input_schema")) if strict
                        else None))
        tools.append({"type": "function", "function": {
            "name": name, "description": t.str("description", default=""),
            "parameters": schema.obj}})
    schemas = tuple(schemas)
    c = f.obj_at("tool_choice")
    if c is None:
        return tools, "auto", schemas, True
    kind = c.str("type", required=True, choices=("auto", "any", "tool", "none"))
    parallel = not c.bool("disable_parallel_tool_use")
    if kind in ("any", "tool") and not tools:
        raise bad_request(f"tool_choice: {kind!r} needs at least one tool", "tool_choice")
    if kind == "tool":
        name = c.str("name", required=True)
        if name not in {t["function"]["name"] for t in tools}:
            raise bad_request(f"tool_choice.name: {name!r} is not among the tools",
                              "tool_choice.name")
        return tools, name, schemas, parallel
    return tools, {"any": "required"}.get(kind, kind), schemas, parallel


def _output_format(f: Fields) -> tuple[bool, Node | None]:
    """`output_config.format` (or the older top-level `output_format`, not both):
    {"type": "json_schema", "schema": {...}}. Returns (constrained, the compiled schema)."""
    config = f.obj_at("output_config")
    fmt = config.obj_at("format") if config is not None else None
    if f.has("output_format"):
        if fmt is not None:
            raise bad_request("output_format: give the format once, in output_config.format "
                              "(output_format is its older name)", "output_format")
        fmt = f.obj_at("output_format")
    if fmt is None:
        return False, None
    fmt.str("type", required=True, choices=("json_schema",))
    schema = fmt.obj_at("schema", required=True)
    return True, schema_node(schema.obj, schema.path)


def _stops(f: Fields) -> tuple[str, ...]:
    stops = f.list("stop_sequences") or []
    for j, s in enumerate(stops):
        if not isinstance(s, str) or not s:
            raise bad_request(f"stop_sequences[{j}]: expected a non-empty string",
                              f"stop_sequences[{j}]")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"stop_sequences: at most {MAX_STOPS}, got {len(stops)}",
                          "stop_sequences")
    return tuple(stops)


def parse_messages(f: Fields, state, *, counting: bool = False) -> MessagesRequest:
    """The request as a `ChatInput`; `counting` (count_tokens) makes max_tokens optional."""
    state.check_model(f.str("model", required=True))
    max_tokens = f.int("max_tokens", required=not counting, minimum=1)
    _metadata(f)
    messages: list[dict] = []
    if f.has("system"):
        messages.append({"role": "system", "content": _text_blocks(f.raw("system"), "system")})
    raw = f.list("messages", required=True, non_empty=True)
    role = None
    for i, item in enumerate(raw):
        m = Fields(item, join("messages", i))
        role = m.str("role", required=True, choices=("user", "assistant", "system"))
        _check_content(m, final_assistant=role == "assistant" and i == len(raw) - 1)
        if role == "system":  # a system message mid-conversation (Claude Code's reminders)
            messages.append({"role": "system",
                             "content": _text_blocks(m.raw("content"), m.where("content"))})
            continue
        (_user if role == "user" else _assistant)(m, messages)
    prefill = _prefill(messages, join("messages", len(raw) - 1)) if role == "assistant" else ""
    thinking = f.obj_at("thinking")
    # on or off reaches a template that reads `enable_thinking`; off where the request has no
    # `thinking`, as Anthropic's API has it (a client that did not ask for thinking reads the
    # first block as text), though Qwen3's template thinks unless told not to; "adaptive"
    # leaves it to the template
    switch: tuple = (("enable_thinking", False),)
    budget = None
    if thinking is not None:
        kind = thinking.str("type", required=True, choices=("enabled", "disabled", "adaptive"))
        switch = () if kind == "adaptive" else (("enable_thinking", kind == "enabled"),)
        if kind == "enabled":  # Anthropic's API asks 1,024 or more; any positive count here
            budget = thinking.int("budget_tokens", default=None, minimum=1, maximum=1 << 30)
    tools, choice, tool_schemas, parallel = _tools(f)
    json_object, json_schema = _output_format(f)
    if prefill and json_object:
        where = "output_format" if f.has("output_format") else "output_config.format"
        raise bad_request(f"{where}: a JSON format cannot follow a prefilled answer (the "
                          f"document would start after the final assistant turn's text); "
                          f"send one or the other", where)
    if prefill and tools and choice not in ("auto", "none"):
        raise bad_request("tool_choice: a forced tool call starts the answer, so it cannot "
                          "follow a prefilled one (the final assistant turn); send tool_choice "
                          "{\"type\": \"auto\"} or no prefill", "tool_choice")
    chat = ChatInput(
        messages=tuple(messages), tools=tuple(tools), tool_choice=choice,
        tool_schemas=tool_schemas, json_object=json_object, json_schema=json_schema,
        max_tokens=max_tokens,
        temperature=f.number("temperature", default=1.0, minimum=0.0, maximum=1.0),
        top_p=f.number("top_p", default=1.0, minimum=1e-9, maximum=1.0),
        top_k=f.int("top_k", default=0, minimum=0, maximum=1 << 20), stop=_stops(f),
        template_vars=switch, prefill=prefill, parallel_tool_calls=parallel,
        reasoning_budget=budget)
    return MessagesRequest(chat=chat, stream=f.bool("stream"))
