"""`ResponseStore`: the Responses API's stored responses, in memory, for `previous_response_id`
and `GET` / `DELETE /v1/responses/{id}`.

Each response keeps its own turn only: the input items its request sent (a string input as one
user message item) and its output items, with the id of the response it followed. A request
naming `previous_response_id` gets the chain's turns, oldest first, before its own input, as the
official API has it (the earlier requests' `instructions` are not carried over). The store is
bounded by bytes (each response's JSON size): the least recently used responses leave first, so
the turns of a conversation still being continued stay while abandoned ones go; a chain whose
older turn has left is a 404 naming it. Nothing is written to disk: a restart forgets all.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from strata.serve.errors import ApiError, bad_request, not_found

DEFAULT_MIB = 64  # `strata serve --response-store-mib`


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict  # the response object as it was returned
    items: tuple  # its turn: the request's input items, then its output items
    previous: str | None  # the response it continued
    n_bytes: int
    inputs: tuple = ()  # the request's input items as `input_items` lists them (`listed`)


class ResponseStore:
    """Up to `max_bytes` of responses (0: none is kept, and every lookup is a 404)."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be 0 or more, got {max_bytes}")
        self.max_bytes = max_bytes
        self.n_bytes = 0
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()  # handlers run on the event loop; tests call from threads

    def __len__(self) -> int:
        return len(self._items)

    def put(self, body: dict, input_items: list, previous: str | None) -> bool:
        """Keep a finished response (`body["output"]` its output items); False where it is
        larger than the whole store (it is not kept)."""
        items = tuple(input_items) + tuple(body["output"])
        inputs = tuple(listed(item) for item in input_items)
        n_bytes = len(json.dumps(body)) + len(json.dumps(items)) + len(json.dumps(inputs))
        if n_bytes > self.max_bytes:
            return False
        with self._lock:
            old = self._items.pop(body["id"], None)
            if old is not None:
                self.n_bytes -= old.n_bytes
            self._items[body["id"]] = StoredResponse(body, items, previous, n_bytes, inputs)
            self.n_bytes += n_bytes
            while self.n_bytes > self.max_bytes:
                _, gone = self._items.popitem(last=False)
                self.n_bytes -= gone.n_bytes
        return True

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        """The stored response (now the most recently used), or a 404 naming the id."""
        with self._lock:
            found = self._items.get(response_id)
            if found is not None:
                self._items.move_to_end(response_id)
        if found is None:
            raise not_found(f"no stored response {response_id!r}: it was never stored "
                            f"(store: false), was deleted, or left the store "
                            f"(--response-store-mib)", param)
        return found

    def delete(self, response_id: str) -> None:
        with self._lock:
            gone = self._items.pop(response_id, None)
            if gone is not None:
                self.n_bytes -= gone.n_bytes
        if gone is None:
            raise not_found(f"no stored response {response_id!r}", "response_id")

    def history(self, response_id: str) -> list:
        """The items of the chain that ends at `response_id`, oldest turn first (each turn used
        now); a 404 naming `previous_response_id` where a turn is missing."""
        turns, at = [], response_id
        while at is not None:
            try:
                found = self.get(at, "previous_response_id")
            except ApiError as e:
                if at == response_id:
                    raise
                raise not_found(f"previous_response_id: the conversation before "
                                f"{response_id!r} is incomplete: its earlier response {at!r} "
                                f"left the store (--response-store-mib)",
                                "previous_response_id") from e
            turns.append(found.items)
            at = found.previous
        return [item for turn in reversed(turns) for item in turn]


# id prefixes of input items that came without one, by type, as the official API names them
_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
           "reasoning": "rs"}


def listed(item) -> dict:
    """An input item as `GET /v1/responses/{id}/input_items` lists it: with an id (its own, or
    one made when it is stored), a message's string content as one text part (`input_text`;
    `output_text` in an assistant's message) and its status."""
    out = dict(item) if isinstance(item, dict) else {"type": "message", "role": "user",
                                                     "content": str(item)}
    kind = out["type"] = out.get("type") or "message"  # a bare {role, content} is a message
    if not isinstance(out.get("id"), str) or not out["id"]:
        out["id"] = f"{_PREFIX.get(kind, 'item')}_{secrets.token_hex(12)}"
    if kind == "message":
        if isinstance(out.get("content"), str):
            part = "output_text" if out.get("role") == "assistant" else "input_text"
            out["content"] = [{"type": part, "text": out["content"]}]
        out.setdefault("status", "completed")
    return out


def page(items, q, what: str) -> dict:
    """A list page of `items` (each with an id, oldest first) by the query q: `limit` (1-100,
    default 20), `order` (`desc`, the default: the last item first; or `asc`), and `after` /
    `before` an item id of the list in that order (`what` names the items in a 400)."""
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"order: expected 'asc' or 'desc', got {order!r}", "order")
    items = list(items if order == "asc" else reversed(items))
    raw = q.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise bad_request(f"limit: expected an integer from 1 to 100, got {raw!r}", "limit")
    ids = [item["id"] for item in items]
    start, end = 0, len(items)
    for key in ("after", "before"):
        if key in q:
            if q[key] not in ids:
                raise bad_request(f"{key}: {q[key]!r} is not an {what}", key)
            at = ids.index(q[key])
            start, end = (at + 1, end) if key == "after" else (start, at)
    got = items[start:min(end, start + int(raw))]
    return {"object": "list", "data": got, "first_id": got[0]["id"] if got else None,
            "last_id": got[-1]["id"] if got else None, "has_more": start + len(got) < end}
