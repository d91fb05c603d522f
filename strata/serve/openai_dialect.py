"""The OpenAI dialect: `/v1/models`, `/v1/chat/completions`, `/v1/completions`.

Requests are validated field by field (a 400 names the field); responses and stream chunks have
the shapes of the official API: `chat.completion` / `chat.completion.chunk` / `text_completion`
objects, SSE `data:` lines ending with `data: [DONE]`, a usage chunk with empty `choices` when
`stream_options.include_usage` is set. `n` choices (`strata.serve.choices`) each carry their
`index`; streamed, their chunks interleave as the choices produce them. Where a request asks
for logprobs, each chunk carries those of the tokens whose text it sends
(`strata.serve.logprobs`); the last chunk, any left.
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
from strata.serve.choices import Choices
from strata.serve.errors import ApiError, error_types
from strata.serve.fields import Fields
from strata.serve.generation import Generation, Prepared, fit_max_tokens
from strata.serve.job import FinishEvent
from strata.serve.logprobs import CompletionLogprobs, chat_logprobs
from strata.serve.openai_request import parse_chat, parse_completion
from strata.serve.reasoning import Thinking
from strata.serve.sse import event_stream, sse, unless_disconnected
from strata.serve.state import ServerState
from strata.serve.tools import ToolCall

FINGERPRINT = f"strata-{__version__}"


def error_body(err: ApiError) -> dict:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    kind = error_types(err.status)[0]
    code = err.code or {401: "invalid_api_key",
                        404: "model_not_found" if err.param == "model" else None,
                        413: "request_too_large"}.get(err.status)
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": code}}


def finish_reason(finish: FinishEvent, calls: list[ToolCall]) -> str:
    if finish.reason == "length":
        return "length"
    return "tool_calls" if calls else "stop"


def _tool_call_json(call: ToolCall, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments_json}}
    return out if index is None else {"index": index, **out}


def _raise_failed(choices: Choices) -> None:
    failed = choices.failed
    if failed is not None:
        raise ApiError(500, f"generation failed: {failed.error}")


def _stream_error(failed: FinishEvent) -> bytes:
    return sse(error_body(ApiError(500, f"generation failed: {failed.error}")))


def model_object(name: str, state: ServerState) -> dict:
    # max_model_len: the context this server runs, as vLLM lists it (clients size their
    # prompts by it rather than guess)
    return {"id": name, "object": "model", "created": state.created, "owned_by": "strata",
            "max_model_len": state.model.max_context}


def models_list(state: ServerState) -> dict:
    names = (state.model.name, *state.model.aliases)
    return {"object": "list", "data": [model_object(n, state) for n in names]}


def _entries(gen: Generation) -> list | None:
    """The log-probability entries not yet sent, or None where the request asked for none."""
    return None if gen.prepared.sampling.logprobs is None else gen.take_logprobs()


async def chat_completions(request: Request, state: ServerState, body: dict) -> Response:
    req = parse_chat(Fields(body), state)
    # rendering and tokenizing a long prompt is CPU work: keep it off the event loop
    prepared = await run_in_threadpool(prepare_chat, state.model, req.chat,
                                       limit=state.max_tokens_limit)
    choices = Choices(state.worker, prepared, req.n, id_prefix="call_")
    rid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
    if req.stream:
        chunks = _chat_chunks(choices, rid, created, state.model, req.include_usage)
        return event_stream(chunks, choices.cancel, prepared.headers)
    results = await unless_disconnected(request, choices.collect(), choices.cancel)
    _raise_failed(choices)
    out = []
    for i, ((text, calls), gen) in enumerate(zip(results, choices.gens)):
        message: dict[str, Any] = {"role": "assistant",
                                   "content": text or (None if calls else ""), "refusal": None}
        if gen.reasoning is not None:  # a thinking model's <think> block, apart
            message.update(_reasoning(gen.reasoning))
        if calls:
            message["tool_calls"] = [_tool_call_json(c) for c in calls]
        out.append({"index": i, "message": message,
                    "logprobs": chat_logprobs(state.model, _entries(gen)),
                    "finish_reason": finish_reason(gen.finish, calls)})
    return JSONResponse({
        "id": rid, "object": "chat.completion", "created": created, "model": state.model.name,
        "system_fingerprint": FINGERPRINT, "choices": out, "usage": choices.usage(),
    }, headers=prepared.headers)


def _reasoning(text: str) -> dict[str, str]:
    """The reasoning under both names clients read: `reasoning_content` (llama.cpp's, DeepSeek's,
    vLLM's first) and `reasoning` (vLLM's since it renamed the field)."""
    return {"reasoning_content": text, "reasoning": text}


async def _chat_chunks(choices: Choices, rid: str, created: int, served,
                       include_usage: bool) -> AsyncIterator[bytes]:
    """Each choice's role chunk, then its content, tool-call and finish chunks (each with its
    `index`) as the choices produce them; a failed choice ends the stream with the error."""
    def chunk(i: int, delta: dict, finish: str | None = None, entries: list | None = None
              ) -> bytes:
        if finish is not None and not entries:
            entries = None  # nothing left to send with the finish reason
        body = {"id": rid, "object": "chat.completion.chunk", "created": created,
                "model": served.name, "system_fingerprint": FINGERPRINT,
                "choices": [{"index": i, "delta": delta,
                             "logprobs": chat_logprobs(served, entries),
                             "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return sse(body)

    for i in range(len(choices)):
        yield chunk(i, {"role": "assistant", "content": ""})
    n_calls = [0] * len(choices)
    async for i, item, entries in choices.items():
        gen = choices.gens[i]
        if item is None:  # choice i has finished
            if gen.finish.reason == "error":
                yield _stream_error(gen.finish)
                return
            yield chunk(i, {}, finish_reason(gen.finish, gen.tool_calls), entries)
        elif isinstance(item, ToolCall):
            yield chunk(i, {"tool_calls": [_tool_call_json(item, n_calls[i])]}, None, entries)
            n_calls[i] += 1
        elif isinstance(item, Thinking):
            yield chunk(i, _reasoning(item.text), None, entries)
        else:
            yield chunk(i, {"content": item}, None, entries)
    if include_usage:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                   "model": served.name, "system_fingerprint": FINGERPRINT, "choices": [],
                   "usage": choices.usage()})
    yield sse("[DONE]")


async def completions(request: Request, state: ServerState, body: dict) -> Response:
    req = await run_in_threadpool(parse_completion, Fields(body), state)  # tokenizes
    batch = len(req.prompts) > 1
    prepared = []  # one a prompt; its choices follow each other (`Choices`)
    for i, prompt in enumerate(req.prompts):
        max_tokens = fit_max_tokens(len(prompt), req.max_tokens,
                                    max_context=state.model.max_context,
                                    limit=state.max_tokens_limit,
                                    param=f"prompt[{i}]" if batch else "prompt")
        prepared.append(Prepared(prompt=prompt, sampling=req.sampling(max_tokens),
                                 requested_max_tokens=req.max_tokens))
    choices = Choices(state.worker, prepared, req.n)
    rid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
    # each choice's echo: its prompt's text
    echo = ([state.model.decode(list(p)) for p in req.prompts for _ in range(req.n)]
            if req.echo else [""] * len(choices))
    headers = prepared[0].headers
    if req.stream:
        chunks = _completion_chunks(choices, rid, created, state.model, req.include_usage, echo)
        return event_stream(chunks, choices.cancel, headers)
    results = await unless_disconnected(request, choices.collect(), choices.cancel)
    _raise_failed(choices)
    out = [{"text": echo[i] + text, "index": i,
            "logprobs": _completion_logprobs(gen, CompletionLogprobs(state.model)),
            "finish_reason": finish_reason(gen.finish, [])}
           for i, ((text, _), gen) in enumerate(zip(results, choices.gens))]
    return JSONResponse({
        "id": rid, "object": "text_completion", "created": created, "model": state.model.name,
        "system_fingerprint": FINGERPRINT, "choices": out, "usage": choices.usage(),
    }, headers=headers)


def _completion_logprobs(gen: Generation, out: CompletionLogprobs) -> dict | None:
    entries = _entries(gen)
    return None if entries is None else out.take(entries)


async def _completion_chunks(choices: Choices, rid: str, created: int, served,
                             include_usage: bool, echo: list[str]) -> AsyncIterator[bytes]:
    offsets = [CompletionLogprobs(served) for _ in choices.gens]

    def chunk(i: int, text: str, finish: str | None = None, entries: list | None = None
              ) -> bytes:
        body = {"id": rid, "object": "text_completion", "created": created,
                "model": served.name, "system_fingerprint": FINGERPRINT,
                "choices": [{"text": text, "index": i,
                             "logprobs": None if entries is None else offsets[i].take(entries),
                             "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return sse(body)

    for i, text in enumerate(echo):  # (never with logprobs)
        if text:
            yield chunk(i, text)
    async for i, item, entries in choices.items():
        gen = choices.gens[i]
        if item is None:
            if gen.finish.reason == "error":
                yield _stream_error(gen.finish)
                return
            yield chunk(i, "", finish_reason(gen.finish, []), entries)
        else:
            yield chunk(i, item, None, entries)
    if include_usage:
        yield sse({"id": rid, "object": "text_completion", "created": created,
                   "model": served.name, "system_fingerprint": FINGERPRINT, "choices": [],
                   "usage": choices.usage()})
    yield sse("[DONE]")
