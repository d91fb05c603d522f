"""The OpenAI dialect: `/v1/models`, `/v1/chat/completions`, `/v1/completions`.

Requests are validated field by field (a 400 names the field); responses and stream chunks have
the shapes of the official API: `chat.completion` / `chat.completion.chunk` / `text_completion`
objects, SSE `data:` lines ending with `data: [DONE]`, a usage chunk with empty `choices` when
`stream_options.include_usage` is set.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata import __version__
from strata.serve.chat import prepare_chat
from strata.serve.errors import ApiError, error_types
from strata.serve.fields import Fields
from strata.serve.generation import Generation, Prepared, fit_max_tokens
from strata.serve.job import FinishEvent
from strata.serve.openai_request import parse_chat, parse_completion
from strata.serve.sse import event_stream, sse, unless_disconnected
from strata.serve.state import ServerState
from strata.serve.tools import ToolCall

FINGERPRINT = f"strata-{__version__}"


def error_body(err: ApiError) -> dict:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    kind = error_types(err.status)[0]
    code = {401: "invalid_api_key", 404: "model_not_found" if err.param == "model" else None,
            413: "request_too_large"}.get(err.status)
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": code}}


def finish_reason(finish: FinishEvent, calls: list[ToolCall]) -> str:
    if finish.reason == "length":
        return "length"
    return "tool_calls" if calls else "stop"


def usage(finish: FinishEvent) -> dict:
    return {"prompt_tokens": finish.n_prompt, "completion_tokens": finish.n_completion,
            "total_tokens": finish.n_prompt + finish.n_completion,
            # the prompt tokens a finished request's KV held (a chat's earlier turns)
            "prompt_tokens_details": {"cached_tokens": finish.n_cached}}


def _tool_call_json(call: ToolCall, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments_json}}
    return out if index is None else {"index": index, **out}


def _raise_failed(finish: FinishEvent) -> None:
    if finish.reason == "error":
        raise ApiError(500, f"generation failed: {finish.error}")


async def list_models(request: Request, state: ServerState) -> Response:
    names = (state.model.name, *state.model.aliases)
    data = [{"id": n, "object": "model", "created": state.created, "owned_by": "strata"}
            for n in names]
    return JSONResponse({"object": "list", "data": data})


async def chat_completions(request: Request, state: ServerState, body: dict) -> Response:
    req = parse_chat(Fields(body), state)
    # rendering and tokenizing a long prompt is CPU work: keep it off the event loop
    prepared = await run_in_threadpool(prepare_chat, state.model, req.chat,
                                       limit=state.max_tokens_limit)
    gen = Generation(state.worker, prepared, id_prefix="call_")
    rid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
    if req.stream:
        chunks = _chat_chunks(gen, rid, created, state.model.name, req.include_usage)
        return event_stream(chunks, gen.cancel, prepared.headers)
    text, calls = await unless_disconnected(request, gen.collect(), gen.cancel)
    _raise_failed(gen.finish)
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else ""),
                               "refusal": None}
    if calls:
        message["tool_calls"] = [_tool_call_json(c) for c in calls]
    return JSONResponse({
        "id": rid, "object": "chat.completion", "created": created, "model": state.model.name,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason(gen.finish, calls)}],
        "usage": usage(gen.finish),
    }, headers=prepared.headers)


async def _chat_chunks(gen: Generation, rid: str, created: int, model: str,
                       include_usage: bool) -> AsyncIterator[bytes]:
    def chunk(delta: dict, finish: str | None = None) -> bytes:
        body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return sse(body)

    yield chunk({"role": "assistant", "content": ""})
    n_calls = 0
    async for item in gen.items():
        if isinstance(item, ToolCall):
            yield chunk({"tool_calls": [_tool_call_json(item, n_calls)]})
            n_calls += 1
        else:
            yield chunk({"content": item})
    if gen.finish.reason == "error":
        yield sse(error_body(ApiError(500, f"generation failed: {gen.finish.error}")))
        return
    yield chunk({}, finish_reason(gen.finish, gen.tool_calls))
    if include_usage:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                   "model": model, "system_fingerprint": FINGERPRINT, "choices": [],
                   "usage": usage(gen.finish)})
    yield sse("[DONE]")


async def completions(request: Request, state: ServerState, body: dict) -> Response:
    req = await run_in_threadpool(parse_completion, Fields(body), state)  # tokenizes
    max_tokens = fit_max_tokens(len(req.prompt), req.max_tokens,
                                max_context=state.model.max_context,
                                limit=state.max_tokens_limit, param="prompt")
    prepared = Prepared(prompt=req.prompt, sampling=req.sampling(max_tokens),
                        requested_max_tokens=req.max_tokens)
    gen = Generation(state.worker, prepared)
    rid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
    echo = state.model.decode(list(req.prompt)) if req.echo else ""
    if req.stream:
        chunks = _completion_chunks(gen, rid, created, state.model.name, req.include_usage, echo)
        return event_stream(chunks, gen.cancel, prepared.headers)
    text, _ = await unless_disconnected(request, gen.collect(), gen.cancel)
    _raise_failed(gen.finish)
    return JSONResponse({
        "id": rid, "object": "text_completion", "created": created, "model": state.model.name,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"text": echo + text, "index": 0, "logprobs": None,
                     "finish_reason": finish_reason(gen.finish, [])}],
        "usage": usage(gen.finish),
    }, headers=prepared.headers)


async def _completion_chunks(gen: Generation, rid: str, created: int, model: str,
                             include_usage: bool, echo: str) -> AsyncIterator[bytes]:
    def chunk(text: str, finish: str | None = None, *, choices: bool = True) -> bytes:
        body = {"id": rid, "object": "text_completion", "created": created, "model": model,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"text": text, "index": 0, "logprobs": None,
                             "finish_reason": finish}] if choices else []}
        if include_usage:
            body["usage"] = None if choices else usage(gen.finish)
        return sse(body)

    if echo:
        yield chunk(echo)
    async for item in gen.items():
        yield chunk(item)
    if gen.finish.reason == "error":
        yield sse(error_body(ApiError(500, f"generation failed: {gen.finish.error}")))
        return
    yield chunk("", finish_reason(gen.finish, []))
    if include_usage:
        yield chunk("", choices=False)
    yield sse("[DONE]")
