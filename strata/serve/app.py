"""The HTTP application: one route table, one error wrapper, auth, bounded bodies.

Every route goes through `_endpoint`, which checks the API key, reads the body under the size
limit, parses JSON, runs the handler, and turns any failure into the route's dialect error
shape: an `ApiError` keeps its 4xx/5xx, anything else is logged and becomes a 500. Handlers
never touch the engine: they queue jobs for the one worker thread.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
from pathlib import Path
from typing import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from strata.serve import (anthropic_dialect, conversations_dialect, infill, ollama_dialect,
                          openai_dialect, responses_dialect, tokens_api)
from strata.serve.errors import ApiError, bad_request
from strata.serve.fields import parse_json
from strata.serve.openapi import build_schema
from strata.serve.request_ids import RequestIds
from strata.serve.sse import ClientGone
from strata.serve.state import ServerState

log = logging.getLogger("strata.serve")
_C, _CI = "/v1/conversations/{conversation_id}", "/v1/conversations/{conversation_id}/items"
_CONVERSATION_ROUTES = (  # path, method, handler, whether it reads a JSON body
    ("/v1/conversations", "POST", conversations_dialect.create, "optional"),
    (_C, "GET", conversations_dialect.retrieve, False),
    (_C, "POST", conversations_dialect.update, True),
    (_C, "DELETE", conversations_dialect.delete, False),
    (_CI, "GET", conversations_dialect.list_items, False),
    (_CI, "POST", conversations_dialect.add_items, True),
    (_CI + "/{item_id}", "GET", conversations_dialect.get_item, False),
    (_CI + "/{item_id}", "DELETE", conversations_dialect.delete_item, False),
)
STATIC_DIR = Path(__file__).parent / "static"
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# pages served from this machine (any port) may call the server from a browser; others only
# where named (`--cors-origin`): a web page elsewhere must not reach a local model unasked
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


def _dialect_of(request: Request) -> str:
    """The Anthropic routes, the Ollama ones (`/api/`), and the models routes where an
    Anthropic client asks (its SDK sends `anthropic-version`); else OpenAI."""
    path = request.url.path
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/models") and "anthropic-version" in request.headers:
        return "anthropic"
    return "openai"


ANTHROPIC_OVERLOADED = 529


def error_response(request: Request, err: ApiError) -> JSONResponse:
    """The error in the shape the route's clients parse."""
    dialect = _dialect_of(request)
    render = {"anthropic": anthropic_dialect.error_body, "ollama": ollama_dialect.error_body,
              "openai": openai_dialect.error_body}[dialect]
    headers = dict(err.headers)
    if err.status == 401:
        headers.setdefault("www-authenticate", "Bearer")
    status = err.status
    if dialect == "anthropic" and status == 503:
        # Anthropic's API answers an overloaded server with 529 overloaded_error, which its
        # clients (Claude Code, the SDKs) retry and name as such
        status = ANTHROPIC_OVERLOADED
    return JSONResponse(render(err), status_code=status, headers=headers)


def check_auth(request: Request, api_key: str | None) -> None:
    """`Authorization: Bearer KEY` or `x-api-key: KEY`, compared in constant time. Either one
    holding the key will do: Claude Code sends both where its user set both of its variables
    (ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN), only one of them meant for this server."""
    if api_key is None:
        return
    given = []
    if "x-api-key" in request.headers:
        given.append(request.headers["x-api-key"])
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        given.append(auth[7:].strip())
    if not given:
        raise ApiError(401, "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
    # every one compared (no early exit): the time taken does not say which was close
    ok = [hmac.compare_digest(g.encode(), api_key.encode()) for g in given]
    if not any(ok):
        raise ApiError(401, "invalid API key")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with a 413 as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {int(declared):,} bytes; the limit is "
                            f"{limit:,} (--max-body-bytes)")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise ApiError(413, f"the request body is over the limit of {limit:,} bytes "
                                f"(--max-body-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


Handler = Callable[..., Awaitable[Response]]


class Server:
    """Builds the Starlette app around a `ServerState`."""

    def __init__(self, state: ServerState, *, api_key: str | None, max_body_bytes: int,
                 cors_origins: tuple[str, ...] = ()):
        if max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {max_body_bytes}")
        self.state = state
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.cors_origins = tuple(cors_origins)

    def _endpoint(self, handler: Handler, *, body: bool | str, auth: bool = True,
                  route: str | None = None):
        async def endpoint(request: Request) -> Response:
            path = request.url.path
            try:
                if auth:
                    check_auth(request, self.api_key)
                if body:  # "optional": an empty body is {}
                    raw = await read_body(request, self.max_body_bytes)
                    data = {} if body == "optional" and not raw.strip() else parse_json(raw)
                    response = await handler(request, self.state, data)
                else:
                    response = await handler(request, self.state)
            except ApiError as e:
                response = error_response(request, e)
            except ClientGone:
                response = Response(status_code=499)  # nobody is left to read it
            except Exception as e:
                log.exception("unhandled error on %s %s", request.method, path)
                response = error_response(request, ApiError(
                    500, f"internal server error ({type(e).__name__}: {e}); see the server log"))
            # counted by route, not path: an id in the path would make a series per request
            self.state.metrics.record_request(route or path, response.status_code)
            return response
        return endpoint

    def routes(self) -> list:
        e = self._endpoint
        return [
            Route("/v1/models", e(list_models, body=False), methods=["GET"]),
            Route("/v1/models/{model:path}",
                  e(retrieve_model, body=False, route="/v1/models/{model}"), methods=["GET"]),
            Route("/v1/chat/completions", e(openai_dialect.chat_completions, body=True),
                  methods=["POST"]),
            Route("/v1/completions", e(openai_dialect.completions, body=True), methods=["POST"]),
            Route("/v1/responses", e(responses_dialect.responses, body=True), methods=["POST"]),
            Route("/v1/responses/{response_id}", e(responses_dialect.retrieve, body=False,
                                                   route="/v1/responses/{response_id}"),
                  methods=["GET"]),
            Route("/v1/responses/{response_id}/input_items",
                  e(responses_dialect.input_items, body=False,
                    route="/v1/responses/{response_id}/input_items"), methods=["GET"]),
            Route("/v1/responses/{response_id}", e(responses_dialect.delete, body=False,
                                                   route="/v1/responses/{response_id}"),
                  methods=["DELETE"]),
            *(Route(path, e(handler, body=body, route=path), methods=[method])
              for path, method, handler, body in _CONVERSATION_ROUTES),
            *(Route(path, e(embeddings, body=False), methods=["POST"])
              for path in ("/v1/embeddings", "/api/embed", "/api/embeddings")),
            # the OpenAI routes without their /v1, as llama.cpp's server also serves them
            # (clients given a base URL without /v1 call these)
            Route("/chat/completions", e(openai_dialect.chat_completions, body=True,
                                         route="/v1/chat/completions"), methods=["POST"]),
            Route("/completions", e(openai_dialect.completions, body=True,
                                    route="/v1/completions"), methods=["POST"]),
            Route("/models", e(list_models, body=False, route="/v1/models"), methods=["GET"]),
            Route("/v1/messages", e(anthropic_dialect.messages, body=True), methods=["POST"]),
            Route("/v1/messages/count_tokens", e(anthropic_dialect.count_tokens, body=True),
                  methods=["POST"]),
            Route("/api/chat", e(ollama_dialect.chat, body=True), methods=["POST"]),
            Route("/api/generate", e(ollama_dialect.generate, body=True), methods=["POST"]),
            Route("/api/show", e(ollama_dialect.show, body=True), methods=["POST"]),
            Route("/api/tags", e(ollama_dialect.tags, body=False), methods=["GET"]),
            Route("/api/ps", e(ollama_dialect.ps, body=False), methods=["GET"]),
            Route("/api/version", e(ollama_dialect.version, body=False, auth=False),
                  methods=["GET"]),
            Route("/api/pull", e(ollama_dialect.pull, body=True), methods=["POST"]),
            *(Route(path, e(ollama_dialect.refuse(what), body=False, route=path),
                    methods={"/api/delete": ["DELETE"],
                             "/api/blobs/{digest}": ["HEAD", "POST"]}.get(path, ["POST"]))
              for path, what in ollama_dialect.STORE_VERBS.items()),
            Route("/infill", e(infill.infill, body=True), methods=["POST"]),
            Route("/tokenize", e(tokens_api.tokenize, body=True), methods=["POST"]),
            Route("/detokenize", e(tokens_api.detokenize, body=True), methods=["POST"]),
            Route("/health", e(health, body=False, auth=False), methods=["GET"]),
            Route("/metrics", e(metrics, body=False), methods=["GET"]),
            Route("/monitor.json", e(monitor, body=False), methods=["GET"]),
            Route("/openapi.json", e(openapi, body=False, auth=False), methods=["GET"]),
            Route("/", index, methods=["GET"]),
            Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
        ]

    def app(self) -> Starlette:
        async def http_error(request: Request, exc: HTTPException) -> Response:
            path = request.url.path
            if exc.status_code == 404:
                msg = f"no route {path!r}; see /openapi.json for the routes"
            elif exc.status_code == 405:
                msg = f"{request.method} is not allowed on {path}"
            else:
                msg = str(exc.detail)
            response = error_response(request, ApiError(exc.status_code, msg))
            self.state.metrics.record_request("(unrouted)", response.status_code)
            return response

        # browsers ask before a cross-origin POST (an OPTIONS preflight): answered here,
        # before auth, as the API key travels only with the real request
        cors = Middleware(CORSMiddleware, allow_origins=list(self.cors_origins),
                          allow_origin_regex=LOCAL_ORIGINS, allow_methods=["GET", "POST", "DELETE"],
                          allow_headers=["*"], expose_headers=["x-request-id", "request-id"],
                          max_age=600)
        return Starlette(routes=self.routes(), exception_handlers={HTTPException: http_error},
                         middleware=[Middleware(RequestIds), cors])


async def list_models(request: Request, state: ServerState) -> Response:
    """The served model and its aliases, in the shape of the SDK asking (`_dialect_of`)."""
    if _dialect_of(request) == "anthropic":  # its list is paged
        return JSONResponse(anthropic_dialect.models_list(state, request.query_params))
    return JSONResponse(openai_dialect.models_list(state))


async def retrieve_model(request: Request, state: ServerState) -> Response:
    """`GET /v1/models/{model}`: the served model (or an alias of it), else a 404 naming them."""
    name = request.path_params["model"]
    state.check_model(name)
    dialect = anthropic_dialect if _dialect_of(request) == "anthropic" else openai_dialect
    return JSONResponse(dialect.model_object(name, state))


async def embeddings(request: Request, state: ServerState) -> Response:
    """`/v1/embeddings`, Ollama's `/api/embed` and `/api/embeddings`: a 400 saying why (a
    generative model's hidden states are not an embedding model's), rather than a bare 404."""
    raise bad_request(f"embeddings are not available: {state.model.name!r} is a generative "
                      f"model and strata serves no embedding model; point the client's "
                      f"embedding setting at an embedding model's server", "model")


async def index(request: Request) -> Response:
    """The monitor page for a browser (it asks for text/html); for a program, Ollama's answer
    at its root, which Ollama clients and desktop tools probe to find a server."""
    if "text/html" in request.headers.get("accept", ""):
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")
    return PlainTextResponse("Ollama is running")


async def health(request: Request, state: ServerState) -> Response:
    alive = state.worker.alive
    body = {"status": "ok" if alive else "engine worker stopped", "model": state.model.name,
            **state.metrics.snapshot()}
    return JSONResponse(body, status_code=200 if alive else 503)


async def metrics(request: Request, state: ServerState) -> Response:
    return PlainTextResponse(state.metrics.render(state.devices()), media_type=PROMETHEUS_TYPE)


async def monitor(request: Request, state: ServerState) -> Response:
    """Everything the monitor page draws, in one JSON document."""
    return JSONResponse({
        "model": state.model.name, "max_context": state.model.max_context,
        "plan": state.plan_summary, "metrics": state.metrics.snapshot(),
        "devices": [dataclasses.asdict(d) for d in state.devices()],
    })


async def openapi(request: Request, state: ServerState) -> Response:
    return JSONResponse(build_schema(state.model.name, (state.model.name, *state.model.aliases)))
