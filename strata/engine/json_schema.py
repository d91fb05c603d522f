"""`compile_schema`: a JSON Schema (the subset structured outputs use) as `Node`s the JSON
constraint walks: what each position of the document may hold.

Taken: `type` (one or a list), `properties`, `required`, `additionalProperties` (true, false or a
schema; absent is true, as JSON Schema says), `items`, `minItems`, `maxItems`, `enum`, `const`,
`anyOf`, `$ref` to `#/$defs/...` or `#/definitions/...` (recursion included), and the keywords
that only annotate (`title`, `description`, `default`, `examples`, ...). Any other keyword
(`format`, `pattern`, `minimum`, `oneOf`, ...) is a `SchemaError` naming it and where it is: a
constraint the output would not keep is refused, never dropped. The root must be an object.
`loose` (a schema the request asks to be followed without `strict`, which OpenAI's API does
not hold output to at all): the keywords that narrow a value within its type (VALUE_CHECKS:
`format`, `pattern`, `minimum`, `maxLength`, ...) are not held, the rest still is.
"""

from __future__ import annotations

import json
from typing import Any

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id",
                         "$comment", "deprecated", "readOnly", "writeOnly"})
TAKEN = frozenset({"type", "properties", "required", "additionalProperties", "items",
                   "minItems", "maxItems", "enum", "const", "anyOf", "$ref", "$defs",
                   "definitions"}) | ANNOTATIONS
# keywords that narrow a value within its type: not held in a loose schema (`compile_schema`)
VALUE_CHECKS = frozenset({"format", "pattern", "minimum", "maximum", "exclusiveMinimum",
                          "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
                          "minProperties", "maxProperties", "uniqueItems", "contentEncoding",
                          "contentMediaType"})
MAX_NODES = 4096  # a schema larger than this is refused (each node is walked per token)


class SchemaError(ValueError):
    """A schema the constraint cannot keep; the message names the keyword and its path."""


class Node:
    """One position of the document. `kinds`: the JSON types it takes (all where absent);
    `literals`: where given, the value is one of these texts (compact JSON); `any_of`: where
    given, the value is one of these nodes' values instead. Objects: `props` (raw key text ->
    node), `required`, `additional` (the node of any other key; None: no other keys). Arrays:
    `items`, `min_items`, `max_items` (None: no limit). Compared by identity."""

    __slots__ = ("kinds", "literals", "any_of", "props", "required", "additional", "items",
                 "min_items", "max_items")

    def __init__(self):
        self.kinds: frozenset[str] = frozenset(TYPES)
        self.literals: tuple[bytes, ...] | None = None
        self.any_of: tuple[Node, ...] | None = None
        self.props: dict[bytes, Node] = {}
        self.required: frozenset[bytes] = frozenset()
        self.additional: Node | None = None
        self.items: Node | None = None
        self.min_items = 0
        self.max_items: int | None = None

    def __repr__(self) -> str:
        return f"Node({sorted(self.kinds)})"


def _any() -> Node:
    node = Node()
    node.additional = node.items = node  # any value, any keys, any items
    return node


ANY = _any()


def key_text(name: str) -> bytes:
    """A key as it is written between its quotes (JSON escapes, UTF-8)."""
    return json.dumps(name, ensure_ascii=False)[1:-1].encode("utf-8")


def value_text(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class _Compiler:
    def __init__(self, root: dict, loose: bool = False):
        self.taken = TAKEN | VALUE_CHECKS if loose else TAKEN
        self.n_nodes = 0
        defs = {}
        for where in ("$defs", "definitions"):
            table = root.get(where, {})
            if not isinstance(table, dict):
                raise SchemaError(f"{where}: expected an object of schemas")
            defs.update({f"#/{where}/{name}": (f"{where}.{name}", sub)
                         for name, sub in table.items()})
        self.targets = {ref: Node() for ref in defs}  # filled below: a $ref may come first
        for ref, (path, sub) in defs.items():
            self.fill(self.targets[ref], sub, path)

    def node(self, schema: Any, path: str) -> Node:
        if isinstance(schema, dict) and "$ref" in schema:
            extra = set(schema) - {"$ref"} - ANNOTATIONS
            if extra:
                raise SchemaError(f"{path}: keywords beside $ref are not taken: "
                                  f"{', '.join(sorted(extra))}")
            target = self.targets.get(schema["$ref"])
            if target is None:
                raise SchemaError(f"{path}.$ref: {schema['$ref']!r} is not among the schema's "
                                  f"$defs / definitions")
            return target
        return self.fill(Node(), schema, path)

    def fill(self, node: Node, schema: Any, path: str) -> Node:
        self.n_nodes += 1
        if self.n_nodes > MAX_NODES:
            raise SchemaError(f"the schema has more than {MAX_NODES} subschemas")
        if schema is True or schema == {}:
            node.additional = node.items = ANY
            return node
        if not isinstance(schema, dict):
            raise SchemaError(f"{path}: expected a schema object, got {type(schema).__name__}")
        unknown = set(schema) - self.taken
        if unknown:
            raise SchemaError(f"{path}: {', '.join(sorted(unknown))} not supported (the output "
                              f"could not be held to it); supported: "
                              f"{', '.join(sorted(TAKEN - ANNOTATIONS))}")
        kinds = schema.get("type")
        if kinds is not None:
            kinds = [kinds] if isinstance(kinds, str) else kinds
            if not isinstance(kinds, list) or not kinds or any(k not in TYPES for k in kinds):
                raise SchemaError(f"{path}.type: expected one of {', '.join(TYPES)} or a list "
                                  f"of them, got {schema['type']!r}")
            node.kinds = frozenset(kinds)
        elif any(k in schema for k in ("properties", "required", "additionalProperties")):
            node.kinds = frozenset({"object"})
        elif any(k in schema for k in ("items", "minItems", "maxItems")):
            node.kinds = frozenset({"array"})
        if "enum" in schema or "const" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"{path}.enum: expected a non-empty array of values")
            node.literals = tuple(dict.fromkeys(value_text(v) for v in values))
        if "anyOf" in schema:
            alts = schema["anyOf"]
            if not isinstance(alts, list) or not alts:
                raise SchemaError(f"{path}.anyOf: expected a non-empty array of schemas")
            node.any_of = tuple(self.node(a, f"{path}.anyOf[{i}]") for i, a in enumerate(alts))
        self._object(node, schema, path)
        self._array(node, schema, path)
        return node

    def _object(self, node: Node, schema: dict, path: str) -> None:
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(f"{path}.properties: expected an object of schemas")
        odd = [k for k in props if any(ch in '"\\' or ord(ch) < 0x20 for ch in k)]
        if odd:
            raise SchemaError(f"{path}.properties: a key with a quote, backslash or control "
                              f"character is not supported: {odd[0]!r}")
        node.props = {key_text(k): self.node(v, f"{path}.properties.{k}")
                      for k, v in props.items()}
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{path}.required: expected an array of property names")
        missing = [r for r in required if key_text(r) not in node.props]
        if missing:
            raise SchemaError(f"{path}.required: {', '.join(missing)} not among the properties")
        node.required = frozenset(key_text(r) for r in required)
        extra = schema.get("additionalProperties", True)
        node.additional = (ANY if extra is True else None if extra is False
                           else self.node(extra, f"{path}.additionalProperties"))

    def _array(self, node: Node, schema: dict, path: str) -> None:
        node.items = self.node(schema["items"], f"{path}.items") if "items" in schema else ANY
        for key in ("minItems", "maxItems"):
            v = schema.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SchemaError(f"{path}.{key}: expected a non-negative integer")
        node.min_items = schema.get("minItems", 0)
        node.max_items = schema.get("maxItems")
        if node.max_items is not None and node.max_items < node.min_items:
            raise SchemaError(f"{path}: maxItems is below minItems")


def compile_schema(schema: Any, loose: bool = False) -> Node:
    """The root node of `schema` (a parsed JSON Schema); `SchemaError` where it cannot be kept
    (`loose`: VALUE_CHECKS not held)."""
    if not isinstance(schema, dict):
        raise SchemaError("the schema must be a JSON object")
    root = _Compiler(schema, loose).node(schema, "schema")
    if root.any_of is not None or root.literals is not None or root.kinds != {"object"}:
        raise SchemaError("schema: the root must be {\"type\": \"object\", ...} (no anyOf, enum "
                          "or other type at the root)")
    return root


def object_node() -> Node:
    """Any JSON object: `response_format` json_object."""
    node = Node()
    node.kinds = frozenset({"object"})
    node.additional = node.items = ANY
    return node


def literal_node(value: Any) -> Node:
    node = Node()
    node.literals = (value_text(value),)
    return node


def call_node(name: str, arguments: Node | None) -> Node:
    """A tool call's document: {"name": the tool's name, "arguments": an object `arguments`
    allows (None: any object)}, both keys, no other."""
    node = Node()
    node.kinds = frozenset({"object"})
    node.props = {b"name": literal_node(name),
                  b"arguments": arguments if arguments is not None else object_node()}
    node.required = frozenset(node.props)
    return node


def any_of_node(nodes: list[Node]) -> Node:
    """A value any of `nodes` allows (all objects: the root of a tool call)."""
    if not nodes:
        raise SchemaError("anyOf needs at least one schema")
    node = Node()
    node.kinds = frozenset({"object"})
    node.any_of = tuple(nodes)
    return node
