"""Server-sent events: framing, and a streaming response that cancels its job when the client
goes away (Starlette cancels the body's task on disconnect; `finally` turns that into
`Generation.cancel()`, which the worker reads before its next decode step). A stream with
nothing to send for KEEP_ALIVE_S (a prompt waiting in the queue or running, a tool call held
until it is whole) sends an SSE comment, which every SSE reader skips, so clients that give up
on a silent connection (Claude Code's stream watchdog, proxies) keep waiting."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

T = TypeVar("T")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
KEEP_ALIVE_S = 10.0  # read at each wait, so a test can shorten it
KEEP_ALIVE = b": keep-alive\n\n"


def sse(data: Any, event: str | None = None) -> bytes:
    """One event: an optional `event:` line, one `data:` line (JSON unless already a str)."""
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False,
                                                         separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {body}\n\n".encode()


def event_stream(chunks: AsyncIterator[bytes], cancel: Callable[[], None],
                 headers: dict[str, str]) -> StreamingResponse:
    """A `text/event-stream` response over `chunks`; `cancel` runs however the stream ends."""

    async def guarded() -> AsyncIterator[bytes]:
        it = chunks.__aiter__()
        pending: asyncio.Future | None = None  # the next chunk, awaited across keep-alives
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(it.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=KEEP_ALIVE_S)
                if not done:
                    yield KEEP_ALIVE
                    continue
                step, pending = pending, None
                try:
                    chunk = step.result()
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            if pending is not None:
                pending.cancel()
            cancel()

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={**SSE_HEADERS, **headers})


class ClientGone(Exception):
    """The client disconnected before the response was ready."""


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T],
                              cancel: Callable[[], None]) -> T:
    """Await `work`; if the client disconnects first, `cancel()` and raise `ClientGone`."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        cancel()
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    cancel()
    with contextlib.suppress(Exception):
        await task  # the worker answers a cancel within one step; let the job wind down
    raise ClientGone()
