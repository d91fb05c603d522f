"""The Anthropic dialect: `POST /v1/messages` (and `/v1/messages/count_tokens`).

Responses are `message` objects with `text` and `tool_use` content blocks; a stream is the
event sequence of the official API: `message_start`, `ping`, then per block
`content_block_start` / `content_block_delta`* / `content_block_stop`, then `message_delta`
(stop reason and output tokens) and `message_stop`. Errors are
``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import secrets
import time
from typing import AsyncIterator, Mapping

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.serve.anthropic_request import parse_messages
from strata.serve.chat import chat_text, prepare_chat
from strata.serve.errors import ApiError, ContextExceeded, bad_request, error_types
from strata.serve.fields import Fields
from strata.serve.generation import Generation
from strata.serve.job import FinishEvent, PromptEvent
from strata.serve.reasoning import Thinking, signature
from strata.serve.sse import event_stream, sse, unless_disconnected
from strata.serve.state import ServerState
from strata.serve.tools import ToolCall


def error_body(err: ApiError) -> dict:
    message = err.message
    if isinstance(err, ContextExceeded):  # Anthropic's words, which its clients look for
        message = (f"prompt is too long: {err.n_prompt} tokens > {err.max_context} maximum "
                   f"({message})")
    return {"type": "error", "error": {"type": error_types(err.status)[1], "message": message}}


def model_object(name: str, state: ServerState) -> dict:
    """A model in the Models API's shape (context sizes in tokens: the served context)."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.created))
    ctx = state.model.max_context
    return {"type": "model", "id": name, "display_name": name, "created_at": created,
            "max_input_tokens": ctx, "max_tokens": ctx}


def models_list(state: ServerState, query: Mapping[str, str] | None = None) -> dict:
    """The Models API's list: the served model and its aliases, paged by the query's `limit`
    (1-1000, 20 by default), `after_id` or `before_id` (an id of the list; not both)."""
    q = query or {}
    names = [state.model.name, *state.model.aliases]
    limit = _query_int(q, "limit", 20, 1, 1000)
    after, before = q.get("after_id"), q.get("before_id")
    if after is not None and before is not None:
        raise bad_request("after_id and before_id cannot be given together", "before_id")
    for key, value in (("after_id", after), ("before_id", before)):
        if value is not None and value not in names:
            raise bad_request(f"{key}: {value!r} is not a model of this list "
                              f"({', '.join(map(repr, names))})", key)
    if after is not None:
        rest = names[names.index(after) + 1:]
        page, more = rest[:limit], len(rest) > limit
    elif before is not None:
        rest = names[:names.index(before)]
        page, more = rest[-limit:], len(rest) > limit
    else:
        page, more = names[:limit], len(names) > limit
    data = [model_object(n, state) for n in page]
    return {"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def _query_int(q: Mapping[str, str], key: str, default: int, lo: int, hi: int) -> int:
    raw = q.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{key}: expected an integer, got {raw!r}", key) from None
    if not lo <= value <= hi:
        raise bad_request(f"{key}: must be {lo} to {hi}, got {value}", key)
    return value


def stop_reason(finish: FinishEvent, calls: list[ToolCall]) -> str:
    if finish.reason == "length":
        return "max_tokens"
    if finish.stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if calls else "end_turn"


def usage(finish: FinishEvent) -> dict:
    """Anthropic's split of the prompt: `input_tokens` computed, `cache_read_input_tokens`
    found in the KV a finished request left (a conversation's earlier turns)."""
    return {"input_tokens": finish.n_prompt - finish.n_cached,
            "output_tokens": finish.n_completion, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": finish.n_cached}


def _tool_use(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}


async def messages(request: Request, state: ServerState, body: dict) -> Response:
    req = parse_messages(Fields(body), state)
    # rendering and tokenizing a long prompt is CPU work: keep it off the event loop
    prepared = await run_in_threadpool(prepare_chat, state.model, req.chat,
                                       limit=state.max_tokens_limit)
    gen = Generation(state.worker, prepared, id_prefix="toolu_")
    mid = f"msg_{secrets.token_hex(12)}"
    if req.stream:
        return event_stream(_events(gen, mid, state.model.name), gen.cancel, prepared.headers)
    content: list[dict] = []
    async def collect() -> None:
        async for item in gen.items():
            if isinstance(item, ToolCall):
                content.append(_tool_use(item))
                continue
            kind, text = _block_of(item)
            if content and content[-1]["type"] == kind:
                content[-1][kind] += text
            else:
                content.append({**_empty_block(kind), kind: text})
    await unless_disconnected(request, collect(), gen.cancel)
    if gen.finish.reason == "error":
        raise ApiError(500, f"generation failed: {gen.finish.error}")
    for block in content:
        if block["type"] == "thinking":
            block["signature"] = signature(block["thinking"])
    return JSONResponse({
        "id": mid, "type": "message", "role": "assistant", "model": state.model.name,
        "content": content, "stop_reason": stop_reason(gen.finish, gen.tool_calls),
        "stop_sequence": gen.finish.stop_sequence, "usage": usage(gen.finish),
    }, headers=prepared.headers)


def _block_of(item: str | Thinking) -> tuple[str, str]:
    """(block type, the text) of a text or reasoning piece; the block's text field is named as
    its type (`text`, `thinking`)."""
    if isinstance(item, Thinking):
        return "thinking", item.text
    return "text", item


def _empty_block(kind: str) -> dict:
    # a thinking block's signature is set once its text is whole (`reasoning.signature`)
    return {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {
        "type": "text", "text": ""}


def _start(mid: str, model: str, n_prompt: int, n_cached: int) -> bytes:
    return sse({"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": n_prompt - n_cached, "output_tokens": 0,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": n_cached}}},
        "message_start") + sse({"type": "ping"}, "ping")


async def _events(gen: Generation, mid: str, model: str) -> AsyncIterator[bytes]:
    # message_start waits for the prompt to run, so its usage splits the prompt as the final
    # counts do (the tokens a finished request's KV held are known only then); the response's
    # headers went out at once. A job that ends before its prompt runs starts with the whole.
    started = False
    index, open_kind = -1, None  # the text or thinking block open, if one is
    thought = []  # the open thinking block's text so far (its signature ends it)

    def stop() -> bytes:
        """The open block's end: a thinking block's signature_delta first, as Anthropic's."""
        out = b""
        if open_kind == "thinking":
            out = sse({"type": "content_block_delta", "index": index, "delta": {
                "type": "signature_delta", "signature": signature("".join(thought))}},
                "content_block_delta")
            thought.clear()
        return out + sse({"type": "content_block_stop", "index": index}, "content_block_stop")

    async for item in gen.items(prompt=True):
        if not started:
            n_cached = item.n_cached if isinstance(item, PromptEvent) else 0
            yield _start(mid, model, len(gen.prepared.prompt), n_cached)
            started = True
        if isinstance(item, PromptEvent):
            continue
        if isinstance(item, ToolCall):
            if open_kind is not None:
                yield stop()
                open_kind = None
            index += 1
            start = {**_tool_use(item), "input": {}}
            yield sse({"type": "content_block_start", "index": index, "content_block": start},
                      "content_block_start")
            yield sse({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": item.arguments_json}},
                      "content_block_delta")
            yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
            continue
        kind, text = _block_of(item)
        if open_kind != kind:
            if open_kind is not None:
                yield stop()
            index += 1
            open_kind = kind
            yield sse({"type": "content_block_start", "index": index,
                       "content_block": _empty_block(kind)}, "content_block_start")
        if kind == "thinking":
            thought.append(text)
        yield sse({"type": "content_block_delta", "index": index,
                   "delta": {"type": f"{kind}_delta", kind: text}}, "content_block_delta")
    if not started:
        yield _start(mid, model, len(gen.prepared.prompt), 0)
    if gen.finish.reason == "error":
        yield sse(error_body(ApiError(500, f"generation failed: {gen.finish.error}")), "error")
        return
    if open_kind is not None:
        yield stop()
    yield sse({"type": "message_delta",
               "delta": {"stop_reason": stop_reason(gen.finish, gen.tool_calls),
                         "stop_sequence": gen.finish.stop_sequence},
               "usage": usage(gen.finish)}, "message_delta")  # the final counts
    yield sse({"type": "message_stop"}, "message_stop")


async def count_tokens(request: Request, state: ServerState, body: dict) -> Response:
    """`/v1/messages/count_tokens`: the prompt's length through the chat template."""
    req = parse_messages(Fields(body), state, counting=True)

    def count() -> int:  # the prompt `messages` would run, prefill and forced call included
        text, prefix = chat_text(state.model, req.chat)
        return len(state.model.encode(text + prefix))

    return JSONResponse({"input_tokens": await run_in_threadpool(count)})
