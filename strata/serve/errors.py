"""`ApiError`: a request the server refuses, with the HTTP status and the field at fault.

Each dialect renders it in its own JSON error shape (see `openai_dialect.error_body` and
`anthropic_dialect.error_body`); the route table maps every failure to one of these, so a client
never sees an HTML page or a dropped connection.
"""

from __future__ import annotations


class ApiError(Exception):
    """A refusal: `status` (4xx or 5xx), a message naming what is wrong, and the field (`param`,
    a dotted path such as ``messages[2].content[0]``) where the request holds one; `code`: the
    OpenAI error code a client acts on (`context_length_exceeded`: agents compact and retry)."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None, code: str | None = None):
        super().__init__(message)
        if not 400 <= status <= 599:
            raise ValueError(f"an API error needs a 4xx or 5xx status, got {status}")
        self.status = status
        self.message = message
        self.param = param
        self.headers = dict(headers or {})
        self.code = code  # OpenAI's machine-readable `code` where it has one for this refusal


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a prompt past the context


class ContextExceeded(ApiError):
    """400: a prompt that leaves no room in the context. Each dialect words it as its API does,
    since clients recognise the overflow by those words and codes (agents then compact their
    history and retry): OpenAI's code `context_length_exceeded` and "maximum context length",
    Anthropic's "prompt is too long: N tokens > M maximum"."""

    def __init__(self, n_prompt: int, max_context: int, param: str):
        over = n_prompt - max_context + 1
        super().__init__(400, f"this model's maximum context length is {max_context} tokens "
                              f"here, but the prompt is {n_prompt} tokens: shorten it by at "
                              f"least {over} token{'' if over == 1 else 's'}",
                         param=param, code=CONTEXT_LENGTH_EXCEEDED)
        self.n_prompt, self.max_context = n_prompt, max_context


def bad_request(message: str, param: str | None = None) -> ApiError:
    """400: the request is malformed or names something this server cannot do."""
    return ApiError(400, message, param=param)


def not_found(message: str, param: str | None = None) -> ApiError:
    """404: an unknown route or an unknown model."""
    return ApiError(404, message, param=param)


# status -> (OpenAI error type, Anthropic error type); both APIs name their errors by status.
ERROR_TYPES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request_error"),
    # OpenAI's API names a bad key and an unknown model invalid requests (with the codes
    # invalid_api_key and model_not_found); Anthropic's has types of their own
    401: ("invalid_request_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("invalid_request_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "invalid_request_error"),
    422: ("invalid_request_error", "invalid_request_error"),
    429: ("rate_limit_error", "rate_limit_error"),
    503: ("server_error", "overloaded_error"),
}


def error_types(status: int) -> tuple[str, str]:
    """The (OpenAI, Anthropic) error type names for an HTTP status."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    if status >= 500:
        return ("server_error", "api_error")
    return ("invalid_request_error", "invalid_request_error")
