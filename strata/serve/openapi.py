"""The server's OpenAPI 3.0 description (`GET /openapi.json`): the routes and the request
bodies they accept, used by clients that read schemas and by the schema fuzz test."""

from __future__ import annotations

from strata import __version__
from strata.serve.openai_request import EFFORTS
from strata.serve.responses_request import INCLUDES

_STR = {"type": "string"}
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"type": "string", "enum": ["text"]}, "text": _STR}}
_STOP = {"oneOf": [_STR, {"type": "array", "items": _STR, "maxItems": 16}], "nullable": True}
_PENALTY = {"type": "number", "minimum": -2, "maximum": 2}
_EXTRA_SAMPLING = {
    "presence_penalty": _PENALTY, "frequency_penalty": _PENALTY,
    # llama.cpp server's extensions
    "top_k": {"type": "integer", "minimum": 0, "maximum": 1 << 20},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "repeat_penalty": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 10},
    "repeat_last_n": {"type": "integer", "minimum": 0, "maximum": 1 << 20},
}
_LOGIT_BIAS = {"type": "object", "additionalProperties": {"type": "number", "minimum": -100,
                                                        "maximum": 100}}
_TOP_LOGPROBS = {"type": "integer", "minimum": 0, "maximum": 20}
_N = {"type": "integer", "minimum": 1, "maximum": 16}
_FUNCTION = {"type": "object", "required": ["name"], "properties": {
    "name": _STR, "description": _STR, "parameters": {"type": "object"},
    "strict": {"type": "boolean"}}}

# OpenAI's metadata (`fields.check_metadata`); Anthropic's holds one optional user_id
_METADATA = {"type": "object", "maxProperties": 16,
             "additionalProperties": {"type": "string", "maxLength": 512}, "nullable": True}
_USER_ID = {"type": "object", "nullable": True, "properties": {
    "user_id": {"type": "string", "maxLength": 256, "nullable": True}}}

_OUTPUT_FORMAT = {"type": "object", "required": ["type", "schema"], "properties": {
    "type": {"type": "string", "enum": ["json_schema"]}, "schema": {"type": "object"}}}


def _sampling(temperature_max: float) -> dict:
    return {
        "max_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": temperature_max},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
    }


def _chat_body(models: list[str]) -> dict:
    message = {"type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"oneOf": [_STR, {"type": "array", "items": _TEXT_PART}], "nullable": True},
        "tool_call_id": _STR,
        "tool_calls": {"type": "array", "items": {"type": "object", "properties": {
            "id": _STR, "type": {"type": "string", "enum": ["function"]},
            "function": {"type": "object", "properties": {"name": _STR, "arguments": _STR}}}}},
    }}
    return {"type": "object", "required": ["model", "messages"], "properties": {
        "model": {"type": "string", "enum": models},
        "messages": {"type": "array", "items": message, "minItems": 1},
        **_sampling(2.0), **_EXTRA_SAMPLING,
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "logit_bias": _LOGIT_BIAS, "logprobs": {"type": "boolean"}, "top_logprobs": _TOP_LOGPROBS,
        "n": _N, "response_format": {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "json_schema": {"type": "object", "required": ["name"], "properties": {
                "name": _STR, "schema": {"type": "object"}, "strict": {"type": "boolean"}}}}},
        "seed": {"type": "integer"},
        "stop": _STOP,
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "tools": {"type": "array", "items": {"type": "object", "required": ["type", "function"],
                                             "properties": {"type": {"type": "string",
                                                                     "enum": ["function"]},
                                                            "function": _FUNCTION}}},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["auto", "none", "required"]},
                                  {"type": "object"}]},
        "chat_template_kwargs": {"type": "object"},
        "reasoning_effort": {"type": "string", "enum": list(EFFORTS)},
        "thinking_token_budget": {"type": "integer", "minimum": 0},
        "metadata": _METADATA, "user": _STR, "store": {"type": "boolean"},
        "parallel_tool_calls": {"type": "boolean"}, "service_tier": _STR,
    }}


def _completion_body(models: list[str]) -> dict:
    return {"type": "object", "required": ["model", "prompt"], "properties": {
        "model": {"type": "string", "enum": models},
        "prompt": {"oneOf": [_STR, {"type": "array", "items": {"type": "integer", "minimum": 0}}]},
        **_sampling(2.0), **_EXTRA_SAMPLING, "seed": {"type": "integer"}, "stop": _STOP,
        "echo": {"type": "boolean"}, "logit_bias": _LOGIT_BIAS,
        "suffix": {**_STR, "nullable": True},  # fill-in-the-middle, where the model has it
        "logprobs": {**_TOP_LOGPROBS, "nullable": True}, "n": _N,
    }}


def _messages_body(models: list[str], *, counting: bool) -> dict:
    block = {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["text", "tool_use", "tool_result"]},
        "text": {"type": "string", "minLength": 1}, "id": _STR, "name": _STR,
        "input": {"type": "object"},
        "tool_use_id": _STR, "content": {"oneOf": [_STR, {"type": "array", "items": _TEXT_PART}]},
        "is_error": {"type": "boolean"}}}
    message = {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": {"oneOf": [_STR, {"type": "array", "items": block}]}}}
    required = ["model", "messages"] + ([] if counting else ["max_tokens"])
    return {"type": "object", "required": required, "properties": {
        "model": {"type": "string", "enum": models},
        "messages": {"type": "array", "items": message, "minItems": 1},
        "system": {"oneOf": [_STR, {"type": "array", "items": _TEXT_PART}]},
        **_sampling(1.0),
        "top_k": {"type": "integer", "minimum": 0},
        "stop_sequences": {"type": "array", "items": _STR, "maxItems": 16},
        "tools": {"type": "array", "items": {"type": "object", "required": ["name", "input_schema"],
                                             "properties": {"name": _STR, "description": _STR,
                                                            "input_schema": {"type": "object"},
                                                            "strict": {"type": "boolean"}}}},
        "tool_choice": {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}, "name": _STR}},
        "output_config": {"type": "object", "properties": {"format": _OUTPUT_FORMAT}},
        "output_format": _OUTPUT_FORMAT, "metadata": _USER_ID,
    }}


def _responses_body(models: list[str]) -> dict:
    part = {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"type": "string", "enum": ["input_text", "output_text"]}, "text": _STR}}
    item = {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["message", "function_call", "function_call_output"]},
        "role": {"type": "string", "enum": ["user", "system", "developer", "assistant"]},
        "content": {"oneOf": [_STR, {"type": "array", "items": part}]},
        "call_id": _STR, "name": _STR, "arguments": _STR, "output": _STR}}
    fmt = {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
        "name": _STR, "schema": {"type": "object"}, "strict": {"type": "boolean"}}}
    return {"type": "object", "required": ["model", "input"], "properties": {
        "model": {"type": "string", "enum": models},
        "input": {"oneOf": [_STR, {"type": "array", "items": item, "minItems": 1}]},
        "instructions": _STR,
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "stream": {"type": "boolean"}, "store": {"type": "boolean"},
        "previous_response_id": _STR,
        "text": {"type": "object", "properties": {"format": fmt}},
        "tools": {"type": "array", "items": {"type": "object", "required": ["type", "name"],
                                             "properties": {
            "type": {"type": "string", "enum": ["function"]}, "name": _STR,
            "description": _STR, "parameters": {"type": "object"},
            "strict": {"type": "boolean"}}}},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["auto", "none", "required"]},
                                  {"type": "object"}]},
        "metadata": _METADATA, "user": _STR,
        "parallel_tool_calls": {"type": "boolean"},
        "include": {"type": "array", "items": {"type": "string",
                                               "enum": ["message.output_text.logprobs"]}},
        "top_logprobs": _TOP_LOGPROBS,
    }}


def _post(summary: str, schema: dict) -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {"200": {"description": "the result (JSON, or an SSE stream when stream "
                                             "is true)"},
                      "400": {"description": "a malformed request; the body names the field"},
                      "401": {"description": "missing or wrong API key"},
                      "404": {"description": "unknown model"},
                      "413": {"description": "the body is over the size limit"},
                      "503": {"description": "the queue is full"}}}}


def _get(summary: str) -> dict:
    return {"get": {"summary": summary, "responses": {"200": {"description": "OK"}}}}


def _ollama_body(models: list[str], *, chat: bool) -> dict:
    """`/api/chat` (chat) or `/api/generate`."""
    opts = {"type": "object", "properties": {
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0}, "seed": {"type": "integer"},
        "num_predict": {"type": "integer", "minimum": -2},
        "repeat_penalty": {"type": "number", "minimum": 0, "maximum": 10},
        "stop": {"type": "array", "items": _STR}, "num_ctx": {"type": "integer"}}}
    props = {"model": {"type": "string", "enum": models}, "stream": {"type": "boolean"},
             "options": opts, "format": {"oneOf": [{"type": "string", "enum": ["json"]},
                                                   {"type": "object"}]},
             "keep_alive": {"oneOf": [_STR, {"type": "number"}]},
             "think": {"oneOf": [{"type": "boolean"}, _STR]}}
    if chat:
        message = {"type": "object", "required": ["role"], "properties": {
            "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
            "content": _STR, "tool_name": _STR}}
        props.update(messages={"type": "array", "items": message},
                     tools={"type": "array", "items": {"type": "object"}})
    else:
        props.update(prompt=_STR, system=_STR, raw={"type": "boolean"}, suffix=_STR)
    return {"type": "object", "required": ["model"], "properties": props}


def _stored() -> dict:
    """`GET` and `DELETE /v1/responses/{response_id}`."""
    param = _path("response_id")
    gone = {"404": {"description": "no stored response of that id"}}
    return {
        "get": {"summary": "a stored response (Responses API)", "parameters": param + [_INCLUDE],
                "responses": {"200": {"description": "the response object"},
                              "400": {"description": "a bad include"}, **gone}},
        "delete": {"summary": "forget a stored response", "parameters": param,
                   "responses": {"200": {"description": "response.deleted"}, **gone}}}


def _path(*names: str) -> list[dict]:
    return [{"name": n, "in": "path", "required": True, "schema": _STR} for n in names]


# the item reads' `include` (`responses_request.with_includes`; `include[]` is read too)
_INCLUDE = {"name": "include", "in": "query", "style": "form", "explode": True,
            "schema": {"type": "array", "items": {"type": "string", "enum": list(INCLUDES)}}}


def _page(summary: str, id_name: str, missing: str) -> dict:
    """A `GET` of a list of items a page at a time (`response_store.page`)."""
    params = _path(id_name) + [
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                   "maximum": 100, "default": 20}},
        {"name": "order", "in": "query", "schema": {"type": "string", "enum": [
            "asc", "desc"], "default": "desc"}},
        {"name": "after", "in": "query", "schema": _STR},
        {"name": "before", "in": "query", "schema": _STR}, _INCLUDE]
    return {"summary": summary, "parameters": params,
            "responses": {"200": {"description": "a list of items"},
                          "400": {"description": "a bad limit, order, cursor or include"},
                          "404": {"description": missing}}}


def _conversations() -> dict:
    """The Conversations API's paths (`conversations_dialect`)."""
    items = {"type": "array", "maxItems": 20, "items": {"type": "object"}}
    meta = _METADATA
    gone = {"404": {"description": "no conversation of that id"}}

    def op(summary: str, names: tuple, body: dict | None = None, **codes: str) -> dict:
        out = {"summary": summary, "parameters": _path(*names),
               "responses": {"200": {"description": "OK"}, **gone,
                             **{c.lstrip("_"): {"description": d} for c, d in codes.items()}}}
        if body is not None:
            out["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": body}}}
        return out
    c, ci = ("conversation_id",), ("conversation_id", "item_id")
    return {
        "/v1/conversations": {"post": {
            "summary": "a new conversation (Conversations API)",
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"items": items, "metadata": meta}}}}},
            "responses": {"200": {"description": "the conversation"},
                          "400": {"description": "a bad item or metadata; the body names it"}}}},
        "/v1/conversations/{conversation_id}": {
            "get": op("a conversation", c),
            "post": op("a conversation's metadata replaced", c, {
                "type": "object", "required": ["metadata"], "properties": {"metadata": meta}},
                _400="bad metadata"),
            "delete": op("forget a conversation", c)},
        "/v1/conversations/{conversation_id}/items": {
            "get": _page("a conversation's items, a page at a time", "conversation_id",
                         "no conversation of that id"),
            "post": op("items added to a conversation", c, {
                "type": "object", "required": ["items"],
                "properties": {"items": {**items, "minItems": 1}}}, _400="a bad item")},
        "/v1/conversations/{conversation_id}/items/{item_id}": {
            "get": {**op("one item of a conversation", ci),
                    "parameters": _path(*ci) + [_INCLUDE]},
            "delete": op("an item removed from a conversation", ci)},
    }


def build_schema(title: str, models: tuple[str, ...]) -> dict:
    """The OpenAPI document for a server serving `models` (the name and its aliases)."""
    names = list(models)
    return {
        "openapi": "3.0.3",
        "info": {"title": f"strata serve: {title}", "version": __version__},
        "paths": {
            "/v1/models": _get("the served model"),
            "/v1/models/{model}": {"get": {
                "summary": "the served model by id (its name or an alias)",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": _STR}],
                "responses": {"200": {"description": "the model object"},
                              "404": {"description": "not a model served here"}}}},
            "/v1/chat/completions": _post("OpenAI chat completion", _chat_body(names)),
            "/v1/completions": _post("OpenAI text completion", _completion_body(names)),
            "/v1/responses": _post("OpenAI response (Responses API)", _responses_body(names)),
            "/v1/responses/{response_id}": _stored(),
            "/v1/responses/{response_id}/input_items": {"get": _page(
                "a stored response's input items, a page at a time", "response_id",
                "no stored response of that id")},
            **_conversations(),
            "/v1/messages": _post("Anthropic message", _messages_body(names, counting=False)),
            "/v1/messages/count_tokens": _post("Anthropic token count",
                                               _messages_body(names, counting=True)),
            "/api/chat": _post("Ollama chat (NDJSON stream unless stream is false)",
                               _ollama_body(names, chat=True)),
            "/api/generate": _post("Ollama generate", _ollama_body(names, chat=False)),
            "/api/show": _post("Ollama model details", {
                "type": "object", "properties": {"model": {"type": "string", "enum": names}}}),
            "/api/tags": _get("Ollama: the served model"),
            "/api/ps": _get("Ollama: the loaded model"),
            "/api/version": _get("Ollama: the server's version"),
            "/api/pull": _post("Ollama pull: success for the served model (nothing is "
                               "downloaded); another is a 400", {
                "type": "object", "properties": {"model": {"type": "string", "enum": names},
                                                 "stream": {"type": "boolean"},
                                                 "insecure": {"type": "boolean"}}}),
            "/infill": _post("llama.cpp infill: code between a prefix and a suffix "
                             "(fill-in-the-middle)", {
                "type": "object", "properties": {
                    "input_prefix": _STR, "input_suffix": _STR, "prompt": _STR,
                    "input_extra": {"type": "array", "items": {
                        "type": "object", "required": ["text"],
                        "properties": {"filename": _STR, "text": _STR}}},
                    "n_predict": {"type": "integer", "minimum": -2},
                    "n_indent": {"type": "integer", "minimum": 0},
                    "t_max_predict_ms": {"type": "integer", "minimum": -1},
                    "stream": {"type": "boolean"}, "stop": _STOP}}),
            "/tokenize": _post("the served model's tokens of a prompt or a chat", {
                "type": "object", "properties": {
                    "model": {"type": "string", "enum": names}, "prompt": _STR, "content": _STR,
                    "messages": {"type": "array", "items": {"type": "object"}},
                    "tools": {"type": "array", "items": {"type": "object"}},
                    "add_special_tokens": {"type": "boolean"}, "add_special": {"type": "boolean"},
                    "with_pieces": {"type": "boolean"}}}),
            "/detokenize": _post("the text of token ids", {
                "type": "object", "required": ["tokens"], "properties": {
                    "model": {"type": "string", "enum": names},
                    "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}),
            "/health": _get("liveness and load"),
            "/metrics": _get("Prometheus metrics"),
            "/monitor.json": _get("the monitor page's data"),
        },
    }
