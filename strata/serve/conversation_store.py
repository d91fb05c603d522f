"""`ConversationStore`: the Conversations API's conversations, in memory, for `/v1/conversations`
and the Responses API's `conversation` field.

A conversation is an id, its creation time, its metadata (up to 16 string pairs) and its items
in order, each with an id (`response_store.listed`): those it was created with or added through
`/v1/conversations/{id}/items`, and each response made in it adds its request's input items and
its output items. The store is bounded by bytes (each conversation's JSON size), as the response
store is: the least recently used conversations leave first; one that alone would pass the bound
is refused (a 400 naming the conversation) rather than let go. Nothing is written to disk.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from strata.serve.errors import bad_request, not_found
from strata.serve.response_store import listed

MAX_ITEMS_A_CALL = 20    # items a create or an add takes at once, as the official API


@dataclass(slots=True)
class Conversation:
    id: str
    created_at: int
    metadata: dict
    items: list = field(default_factory=list)  # listed items, oldest first
    n_bytes: int = 0

    def body(self) -> dict:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}


class ConversationStore:
    """Up to `max_bytes` of conversations (0: none can be made: a create is a 400)."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be 0 or more, got {max_bytes}")
        self.max_bytes = max_bytes
        self.n_bytes = 0
        self._convs: OrderedDict[str, Conversation] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._convs)

    def create(self, items: list, metadata: dict) -> Conversation:
        """A new conversation holding `items` (checked by the caller), listed with ids."""
        conv = Conversation(f"conv_{secrets.token_hex(24)}", int(time.time()), metadata)
        with self._lock:
            self._grow(conv, [listed(item) for item in items], "items")
            self._convs[conv.id] = conv
            self._fit(conv.id)
        return conv

    def get(self, conv_id: str, param: str = "conversation_id") -> Conversation:
        """The conversation (now the most recently used), or a 404 naming the id."""
        with self._lock:
            conv = self._convs.get(conv_id)
            if conv is not None:
                self._convs.move_to_end(conv_id)
        if conv is None:
            raise not_found(f"no conversation {conv_id!r}: it was never made here, was "
                            f"deleted, or left the store (--response-store-mib)", param)
        return conv

    def set_metadata(self, conv_id: str, metadata: dict) -> Conversation:
        conv = self.get(conv_id)
        with self._lock:
            self._resize(conv, conv.items, metadata)
            conv.metadata = metadata
        return conv

    def delete(self, conv_id: str) -> None:
        with self._lock:
            gone = self._convs.pop(conv_id, None)
            if gone is not None:
                self.n_bytes -= gone.n_bytes
        if gone is None:
            raise not_found(f"no conversation {conv_id!r}", "conversation_id")

    def add(self, conv_id: str, items: list, param: str = "items") -> list:
        """`items` appended to the conversation, listed with ids; the listed items."""
        conv = self.get(conv_id)
        new = [listed(item) for item in items]
        with self._lock:
            self._grow(conv, new, param)
            self._fit(conv.id)
        return new

    def item(self, conv_id: str, item_id: str) -> dict:
        for item in self.get(conv_id).items:
            if item["id"] == item_id:
                return item
        raise not_found(f"conversation {conv_id!r} has no item {item_id!r}", "item_id")

    def delete_item(self, conv_id: str, item_id: str) -> Conversation:
        conv = self.get(conv_id)
        with self._lock:
            kept = [item for item in conv.items if item["id"] != item_id]
            if len(kept) == len(conv.items):
                raise not_found(f"conversation {conv_id!r} has no item {item_id!r}",
                                "item_id")
            self._resize(conv, kept, conv.metadata)
            conv.items = kept
        return conv

    def history(self, conv_id: str) -> list:
        """The conversation's items, oldest first, as a Responses request continues them."""
        return list(self.get(conv_id, "conversation").items)

    # -- bytes (under the lock) ------------------------------------------------------------------

    def _size(self, items: list, metadata: dict) -> int:
        return len(json.dumps(items)) + len(json.dumps(metadata)) + 64

    def _resize(self, conv: Conversation, items: list, metadata: dict) -> None:
        n = self._size(items, metadata)
        self.n_bytes += n - conv.n_bytes
        conv.n_bytes = n

    def _grow(self, conv: Conversation, new: list, param: str) -> None:
        """`new` appended, counted by its own bytes (not the whole conversation again: a
        response adds a turn to a conversation that may be long)."""
        n = (conv.n_bytes or self._size([], conv.metadata)) + len(json.dumps(new))
        if n > self.max_bytes:
            raise bad_request(f"{param}: conversation {conv.id!r} would hold {n} bytes, more "
                              f"than the whole store ({self.max_bytes}, --response-store-mib)",
                              param)
        conv.items.extend(new)
        self.n_bytes += n - conv.n_bytes
        conv.n_bytes = n

    def _fit(self, keep: str) -> None:
        """The least recently used conversations out until the store fits (never `keep`)."""
        for conv_id in list(self._convs):
            if self.n_bytes <= self.max_bytes:
                break
            if conv_id != keep:
                self.n_bytes -= self._convs.pop(conv_id).n_bytes
