"""`Fields`: typed reads from a request's JSON object, each failure a 400 naming the field.

Both dialects validate through this one reader, so every wrong type, missing key or
out-of-range value gets the same kind of message: ``max_tokens: expected an integer, got
string``, with `param` set to the field's dotted path.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from strata.serve.errors import ApiError, bad_request
from strata.tokenizer import replace_surrogates

_MISSING = object()
# Arrays and objects inside each other in a body, the body itself being level 1. No API body
# nests near this (a schema 64 levels deep, the most a request's schema may nest, is about 130);
# Python's JSON decoder and encoder recurse per level and give out near 1,000, so a body just
# under that would still fail where a value of it is echoed or rendered.
MAX_JSON_DEPTH = 256
# a surrogate escape, or a surrogate the decoder let through: only then are strings checked
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def type_name(value: Any) -> str:
    """A value's JSON type, as error messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object; a 400 for anything else (NaN and Infinity included)."""
    if not body:
        raise bad_request("the request body is empty: expected a JSON object")
    try:  # decoded as json.loads decodes bytes (UTF-16 and -32 are found by their zeros)
        text = body.decode(json.detect_encoding(body), "surrogatepass")
        value = json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not UTF-8 ({e.reason})") from e
    except RecursionError:
        raise bad_request(f"the request body is nested too deeply: at most {MAX_JSON_DEPTH} "
                          f"arrays and objects inside each other") from None
    except (json.JSONDecodeError, ValueError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise bad_request(f"the request body must be a JSON object, got {type_name(value)}")
    # the depth can pass the limit only where the text opens that many arrays and objects
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _too_deep(value):
        raise bad_request(f"the request body is nested too deeply: at most {MAX_JSON_DEPTH} "
                          f"arrays and objects inside each other")
    if _SURROGATE.search(text):  # (the depth is within MAX_JSON_DEPTH by now)
        value = valid_text(value)
    return value


def _too_deep(value: Any) -> bool:
    """Whether `value` nests more than MAX_JSON_DEPTH arrays and objects (walked without
    recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return True
        for child in (v.values() if isinstance(v, dict) else v):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def valid_text(value: Any) -> Any:
    """`value` with every lone surrogate in its strings (keys too) replaced by U+FFFD.

    JSON may escape a lone surrogate (``"\\ud800"``), which Python decodes into a string no
    UTF-8 text can hold: the tokenizer takes it as U+FFFD, but a field echoed back (metadata,
    a stop string, an error naming a key) could not be written out, so every field gets the
    replacement at once. Recursive: a caller bounds the depth (or catches RecursionError)."""
    if isinstance(value, str):
        return replace_surrogates(value)
    if isinstance(value, list):
        return [valid_text(v) for v in value]
    if isinstance(value, dict):
        return {replace_surrogates(k): valid_text(v) for k, v in value.items()}
    return value


def a_or_an(word: str) -> str:
    """`word` quoted after its article: ``an 'image'``, ``a 'document'`` (by its first letter,
    which suits the part and block type names the APIs have)."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word!r}"


def join(path: str, key: str | int) -> str:
    """The dotted path of a child: ``join("messages", 2)`` is ``messages[2]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class Fields:
    """One JSON object of the request, read by key with type checks."""

    def __init__(self, obj: Any, path: str = ""):
        if not isinstance(obj, dict):
            where = path or "the request body"
            raise bad_request(f"{where}: expected an object, got {type_name(obj)}", path or None)
        self.obj = obj
        self.path = path

    def where(self, key: str) -> str:
        return join(self.path, key)

    def _fail(self, key: str, expected: str, value: Any) -> ApiError:
        return bad_request(f"{self.where(key)}: expected {expected}, got {type_name(value)}",
                           self.where(key))

    def _get(self, key: str, required: bool) -> Any:
        value = self.obj.get(key, _MISSING)
        if value is _MISSING and required:
            raise bad_request(f"{self.where(key)}: this field is required", self.where(key))
        return value

    def has(self, key: str) -> bool:
        """Present and not null (both APIs treat an explicit null as absent)."""
        return self.obj.get(key) is not None

    def raw(self, key: str, *, required: bool = False) -> Any:
        value = self._get(key, required)
        return None if value is _MISSING else value

    def str(self, key: str, *, required: bool = False, default: str | None = None,
            choices: tuple[str, ...] | None = None, non_empty: bool = False) -> str | None:
        value = self._get(key, required)
        if value is _MISSING or (value is None and not required):
            return default
        if not isinstance(value, str):
            raise self._fail(key, "a string", value)
        if non_empty and not value:
            raise bad_request(f"{self.where(key)}: must not be empty", self.where(key))
        if choices is not None and value not in choices:
            raise bad_request(f"{self.where(key)}: {value!r} is not one of "
                              f"{', '.join(repr(c) for c in choices)}", self.where(key))
        return value

    def int(self, key: str, *, required: bool = False, default: int | None = None,
            minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = self._get(key, required)
        if value is _MISSING or (value is None and not required):
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer", value)
        self._check_range(key, value, minimum, maximum)
        return value

    def number(self, key: str, *, default: float | None = None, minimum: float | None = None,
               maximum: float | None = None) -> float | None:
        value = self._get(key, False)
        if value is _MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, "a number", value)
        if not math.isfinite(value):
            raise bad_request(f"{self.where(key)}: must be finite", self.where(key))
        self._check_range(key, value, minimum, maximum)
        return float(value)

    def bool(self, key: str, *, default: bool = False) -> bool:
        value = self._get(key, False)
        if value is _MISSING or value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, "a boolean", value)
        return value

    def list(self, key: str, *, required: bool = False, non_empty: bool = False) -> list | None:
        value = self._get(key, required)
        if value is _MISSING or (value is None and not required):
            return None
        if not isinstance(value, list):
            raise self._fail(key, "an array", value)
        if non_empty and not value:
            raise bad_request(f"{self.where(key)}: must not be empty", self.where(key))
        return value

    def obj_at(self, key: str, *, required: bool = False) -> "Fields | None":
        value = self._get(key, required)
        if value is _MISSING or (value is None and not required):
            return None
        return Fields(value, self.where(key))

    def _check_range(self, key: str, value: float, minimum: float | None,
                     maximum: float | None) -> None:
        if minimum is not None and value < minimum:
            raise bad_request(f"{self.where(key)}: {value} is below the minimum {minimum}",
                              self.where(key))
        if maximum is not None and value > maximum:
            raise bad_request(f"{self.where(key)}: {value} is above the maximum {maximum}",
                              self.where(key))


# OpenAI's `metadata` (chat completions, responses, conversations): pairs, key and value sizes
MAX_METADATA = 16
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 512


def check_metadata(value: Any, where: str = "metadata") -> dict:
    """OpenAI's `metadata`: a JSON object of at most 16 string values (keys up to 64 characters,
    values up to 512), or a 400 naming what is wrong, as the official API checks it (nothing
    here reads it, but a wrong one is the client's mistake, not something to drop); null is
    {}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{where}: expected an object of strings, got {type_name(value)}",
                          where)
    if len(value) > MAX_METADATA:
        raise bad_request(f"{where}: {len(value)} pairs, at most {MAX_METADATA}", where)
    for key, v in value.items():
        if len(key) > MAX_KEY_CHARS:
            raise bad_request(f"{where}: key {key[:16]!r}... is longer than {MAX_KEY_CHARS} "
                              f"characters", where)
        if not isinstance(v, str) or len(v) > MAX_VALUE_CHARS:
            raise bad_request(f"{join(where, key)}: expected a string of at most "
                              f"{MAX_VALUE_CHARS} characters, got {_sized(v)}", join(where, key))
    return dict(value)


def _sized(value: Any) -> str:
    """What a metadata value is, as the error names it: its type, or a string's length."""
    return f"{len(value)} characters" if isinstance(value, str) else type_name(value)


PART_JOIN = "\n"  # between the text parts of one message (every route)


def text_parts(value: Any, path: str, *, texts: tuple[str, ...],
               not_text: tuple[str, ...]) -> str:
    """A message's content: a string, or an array of parts joined by newlines (as vLLM joins
    them for a template that takes a string; back to back, "</system-reminder>" ran into the
    user's first word). A part whose `type` is in
    `texts` gives its `text`, a `refusal` part its `refusal`; one in `not_text` (an image,
    audio, a file) is a 400 naming the part, since the model takes text only; any other type
    a 400 naming its `type`."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{path}: expected a string or an array of content parts", path)
    out = []
    for j, raw in enumerate(value):
        part = Fields(raw, join(path, j))
        kind = part.str("type", required=True)
        if kind in texts:
            out.append(part.str("text", required=True))
        elif kind == "refusal":
            out.append(part.str("refusal", required=True))
        elif kind in not_text:
            raise bad_request(f"{part.path} is {a_or_an(kind)} part, but this model takes text "
                              f"only: remove it or serve a model that accepts it", part.path)
        else:
            expected = " or ".join(repr(t) for t in texts)
            raise bad_request(f"{part.where('type')}: unknown content part type {kind!r} "
                              f"(expected {expected})", part.where("type"))
    return PART_JOIN.join(out)
