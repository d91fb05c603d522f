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

A chat's next turn: where every engine can `rewind(n)` (keep its first n positions: the CPU
engine), `PerSlotEngines` keeps a finished sequence's KV (`release(slot, tokens)`, as the CUDA
batch engine does), and a later prompt that starts with the same tokens is computed only past
them. A new prompt takes the engine, among the slots not running, whose kept tokens share the
longest prefix with it: engines are swapped between slots, so the worker's choice of slot does
not lose a conversation's KV.

A prompt shared with a running sequence (a request's `n` choices; clients that send one system
prompt): where the engines can `copy_prefix(other, n)`, the new sequence's engine takes the
K/V of the prompt tokens they share from the running one's (a copy, not a prefill). Each
sequence's prompt and its logits are kept while its KV holds them, so a prompt equal to one of
them (the second choice, a request sent again) computes nothing: its logits are the recorded
ones, bit for bit what its own prefill gave. (`common_prefix` leaves the last token to compute
otherwise: KV alone does not give its logits.)

A prompt stopped between its chunks (`strata.engine.interrupt`: its client went away) keeps
the chunks it ran: the worker releases it with its prompt, and a retry of the same request
computes only past them.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from strata.engine.engine import PromptRecord, reusable_prefix
from strata.engine.interrupt import PrefillInterrupted


@runtime_checkable
class BatchEngine(Protocol):
    """Slots 0..n_slots-1, each holding one sequence's KV state."""

    n_slots: int
    max_context: int

    def prefill(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        """Start a new sequence in `slot` (dropping what it held) from `tokens`;
        returns the last token's logits: [n_vocab] f32. An engine that reuses K/V it holds
        (`keeps_prefix`) also takes `reuse=False`: compute the whole prompt."""
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
    A decode step runs the slots one after another: correct everywhere, batched nowhere.
    With engines that can `rewind`, a released sequence's KV is kept for a later prompt that
    shares its prefix (see the module doc; `n_reused` counts the last prefill's reused tokens)."""

    def __init__(self, make_engine: Callable[[], Any], n_slots: int):
        if n_slots < 1:
            raise ValueError(f"n_slots must be at least 1, got {n_slots}")
        self.engines = [make_engine() for _ in range(n_slots)]
        self.n_slots = n_slots
        self.max_context = min(int(e.max_context) for e in self.engines)
        self.keeps_prefix = all(callable(getattr(e, "rewind", None)) for e in self.engines)
        self.shape = getattr(self.engines[0], "shape", None)  # the model's (every engine's)
        # tokens a released slot's KV holds (None: nothing kept, or the slot is running)
        self._kept: list[list[int] | None] = [None] * n_slots
        # each slot's prompt and its logits while its KV holds them (running, or kept)
        self._prompts: list[PromptRecord | None] = [None] * n_slots
        self.copies_prefix = self.keeps_prefix and all(
            callable(getattr(e, "copy_prefix", None)) for e in self.engines)
        self._running: set[int] = set()
        self.n_reused = 0

    def _engine(self, slot: int) -> Any:
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} out of range 0..{self.n_slots - 1}")
        return self.engines[slot]

    def prefill(self, slot: int, tokens: Sequence[int], *, reuse: bool = True) -> np.ndarray:
        """`reuse`: take what K/V the engines hold (see the module doc); False: compute the
        whole prompt (`--no-prefix-cache`)."""
        self._engine(slot)  # in range
        tokens = [int(t) for t in tokens]
        self._running.discard(slot)  # a prefill starts the slot's sequence again
        # the released slot whose kept tokens share the most (this one on a tie)
        shared = [self._shared(s, tokens) if s not in self._running and reuse else 0
                  for s in range(self.n_slots)]
        common = max(shared)
        best = slot if shared[slot] == common else shared.index(common)
        # a running sequence's prompt, where it shares more: its K/V copied
        source, from_running = None, 0
        if self.copies_prefix and reuse:
            for s in sorted(self._running):
                n = self._shared(s, tokens)
                if n > max(common, from_running):
                    source, from_running = s, n
        if source is None and best != slot:  # its engine (and KV) moves into this slot's name
            self.engines[slot], self.engines[best] = self.engines[best], self.engines[slot]
            self._kept[slot], self._kept[best] = self._kept[best], self._kept[slot]
            self._prompts[slot], self._prompts[best] = self._prompts[best], self._prompts[slot]
        engine, self._kept[slot], record = self.engines[slot], None, self._prompts[slot]
        self._prompts[slot] = None
        self.n_reused = 0
        try:
            if source is not None:
                engine.copy_prefix(self.engines[source], from_running)
                common, record = from_running, self._prompts[source]
            elif common:
                engine.rewind(common)
            else:
                engine.reset()
            if common and common == len(tokens):  # the recorded prompt: nothing to compute
                logits = record.logits.copy()
            else:
                logits = last_logits(engine.prefill(tokens[common:]))
            self.n_reused = common
        except PrefillInterrupted:  # its request went away: the chunks run stay, and
            self.n_reused = 0  # `release` keeps them for a prompt sent again (a retry)
            raise
        except BaseException:
            engine.reset()  # a failed prefill leaves no state to reuse
            self.n_reused = 0
            raise
        self._prompts[slot] = PromptRecord.of(tokens, logits)
        self._running.add(slot)
        return logits

    def _shared(self, slot: int, tokens: list[int]) -> int:
        """How many leading `tokens` slot's KV gives (`reusable_prefix`)."""
        if not self.keeps_prefix:
            return 0
        return reusable_prefix(self._prompts[slot], self._kept[slot], tokens,
                               running=slot in self._running)

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        if len(slots) != len(tokens):
            raise ValueError(f"{len(slots)} slots but {len(tokens)} tokens")
        rows = [last_logits(self._engine(s).decode_step(int(t))) for s, t in zip(slots, tokens)]
        return np.stack(rows)  # [n_seq, n_vocab] f32

    def release(self, slot: int, tokens: Sequence[int] | None = None) -> None:
        """The slot's sequence is over. `tokens`: what it fed (its prompt, then its tokens;
        any past what its KV holds are ignored): kept for a later prompt's prefix where the
        engines can rewind; without them the KV is dropped."""
        engine = self._engine(slot)
        self._running.discard(slot)
        n = int(getattr(engine, "n_past", 0))
        record = self._prompts[slot]
        if self.keeps_prefix and tokens is not None and len(tokens) >= n > 0:
            self._kept[slot] = [int(t) for t in tokens[:n]]
            if record is not None and not record.begins(self._kept[slot]):
                self._prompts[slot] = None  # what it fed did not start with its prompt
        else:
            self._kept[slot] = self._prompts[slot] = None
            engine.reset()


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

    def release(self, slot: int, tokens: Sequence[int] | None = None) -> None:
        super().release(slot, tokens)
        self._read_hits()

    def _read_hits(self) -> None:
        self._hits = np.array(self.engine.hits().counts)

    def hit_counts(self) -> np.ndarray:
        """The per-layer decode [hits, misses] counters (cumulative) as of the last copy:
        int64 [L, 2], a host array."""
        return np.array(self._hits)
