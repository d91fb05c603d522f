"""The generation loop, backend-independent: prefill the prompt, then sample and decode one token
at a time until a stop token, the token budget, or the end of the context."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from strata.engine.engine import Engine
from strata.engine.sampler import Sampler

STOP_REASONS = ("stop", "length", "context")
# engines with `device_tokens` (the CUDA engine) pick tokens on the device, where the step's
# logits stay, unless the logits are kept or the device would draw otherwise (`picks`); False
# samples every backend's logits on the host
DEVICE_PICK = True


class TextStream(Protocol):
    """Token ids in, text out, never splitting a UTF-8 character (the tokenizer's
    StreamDecoder)."""

    def push(self, token: int) -> str: ...

    def flush(self) -> str: ...


@dataclass(slots=True)
class Generation:
    """What one generation produced. `tokens` are the generated ids (a stop token that ended it
    is the last one, and adds no text); `logits` (when kept) is float32[len(tokens), n_vocab],
    row i the logits that chose tokens[i]."""

    prompt_tokens: int
    reused_tokens: int = 0  # leading prompt tokens whose KV the engine kept (not computed)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = "length"  # one of STOP_REASONS
    prefill_s: float = 0.0
    decode_s: float = 0.0
    logits: np.ndarray | None = None

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens computed per second (the reused ones were not)."""
        n = self.prompt_tokens - self.reused_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens decoded per second: the first generated token comes from the prefill, so
        len(tokens) - 1 decode steps fed the rest."""
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


def generate(engine: Engine, prompt: Sequence[int], *, n_predict: int, sampler: Sampler,
             stop_ids: Iterable[int] = (), text: TextStream | None = None,
             on_text: Callable[[str], None] | None = None,
             keep_logits: bool = False, reuse: int = 0) -> Generation:
    """Generate up to `n_predict` tokens after `prompt` on a fresh sequence of `engine`, or
    (reuse > 0) on the one it holds, whose first `reuse` positions are `prompt[:reuse]` (a
    chat's earlier turns: `Engine.rewind` keeps them and only the rest is computed; at most
    len(prompt) - 1, since the prompt's last token gives the first logits).

    Stops at a token in `stop_ids` (reason "stop"), after `n_predict` tokens ("length"), or
    when the context is full ("context"). Text goes through `text` (when given) and each new
    piece to `on_text` as soon as it is complete."""
    if n_predict < 1:
        raise ValueError(f"n_predict must be at least 1, got {n_predict}")
    if not 0 <= reuse < max(len(prompt), 1):
        raise ValueError(f"reuse must keep fewer than the prompt's {len(prompt)} tokens, "
                         f"got {reuse}")
    stops = frozenset(int(t) for t in stop_ids)
    if reuse:
        rewind = getattr(engine, "rewind", None)
        if rewind is None:
            raise ValueError(f"the {engine.backend} engine cannot keep a sequence's positions")
        rewind(reuse)  # refuses more than the engine holds
    else:
        engine.reset()
    sampler.accept(prompt)
    out = Generation(prompt_tokens=len(prompt), reused_tokens=reuse)
    rows: list[np.ndarray] = []
    pieces: list[str] = []

    def emit(piece: str) -> None:
        if piece:
            pieces.append(piece)
            if on_text is not None:
                on_text(piece)

    t0 = time.perf_counter()
    logits = engine.prefill(prompt[reuse:])
    out.prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # the device picks and feeds each token itself (`device_tokens`) where it draws as the
    # host would (`picks`: never under a constraint, which only the host keeps); else the host
    # samples the logits of each step
    picks = getattr(engine, "picks", None)
    on_device = (DEVICE_PICK and not keep_logits and picks is not None
                 and getattr(sampler, "constraint", None) is None and picks(sampler.params))
    picked = engine.device_tokens(sampler.params, n_predict) if on_device else None
    try:
        while True:
            if keep_logits:
                rows.append(np.array(logits, dtype=np.float32))
            token = next(picked) if on_device else sampler(logits)
            out.tokens.append(token)
            if token in stops:
                out.stop_reason = "stop"
                break
            if text is not None:
                emit(text.push(token))
            if len(out.tokens) >= n_predict:
                out.stop_reason = "length"
                break
            if len(prompt) + len(out.tokens) - 1 >= engine.max_context:  # n_past, once fed
                out.stop_reason = "context"
                break
            if not on_device:
                logits = engine.decode_step(token)
    finally:
        if on_device:
            picked.close()  # undoes a step run ahead of the last token
            sampler.accept(out.tokens)
    out.decode_s = time.perf_counter() - t0
    if text is not None:
        emit(text.flush())
    out.text = "".join(pieces)
    if keep_logits:
        out.logits = np.stack(rows) if rows else np.zeros((0, engine.shape.n_vocab), np.float32)
    return out

