"""Every HTTP response names its request: `x-request-id` (OpenAI's header, which its SDK
reports as `_request_id`) and `request-id` (Anthropic's, likewise), the same id in both.

A client (or a proxy in front) that sent its own `x-request-id` gets it back, so one id
follows a request through its logs and ours; one that is not a plain token (letters, digits,
`.`, `_`, `-`, up to 128) is replaced, never echoed into a header. Otherwise the id is
`req_` and 24 random hex digits. A pure ASGI wrapper: streamed responses pass through
untouched but for their first message's headers.
"""

from __future__ import annotations

import re
import secrets

HEADERS = (b"x-request-id", b"request-id")
_TOKEN = re.compile(rb"[A-Za-z0-9._-]{1,128}")


def request_id(scope: dict) -> bytes:
    """The client's own id where it sent a plain one, else a fresh `req_...`."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and _TOKEN.fullmatch(value):
            return value
    return b"req_" + secrets.token_hex(12).encode()


class RequestIds:
    """ASGI middleware: the request's id on every HTTP response (see the module doc)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k not in HEADERS]
                message = {**message, "headers": headers + [(h, rid) for h in HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_id)
