"""`CpuEngine`: the shared qwen3moe forward on the CPU backend, one sequence per engine."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from strata.engine.cpu.layers import CpuLayers, CpuModel
from strata.engine.engine import Callback, Engine, kept_positions
from strata.engine.interrupt import checkpoint
from strata.engine.qwen3moe import forward
from strata.gguf import ModelFile
from strata.kv import HostKVCache
from strata.plan.options import DEFAULT_MAX_CONTEXT

DEFAULT_PREFILL_CHUNK = 256  # tokens per forward call: bounds activation memory on long prompts
CPU_CONTEXT_CAP = 4096  # the default context at most: the CPU engine's KV is f32 per position


def default_max_context(shape) -> int:
    """The context when none is asked for: the model's training context, at most 4096. A
    non-positive training context is unknown, as `strata plan` reads it (its default, capped)."""
    train = shape.n_ctx_train if shape.n_ctx_train > 0 else DEFAULT_MAX_CONTEXT
    return min(train, CPU_CONTEXT_CAP)


class CpuEngine(Engine):
    """Runs a qwen3moe model on the CPU with numba kernels over the quantized blocks.

    Several engines built from one `CpuModel` share its (read-only, mapped) weights; each has
    its own KV cache of `max_context` positions, allocated here."""

    backend = "cpu"

    def __init__(self, model: CpuModel | ModelFile, *, max_context: int | None = None,
                 cb: Callback | None = None, profile: bool = False,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK):
        self.model = model if isinstance(model, CpuModel) else CpuModel(model)
        self.shape = s = self.model.shape
        self.max_context = default_max_context(s) if max_context is None else int(max_context)
        if self.max_context < 1:
            raise ValueError(f"max_context must be at least 1, got {self.max_context}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.cb = cb
        self.prefill_chunk = prefill_chunk
        self.kv = HostKVCache(s.n_layer, self.max_context, s.n_head_kv, s.head_dim)
        self.layers = CpuLayers(self.model, self.kv, profile=profile)
        self._n_past = 0

    @property
    def n_past(self) -> int:
        return self._n_past

    def reset(self) -> None:
        self._n_past = 0

    def rewind(self, n_keep: int) -> None:
        """Keep the sequence's first `n_keep` positions; the next prefill appends after them
        (the KV cache is positional: what lay past them is overwritten as it is recomputed)."""
        self._n_past = kept_positions(n_keep, self._n_past)

    def copy_prefix(self, other: "CpuEngine", n: int) -> None:
        """Start this sequence as `other`'s first `n` positions (their K/V copied): a prompt
        prefix another running sequence computed. The next prefill appends after them."""
        if other.shape != self.shape:
            raise ValueError("the engines run different models")
        if not 0 <= n <= other.n_past:
            raise ValueError(f"cannot copy {n} positions of a {other.n_past}-position sequence")
        if n > self.max_context:
            raise ValueError(f"{n} positions do not fit this engine's context of "
                             f"{self.max_context}")
        self.kv.copy_prefix(other.kv, n)
        self._n_past = int(n)

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        ids = self.check_tokens(tokens)
        logits = None
        for i in range(0, ids.size, self.prefill_chunk):
            if i:
                checkpoint()  # a cancelled request's prompt stops here (`interrupt`)
            logits = self._run(ids[i:i + self.prefill_chunk])
        return logits

    def decode_step(self, token: int) -> np.ndarray:
        return self._run(self.check_tokens([token]))

    def _run(self, ids: np.ndarray) -> np.ndarray:
        logits = forward(self.layers, self.shape, ids, self._n_past, cb=self.cb)
        self._n_past += ids.size
        return logits
