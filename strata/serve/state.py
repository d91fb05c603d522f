"""`ServerState`: what every route handler reads — the model, the worker, metrics, knobs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from strata.serve.conversation_store import ConversationStore
from strata.serve.errors import not_found
from strata.serve.metrics import DeviceReport, Metrics
from strata.serve.response_store import DEFAULT_MIB, ResponseStore


@dataclass(slots=True)
class ServerState:
    """One server's shared objects. `model` is a `ServedModel` (or a test double with the same
    surface); `devices()` measures the memory picture on demand."""

    model: Any
    worker: Any
    metrics: Metrics
    max_tokens_limit: int | None = None
    devices: Callable[[], list[DeviceReport]] = list
    plan_summary: dict = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))
    # the Responses API's stored responses (previous_response_id, GET/DELETE by id)
    responses: ResponseStore = field(
        default_factory=lambda: ResponseStore(DEFAULT_MIB << 20))
    # the Conversations API's conversations (/v1/conversations, a response's `conversation`)
    conversations: ConversationStore = field(
        default_factory=lambda: ConversationStore(DEFAULT_MIB << 20))

    def check_model(self, name: str) -> None:
        """A 404 naming the served model(s) when a request asks for another; its words start
        as Ollama's do ("model 'x' not found"), which Ollama clients match on."""
        served = (self.model.name, *self.model.aliases)
        # `name:latest` is `name`, as in Ollama, whose clients send it to every route
        if name not in served and name.removesuffix(":latest") not in served:
            raise not_found(f"model {name!r} not found; this server serves "
                            f"{', '.join(repr(n) for n in served)}", "model")
