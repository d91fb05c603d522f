"""Stopping a long prompt between its chunks.

A prompt of tens of thousands of tokens takes seconds (minutes where experts stream over PCIe
on a small card), and a client that gives up on it (Claude Code's Esc, a closed connection)
should free the GPU for the request it sends next, not wait behind it. The server's worker runs
an engine's `prefill` inside `interruptible(check)`; every engine calls `checkpoint()` between
the chunks of a prompt, which raises `PrefillInterrupted` once check() holds. The engines and
their slot wrappers treat it as any failed prefill: the sequence's state is dropped (its KV is
not reused). Outside `interruptible` (generate, bench) `checkpoint` does nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["PrefillInterrupted", "checkpoint", "interruptible"]

_local = threading.local()  # the worker's thread runs the engine: its own check


class PrefillInterrupted(Exception):
    """The prompt was stopped between two chunks (`checkpoint`)."""


@contextmanager
def interruptible(check: Callable[[], bool]) -> Iterator[None]:
    """Within it, `checkpoint()` on this thread raises once check() is true."""
    before = getattr(_local, "check", None)
    _local.check = check
    try:
        yield
    finally:
        _local.check = before


def checkpoint() -> None:
    """Between a prompt's chunks: raise `PrefillInterrupted` if this thread's check holds."""
    check = getattr(_local, "check", None)
    if check is not None and check():
        raise PrefillInterrupted("the prompt was stopped between chunks: its request was "
                                 "cancelled")
