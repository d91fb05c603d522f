"""Tool calls in the XML form Qwen3-Coder's chat template teaches its models:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    2
    </parameter>
    </function>
    </tool_call>

It is the same `<tool_call>` block as the JSON form (`strata.serve.tools`), so the same
streaming parser finds it; its body is read here. A parameter's value is its text with the one
newline the template writes on each side taken off (code keeps its own whitespace). The text
becomes the JSON value the request's tool schema asks for: a string where the parameter is typed
string, or untyped, or unknown to the request; else the JSON the text spells where it is of a
type the schema allows (a number, boolean, object, array or null), else the text itself.
A body with anything but parameters inside its function, or no function, is no call.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from strata.engine import xml_trigger
from strata.engine.json_schema_request import types_of

# the tags as text (the grammar that holds strict calls, `xml_trigger`, has them as bytes)
FUNCTION_OPEN = xml_trigger.FUNCTION_OPEN.decode()
FUNCTION_CLOSE = xml_trigger.FUNCTION_CLOSE.decode()
PARAM_OPEN = xml_trigger.PARAM_OPEN.decode()
PARAM_CLOSE = xml_trigger.PARAM_CLOSE.decode()
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>\s*)?\Z", re.DOTALL)

# per tool, per parameter: the JSON types its schema allows (empty: any, read as a string)
ParamTypes = Mapping[str, Mapping[str, frozenset[str]]]


def template_uses_xml_calls(source: str) -> bool:
    """Whether a chat template writes a call's body as `<function=...>` with `<parameter=...>`
    (Qwen3-Coder's) inside its `<tool_call>` block."""
    return FUNCTION_OPEN in source and PARAM_OPEN in source


def forced_xml_prefix(tool_choice: str) -> str:
    """The assistant text that makes an XML-call model call a tool: any ("required"), or the
    named one, whose parameters it then writes; "" where no call is forced."""
    if tool_choice in ("auto", "none"):
        return ""
    if tool_choice == "required":
        return "<tool_call>\n"
    return f"<tool_call>\n{FUNCTION_OPEN}{tool_choice}>\n"


def param_types(tools: list[dict] | tuple[dict, ...]) -> dict[str, dict[str, frozenset[str]]]:
    """The request's tools (OpenAI's function shape, as `ChatInput.tools` holds them) as the
    types each parameter allows (`ParamTypes`)."""
    out: dict[str, dict[str, frozenset[str]]] = {}
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(props, dict):
            out[fn["name"]] = {k: _types(v, params) for k, v in props.items()}
    return out


def _types(schema: Any, root: dict, depth: int = 0) -> frozenset[str]:
    """The JSON types a parameter's schema allows (empty: any, read as text): its `type`, an
    `enum`'s or `const`'s values' types, the union over `anyOf` / `oneOf`, a `$ref` into the
    parameters' `$defs` / `definitions` followed (as strict calls' grammar reads the schema,
    `strata.engine.xml_trigger`, so a value held as JSON is read back as JSON)."""
    if not isinstance(schema, dict) or depth > 32:
        return frozenset()
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset({kind})
    if isinstance(kind, list):
        return frozenset(k for k in kind if isinstance(k, str))
    if isinstance(schema.get("enum"), list):
        return frozenset().union(*(types_of(v) for v in schema["enum"]))
    if "const" in schema:
        return frozenset(types_of(schema["const"]))
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return frozenset().union(*(_types(s, root, depth + 1) for s in schema[key]))
    ref = schema.get("$ref")
    for prefix in ("#/$defs/", "#/definitions/"):
        if isinstance(ref, str) and ref.startswith(prefix):
            defs = root.get(prefix[2:-1])
            target = defs.get(ref[len(prefix):]) if isinstance(defs, dict) else None
            return _types(target, root, depth + 1)
    return frozenset()


def parse_xml_body(body: str, types: ParamTypes | None = None
                   ) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) of one block's body in the XML form, or None where it is not one."""
    m = _FUNCTION.match(body.strip())
    if m is None:
        return None
    name, inner = m.group(1).strip(), m.group(2)
    if not name:
        return None
    allowed = (types or {}).get(name, {})
    args: dict[str, Any] = {}
    pos = 0
    while True:
        start = inner.find(PARAM_OPEN, pos)
        if start == -1:
            if inner[pos:].strip():
                return None  # text that is no parameter
            return name, args
        if inner[pos:start].strip():
            return None
        key_end = inner.find(">", start)
        if key_end == -1:
            return None
        key = inner[start + len(PARAM_OPEN):key_end].strip()
        end = inner.find(PARAM_CLOSE, key_end)
        after = inner.find(PARAM_OPEN, key_end)
        if end == -1 or (after != -1 and after < end):  # its closing tag left out
            end = len(inner) if after == -1 else after
            pos = end
        else:
            pos = end + len(PARAM_CLOSE)
        if not key:
            return None
        args[key] = _value(_trim(inner[key_end + 1:end]), allowed.get(key, frozenset()))


def _trim(text: str) -> str:
    """The value between its tags, less the newline the template writes on each side."""
    if text.startswith("\n"):
        text = text[1:]
    return text[:-1] if text.endswith("\n") else text


def _value(text: str, allowed: frozenset[str]) -> Any:
    if not allowed or "string" in allowed:
        return text
    spelled = text.strip()
    if "boolean" in allowed and spelled.lower() in ("true", "false"):
        return spelled.lower() == "true"  # Python's True / False as well as JSON's
    try:
        value = json.loads(spelled)
    except (json.JSONDecodeError, RecursionError):
        return text
    return value if types_of(value) & allowed else text

