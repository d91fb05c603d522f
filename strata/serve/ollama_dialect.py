"""The Ollama API, for the tools and UIs written against a local Ollama: `POST /api/chat`,
`POST /api/generate`, `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`
(`strata.serve.ollama_request` reads the bodies), and `POST /api/pull` of the served model; the
model store's other verbs are a 400 saying why.

Streaming is on unless the body says `"stream": false`, as in Ollama: one JSON object per line
(`application/x-ndjson`), each with `model`, `created_at` and `done`; chat lines carry a
`message` (`content` pieces; a tool call as `tool_calls` with its arguments as an object),
generate lines a `response` piece. A tool call is Ollama's `{"id": "call_...", "function":
{"index", "name", "arguments"}}` (a tool message answers it by `tool_call_id`). The last line is
`done: true` with `done_reason` (`stop`, or `length` where `num_predict` or the context ran out)
and the counts and nanosecond durations Ollama reports (`prompt_eval_count` the prompt's tokens;
`load_duration` 0: the model is loaded at start-up); a templated generate's last line also has
Ollama's `context` (the prompt's token ids and the answer's, to send back for a short memory).
Where the request asked for `logprobs`, each line has its tokens' (`token`, `logprob`, `bytes`,
`top_logprobs`). A request without messages (or an empty generate prompt) is Ollama's load
request: one `done_reason: "load"` object (`"unload"` where `keep_alive` is 0, as Ollama answers
it; the model stays loaded here, as it always does). A failure mid-stream is an
`{"error": ...}` line; errors before it are `{"error": ...}` bodies with the HTTP status.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime, timezone
from typing import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from strata import __version__
from strata.serve.chat import prepare_chat
from strata.serve.errors import ApiError, bad_request
from strata.serve.fields import Fields
from strata.serve.generation import Generation, Prepared, fit_max_tokens
from strata.serve.job import FinishEvent, PromptEvent, Sampling
from strata.serve.logprobs import chat_content
from strata.serve.ollama_request import OllamaRequest, check_model, parse_chat, parse_generate
from strata.serve.reasoning import Thinking
from strata.serve.sse import SSE_HEADERS, unless_disconnected
from strata.serve.state import ServerState
from strata.serve.tools import ToolCall

NDJSON = "application/x-ndjson"


def error_body(err: ApiError) -> dict:
    return {"error": err.message}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


class _Clock:
    """The request's start, its prompt's end and its last token: Ollama's durations."""

    def __init__(self):
        self.start = self.prompt = time.perf_counter_ns()

    def stats(self, finish: FinishEvent) -> dict:
        end = time.perf_counter_ns()
        return {"done_reason": "length" if finish.reason == "length" else "stop",
                "total_duration": end - self.start, "load_duration": 0,
                "prompt_eval_count": finish.n_prompt,
                "prompt_eval_duration": self.prompt - self.start,
                "eval_count": finish.n_completion, "eval_duration": end - self.prompt}


def _call(call: ToolCall, index: int) -> dict:
    """Ollama's tool call: its id, and its place among the answer's calls as `index`."""
    return {"id": call.id, "function": {"index": index, "name": call.name,
                                        "arguments": call.arguments}}


def _piece(chat: bool, item: str | ToolCall | Thinking, index: int = 0) -> dict:
    """One line's payload: a chat message (text, reasoning or a tool call, the answer's
    `index`th) or a generate response (text or reasoning)."""
    if isinstance(item, Thinking):
        if not chat:
            return {"response": "", "thinking": item.text}
        return {"message": {"role": "assistant", "content": "", "thinking": item.text}}
    if not chat:
        return {"response": item}
    if isinstance(item, ToolCall):
        return {"message": {"role": "assistant", "content": "",
                            "tool_calls": [_call(item, index)]}}
    return {"message": {"role": "assistant", "content": item}}


def _loaded(req: OllamaRequest, chat: bool) -> JSONResponse:
    body = {"model": req.model, "created_at": _now(), "done": True,
            "done_reason": "unload" if req.unload else "load"}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return JSONResponse(body)


def _prepared(state: ServerState, req: OllamaRequest) -> Prepared:
    """The chat through the template, or a raw prompt as given, or with a suffix the model's
    fill-in-the-middle prompt (tokenizing runs off the loop);
    a generate's `context` before the templated prompt (its BOS once, at the start)."""
    if req.chat is not None:
        prepared = prepare_chat(state.model, req.chat, limit=state.max_tokens_limit)
        if not req.context:
            return prepared
        bos = getattr(getattr(state.model, "tokenizer", None), "bos_id", None)
        rest = prepared.prompt[1:] if bos is not None and prepared.prompt[:1] == (bos,) \
            else prepared.prompt
        prompt = req.context + rest
        n = fit_max_tokens(len(prompt), req.max_tokens, max_context=state.model.max_context,
                           limit=state.max_tokens_limit, param="context")
        return dataclasses.replace(prepared, prompt=prompt, sampling=dataclasses.replace(
            prepared.sampling, max_tokens=n))
    prompt = (state.model.encode_prompt(req.raw_prompt) if req.suffix is None else
              state.model.encode_fim(req.raw_prompt, req.suffix, "suffix"))
    n = fit_max_tokens(len(prompt), req.max_tokens, max_context=state.model.max_context,
                       limit=state.max_tokens_limit, param="prompt")
    return Prepared(prompt=tuple(prompt), sampling=Sampling(max_tokens=n, **req.sampling),
                    requested_max_tokens=req.max_tokens)


async def _run(request: Request, state: ServerState, req: OllamaRequest,
               chat: bool) -> Response:
    prepared = await run_in_threadpool(_prepared, state, req)
    gen = Generation(state.worker, prepared, id_prefix="call_")
    clock = _Clock()

    def line(**fields) -> dict:
        if req.logprobs:  # the tokens since the last line's (none: the key left out)
            taken = gen.take_logprobs()
            if taken:
                fields["logprobs"] = chat_content(state.model, taken)
        return {"model": req.model, "created_at": _now(), **fields}

    async def context(answer: str) -> dict:
        """A templated generate's `context`: the prompt's ids and the answer's (re-encoded,
        as Ollama tokenizes prompt and answer); nothing elsewhere."""
        if req.context is None:
            return {}
        ids = await run_in_threadpool(state.model.encode, answer)
        return {"context": [*prepared.prompt, *ids]}

    async def items() -> AsyncIterator[str | ToolCall | Thinking]:
        async for item in gen.items(prompt=True):
            if isinstance(item, PromptEvent):
                clock.prompt = time.perf_counter_ns()
            elif item != "":
                yield item

    if req.stream:
        async def lines() -> AsyncIterator[bytes]:
            try:
                text, n_calls = [], 0
                async for item in items():
                    yield _ndjson(line(**_piece(chat, item, n_calls), done=False))
                    if isinstance(item, ToolCall):
                        n_calls += 1
                    elif isinstance(item, str):
                        text.append(item)
                if gen.finish.reason == "error":
                    yield _ndjson({"error": f"generation failed: {gen.finish.error}"})
                    return
                last = line(**_piece(chat, ""), done=True, **clock.stats(gen.finish),
                            **await context("".join(text)))
                yield _ndjson(last)
            finally:
                gen.cancel()

        return StreamingResponse(lines(), media_type=NDJSON,
                                 headers={**SSE_HEADERS, **prepared.headers})

    async def collect() -> tuple[str, list[ToolCall]]:
        text, calls = [], []
        async for item in items():
            if isinstance(item, ToolCall):
                calls.append(item)
            elif not isinstance(item, Thinking):  # kept by the generation: `reasoning`
                text.append(item)
        return "".join(text), calls

    text, calls = await unless_disconnected(request, collect(), gen.cancel)
    if gen.finish.reason == "error":
        raise ApiError(500, f"generation failed: {gen.finish.error}")
    if chat:
        message = {"role": "assistant", "content": text}
        if gen.reasoning is not None:
            message["thinking"] = gen.reasoning
        if calls:
            message["tool_calls"] = [_call(c, i) for i, c in enumerate(calls)]
        payload = {"message": message}
    else:
        payload = {"response": text}
        if gen.reasoning is not None:
            payload["thinking"] = gen.reasoning
    return JSONResponse(line(**payload, done=True, **clock.stats(gen.finish),
                             **await context(text)), headers=prepared.headers)


def _ndjson(body: dict) -> bytes:
    return (json.dumps(body, ensure_ascii=False) + "\n").encode()


async def chat(request: Request, state: ServerState, body: dict) -> Response:
    req = parse_chat(Fields(body), state)
    if req.chat is None:
        return _loaded(req, chat=True)
    return await _run(request, state, req, chat=True)


async def generate(request: Request, state: ServerState, body: dict) -> Response:
    req = parse_generate(Fields(body), state)
    if req.chat is None and req.raw_prompt is None:
        return _loaded(req, chat=False)
    return await _run(request, state, req, chat=False)


def parameter_size(n: int) -> str:
    """A parameter count as Ollama writes it: "30.5B", "567.0M" ("" where unknown)."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n) if n else ""


def _details(state: ServerState) -> dict:
    s = state.plan_summary
    return {"parent_model": "", "format": "gguf", "family": s.get("arch", ""),
            "families": [s.get("arch", "")],
            "parameter_size": parameter_size(s.get("n_params", 0)),
            "quantization_level": s.get("quantization", "")}


def _model_entry(name: str, state: ServerState) -> dict:
    return {"name": name, "model": name, "modified_at": _rfc3339(state.created),
            "size": state.plan_summary.get("weights_bytes", 0), "digest": "",
            "details": _details(state)}


async def tags(request: Request, state: ServerState) -> Response:
    """`GET /api/tags`: the served model and its aliases."""
    names = (state.model.name, *state.model.aliases)
    return JSONResponse({"models": [_model_entry(n, state) for n in names]})


async def ps(request: Request, state: ServerState) -> Response:
    """`GET /api/ps`: the loaded model (always: it stays loaded while the server runs)."""
    entry = {**_model_entry(state.model.name, state), "expires_at": "0001-01-01T00:00:00Z",
             "size_vram": sum(r.n_bytes for d in await run_in_threadpool(state.devices)
                              if d.device.startswith("cuda") for r in d.regions),
             "context_length": state.model.max_context}
    return JSONResponse({"models": [entry]})


async def show(request: Request, state: ServerState, body: dict) -> Response:
    """`POST /api/show`: the model's template, details and context length."""
    check_model(Fields(body), state)
    arch = state.plan_summary.get("arch", "")
    template = getattr(getattr(state.model, "template", None), "source", "")
    # "thinking" where the reasoning comes apart from the answer (Ollama's `thinking` field),
    # which clients read to offer the `think` switch
    # "insert" where the vocabulary has fill-in-the-middle tokens (a generate's `suffix`)
    capabilities = (["completion"] + (["tools"] if state.model.tool_calls_parsed else [])
                    + (["insert"] if state.model.fim else [])
                    + (["thinking"] if getattr(state.model, "splits_thinking", False) else []))
    return JSONResponse({
        "modelfile": "", "parameters": "", "template": template, "details": _details(state),
        # the file's keys, its context length the one this server runs (clients size their
        # prompts by `<arch>.context_length`; GitHub Copilot names the model by
        # `general.basename`)
        "model_info": {**state.plan_summary.get("model_info", {}), "general.architecture": arch,
                       f"{arch}.context_length": state.model.max_context},
        "capabilities": capabilities, "modified_at": _rfc3339(state.created)})


# The Ollama release whose API this one answers as (logprobs came in 0.12.11). Clients gate on
# `/api/version` (GitHub Copilot's Ollama provider refuses a server below 0.6.4), so it says
# this, not strata's own version, which goes beside it.
OLLAMA_API_VERSION = "0.12.11"


async def version(request: Request, state: ServerState) -> Response:
    return JSONResponse({"version": OLLAMA_API_VERSION, "strata": __version__})


def _one_file(state: ServerState, what: str) -> ApiError:
    served = ", ".join(repr(n) for n in (state.model.name, *state.model.aliases))
    return bad_request(f"strata serves the one model file it was started with ({served}) and "
                       f"does not {what}: fetch the GGUF yourself and start `strata serve -m "
                       f"FILE` (--model-name and --alias name it)", "model")


async def pull(request: Request, state: ServerState, body: dict) -> Response:
    """`POST /api/pull`: the served model is here already (Ollama's `success`, one line or
    one object); any other is a 400: models are not downloaded."""
    f = Fields(body)
    f.bool("insecure")
    stream = f.bool("stream", default=True)
    try:
        check_model(f, state)
    except ApiError:
        raise _one_file(state, "download models") from None
    if stream:
        return Response(_ndjson({"status": "success"}), media_type=NDJSON)
    return JSONResponse({"status": "success"})


# Ollama's model store, which this server does not have: route -> what a 400 says it does not do
STORE_VERBS = {"/api/push": "upload models", "/api/create": "create models",
               "/api/copy": "copy models (--alias gives the served model more names)",
               "/api/delete": "delete model files", "/api/blobs/{digest}": "store blobs"}


def refuse(what: str):
    """The handler of one of STORE_VERBS' routes: a 400 saying this server does not `what`."""
    async def handler(request: Request, state: ServerState) -> Response:
        raise _one_file(state, what)
    return handler
