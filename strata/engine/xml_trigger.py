"""`TriggeredXml`: strict tool calls in the XML form Qwen3-Coder's chat template teaches

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

held as `TriggeredJson` holds the JSON form: free text (and a thinking model's reasoning) takes
any token; once the model writes `<tool_call>`, the call must name one of the tools, give each
parameter at most once, only those its schema knows (any other where the schema allows more
keys), every required one before `</function>`, and close the block. A value is held to its
parameter's schema as the XML reader (`strata.serve.xml_calls`) will type it: where the schema
allows a string (or says no type), the value is text, which ends at `</parameter>` and may not
hold `<parameter=` or `</tool_call>` (tags the reader would end it at); an `enum` or `const` is
one of its values, strings written bare; any other schema's value is JSON it allows (numbers,
booleans, null, arrays, objects), written as the reader parses it. An end token is refused
inside a call. A pure function of bytes, so a candidate is tried without undoing anything.
"""

from __future__ import annotations

import json
from typing import Sequence

from strata.engine.json_constraint import TokenBytes, complete, feed, start
from strata.engine.json_schema import Node
from strata.engine.json_trigger import TriggeredJson

FUNCTION_OPEN = b"<function="
FUNCTION_CLOSE = b"</function>"
PARAM_OPEN = b"<parameter="
PARAM_CLOSE = b"</parameter>"
CALL_END = FUNCTION_CLOSE + b"\n</tool_call>"  # as the template closes a call
BANNED_IN_TEXT = (PARAM_OPEN, b"</tool_call>")  # the reader would end the value there
# after `<tool_call>`: the function, on the next line as the template writes it (or at once)
OPENING = ("lits", ((b"\n" + FUNCTION_OPEN, "fname"), (FUNCTION_OPEN, "fname")))
NAME_STOPS = frozenset(b" \t\r\n<>/=\"'")  # never in a key the schema does not name
MAX_NAME_BYTES = 256  # a key the schema does not name, at most

# A call's state: ("call", tool (an index, None before its name), keys given, sub), sub one of
#   ("lits", ((bytes still due, then), ...)): one of fixed texts, each followed by `then`:
#       "fname" (the tool's name next), ("tool", i), "between" (a parameter or the call's end),
#       "pname" (a key), ("value", key) or "free" (the call is over)
#   ("pname", the key's bytes so far)   ("text", the value's last bytes)
#   ("json", the JSON constraint's states, over the value inside "[" ... "]")


def _wrapped(node: Node) -> Node:
    """An array of exactly one `node`: the JSON constraint ends a value at its root only
    where it is an object; inside brackets a number ends, and blank space may follow it."""
    arr = Node()
    arr.kinds = frozenset({"array"})
    arr.items, arr.min_items, arr.max_items = node, 1, 1
    return arr


def _takes_text(node: Node) -> bool:
    """Whether the reader returns the value as text: the schema allows a string (an
    `anyOf` where any branch does), or gives no type."""
    if node.any_of is not None:
        return any(_takes_text(n) or _string_literal(n) for n in node.any_of)
    return node.literals is None and "string" in node.kinds


def _string_literal(node: Node) -> bool:
    return node.literals is not None and any(t.startswith(b'"') for t in node.literals)


def _bare(literal: bytes) -> bytes:
    """An enum value as the XML form writes it: a string's text, anything else its JSON."""
    value = json.loads(literal)
    return value.encode("utf-8") if isinstance(value, str) else literal


class TriggeredXml(TriggeredJson):
    """`tools`: (name, its parameters' object node) each; a tool that is not strict has
    `object_node()` (any keys, text values). `forced`: the prompt already opened a call:
    "required" (it ends with `<tool_call>` and a newline) or a tool's name (it ends with
    `<function=NAME>` and a newline). `think` as `TriggeredJson`'s."""

    def __init__(self, vocab: TokenBytes, stop_ids: Sequence[int], *, trigger: bytes,
                 tools: Sequence[tuple[str, Node]], forced: str | None = None,
                 think: str | None = None):
        if not tools:
            raise ValueError("strict XML calls need at least one tool")
        names = [n for n, _ in tools]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be distinct")
        # (TriggeredJson's document and suffix are not used: the call's parts are held here)
        super().__init__(vocab, stop_ids, trigger=trigger, root=tools[0][1], suffix=CALL_END,
                         think=None if forced is not None else think)
        self.tools = [(n.encode("utf-8"), node) for n, node in tools]
        if forced == "required":
            self.state = ("call", None, frozenset(), ("lits", ((FUNCTION_OPEN, "fname"),)))
        elif forced is not None:
            if forced not in names:
                raise ValueError(f"forced tool {forced!r} is not among the tools")
            i = names.index(forced)
            self.state = ("call", i, frozenset(), self._between(i, frozenset()))

    # -- the call's parts ---------------------------------------------------------------

    def _between(self, tool: int, given: frozenset) -> tuple:
        """After the function's name or a parameter: another parameter (where one may still
        come), or the call's end (once every required one is given)."""
        node = self.tools[tool][1]
        alts = []
        if node.additional is not None or any(k not in given for k in node.props):
            alts.append((PARAM_OPEN, "pname"))
        if node.required <= given:
            alts.append((CALL_END, "free"))
        return ("lits", tuple(alts))

    def _value(self, node: Node) -> tuple:
        if node.any_of is None and node.literals is not None:  # enum / const
            return ("lits", tuple((_bare(t) + b"\n" + PARAM_CLOSE + b"\n", "between")
                                  for t in node.literals))
        if _takes_text(node):
            return ("text", b"")
        return ("json", feed(start(_wrapped(node)), b"["))

    def _then(self, tool, given, then) -> tuple:
        """The state a fixed text's end leads to."""
        if then == "free":
            return ("free", b"")
        if then == "fname":
            return ("call", None, given, ("lits", tuple(
                (name + b">\n", ("tool", i)) for i, (name, _) in enumerate(self.tools))))
        if then == "between":
            return ("call", tool, given, self._between(tool, given))
        if then == "pname":
            return ("call", tool, given, ("pname", b""))
        if then[0] == "tool":
            return ("call", then[1], given, self._between(then[1], given))
        key = then[1]  # ("value", key): its newline written
        node = self.tools[tool][1]
        return ("call", tool, given | {key}, self._value(node.props.get(key, node.additional)))

    def _key(self, tool: int, given: frozenset, typed: bytes, c: int) -> tuple | None:
        node = self.tools[tool][1]
        if c == ord(">"):
            if not typed or typed in given:
                return None
            if typed not in node.props and (node.additional is None
                                            or any(b in NAME_STOPS for b in typed)):
                return None
            return ("call", tool, given, ("lits", ((b"\n", ("value", typed)),)))
        typed += bytes([c])
        if any(k.startswith(typed) for k in node.props if k not in given):
            return ("call", tool, given, ("pname", typed))
        if node.additional is None or c in NAME_STOPS or len(typed) > MAX_NAME_BYTES:
            return None
        return ("call", tool, given, ("pname", typed))

    def _step(self, state, suffix_due, c):
        if state[0] != "call":  # free text, or a thinking model's lead and reasoning
            out = super()._step(state, suffix_due, c)
            if out is not None and out[0][0] == "gap":  # the trigger is whole: a call opens
                return ("call", None, frozenset(), OPENING), None
            return out
        _, tool, given, sub = state
        part = sub[0]
        if part == "lits":
            alts = tuple((due[1:], then) for due, then in sub[1] if due[0] == c)
            if not alts:
                return None
            for due, then in alts:
                if not due:  # (no fixed text here is a prefix of another's)
                    return self._then(tool, given, then), None
            return ("call", tool, given, ("lits", alts)), None
        if part == "pname":
            out = self._key(tool, given, sub[1], c)
            return None if out is None else (out, None)
        if part == "text":
            tail = (sub[1] + bytes([c]))[-len(PARAM_CLOSE):]
            if tail == PARAM_CLOSE:  # the newline after it, then another or the end
                return ("call", tool, given, ("lits", ((b"\n", "between"),))), None
            if any(tail.endswith(b) for b in BANNED_IN_TEXT):
                return None
            return ("call", tool, given, ("text", tail[1 - len(PARAM_CLOSE):])), None
        # json
        nxt = feed(sub[1], bytes([c]))
        if nxt is not None and not complete(nxt):  # (whole: the model closed our brackets)
            return ("call", tool, given, ("json", nxt)), None
        closed = feed(sub[1], b"]")
        if closed is None or not complete(closed):
            return None
        return self._step(("call", tool, given, ("lits", ((PARAM_CLOSE + b"\n", "between"),))),
                          None, c)
