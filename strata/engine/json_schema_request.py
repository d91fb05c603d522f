"""`compile_request_schema`: a user's JSON schema (a serve request's, `generate --json-schema`)
checked, then compiled for the constraint (`strata.engine.json_schema.compile_schema`), every
failure a `SchemaError` naming its path.

Before the compiler sees a schema, three things are settled here:

- nesting: a subschema nested more than MAX_SCHEMA_DEPTH levels (through `properties`,
  `items`, `additionalProperties`, `anyOf`) is refused, since the compiler recurses per level
  and a deep enough schema would exhaust Python's stack (a 500, not the client's 400);
- `type` beside `enum` / `const`: only the values of an allowed type are kept (JSON Schema
  asks a value to satisfy both; the constraint would otherwise write any listed value), and a
  schema none of whose values has its type is refused;
- `$defs` / `definitions` beside `$ref` are containers, not constraints: Pydantic writes a
  recursive model as ``{"$defs": {...}, "$ref": "#/$defs/Model"}``, whose root is then the
  referenced definition (the definitions kept beside it, so references inside still resolve).
  Elsewhere they are dropped beside a `$ref`: ``#/$defs/...`` points into the root's only.

The request's own dicts are never changed (a tool's schema also reaches the chat template):
a subschema that changes is a copy.
"""

from __future__ import annotations

import json
from typing import Any

from strata.engine.json_schema import ANNOTATIONS, TYPES, Node, SchemaError, compile_schema

# Subschemas inside each other, the root being level 1. Real schemas nest a few levels (a
# recursive model nests through $ref, which does not count); the compiler takes three Python
# frames a level, so this keeps it far from the interpreter's ~1,000-frame limit.
MAX_SCHEMA_DEPTH = 64
CONTAINERS = ("$defs", "definitions")


def compile_request_schema(schema: Any, loose: bool = False) -> Node:
    """The root node of a request's schema; `SchemaError` where it cannot be kept (`loose`:
    see `compile_schema`)."""
    if not isinstance(schema, dict):
        return compile_schema(schema)  # its error: the schema must be a JSON object
    root = _narrowed(_unwrapped(schema), "schema", 1)
    defs = {}
    for where in CONTAINERS:
        table = root.get(where)
        if isinstance(table, dict):  # anything else is the compiler's to refuse
            defs[where] = {name: _narrowed(sub, f"{where}.{name}", 1)
                           for name, sub in table.items()}
    return compile_schema({**root, **defs}, loose)


def _unwrapped(root: dict) -> dict:
    """The root, or where it is a `$ref` beside its definitions, the definition it names with
    the definitions kept beside it (an alias of an alias followed)."""
    seen: set[str] = set()
    while "$ref" in root and any(k in root for k in CONTAINERS):
        extra = set(root) - {"$ref", *CONTAINERS} - ANNOTATIONS
        if extra:
            raise SchemaError(f"schema: keywords beside $ref are not taken: "
                              f"{', '.join(sorted(extra))}")
        tables = [(w, root[w]) for w in CONTAINERS if w in root]
        if not all(isinstance(t, dict) for _, t in tables):
            return root  # the compiler names the table that is not an object of schemas
        targets = {f"#/{w}/{name}": sub for w, t in tables for name, sub in t.items()}
        ref = root["$ref"]
        if not isinstance(ref, str) or ref not in targets:
            raise SchemaError(f"schema.$ref: {ref!r} is not among the schema's $defs / "
                              f"definitions")
        if ref in seen:
            raise SchemaError(f"schema.$ref: {ref!r} leads back to itself through $ref alone")
        seen.add(ref)
        target = targets[ref]
        body = ({k: v for k, v in target.items() if k not in CONTAINERS}
                if isinstance(target, dict) else {})  # not an object: the root check refuses
        root = {**dict(tables), **body}
    return root


def _narrowed(schema: Any, path: str, depth: int) -> Any:
    """`schema` with its subschemas checked for depth and its enum/const narrowed to its
    type; the same object where nothing changes."""
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"{path}: the schema nests subschemas more than {MAX_SCHEMA_DEPTH} "
                          f"levels deep")
    if not isinstance(schema, dict):
        return schema  # true, or something the compiler refuses by path
    changes: dict[str, Any] = {}
    if "$ref" in schema:
        if not isinstance(schema["$ref"], str):
            raise SchemaError(f"{path}.$ref: expected a string such as \"#/$defs/name\"")
        if any(k in schema for k in CONTAINERS):  # (the root's were unwrapped before)
            return {k: v for k, v in schema.items() if k not in CONTAINERS}
    props = schema.get("properties")
    if isinstance(props, dict):
        new = {k: _narrowed(v, f"{path}.properties.{k}", depth + 1) for k, v in props.items()}
        if any(new[k] is not props[k] for k in props):
            changes["properties"] = new
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, dict):
            new_sub = _narrowed(sub, f"{path}.{key}", depth + 1)
            if new_sub is not sub:
                changes[key] = new_sub
    alts = schema.get("anyOf")
    if isinstance(alts, list):
        new_alts = [_narrowed(a, f"{path}.anyOf[{i}]", depth + 1) for i, a in enumerate(alts)]
        if any(a is not b for a, b in zip(new_alts, alts)):
            changes["anyOf"] = new_alts
    changes.update(_typed_values(schema, path))
    return {**schema, **changes} if changes else schema


def types_of(value: Any) -> set[str]:
    """The JSON Schema types `value` is an instance of (5 is an integer and a number)."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"integer", "number"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


def _typed_values(schema: dict, path: str) -> dict[str, Any]:
    """{"enum": the values `type` allows} where `type` rules some out; {} where it rules out
    none (or the keywords are malformed: the compiler names them)."""
    kinds = schema.get("type")
    if kinds is None or not ("enum" in schema or "const" in schema):
        return {}
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds or any(k not in TYPES for k in kinds):
        return {}
    allowed, shown = set(kinds), " or ".join(kinds)
    if "const" in schema:  # the compiler takes const over enum, so is it checked alone
        value = schema["const"]
        if types_of(value) & allowed:
            return {}
        raise SchemaError(f"{path}.const: {_short(value)} is not of the schema's type "
                          f"({shown}): no value could be written")
    values = schema["enum"]
    if not isinstance(values, list) or not values:
        return {}
    kept = [v for v in values if types_of(v) & allowed]
    if not kept:
        raise SchemaError(f"{path}.enum: none of its values is of the schema's type ({shown}): "
                          f"no value could be written")
    return {} if len(kept) == len(values) else {"enum": kept}


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."
