"""The OpenAI Responses API: `POST /v1/responses` (`strata.serve.responses_request` reads it).

A response object (`"object": "response"`) whose `output` holds the answer's items in order: a
`message` item (one `output_text` part) for each run of text, a `function_call` item for each
tool call. `status` is `completed`, or `incomplete` with `incomplete_details.reason`
`max_output_tokens` where the budget ended it (and then the message or reasoning item it cut,
the last, is `incomplete` too). Usage counts `input_tokens` (with
`input_tokens_details.cached_tokens`, the prompt tokens found in K/V: a finished request's
or a running one's prompt) and
`output_tokens`.

Streamed, the events of the official API, each with its `event:` line and a `sequence_number`:
`response.created`, `response.in_progress`; per message item `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta`*, `response.output_text.done`,
`response.content_part.done`, `response.output_item.done`; per function call
`response.output_item.added`, `response.function_call_arguments.delta`,
`response.function_call_arguments.done`, `response.output_item.done`; then
`response.completed` (or `response.incomplete`) with the whole response, or `response.failed`.
Where the request asked for log-probabilities, each text delta carries its tokens' entries and
each output_text part all of them (the chat route's entries: token, logprob, bytes,
top_logprobs). Errors outside a stream have the OpenAI shape.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any, AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.serve.chat import prepare_chat
from strata.serve.errors import ApiError
from strata.serve.fields import Fields
from strata.serve.generation import Generation
from strata.serve.job import FinishEvent
from strata.serve.logprobs import chat_content
from strata.serve.reasoning import Thinking
from strata.serve.response_store import page
from strata.serve.responses_request import (ResponsesRequest, parse_responses, seal,
                                            with_includes)
from strata.serve.sse import event_stream, sse, unless_disconnected
from strata.serve.state import ServerState
from strata.serve.tools import ToolCall

log = logging.getLogger("strata.serve")


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def usage(finish: FinishEvent) -> dict:
    # cache_write_tokens: a field the API's usage always has (the SDK's types require it);
    # no write is billed apart here, so none is counted
    return {"input_tokens": finish.n_prompt,
            "input_tokens_details": {"cached_tokens": finish.n_cached,
                                     "cache_write_tokens": 0},
            "output_tokens": finish.n_completion,
            "output_tokens_details": {"reasoning_tokens": finish.n_reasoning},
            "total_tokens": finish.n_prompt + finish.n_completion}


class Shell:
    """The response object around its output: its id, settings, status and usage."""

    def __init__(self, req: ResponsesRequest, model: str):
        self.id, self.created = _id("resp"), int(time.time())
        self.req, self.model = req, model

    def body(self, output: list[dict], *, status: str, finish: FinishEvent | None = None,
             error: str | None = None) -> dict:
        incomplete = status == "incomplete"
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": None if error is None else {"code": "server_error", "message": error},
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model, "output": output,
            "reasoning": {"effort": None, "summary": None},
            "truncation": "disabled", "user": None, **self.req.echo,
            "usage": None if finish is None else usage(finish),
        }


def status_of(finish: FinishEvent) -> str:
    return "incomplete" if finish.reason == "length" else "completed"


# the items a budget can end mid-way: the last one of an incomplete response is "incomplete"
# too, as OpenAI's is (a function call is whole, or it stays text)
_CUT_KINDS = ("message", "reasoning")


def message_item(mid: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [_text_part(text)]}


def reasoning_item(rid: str, text: str, status: str = "completed") -> dict:
    """A thinking model's reasoning, as its text (no summary is written)."""
    return {"type": "reasoning", "id": rid, "status": status, "summary": [],
            "content": [] if status == "in_progress" else [
                {"type": "reasoning_text", "text": text}]}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(iid: str, call: ToolCall, status: str = "completed") -> dict:
    return {"type": "function_call", "id": iid, "call_id": call.id, "name": call.name,
            "arguments": "" if status == "in_progress" else call.arguments_json,
            "status": status}


async def responses(request: Request, state: ServerState, body: dict) -> Response:
    req = parse_responses(Fields(body), state)
    # rendering and tokenizing a long prompt is CPU work: keep it off the event loop
    try:
        prepared = await run_in_threadpool(prepare_chat, state.model, req.chat,
                                           limit=state.max_tokens_limit)
    except ApiError as e:  # the chat route's name for the conversation is not this API's
        if e.param != "messages":
            raise
        message = "input: " + e.message.removeprefix("messages: ")
        raise ApiError(e.status, message, param="input", headers=e.headers,
                       code=e.code) from e
    gen = Generation(state.worker, prepared, id_prefix="call_")
    shell = Shell(req, state.model.name)
    entries = _Entries(gen, state.model)
    if req.stream:
        return event_stream(_events(gen, shell, entries, state), gen.cancel, prepared.headers)
    output: list[dict] = []

    async def collect() -> None:
        async for item in gen.items():
            taken = entries.take()
            if isinstance(item, ToolCall):
                output.append(call_item(_id("fc"), item))
                continue
            if isinstance(item, Thinking):
                if not output or output[-1]["type"] != "reasoning":
                    output.append(reasoning_item(_id("rs"), ""))
                output[-1]["content"][0]["text"] += item.text
                continue
            if not output or output[-1]["type"] != "message":
                output.append(message_item(_id("msg"), ""))
            part = output[-1]["content"][0]
            part["text"] += item
            part["logprobs"] += taken

    await unless_disconnected(request, collect(), gen.cancel)
    if gen.finish.reason == "error":
        raise ApiError(500, f"generation failed: {gen.finish.error}")
    for item in output:
        _sealed(req, item)
    status = status_of(gen.finish)
    if status == "incomplete" and output and output[-1]["type"] in _CUT_KINDS:
        output[-1]["status"] = "incomplete"
    body = shell.body(output, status=status, finish=gen.finish)
    _keep(state, req, body)
    return JSONResponse(body, headers=prepared.headers)


def _sealed(req: ResponsesRequest, item: dict) -> None:
    """A finished reasoning item's text sealed into its `encrypted_content`, where the request
    included `reasoning.encrypted_content`."""
    if req.seal_reasoning and item["type"] == "reasoning":
        item["encrypted_content"] = seal(item["content"][0]["text"])


def _keep(state: ServerState, req: ResponsesRequest, body: dict) -> None:
    """A finished response into the store, unless the request said `store: false`; its input
    and output items added to the conversation it continued, if any (a conversation deleted
    meanwhile, or grown past the store, keeps nothing more: the response still goes out)."""
    if req.echo["store"]:
        state.responses.put(body, req.input_items, req.echo["previous_response_id"])
    conv = req.echo["conversation"]
    if conv is not None:
        try:
            state.conversations.add(conv["id"], req.input_items + body["output"],
                                    "conversation")
        except ApiError as e:
            log.warning("response %s: not added to its conversation: %s", body["id"], e)


async def retrieve(request: Request, state: ServerState) -> Response:
    """`GET /v1/responses/{response_id}`: a stored response as it was returned, its output
    items with the query's `include` (`responses_request.with_includes`)."""
    body = state.responses.get(request.path_params["response_id"]).body
    output = with_includes(body["output"], request.query_params)
    return JSONResponse(body if output is body["output"] else {**body, "output": output})


async def input_items(request: Request, state: ServerState) -> Response:
    """`GET /v1/responses/{response_id}/input_items`: a stored response's input items (its own
    request's, not the turns it continued), a page at a time (`response_store.page`), with
    the query's `include` (`responses_request.with_includes`)."""
    stored = state.responses.get(request.path_params["response_id"])
    body = page(stored.inputs, request.query_params, "input item of this response")
    body["data"] = with_includes(body["data"], request.query_params)
    return JSONResponse(body)


async def delete(request: Request, state: ServerState) -> Response:
    """`DELETE /v1/responses/{response_id}`: a stored response forgotten (a response that
    continued it can no longer be continued)."""
    response_id = request.path_params["response_id"]
    state.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


class _Entries:
    """The log-probability entries of the tokens received since the last `take` (the chat
    route's per-token objects), or none where the request asked for none. A function call's
    tokens have none in this API: their entries are taken and dropped with the call."""

    def __init__(self, gen: Generation, model):
        self.gen, self.model = gen, model
        self.wanted = gen.prepared.sampling.logprobs is not None

    def take(self) -> list[dict]:
        return chat_content(self.model, self.gen.take_logprobs()) if self.wanted else []


class _Events:
    """Numbered SSE events of one response."""

    def __init__(self):
        self.n = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return sse(body, kind)


async def _events(gen: Generation, shell: Shell, entries: _Entries,
                  state: ServerState) -> AsyncIterator[bytes]:
    ev = _Events()
    yield ev("response.created", response=shell.body([], status="in_progress"))
    yield ev("response.in_progress", response=shell.body([], status="in_progress"))
    output: list[dict] = []
    open_at: int | None = None  # the output index of the message or reasoning item open

    def close(status: str = "completed") -> list[bytes]:
        item = output[open_at]
        part = item["content"][0]
        if item["type"] == "reasoning":
            out = [ev("response.reasoning_text.done", item_id=item["id"], output_index=open_at,
                      content_index=0, text=part["text"])]
        else:
            out = [ev("response.output_text.done", item_id=item["id"], output_index=open_at,
                      content_index=0, text=part["text"], logprobs=part["logprobs"])]
        out.append(ev("response.content_part.done", item_id=item["id"], output_index=open_at,
                      content_index=0, part=part))
        item["status"] = status
        _sealed(shell.req, item)
        out.append(ev("response.output_item.done", output_index=open_at, item=item))
        return out

    async for item in gen.items():
        taken = entries.take()
        kind = ("function_call" if isinstance(item, ToolCall) else
                "reasoning" if isinstance(item, Thinking) else "message")
        if open_at is not None and output[open_at]["type"] != kind:
            for chunk in close():
                yield chunk
            open_at = None
        if kind == "function_call":
            iid, at = _id("fc"), len(output)
            yield ev("response.output_item.added", output_index=at,
                     item=call_item(iid, item, "in_progress"))
            yield ev("response.function_call_arguments.delta", item_id=iid, output_index=at,
                     delta=item.arguments_json)
            yield ev("response.function_call_arguments.done", item_id=iid, output_index=at,
                     arguments=item.arguments_json)
            output.append(call_item(iid, item))
            yield ev("response.output_item.done", output_index=at, item=output[-1])
            continue
        if open_at is None:
            open_at = len(output)
            if kind == "reasoning":
                iid = _id("rs")
                yield ev("response.output_item.added", output_index=open_at,
                         item=reasoning_item(iid, "", "in_progress"))
                # its text part opened and closed as a message's is (OpenAI's own server
                # does; a client that replays events indexes the part its deltas fill)
                yield ev("response.content_part.added", item_id=iid, output_index=open_at,
                         content_index=0, part={"type": "reasoning_text", "text": ""})
                output.append({**reasoning_item(iid, ""), "status": "in_progress"})
            else:
                iid = _id("msg")
                yield ev("response.output_item.added", output_index=open_at,
                         item=message_item(iid, "", "in_progress"))
                yield ev("response.content_part.added", item_id=iid, output_index=open_at,
                         content_index=0, part=_text_part(""))
                output.append({**message_item(iid, ""), "status": "in_progress"})
        part = output[open_at]["content"][0]
        iid = output[open_at]["id"]
        if kind == "reasoning":  # the API gives reasoning text no log-probabilities
            part["text"] += item.text
            yield ev("response.reasoning_text.delta", item_id=iid, output_index=open_at,
                     content_index=0, delta=item.text)
            continue
        part["text"] += item
        part["logprobs"] += taken
        yield ev("response.output_text.delta", item_id=iid, output_index=open_at,
                 content_index=0, delta=item, logprobs=taken)
    if gen.finish.reason == "error":
        message = f"generation failed: {gen.finish.error}"
        yield ev("response.failed", response=shell.body(output, status="failed",
                                                       finish=gen.finish, error=message))
        return
    status = status_of(gen.finish)
    if open_at is not None:  # the last item: where the budget ended the answer, it ends there
        for chunk in close(status):
            yield chunk
    body = shell.body(output, status=status, finish=gen.finish)
    _keep(state, shell.req, body)
    yield ev(f"response.{status}", response=body)
