"""Tool calls in generated text: the Hermes/Qwen format, parsed back into structured calls.

Qwen3 (and the ChatML templates written in its style) have the model answer a tool call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

or, Qwen3-Coder's form, as `<function=...>` with a `<parameter=...>` each inside the block
(`strata.serve.xml_calls`). `ToolCallParser` splits streamed text into plain text and completed
`ToolCall`s. Text that might be the start of a tag is held back; whitespace just before a call
is dropped (it only separates the call from the prose). A block whose body does not parse, or
names no function, is returned as text: the client sees what the model wrote instead of a call
it did not make.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from strata.engine.json_schema import Node, any_of_node, call_node, object_node
from strata.serve.errors import bad_request
from strata.serve.fields import valid_text
from strata.serve.xml_calls import FUNCTION_CLOSE, FUNCTION_OPEN, ParamTypes, parse_xml_body

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
CALL_SUFFIX = ("\n" + CLOSE_TAG).encode()  # what closes a call's JSON, as the template writes it


@dataclass(frozen=True, slots=True)
class StrictCalls:
    """How a request's strict tools hold the model's calls (`strata.engine.json_trigger`):
    `root` any call document ({"name", "arguments"} of one tool, a strict tool's arguments held
    to its parameters' schema), opened by `<tool_call>`; `inside`, where the prompt already
    opened a call (a forced choice), that call's open document and what closes it."""

    root: Node
    inside: tuple[Node, bytes] | None = None
    # a thinking model's answer: "start" (it may open a <think> block) or "open" (the prompt
    # opened one); no call is opened inside the block (`TriggeredJson`'s `think`)
    think: str | None = None


def strict_calls(schemas: tuple[tuple[str, Node | None], ...], choice: str,
                 forced: bool, think: str | None = None, *,
                 json_answer: bool = False) -> StrictCalls | None:
    """The constraint for tools `schemas` ((name, its parameters' node where `strict`, else
    None)) under `tool_choice` `choice`, `forced` where the prompt ends with the opening of the
    forced call; None where no tool is strict, no call is forced and no JSON format stands
    beside the tools (`json_answer`): the calls stay free."""
    if not forced and not json_answer and not any(node is not None for _, node in schemas):
        return None  # calls the model may make or not, none strict: free text
    # (json_answer: a JSON format beside the tools, whose answer is a call or the document:
    # the calls' documents are held too, a non-strict tool's arguments to any object)
    # (a forced call is held to the call document even where no tool is strict, its
    # arguments to any object: the prompt opened it, and text that is no call would be
    # returned to a client that was promised one)
    root = any_of_node([call_node(name, node) for name, node in schemas])
    inside = None
    if forced and choice == "required":  # the prompt ends with the tag and a newline
        inside = (root, CALL_SUFFIX)
    elif forced:  # ... and '{"name": "X", "arguments": ': the arguments' object, then "}"
        node = dict(schemas)[choice]
        inside = (node if node is not None else object_node(), b"}" + CALL_SUFFIX)
    return StrictCalls(root=root, inside=inside, think=None if forced else think)


@dataclass(frozen=True, slots=True)
class StrictXmlCalls:
    """How a request's strict tools hold an XML-call model's calls
    (`strata.engine.xml_trigger`): `tools`, (name, its parameters' node: a strict tool's
    schema, any keys with text values for the others) each; `forced` where the prompt opened
    the call ("required", or the forced tool's name); `think` as `StrictCalls`'."""

    tools: tuple[tuple[str, Node], ...]
    forced: str | None = None
    think: str | None = None


def strict_xml_calls(schemas: tuple[tuple[str, Node | None], ...], choice: str,
                     forced: bool, think: str | None = None, *,
                     json_answer: bool = False) -> StrictXmlCalls | None:
    """`strict_calls` for a model whose calls are Qwen3-Coder's XML: None where no tool is
    strict, no call is forced and no JSON format stands beside the tools (`json_answer`: the
    answer is then a call or the document, and the calls are held too); a forced call is held
    whether or not its tool is strict (the prompt opened it: what follows must be a call), and
    is the answer whatever the format."""
    if not forced and not json_answer and not any(node is not None for _, node in schemas):
        return None
    for i, (name, node) in enumerate(schemas):
        for key in node.props if node is not None else ():
            if any(ch in key for ch in b"<>\n") or key != key.strip():
                raise bad_request(f"tools[{i}] ({name}): the parameter {key.decode()!r} cannot "
                                  "be written in this model's XML calls (`<parameter=KEY>`): "
                                  "a key without <, >, a newline or blank space at its ends",
                                  f"tools[{i}]")
    tools = tuple((name, node if node is not None else object_node()) for name, node in schemas)
    return StrictXmlCalls(tools=tools, forced=choice if forced else None,
                          think=None if forced else think)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def new_call_id(prefix: str) -> str:
    """A fresh call id in the dialect's style (``call_...`` or ``toolu_...``)."""
    return f"{prefix}{secrets.token_hex(12)}"


def template_uses_hermes_calls(template_source: str) -> bool:
    """Whether a chat template's tool calls are `<tool_call>` blocks (Qwen, Hermes, ChatML)."""
    return OPEN_TAG in template_source and CLOSE_TAG in template_source


def parse_call(body: str, id_prefix: str, types: ParamTypes | None = None) -> ToolCall | None:
    """The call in one block's body (JSON, or Qwen3-Coder's XML form: `xml_calls`, its
    parameters typed by the request's tool schemas `types`), or None when it is not a
    well-formed call."""
    if body.startswith(FUNCTION_OPEN):
        parsed = parse_xml_body(body, types)
        if parsed is None:
            return None
        name, args = parsed
    else:
        try:
            value = json.loads(body)
        except (json.JSONDecodeError, RecursionError):  # a model's text may nest without end
            return None
        if not isinstance(value, dict):
            return None
        name = value.get("name")
        args = value.get("arguments", value.get("parameters", {}))
        if isinstance(args, str):  # some models emit the arguments as a JSON string
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):
                return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    if "\\u" in body:  # an escaped lone surrogate could not be written into the response
        try:
            name, args = valid_text(name), valid_text(args)
        except RecursionError:
            return None
    return ToolCall(name=name, arguments=args, id=new_call_id(id_prefix))


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    """Feed generated text; get back a list of `str` pieces and `ToolCall`s in order."""

    def __init__(self, id_prefix: str = "call_", types: ParamTypes | None = None):
        self.id_prefix = id_prefix
        self.types = types  # the request's tools' parameter types (`xml_calls.param_types`)
        self._buf = ""  # text not yet decided
        self._in_call = False
        self.n_calls = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        self._buf += text
        out: list[str | ToolCall] = []
        while True:
            if self._in_call:
                end = self._buf.find(CLOSE_TAG)
                if end == -1:
                    return out
                body, self._buf = self._buf[:end], self._buf[end + len(CLOSE_TAG):]
                self._in_call = False
                call = parse_call(body.strip(), self.id_prefix, self.types)
                if call is None:
                    out.append(OPEN_TAG + body + CLOSE_TAG)
                else:
                    self.n_calls += 1
                    out.append(call)
                    self._buf = self._buf.lstrip()
                continue
            start = self._buf.find(OPEN_TAG)
            if start != -1:
                before = self._buf[:start].rstrip()
                if before:
                    out.append(before)
                self._buf = self._buf[start + len(OPEN_TAG):]
                self._in_call = True
                continue
            # hold back a possible partial tag and the whitespace before it
            ready = self._buf[:len(self._buf) - _partial_tag(self._buf, OPEN_TAG)].rstrip()
            if ready:
                out.append(ready)
            self._buf = self._buf[len(ready):]
            return out

    def finish(self) -> list[str | ToolCall]:
        """What is left when generation ends: an unterminated call whose body is a whole call
        (the model ended its turn where the closing tag belongs, or wrote part of the tag) is
        that call; one cut inside its body comes back as its raw text."""
        if self._in_call:
            body = self._buf[:len(self._buf) - _partial_tag(self._buf, CLOSE_TAG)].strip()
            # an XML body must have closed its function: its parser forgives a parameter's
            # closing tag left out, which here would pass a value cut short for a whole one
            whole = not body.startswith(FUNCTION_OPEN) or body.endswith(FUNCTION_CLOSE)
            call = parse_call(body, self.id_prefix, self.types) if whole else None
            if call is not None:
                self._buf, self._in_call = "", False
                self.n_calls += 1
                return [call]
        rest = (OPEN_TAG + self._buf) if self._in_call else self._buf
        self._buf, self._in_call = "", False
        if self.n_calls and not rest.strip():
            return []  # whitespace after the last call only separated it from nothing
        return [rest] if rest else []
