"""`BatchEngine`: what the serve worker drives — several sequences, each with its own KV state
in a numbered slot, decoded together one token per step.

A backend whose engine batches natively (the GPU engine: one pass over the weights for up to N
sequences) implements this directly. `PerSlotEngines` builds one from single-sequence engines
(`reset()`, `prefill(tokens)`, `decode_step(token)`, `max_context`): one engine instance per slot.
An engine may also choose tokens itself: `picks(params)` (whether it draws a `SamplingParams` as
the host `Sampler` would) and `decode_picked(slots, tokens, params)` (a step whose result is each
slot's next token where its params are given, its logits where they are None); the worker uses
them for the sequences that qualify.
Memory note: on the CPU backend every instance maps the same read-only weights, so N slots cost
N KV caches and N sets of activation buffers, not N models.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class BatchEngine(Protocol):
    """Slots 0..n_slots-1, each holding one sequence's KV state."""

    n_slots: int
    max_context: int

    def prefill(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        """Start a new sequence in `slot` (dropping what it held) from `tokens`;
        returns the last token's logits: [n_vocab] f32."""
        ...

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Append one token to each listed slot's sequence in one step;
        returns [len(slots), n_vocab] f32 logits."""
        ...

    def release(self, slot: int) -> None:
        """The slot's sequence is over; its KV state may be reused."""
        ...


def last_logits(logits: Any) -> np.ndarray:
    """The last position's logits as [n_vocab] f32, whether an engine returns [n_vocab] or
    [n_tokens, n_vocab]."""
    arr = np.asarray(logits, dtype=np.float32)
    if arr.ndim == 2:
        return arr[-1]
    if arr.ndim != 1:
        raise ValueError(f"logits should be [n_vocab] or [n_tokens, n_vocab], got shape "
                         f"{arr.shape}")
    return arr


class PerSlotEngines:
    """A `BatchEngine` over single-sequence engines, one per slot (made by `make_engine()`).
    A decode step runs the slots one after another: correct everywhere, batched nowhere."""

    def __init__(self, make_engine: Callable[[], Any], n_slots: int):
        if n_slots < 1:
            raise ValueError(f"n_slots must be at least 1, got {n_slots}")
        self.engines = [make_engine() for _ in range(n_slots)]
        self.n_slots = n_slots
        self.max_context = min(int(e.max_context) for e in self.engines)

    def _engine(self, slot: int) -> Any:
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} out of range 0..{self.n_slots - 1}")
        return self.engines[slot]

    def prefill(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        engine = self._engine(slot)
        engine.reset()
        return last_logits(engine.prefill(list(tokens)))

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        if len(slots) != len(tokens):
            raise ValueError(f"{len(slots)} slots but {len(tokens)} tokens")
        rows = [last_logits(self._engine(s).decode_step(int(t))) for s, t in zip(slots, tokens)]
        return np.stack(rows)  # [n_seq, n_vocab] f32

    def release(self, slot: int) -> None:
        self._engine(slot).reset()


class SplitSlot(PerSlotEngines):
    """One slot over a layer split's `SplitEngine`: one sequence at a time over several GPUs.
    Its decode hit counters live on the GPUs; the worker's thread copies them to the host every
    `HIT_EVERY` steps and when a sequence ends, so `hit_counts()` (read by the metrics from
    HTTP threads) never touches a GPU."""

    HIT_EVERY = 16

    def __init__(self, engine: Any):
        super().__init__(lambda: engine, 1)
        self.engine = engine
        self._hits = np.zeros((engine.shape.n_layer, 2), np.int64)
        self._steps = 0

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        out = super().decode(slots, tokens)
        self._steps += 1
        if self._steps % self.HIT_EVERY == 0:
            self._read_hits()
        return out

    def release(self, slot: int) -> None:
        super().release(slot)
        self._read_hits()

    def _read_hits(self) -> None:
        self._hits = np.array(self.engine.hits().counts)

    def hit_counts(self) -> np.ndarray:
        """The per-layer decode [hits, misses] counters (cumulative) as of the last copy:
        int64 [L, 2], a host array."""
        return np.array(self._hits)
