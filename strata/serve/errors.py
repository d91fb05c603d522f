"""`ApiError`: a request the server refuses, with the HTTP status and the field at fault.

Each dialect renders it in its own JSON error shape (see `openai_dialect.error_body` and
`anthropic_dialect.error_body`); the route table maps every failure to one of these, so a client
never sees an HTML page or a dropped connection.
"""

from __future__ import annotations


class ApiError(Exception):
    """A refusal: `status` (4xx or 5xx), a message naming what is wrong, and the field (`param`,
    a dotted path such as ``messages[2].content[0]``) where the request holds one."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        if not 400 <= status <= 599:
            raise ValueError(f"an API error needs a 4xx or 5xx status, got {status}")
        self.status = status
        self.message = message
        self.param = param
        self.headers = dict(headers or {})


def bad_request(message: str, param: str | None = None) -> ApiError:
    """400: the request is malformed or names something this server cannot do."""
    return ApiError(400, message, param=param)


def not_found(message: str, param: str | None = None) -> ApiError:
    """404: an unknown route or an unknown model."""
    return ApiError(404, message, param=param)


# status -> (OpenAI error type, Anthropic error type); both APIs name their errors by status.
ERROR_TYPES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("not_found_error", "not_found_error"),
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
